// The kernels of an fp32 residual stream beside bf16 activations (the
// artifact given on the command line: tiny_bf16_fp32_residual, n = 4, its
// image compiled with res_t = float): expand, contract, pre-mix, post-res,
// the residual add, their backwards and the mHC entry's coefficients
// (projection in fp32 on the widened bf16 weights) against the CPU kernels
// run in fp32 on the same values. Outputs in the stream are fp32, so they
// agree with the CPU to fp32 rounding (exactly where the expression has one
// operation); bf16 outputs to one bf16 rounding. Every GPU result is
// bit-identical when run twice, and the zero-bubble split (B, then W) gives
// the bits of one backward. Skips cleanly where no GPU is visible
// (ModelKernelsTest.h).
#include "runtime/cpu/Bf16.h"
#include "runtime/cpu/Kernels.h"
#include "runtime/cuda/DeviceKernels.h"
#include "tests/runtime/ModelKernelsTest.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

namespace mhcc::runtime {
namespace {

namespace k = kernels;
using cuda::bf16;

// 100 tokens, tiny's C = 64 at n = 4.
constexpr int64_t T = 100, C = 64, N = 4, W = N * C, K = N * N + 2 * N;

class CudaFp32ResidualKernels : public ModelKernelsTest {
protected:
  CudaFp32ResidualKernels() : ModelKernelsTest(2, N, 0, 4) {}

  /// Normal values, rounded to bf16 where the GPU stores them so.
  std::vector<float> random(size_t count, float scale = 1.0f, bool roundBf16 = true) {
    return normalValues(rng_, count, scale, roundBf16);
  }
  std::vector<float> stream(size_t count, float scale = 1.0f) { return random(count, scale, false); }
  static std::vector<float> rounded(std::vector<float> v) {
    for (float &x : v)
      x = roundToBf16(x);
    return v;
  }
  static bool sameBits(const std::vector<float> &a, const std::vector<float> &b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
  }
  int64_t sinkhornIterations() {
    std::string error;
    std::optional<Artifact> artifact = readArtifact(gArtifact, error);
    return artifact && artifact->deviceCode ? artifact->deviceCode->sinkhornIterations : 0;
  }

  std::mt19937 rng_{11};
};

/// The model's residual storage is what the image was compiled for: a bf16
/// stream is refused with one line naming the global and the fix.
TEST_F(CudaFp32ResidualKernels, ImageOfAnFp32StreamRefusesABf16Model) {
  std::string error;
  std::optional<Artifact> artifact = readArtifact(gArtifact, error);
  ASSERT_TRUE(artifact && artifact->deviceCode) << error;
  EXPECT_FALSE(cuda::ModelKernels::load(*artifact->deviceCode, 0, 2, 2, error));
  EXPECT_NE(error.find("store the residual stream as fp32 (4 bytes), where this model asks for bf16"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("mhcc_abi_residual_bytes"), std::string::npos) << error;
}

TEST_F(CudaFp32ResidualKernels, StreamKernelsAgainstTheCpu) {
  auto h = random(T * C), x = stream(T * W), y = random(T * C), du = random(T * C), dOut = stream(T * W);
  auto dx0 = stream(T * W, 0.1f), dh0 = random(T * C, 0.1f), dy0 = random(T * C, 0.1f), dc0 = random(T * K, 0.1f);
  std::vector<float> coef(T * K);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (float &c : coef)
    c = unit(rng_);
  // The CPU in fp32 on the same values; the GPU rounds its bf16 outputs once.
  std::vector<float> expanded(T * W), contracted(T * C), u(T * C), mixed(T * W), added(T * C);
  k::expandForward(h.data(), expanded.data(), T, C, N);
  k::contractForward(x.data(), contracted.data(), T, C, N);
  k::mhcPreForward(x.data(), coef.data(), u.data(), T, C, N);
  k::mhcPostResForward(x.data(), coef.data(), y.data(), mixed.data(), T, C, N);
  k::residualForward(x.data(), y.data(), added.data(), T * C);
  std::vector<float> expandDh = dh0, contractDx = dx0, preDx = dx0, preDc = dc0, postDx = dx0, postDc = dc0,
                     postDy = dy0, residualDy = dy0;
  std::vector<float> residualDx(dx0.begin(), dx0.begin() + T * C); // the n = 1 add: T C elements
  k::expandBackward(dOut.data(), expandDh.data(), T, C, N);
  k::contractBackward(dh0.data(), contractDx.data(), T, C, N);
  k::mhcPreBackward(x.data(), coef.data(), du.data(), preDx.data(), preDc.data(), T, C, N);
  k::mhcPostResBackward(x.data(), coef.data(), y.data(), dOut.data(), postDx.data(), postDc.data(), postDy.data(), T,
                        C, N);
  k::residualBackward(dOut.data(), residualDx.data(), residualDy.data(), T * C);
  constexpr int kOutputs = 14;
  const std::vector<float> want[kOutputs] = {expanded, rounded(contracted), rounded(u), mixed, added,
                                             rounded(expandDh), contractDx, preDx, preDc, postDx,
                                             postDc, rounded(postDy), residualDx, rounded(residualDy)};
  const char *names[kOutputs] = {"expand",      "contract",     "pre-mix u",   "post-res out", "residual add",
                                 "expand dh",   "contract dx",  "pre dx",      "pre dCoef",    "post/res dx",
                                 "post/res dCoef", "post/res dy", "residual dx", "residual dy"};
  // Relative tolerances: 0 where the CPU's expression is the GPU's (copies,
  // a sum in the same order, one division or add); fp32 rounding for the
  // mixes (contracted multiply-adds); a bf16 rounding apart for the pre-mix.
  const double tolerance[kOutputs] = {0, 0, 8e-3, 1e-5, 0, 0, 0, 1e-5, 1e-5, 1e-5, 1e-5, 8e-3, 0, 0};
  const bf16 *dH = uploadBf16(h), *dY = uploadBf16(y), *dDu = uploadBf16(du);
  const float *dX = uploadF32(x), *dDOut = uploadF32(dOut), *dCoef = uploadF32(coef);
  std::vector<float> got[2][kOutputs];
  for (auto &run : got) {
    float *xOut = allocate<float>(T * W), *mixOut = allocate<float>(T * W), *addOut = allocate<float>(T * C);
    bf16 *hOut = allocate<bf16>(T * C), *uOut = allocate<bf16>(T * C);
    cuda::expandForward(*kernels_, dH, xOut, T, C, N, nullptr);
    cuda::contractForward(*kernels_, dX, hOut, T, C, N, nullptr);
    cuda::mhcPreForward(*kernels_, dX, dCoef, uOut, T, C, N, nullptr);
    cuda::mhcPostResForward(*kernels_, dX, dCoef, dY, mixOut, T, C, N, nullptr);
    cuda::residualForward(*kernels_, dX, dY, addOut, T * C, nullptr);
    bf16 *eDh = uploadBf16(dh0), *postDyGpu = uploadBf16(dy0), *resDy = uploadBf16(dy0);
    float *cDx = uploadF32(dx0), *pDx = uploadF32(dx0), *pDc = uploadF32(dc0), *qDx = uploadF32(dx0);
    float *qDc = uploadF32(dc0), *rDx = uploadF32(dx0);
    cuda::expandBackward(*kernels_, dDOut, eDh, T, C, N, nullptr);
    cuda::contractBackward(*kernels_, static_cast<const bf16 *>(uploadBf16(dh0)), cDx, T, C, N, nullptr);
    cuda::mhcPreBackward(*kernels_, dX, dCoef, dDu, pDx, pDc, T, C, N, nullptr);
    cuda::mhcPostResBackward(*kernels_, dX, dCoef, dY, dDOut, qDx, qDc, postDyGpu, 0, T, C, N, nullptr);
    cuda::residualBackward(*kernels_, static_cast<const float *>(dDOut), rDx, resDy, T * C, nullptr);
    noErrors("the stream's kernels");
    run[0] = downloadF32(xOut, T * W);
    run[1] = downloadBf16(hOut, T * C);
    run[2] = downloadBf16(uOut, T * C);
    run[3] = downloadF32(mixOut, T * W);
    run[4] = downloadF32(addOut, T * C);
    run[5] = downloadBf16(eDh, T * C);
    run[6] = downloadF32(cDx, T * W);
    run[7] = downloadF32(pDx, T * W);
    run[8] = downloadF32(pDc, T * K);
    run[9] = downloadF32(qDx, T * W);
    run[10] = downloadF32(qDc, T * K);
    run[11] = downloadBf16(postDyGpu, T * C);
    run[12] = downloadF32(rDx, T * C);
    run[13] = downloadBf16(resDy, T * C);
  }
  for (int i = 0; i < kOutputs; ++i) {
    if (tolerance[i] == 0)
      EXPECT_TRUE(sameBits(got[0][i], want[i])) << names[i] << ": " << relativeError(got[0][i], want[i]);
    else
      EXPECT_LT(relativeError(got[0][i], want[i]), tolerance[i]) << names[i];
    EXPECT_TRUE(sameBits(got[0][i], got[1][i])) << names[i] << " differs between two runs";
  }
  // Not vacuous: the stream keeps what bf16 would have rounded away.
  int64_t unrounded = 0;
  for (float v : got[0][3])
    unrounded += v != roundToBf16(v);
  EXPECT_GT(unrounded, T * W / 2) << "the post-res output looks rounded to bf16";
}

/// The post/res backward into fresh gradients (NaN-filled: taken as zero,
/// written), and the element-at-a-time fallbacks (a misaligned stream, a
/// residual add whose count is not a multiple of 4): each element the same
/// bits as the quad paths give, the dots within fp32 rounding.
TEST_F(CudaFp32ResidualKernels, FreshGradientsAndElementPaths) {
  auto x = stream(T * W), y = random(T * C), du = random(T * C), dOut = stream(T * W);
  std::vector<float> coef(T * K);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (float &c : coef)
    c = unit(rng_);
  std::vector<float> dx(T * W), dc(T * K), dy(T * C);
  k::mhcPostResBackward(x.data(), coef.data(), y.data(), dOut.data(), dx.data(), dc.data(), dy.data(), T, C, N);
  const bf16 *dY = uploadBf16(y), *dDu = uploadBf16(du);
  const float *dCoef = uploadF32(coef);
  // [aligned, misaligned by one element]
  std::vector<float> fresh[2][3], mixed[2], u[2], expanded[2], added[2], preDx[2], preDc[2];
  for (int misaligned = 0; misaligned < 2; ++misaligned) {
    const size_t o = misaligned;
    const float *dX = uploadF32(x, o), *dDOut = uploadF32(dOut, o);
    float *gDx = allocate<float>(T * W + o) + o, *gDc = allocate<float>(T * K);
    bf16 *gDy = allocate<bf16>(T * C + o) + o;
    cudaMemset(gDx, 0xff, T * W * 4);
    cudaMemset(gDc, 0xff, T * K * 4);
    cudaMemset(gDy, 0xff, T * C * 2);
    cuda::mhcPostResBackward(*kernels_, dX, dCoef, dY, dDOut, gDx, gDc, gDy, 1 | 2 | 4, T, C, N, nullptr);
    float *mixOut = allocate<float>(T * W + o) + o, *xOut = allocate<float>(T * W + o) + o;
    float *addOut = allocate<float>(T * C + o) + o, *pDx = uploadF32(std::vector<float>(T * W), o);
    float *pDc = uploadF32(std::vector<float>(T * K));
    bf16 *uOut = allocate<bf16>(T * C);
    cuda::mhcPostResForward(*kernels_, dX, dCoef, dY, mixOut, T, C, N, nullptr);
    cuda::mhcPreForward(*kernels_, dX, dCoef, uOut, T, C, N, nullptr);
    cuda::expandForward(*kernels_, dY, xOut, T, C, N, nullptr);
    cuda::residualForward(*kernels_, dX, dY, addOut, T * C - 3, nullptr); // a tail of 1 after the quads
    cuda::mhcPreBackward(*kernels_, dX, dCoef, dDu, pDx, pDc, T, C, N, nullptr);
    noErrors(misaligned ? "misaligned" : "aligned");
    fresh[o][0] = downloadF32(gDx, T * W);
    fresh[o][1] = downloadF32(gDc, T * K);
    fresh[o][2] = downloadBf16(gDy, T * C);
    mixed[o] = downloadF32(mixOut, T * W);
    u[o] = downloadBf16(uOut, T * C);
    expanded[o] = downloadF32(xOut, T * W);
    added[o] = downloadF32(addOut, T * C - 3);
    preDx[o] = downloadF32(pDx, T * W);
    preDc[o] = downloadF32(pDc, T * K);
  }
  const std::vector<float> *want[3] = {&dx, &dc, &dy};
  const double tolerance[3] = {1e-5, 1e-5, 8e-3};
  const char *names[3] = {"fresh dx", "fresh dCoef", "fresh dy"};
  for (int i = 0; i < 3; ++i)
    for (int o = 0; o < 2; ++o)
      EXPECT_LT(relativeError(fresh[o][i], i == 2 ? rounded(*want[i]) : *want[i]), tolerance[i])
          << names[i] << (o ? ", misaligned" : "");
  // The elementwise kernels: one expression an element on either path.
  EXPECT_TRUE(sameBits(fresh[0][0], fresh[1][0])) << "post/res dx, quads against elements";
  EXPECT_TRUE(sameBits(fresh[0][2], fresh[1][2])) << "post/res dy, quads against elements";
  EXPECT_TRUE(sameBits(mixed[0], mixed[1])) << "post-res forward, quads against elements";
  EXPECT_TRUE(sameBits(u[0], u[1])) << "pre-mix, quads against elements";
  EXPECT_TRUE(sameBits(expanded[0], expanded[1])) << "expand, quads against elements";
  EXPECT_TRUE(sameBits(added[0], added[1])) << "residual add, quads and tail against elements";
  EXPECT_TRUE(sameBits(preDx[0], preDx[1])) << "pre backward dx, quads against elements";
  EXPECT_LT(relativeError(preDc[1], preDc[0]), 1e-5) << "pre backward dots, quads against elements";
  for (int64_t i = 0; i < T * C - 3; ++i)
    ASSERT_EQ(added[0][i], x[i] + y[i]) << "residual add at " << i;
}

TEST_F(CudaFp32ResidualKernels, CoefficientsForwardAndBackwardAgainstTheCpu) {
  const int64_t iterations = sinkhornIterations();
  ASSERT_GT(iterations, 0);
  auto x = stream(T * W), wmap = random(W * K, 0.05f), bias = random(K, 0.3f), alpha = random(3);
  auto dCoef = random(T * K), dx0 = stream(T * W, 0.1f);
  // The CPU in fp32 on the same values.
  std::vector<float> coef(T * K), aux(T * (K + 1)), dx = dx0, dWmap(W * K), dBias(K), dAlpha(3);
  k::mhcCoeffsForward(x.data(), wmap.data(), bias.data(), alpha.data(), coef.data(), aux.data(), T, C, N,
                      iterations);
  k::mhcCoeffsBackward(x.data(), wmap.data(), alpha.data(), aux.data(), dCoef.data(), dx.data(), dWmap.data(),
                       dBias.data(), dAlpha.data(), T, C, N, iterations);
  const float *dX = uploadF32(x), *dDCoef = uploadF32(dCoef);
  const bf16 *dWmapIn = uploadBf16(wmap), *dBiasIn = uploadBf16(bias), *dAlphaIn = uploadBf16(alpha);
  const int64_t auxFloats = T * (K + 1) + cuda::mhcCoeffsAuxExtra(T, N);
  float *wide = allocate<float>(cuda::mhcCoeffsWideScratch(T, C, N));
  float *scratch = allocate<float>(cuda::mhcCoeffsBackwardScratch(T, N));
  // [run]: coef, dx, dWmap, dBias, dAlpha; run 2 splits the backward into B then W.
  std::vector<float> got[3][5];
  for (int run = 0; run < 3; ++run) {
    float *gCoef = allocate<float>(T * K), *gAux = allocate<float>(auxFloats);
    float *stash = allocate<float>(cuda::mhcCoeffsBackwardStash(T, N));
    float *gDx = uploadF32(dx0), *gWmap = uploadF32(std::vector<float>(W * K)), *gBias = uploadF32(std::vector<float>(K));
    float *gAlpha = uploadF32(std::vector<float>(3));
    cuda::mhcCoeffsForward(*kernels_, *gemms_, dX, dWmapIn, dBiasIn, dAlphaIn, gCoef, gAux, T, C, N, nullptr, wide);
    const float *gAuxIn = gAux;
    auto backward = [&](cuda::GradParts parts) {
      cuda::mhcCoeffsBackward(*kernels_, *gemms_, dX, dWmapIn, dAlphaIn, gAuxIn, dDCoef, gDx, gWmap, gBias, gAlpha,
                              stash, scratch, T, C, N, parts, nullptr, nullptr, wide);
    };
    if (run < 2) {
      backward({true, true});
    } else {
      backward({true, false});
      backward({false, true});
    }
    noErrors("mhc coefficients, an fp32 stream");
    got[run][0] = downloadF32(gCoef, T * K);
    got[run][1] = downloadF32(gDx, T * W);
    got[run][2] = downloadF32(gWmap, W * K);
    got[run][3] = downloadF32(gBias, K);
    got[run][4] = downloadF32(gAlpha, 3);
  }
  const std::vector<float> *want[5] = {&coef, &dx, &dWmap, &dBias, &dAlpha};
  const char *names[5] = {"coefficients", "dx", "dWmap", "dBias", "dAlpha"};
  // The forward: fp32 throughout (SGEMM's order against the CPU's). The
  // backward's products read dp as the Sinkhorn backward stores it (bf16).
  const double tolerance[5] = {1e-4, 1e-2, 1e-2, 1e-3, 1e-3};
  for (int i = 0; i < 5; ++i) {
    EXPECT_LT(relativeError(got[0][i], *want[i]), tolerance[i]) << names[i];
    EXPECT_TRUE(sameBits(got[0][i], got[1][i])) << names[i] << " differs between two runs";
    EXPECT_TRUE(sameBits(got[0][i], got[2][i])) << names[i] << ": B then W differs from one backward";
  }
  double largest = 0;
  for (int64_t i = 0; i < T * W; ++i)
    largest = std::max(largest, double(std::abs(got[0][1][i] - dx0[i])));
  EXPECT_GT(largest, 1e-3) << "the coefficients' input gradient is too small to test";
}

} // namespace
} // namespace mhcc::runtime

int main(int argc, char **argv) {
  return mhcc::runtime::runModelKernelTests(argc, argv, "a bf16 model's artifact with residual_dtype f32");
}
