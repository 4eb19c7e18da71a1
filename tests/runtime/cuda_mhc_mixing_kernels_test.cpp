// The mHC mixing kernels of a bf16 image at its n (the artifact given on
// the command line: tiny_bf16 at n = 2, 4 or 8): the coefficient
// projection's input gradient on tensor cores against its definition
// computed on the host (the K-term sums in double, then the two roundings:
// they may differ only where a sum lies within an fp32 rounding of a bf16
// tie), the one-pass pre and post/res backwards against the CPU kernels, the
// one-kernel forward entry (projection, squares, coefficients, pre-mix)
// against its definition and its unfused parts, and with the post-res mix
// before it (one block a tile, and over clusters of blocks) bit for bit
// against the two kernels; the backward's mixing in three passes (n <= 4)
// bit for bit against the three kernels it replaces; every GPU result
// bit-identical when run twice. Skips cleanly where no GPU is visible
// (ModelKernelsTest.h).
#include "runtime/cpu/Bf16.h"
#include "runtime/cpu/Kernels.h"
#include "runtime/cuda/DeviceKernels.h"
#include "tests/runtime/ModelKernelsTest.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

namespace mhcc::runtime {
namespace {

namespace k = kernels;
using cuda::bf16;

// 100 tokens: a partial warp tile; C = 64: one column tile of the backward's passes.
constexpr int64_t T = 100, C = 64;

class CudaMhcMixingKernels : public ModelKernelsTest {
protected:
  CudaMhcMixingKernels() : ModelKernelsTest(2, 0, 0) {}
  void SetUp() override {
    ModelKernelsTest::SetUp();
    if (!IsSkipped() && !HasFatalFailure()) {
      N = streams();
      K = N * N + 2 * N;
    }
  }

  /// Normal values rounded to bf16 (so the host copy is exactly what the GPU holds).
  std::vector<float> random(size_t count, float scale = 1.0f) { return normalValues(rng_, count, scale, true); }
  /// The backward's three passes take n <= kMixMaxStreams; wider models run the three kernels.
  bool threePasses() const { return N <= cuda::kMixMaxStreams; }
  void checkFusedForward(int64_t T, int64_t C);
  void checkPostResEntry(int64_t T, int64_t C);
  void checkMixBackward(int64_t T, int64_t C, int freshDy);
  void checkPassABefore(int64_t T, int64_t C);

  int64_t N = 0, K = 0; // the image's streams and coefficients a token
  std::mt19937 rng_{7};
};

/// Elements of `got` that differ from `want`, each by at most 2 units in
/// the last place of a bf16 (else a test failure naming it).
int64_t neighbouringDifferences(const std::vector<float> &got, const std::vector<float> &want, const char *what) {
  int64_t differing = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i])
      continue;
    if (++differing > 20)
      continue; // enough named
    const float ulp = std::ldexp(1.0f, std::ilogb(std::max(std::abs(want[i]), 1e-30f)) - 7);
    EXPECT_LE(std::abs(got[i] - want[i]), 2 * ulp) << what << ": element " << i;
  }
  return differing;
}

TEST_F(CudaMhcMixingKernels, CoefficientInputGradientMatchesItsDefinition) {
  const int64_t W = N * C;
  auto x = random(T * W), wmap = random(W * K, 0.05f), bias = random(K, 0.3f), dx0 = random(T * W, 0.1f);
  auto alpha = random(3), dCoef = random(T * K);
  bf16 *dX = uploadBf16(x), *dWmap = uploadBf16(wmap), *dBias = uploadBf16(bias), *dAlpha = uploadBf16(alpha);
  float *coef = allocate<float>(T * K), *aux = allocate<float>(T * (K + 1) + cuda::mhcCoeffsAuxExtra(T, N));
  cuda::mhcCoeffsForward(*kernels_, *gemms_, dX, dWmap, dBias, dAlpha, coef, aux, T, C, N, nullptr);
  float *dDCoef = uploadF32(dCoef);
  float *stash = allocate<float>(cuda::mhcCoeffsBackwardStash(T, N));
  float *scratch = allocate<float>(cuda::mhcCoeffsBackwardScratch(T, N));
  std::vector<float> fused[2];
  for (auto &run : fused) {
    bf16 *dx = uploadBf16(dx0);
    cudaMemset(stash, 0, cuda::mhcCoeffsBackwardStash(T, N) * 4);
    cuda::mhcCoeffsBackward(*kernels_, *gemms_, dX, dWmap, dAlpha, aux, dDCoef, dx, nullptr, nullptr, nullptr, stash,
                            scratch, T, C, N, cuda::GradParts{true, false}, nullptr);
    noErrors("mhc coeffs backward (inputs)");
    run = downloadBf16(dx, T * W);
  }
  EXPECT_EQ(std::memcmp(fused[0].data(), fused[1].data(), fused[0].size() * 4), 0) << "differs between two runs";
  // The definition on the host from the same dp (the stash, after dh) and RMS
  // scale (scratch's first T floats): the K-term sum in double, then the two
  // roundings. Only sums within an fp32 rounding of a bf16 tie may differ.
  const bf16 *dp = reinterpret_cast<const bf16 *>(stash + T * K);
  const std::vector<float> hostDp = downloadBf16(dp, T * K), scale = downloadF32(scratch, T);
  std::vector<float> defined(T * W);
  double productScale = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < W; ++j) {
      double product = 0;
      for (int64_t m = 0; m < K; ++m)
        product += double(hostDp[t * K + m]) * wmap[j * K + m];
      productScale = std::max(productScale, std::abs(product));
      const float first = roundToBf16(dx0[t * W + j] + float(product));
      defined[t * W + j] = roundToBf16(first + scale[t] * x[t * W + j]);
    }
  ASSERT_GT(productScale, 1e-2) << "the products are too small to test";
  const int64_t differing = neighbouringDifferences(fused[0], defined, "against the definition");
  EXPECT_LT(differing, T * W / 200) << differing << " of " << T * W << " elements differ from the definition";
  // The composition it replaced (cuBLASLt's product into dx, then the row
  // scale), for the record only: measured on an H200, a fifth of its
  // elements differ from the definition, some by 8 units in the last place
  // (cuBLASLt's bf16 output with beta = 1 does not round dx + product once).
  bf16 *dx = uploadBf16(dx0);
  cuda::matmulTransBAcc(*gemms_, dp, dWmap, dx, T, K, W);
  kernels_->launch(cuda::ModelKernel::RowScaleAdd, 64, 1, 256, nullptr, static_cast<const bf16 *>(dX),
                   static_cast<const float *>(scratch), dx, T, W);
  noErrors("product then row scale");
  const std::vector<float> composed = downloadBf16(dx, T * W);
  int64_t composedDiffering = 0;
  for (int64_t i = 0; i < T * W; ++i)
    composedDiffering += composed[i] != defined[i];
  std::printf("input gradient: %lld of %lld elements differ from the definition, cuBLASLt + row scale %lld\n",
              (long long)differing, (long long)(T * W), (long long)composedDiffering);
}

TEST_F(CudaMhcMixingKernels, OnePassPreAndPostResBackwards) {
  const int64_t W = N * C;
  auto x = random(T * W), y = random(T * C), du = random(T * C), dOut = random(T * W), dx0 = random(T * W, 0.1f);
  auto dy0 = random(T * C, 0.1f), dc0 = random(T * K, 0.1f);
  std::vector<float> coef(T * K);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (float &c : coef)
    c = unit(rng_);
  bf16 *dX = uploadBf16(x), *dY = uploadBf16(y), *dDu = uploadBf16(du), *dDOut = uploadBf16(dOut);
  float *dCoefIn = uploadF32(coef);
  // CPU twins in fp32 on the same (bf16) values; the GPU rounds its outputs once.
  std::vector<float> preDx = dx0, preDc = dc0, postDx = dx0, postDc = dc0, postDy = dy0;
  k::mhcPreBackward(x.data(), coef.data(), du.data(), preDx.data(), preDc.data(), T, C, N);
  k::mhcPostResBackward(x.data(), coef.data(), y.data(), dOut.data(), postDx.data(), postDc.data(), postDy.data(), T, C,
                        N);
  std::vector<float> runs[2][5];
  for (auto &run : runs) {
    bf16 *dx = uploadBf16(dx0), *dx2 = uploadBf16(dx0), *dy = uploadBf16(dy0);
    float *dc = uploadF32(dc0), *dc2 = uploadF32(dc0);
    cuda::mhcPreBackward(*kernels_, dX, dCoefIn, dDu, dx, dc, T, C, N, nullptr);
    cuda::mhcPostResBackward(*kernels_, dX, dCoefIn, dY, dDOut, dx2, dc2, dy, 0, T, C, N, nullptr);
    noErrors("mhc pre and post/res backward");
    run[0] = downloadBf16(dx, T * W);
    run[1] = downloadF32(dc, T * K);
    run[2] = downloadBf16(dx2, T * W);
    run[3] = downloadF32(dc2, T * K);
    run[4] = downloadBf16(dy, T * C);
  }
  const std::vector<float> *want[5] = {&preDx, &preDc, &postDx, &postDc, &postDy};
  const char *names[5] = {"pre dx", "pre dCoef", "post/res dx", "post/res dCoef", "post/res dy"};
  for (int i = 0; i < 5; ++i) {
    // bf16 outputs: one rounding (2^-9 relative); the dots: fp32 sums of bf16 products.
    EXPECT_LT(relativeError(runs[0][i], *want[i]), 1e-2) << names[i];
    EXPECT_EQ(std::memcmp(runs[0][i].data(), runs[1][i].data(), runs[0][i].size() * 4), 0)
        << names[i] << " differs between two runs";
  }
}

/// The backward's mixing in three passes (MhcBackwardKernels.cu) against
/// the three kernels it replaces, run as the CUDA rank runs them (dx and
/// dCoef fresh at the post/res backward; dy fresh or not): dx, dy and
/// dCoef's pre and res entries bit for bit, its post entries (pass A sums
/// them in tile order) within fp32 rounding, and the same on rerun; pass C
/// then runs on the kernels' dCoef, so that dx, dh and dp compare bit for bit.
void CudaMhcMixingKernels::checkMixBackward(int64_t T, int64_t C, int freshDy) {
  SCOPED_TRACE("T " + std::to_string(T) + ", C " + std::to_string(C) + ", fresh dy " + std::to_string(freshDy));
  const int64_t W = N * C, auxFloats = T * (K + 1) + cuda::mhcCoeffsAuxExtra(T, N);
  const int64_t stashFloats = cuda::mhcCoeffsBackwardStash(T, N), scratchFloats = cuda::mhcCoeffsBackwardScratch(T, N);
  auto x = random(T * W), wmap = random(W * K, 0.05f), bias = random(K, 0.3f), alpha = random(3);
  auto y = random(T * C), du = random(T * C), dOut = random(T * W), dy0 = random(T * C, 0.1f);
  bf16 *dX = uploadBf16(x), *dWmap = uploadBf16(wmap), *dBias = uploadBf16(bias), *dAlpha = uploadBf16(alpha);
  bf16 *dY = uploadBf16(y), *dDu = uploadBf16(du), *dDOut = uploadBf16(dOut);
  float *coef = allocate<float>(T * K), *aux = allocate<float>(auxFloats);
  cuda::mhcCoeffsForward(*kernels_, *gemms_, static_cast<const bf16 *>(dX), static_cast<const bf16 *>(dWmap),
                         static_cast<const bf16 *>(dBias), static_cast<const bf16 *>(dAlpha), coef, aux, T, C, N,
                         nullptr);
  ASSERT_TRUE(cuda::mhcMixBackwardApplies(C, N, {dX, dY, dDu, dDOut, dWmap}));
  const int fresh = 1 | 2 | freshDy;
  // [path][run]: dx, dCoef, dy, stash (dh, dp)
  std::vector<float> got[2][2][4];
  for (int path = 0; path < 2; ++path)
    for (int run = 0; run < 2; ++run) {
      bf16 *dx = allocate<bf16>(T * W), *dy = uploadBf16(dy0);
      float *dCoef = allocate<float>(T * K), *stash = allocate<float>(stashFloats);
      float *scratch = allocate<float>(scratchFloats);
      cudaMemset(dx, 0xff, T * W * 2); // NaNs: what a fresh gradient may hold
      cudaMemset(dCoef, 0xff, T * K * 4);
      if (freshDy)
        cudaMemset(dy, 0xff, T * C * 2);
      const cuda::GradParts inputs{true, false};
      if (path == 0) { // the three kernels
        cuda::mhcPostResBackward(*kernels_, static_cast<const bf16 *>(dX), static_cast<const float *>(coef),
                                 static_cast<const bf16 *>(dY), static_cast<const bf16 *>(dDOut), dx, dCoef, dy,
                                 fresh, T, C, N, nullptr);
        cuda::mhcPreBackward(*kernels_, static_cast<const bf16 *>(dX), static_cast<const float *>(coef),
                             static_cast<const bf16 *>(dDu), dx, dCoef, T, C, N, nullptr);
        cuda::mhcCoeffsBackward(*kernels_, *gemms_, static_cast<const bf16 *>(dX),
                                static_cast<const bf16 *>(dWmap), static_cast<const bf16 *>(dAlpha), aux, dCoef, dx,
                                nullptr, nullptr, nullptr, stash, scratch, T, C, N, inputs, nullptr);
      } else { // passes A, B and C
        cuda::mhcPostBackward(*kernels_, coef, dY, dDOut, dCoef, dy, fresh, T, C, nullptr);
        cuda::mhcMixBackwardDots(*kernels_, dX, dDOut, dDu, dCoef, nullptr, T, C, nullptr);
        // Pass C on the kernels' dCoef (post entries in lane order): dx, dh, dp comparable bit for bit.
        got[path][run][1] = downloadF32(dCoef, T * K);
        cudaMemcpy(dCoef, got[0][0][1].data(), T * K * 4, cudaMemcpyHostToDevice);
        const cuda::MixBackwardTerms mix{coef, dDOut, dDu};
        cuda::mhcCoeffsBackward(*kernels_, *gemms_, static_cast<const bf16 *>(dX),
                                static_cast<const bf16 *>(dWmap), static_cast<const bf16 *>(dAlpha), aux, dCoef, dx,
                                nullptr, nullptr, nullptr, stash, scratch, T, C, N, inputs, nullptr, &mix);
      }
      noErrors(path == 0 ? "the three kernels" : "the three passes");
      got[path][run][0] = downloadBf16(dx, T * W);
      if (path == 0)
        got[path][run][1] = downloadF32(dCoef, T * K);
      got[path][run][2] = downloadBf16(dy, T * C);
      got[path][run][3] = downloadF32(stash, stashFloats);
    }
  const char *names[4] = {"dx", "dCoef", "dy", "dh and dp"};
  // dCoef's post entries: tile order in pass A, lane order in the kernel.
  auto postEntry = [&](int v, size_t i) { return v == 1 && int64_t(i % K) >= N && int64_t(i % K) < 2 * N; };
  std::vector<float> postKernels, postPasses;
  for (int v = 0; v < 4; ++v) {
    const size_t bytes = got[0][0][v].size() * 4;
    EXPECT_EQ(std::memcmp(got[0][0][v].data(), got[0][1][v].data(), bytes), 0) << names[v] << ": kernels, rerun";
    EXPECT_EQ(std::memcmp(got[1][0][v].data(), got[1][1][v].data(), bytes), 0) << names[v] << ": passes, rerun";
    int64_t differing = 0, first = -1;
    for (size_t i = 0; i < got[0][0][v].size(); ++i) {
      if (postEntry(v, i)) {
        postKernels.push_back(got[0][0][v][i]);
        postPasses.push_back(got[1][0][v][i]);
      } else if (std::memcmp(&got[0][0][v][i], &got[1][0][v][i], 4) != 0 && differing++ == 0) {
        first = int64_t(i);
      }
    }
    EXPECT_EQ(differing, 0) << names[v] << ": the passes differ from the kernels at " << differing
                            << " elements, first " << first;
  }
  EXPECT_LT(relativeError(postPasses, postKernels), 1e-5) << "dCoef's post entries";
  // Not vacuous: dx holds all three terms (the RMS term's scale is nonzero).
  double largest = 0;
  for (float v : got[1][0][0])
    largest = std::max(largest, double(std::abs(v)));
  EXPECT_GT(largest, 1e-2) << "dx is too small to test";
}

/// Pass C of a sublayer doing pass A of the sublayer before (whose output
/// gradient its dx is), then that sublayer's pass B summing the post
/// partials, against pass C, pass A and pass B apart: dx, dy and dCoef bit
/// for bit (both sum the post dots in tile order: a stage's first sublayer,
/// whose pass A runs apart, must agree with the others for pipeline
/// layouts to agree), every output written (NaN-filled before), the same
/// bits on rerun.
void CudaMhcMixingKernels::checkPassABefore(int64_t T, int64_t C) {
  SCOPED_TRACE("T " + std::to_string(T) + ", C " + std::to_string(C));
  const int64_t W = N * C, auxFloats = T * (K + 1) + cuda::mhcCoeffsAuxExtra(T, N);
  const int64_t stashFloats = cuda::mhcCoeffsBackwardStash(T, N), scratchFloats = cuda::mhcCoeffsBackwardScratch(T, N);
  // This sublayer: x, wmap, its coefficients' gradient, dOut and du.
  auto x = random(T * W), wmap = random(W * K, 0.05f), bias = random(K, 0.3f), alpha = random(3);
  auto dCoefNext = random(T * K, 0.1f), du = random(T * C), dOut = random(T * W);
  // The sublayer before: its coefficients, y, x and du.
  auto coefBefore = random(T * K, 0.5f), yBefore = random(T * C), xBefore = random(T * W), duBefore = random(T * C);
  bf16 *dX = uploadBf16(x), *dWmap = uploadBf16(wmap), *dBias = uploadBf16(bias), *dAlpha = uploadBf16(alpha);
  bf16 *dDu = uploadBf16(du), *dDOut = uploadBf16(dOut), *dYBefore = uploadBf16(yBefore);
  bf16 *dXBefore = uploadBf16(xBefore), *dDuBefore = uploadBf16(duBefore);
  float *dDCoefNext = uploadF32(dCoefNext), *dCoefBefore = uploadF32(coefBefore);
  float *coef = allocate<float>(T * K), *aux = allocate<float>(auxFloats);
  cuda::mhcCoeffsForward(*kernels_, *gemms_, static_cast<const bf16 *>(dX), static_cast<const bf16 *>(dWmap),
                         static_cast<const bf16 *>(dBias), static_cast<const bf16 *>(dAlpha), coef, aux, T, C, N,
                         nullptr);
  ASSERT_TRUE(cuda::mhcMixBackwardApplies(C, N, {dX, dDu, dDOut, dWmap, dYBefore, dXBefore, dDuBefore}));
  // [path][run]: dx, dy before, dCoef before
  std::vector<float> got[2][2][3];
  for (int path = 0; path < 2; ++path)
    for (int run = 0; run < 2; ++run) {
      bf16 *dx = allocate<bf16>(T * W), *dy = allocate<bf16>(T * C);
      float *dCoef = allocate<float>(T * K), *stash = allocate<float>(stashFloats);
      float *scratch = allocate<float>(scratchFloats);
      float *partials = allocate<float>(cuda::mhcPostPartialsCount(T, C, N));
      cudaMemset(dx, 0xff, T * W * 2); // NaNs: what fresh gradients may hold
      cudaMemset(dy, 0xff, T * C * 2);
      cudaMemset(dCoef, 0xff, T * K * 4);
      cuda::MixBackwardTerms mix{coef, dDOut, dDu};
      if (path == 1)
        mix = {coef, dDOut, dDu, dCoefBefore, dYBefore, dy, partials};
      const cuda::GradParts inputs{true, false};
      cuda::mhcCoeffsBackward(*kernels_, *gemms_, static_cast<const bf16 *>(dX), static_cast<const bf16 *>(dWmap),
                              static_cast<const bf16 *>(dAlpha), aux, dDCoefNext, dx, nullptr, nullptr, nullptr,
                              stash, scratch, T, C, N, inputs, nullptr, &mix);
      if (path == 0) // pass A apart, on the dx just written
        cuda::mhcPostBackward(*kernels_, dCoefBefore, dYBefore, dx, dCoef, dy, 1 | 2 | 4, T, C, nullptr);
      cuda::mhcMixBackwardDots(*kernels_, dXBefore, dx, dDuBefore, dCoef, path == 1 ? partials : nullptr, T, C,
                               nullptr);
      noErrors(path == 0 ? "pass C, then pass A and B" : "pass C with pass A, then pass B");
      got[path][run][0] = downloadBf16(dx, T * W);
      got[path][run][1] = downloadBf16(dy, T * C);
      got[path][run][2] = downloadF32(dCoef, T * K);
    }
  const char *names[3] = {"dx", "dy before", "dCoef before"};
  for (int v = 0; v < 3; ++v) {
    const size_t bytes = got[0][0][v].size() * 4;
    EXPECT_EQ(std::memcmp(got[1][0][v].data(), got[1][1][v].data(), bytes), 0) << names[v] << ": joined, rerun";
  }
  for (int v = 0; v < 3; ++v) {
    int64_t differing = 0, first = -1;
    for (size_t i = 0; i < got[0][0][v].size(); ++i)
      if (std::memcmp(&got[0][0][v][i], &got[1][0][v][i], 4) != 0 && differing++ == 0)
        first = int64_t(i);
    EXPECT_EQ(differing, 0) << names[v] << ": the joined pass differs from pass A apart at " << differing
                            << " elements, first " << first;
  }
  double largest = 0; // not vacuous: the post entries (written by pass B from the partials)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = N; e < 2 * N; ++e)
      largest = std::max(largest, double(std::abs(got[1][0][2][t * K + e])));
  EXPECT_GT(largest, 1e-2) << "the post entries are too small to test";
}

TEST_F(CudaMhcMixingKernels, PassCDoesPassAOfTheSublayerBefore) {
  if (!threePasses())
    GTEST_SKIP() << "n = " << N << ": the backward runs the three kernels (its passes take n <= 4)";
  checkPassABefore(T, C);     // a partial token tile, one column tile
  checkPassABefore(40, 1024); // sixteen column tiles
}

TEST_F(CudaMhcMixingKernels, BackwardMixingInThreePassesGivesTheSameBits) {
  if (!threePasses())
    GTEST_SKIP() << "n = " << N << ": the backward runs the three kernels (its passes take n <= 4)";
  checkMixBackward(T, C, 0);  // a partial token tile, one column tile
  checkMixBackward(T, C, 4);  // dy fresh too
  checkMixBackward(40, 1024, 0);
}

/// mhcCoeffsPreForward at T tokens of width N C: p and the row squares
/// against their definitions (sums in double; fp32 accumulation error only),
/// the coefficients and u bit for bit what mhcc_mhc_coeffs_forward and
/// mhcc_mhc_pre_forward make of that p and those squares, and close to the
/// unfused path's (cuBLASLt's projection, mhcc_row_squares).
void CudaMhcMixingKernels::checkFusedForward(int64_t T, int64_t C) {
  SCOPED_TRACE("T " + std::to_string(T) + ", C " + std::to_string(C));
  const int64_t W = N * C, auxFloats = T * (K + 1) + cuda::mhcCoeffsAuxExtra(T, N);
  ASSERT_TRUE(cuda::mhcFusedForwardApplies(C, N));
  auto x = random(T * W), wmap = random(W * K, 0.05f), bias = random(K, 0.3f);
  auto alpha = random(3);
  bf16 *dX = uploadBf16(x), *dWmap = uploadBf16(wmap), *dBias = uploadBf16(bias);
  bf16 *dAlpha = uploadBf16(alpha);
  std::vector<float> coef[2], aux[2], u[2];
  float *dCoef = allocate<float>(T * K), *dAux = allocate<float>(auxFloats);
  bf16 *dU = allocate<bf16>(T * C);
  for (int run = 0; run < 2; ++run) {
    cudaMemset(dCoef, 0xff, T * K * 4); // NaNs: every output must be written
    cudaMemset(dAux, 0xff, auxFloats * 4);
    cudaMemset(dU, 0xff, T * C * 2);
    cuda::mhcCoeffsPreForward(*kernels_, dX, dWmap, dBias, dAlpha, dCoef, dAux, dU, T, C, N, nullptr);
    noErrors("fused forward");
    coef[run] = downloadF32(dCoef, T * K);
    aux[run] = downloadF32(dAux, auxFloats);
    u[run] = downloadBf16(dU, T * C);
  }
  EXPECT_EQ(std::memcmp(coef[0].data(), coef[1].data(), coef[0].size() * 4), 0) << "coef differs between two runs";
  EXPECT_EQ(std::memcmp(aux[0].data(), aux[1].data(), aux[0].size() * 4), 0) << "aux differs between two runs";
  EXPECT_EQ(std::memcmp(u[0].data(), u[1].data(), u[0].size() * 4), 0) << "u differs between two runs";
  const float *p = aux[0].data() + T * (K + 1), *squares = p + T * K;
  int64_t badP = 0, badSquares = 0;
  for (int64_t t = 0; t < T; ++t) {
    double square = 0;
    for (int64_t j = 0; j < W; ++j)
      square += double(x[t * W + j]) * x[t * W + j];
    badSquares += !(std::abs(squares[t] - square) <= 1e-5 * square);
    for (int64_t m = 0; m < K; ++m) {
      double sum = 0, magnitude = 0;
      for (int64_t j = 0; j < W; ++j) {
        sum += double(x[t * W + j]) * wmap[j * K + m];
        magnitude += std::abs(double(x[t * W + j]) * wmap[j * K + m]);
      }
      if (!(std::abs(p[t * K + m] - sum) <= 1e-5 * magnitude) && ++badP <= 10)
        ADD_FAILURE() << "p[" << t << ", " << m << "] = " << p[t * K + m] << ", defined " << sum;
    }
  }
  EXPECT_EQ(badP, 0) << "of " << T * K << " projections";
  EXPECT_EQ(badSquares, 0) << "of " << T << " row squares";
  // The coefficient kernel and the pre-mix on the fused p and squares.
  float *dP = uploadF32(std::vector<float>(p, p + T * K)), *dSquares = uploadF32(std::vector<float>(squares, squares + T));
  float *coefParts = allocate<float>(T * K), *auxParts = allocate<float>(T * (K + 1));
  cuda::mhcCoeffsFromProjection(*kernels_, static_cast<const float *>(dSquares), static_cast<const float *>(dP),
                                static_cast<const bf16 *>(dBias), static_cast<const bf16 *>(dAlpha), coefParts,
                                auxParts, T, C, N, nullptr);
  bf16 *uParts = allocate<bf16>(T * C);
  cuda::mhcPreForward(*kernels_, dX, static_cast<const float *>(dCoef), uParts, T, C, N, nullptr);
  noErrors("coefficients and pre-mix on the fused p");
  EXPECT_EQ(std::memcmp(downloadF32(coefParts, T * K).data(), coef[0].data(), T * K * 4), 0)
      << "coef is not mhcc_mhc_coeffs_forward's of the fused p and squares";
  EXPECT_EQ(std::memcmp(downloadF32(auxParts, T * (K + 1)).data(), aux[0].data(), T * (K + 1) * 4), 0)
      << "h, r are not mhcc_mhc_coeffs_forward's of the fused p and squares";
  EXPECT_EQ(std::memcmp(downloadBf16(uParts, T * C).data(), u[0].data(), T * C * 4), 0)
      << "u is not mhcc_mhc_pre_forward's of the fused coefficients";
  // The unfused path: the same values up to the sums' order.
  float *coefUnfused = allocate<float>(T * K), *auxUnfused = allocate<float>(auxFloats);
  cuda::mhcCoeffsForward(*kernels_, *gemms_, dX, dWmap, dBias, dAlpha, coefUnfused, auxUnfused, T, C, N,
                         nullptr);
  cuda::mhcPreForward(*kernels_, dX, static_cast<const float *>(coefUnfused), uParts, T, C, N, nullptr);
  noErrors("unfused forward");
  EXPECT_LT(relativeError(coef[0], downloadF32(coefUnfused, T * K)), 1e-4);
  EXPECT_LT(relativeError(u[0], downloadBf16(uParts, T * C)), 1e-2);
}

TEST_F(CudaMhcMixingKernels, OneKernelForwardEntryMatchesItsParts) {
  checkFusedForward(T, C);     // a partial token tile; at n <= 4 some warps take no columns
  checkFusedForward(40, 1024); // several steps a warp
}

/// mhcPostResCoeffsPreForward at T tokens of width N C: x', the
/// coefficients, aux and u bit for bit what mhcPostResForward and then
/// mhcCoeffsPreForward write, every output written (NaN-filled before), the
/// same bits when run twice, and from the cluster kernel where it applies.
void CudaMhcMixingKernels::checkPostResEntry(int64_t T, int64_t C) {
  SCOPED_TRACE("T " + std::to_string(T) + ", C " + std::to_string(C));
  const int64_t W = N * C, auxFloats = T * (K + 1) + cuda::mhcCoeffsAuxExtra(T, N);
  auto xPrev = random(T * W), coefPrev = random(T * K, 0.5f), y = random(T * C);
  auto wmap = random(W * K, 0.05f), bias = random(K, 0.3f), alpha = random(3);
  bf16 *dXPrev = uploadBf16(xPrev), *dY = uploadBf16(y), *dWmap = uploadBf16(wmap), *dBias = uploadBf16(bias);
  bf16 *dAlpha = uploadBf16(alpha);
  float *dCoefPrev = uploadF32(coefPrev);
  // [0]: the two kernels; [1], [2]: the fused kernel twice; [3]: its cluster form.
  const bool cluster = cuda::mhcClusterForwardApplies(C, N);
  EXPECT_TRUE(kernels_->clusterForwardReady()) << "the cluster kernel's shared memory was refused at load";
  const int runs = cluster ? 4 : 3;
  std::vector<float> x[4], coef[4], aux[4], u[4];
  bf16 *dX = allocate<bf16>(T * W), *dU = allocate<bf16>(T * C);
  float *dCoef = allocate<float>(T * K), *dAux = allocate<float>(auxFloats);
  for (int run = 0; run < runs; ++run) {
    cudaMemset(dX, 0xff, T * W * 2); // NaNs: every output must be written
    cudaMemset(dU, 0xff, T * C * 2);
    cudaMemset(dCoef, 0xff, T * K * 4);
    cudaMemset(dAux, 0xff, auxFloats * 4);
    if (run == 0) {
      cuda::mhcPostResForward(*kernels_, static_cast<const bf16 *>(dXPrev), static_cast<const float *>(dCoefPrev),
                              static_cast<const bf16 *>(dY), dX, T, C, N, nullptr);
      cuda::mhcCoeffsPreForward(*kernels_, dX, dWmap, dBias, dAlpha, dCoef, dAux, dU, T, C, N, nullptr);
    } else {
      cuda::mhcPostResCoeffsPreForward(*kernels_, dXPrev, dCoefPrev, dY, dX, dWmap, dBias, dAlpha, dCoef, dAux, dU,
                                       T, C, N, nullptr, run == 3);
    }
    noErrors(run == 0   ? "post-res, then the entry"
             : run == 3 ? "the cluster kernel"
                        : "post-res and the entry in one kernel");
    x[run] = downloadBf16(dX, T * W);
    coef[run] = downloadF32(dCoef, T * K);
    aux[run] = downloadF32(dAux, auxFloats);
    u[run] = downloadBf16(dU, T * C);
  }
  for (int run = 1; run < runs; ++run) {
    SCOPED_TRACE(run == 1 ? "first fused run" : run == 2 ? "second fused run" : "the cluster kernel");
    EXPECT_EQ(std::memcmp(x[run].data(), x[0].data(), x[0].size() * 4), 0) << "x' is not the post-res kernel's";
    EXPECT_EQ(std::memcmp(coef[run].data(), coef[0].data(), coef[0].size() * 4), 0) << "coef differs";
    EXPECT_EQ(std::memcmp(aux[run].data(), aux[0].data(), aux[0].size() * 4), 0) << "aux differs";
    EXPECT_EQ(std::memcmp(u[run].data(), u[0].data(), u[0].size() * 4), 0) << "u differs";
  }
  // Not vacuous: x' is the mix, neither zero nor the previous stream.
  int64_t moved = 0;
  for (int64_t i = 0; i < T * W; ++i)
    moved += x[0][i] != xPrev[i] && std::isfinite(x[0][i]);
  EXPECT_GT(moved, T * W / 2) << "x' barely differs from the previous stream";
}

TEST_F(CudaMhcMixingKernels, OneKernelPostResAndEntryGivesItsPartsBits) {
  checkPostResEntry(T, C);      // a partial token tile
  checkPostResEntry(40, 1024);  // several steps a warp; the cluster kernel's half tile
  checkPostResEntry(100, 2048); // 1b's width; a last tile of 4 tokens (three blocks own none)
  EXPECT_FALSE(cuda::mhcClusterForwardApplies(C, N)) << "C = 64 is not a multiple of the walk's column step";
  // The cluster kernel at C = 1024 for every n it is built for (at n = 8
  // and C = 2048 a block's quarter of the tile outgrows its shared memory).
  EXPECT_TRUE(cuda::mhcClusterForwardApplies(1024, N));
  std::printf("n = %lld: the cluster kernel at C = 1024 %s, at C = 2048 %s\n", (long long)N,
              cuda::mhcClusterForwardApplies(1024, N) ? "yes" : "no",
              cuda::mhcClusterForwardApplies(2048, N) ? "yes" : "no");
}

} // namespace
} // namespace mhcc::runtime

int main(int argc, char **argv) {
  return mhcc::runtime::runModelKernelTests(argc, argv, "a bf16 model, any n");
}
