// The bf16 image's other kernels (the artifact given on the command line: a
// bf16 model, n = 4): RMSNorm's paths, the backwards into fresh gradients,
// AdamW's quads and singles, Gated DeltaNet against the CPU's bf16 path;
// every GPU result bit-identical when run twice. The mHC mixing kernels are
// cuda_mhc_mixing_kernels_test's, at n = 2, 4 and 8. Skips cleanly where no
// GPU is visible (ModelKernelsTest.h).
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
#include <functional>
#include <random>

namespace mhcc::runtime {
namespace {

namespace k = kernels;
using cuda::bf16;

class CudaBf16Kernels : public ModelKernelsTest {
protected:
  CudaBf16Kernels() : ModelKernelsTest(2, 4, 0) {}

  /// Normal values rounded to bf16 (so the host copy is exactly what the GPU holds).
  std::vector<float> random(size_t count, float scale = 1.0f) { return normalValues(rng_, count, scale, true); }
  std::mt19937 rng_{7};
};

// RMSNorm's forward takes three paths: a row of up to 2048 bf16 values
// resident in registers, longer rows streamed through shared memory, and
// element by element where a row or pointer is not 16-byte aligned. Each
// lane sums its elements c = lane + 32 k in order whatever the path, so the
// paths give the same bits: aligned (resident at C = 2048, streamed at 4096)
// against misaligned copies of the same rows (the element path); at C = 60
// (C % 8 != 0) both take the element path. All within an fp32 rounding of
// the CPU kernel before the output's rounding.
TEST_F(CudaBf16Kernels, RmsNormForwardPathsGiveTheSameBits) {
  for (int64_t width : {2048, 4096, 60}) {
    SCOPED_TRACE("C " + std::to_string(width));
    const int64_t rows = 70;
    auto u = random(rows * width), gain = random(width, 0.5f);
    std::vector<float> out[2], scale[2];
    for (int misaligned = 0; misaligned < 2; ++misaligned) {
      bf16 *dU = uploadBf16(u, misaligned), *dGain = uploadBf16(gain, misaligned);
      bf16 *dY = allocate<bf16>(rows * width + 1) + misaligned;
      float *aux = allocate<float>(rows);
      cuda::rmsNormForward(*kernels_, static_cast<const bf16 *>(dU), static_cast<const bf16 *>(dGain), dY, aux, rows,
                           width, 1e-6f, nullptr);
      noErrors("rms norm forward");
      out[misaligned] = downloadBf16(dY, rows * width);
      scale[misaligned] = downloadF32(aux, rows);
    }
    EXPECT_EQ(std::memcmp(scale[0].data(), scale[1].data(), rows * 4), 0) << "1/rms differs between the paths";
    EXPECT_EQ(std::memcmp(out[0].data(), out[1].data(), rows * width * 4), 0) << "y differs between the paths";
    std::vector<float> want(rows * width), wantScale(rows);
    k::rmsNormForward(u.data(), gain.data(), want.data(), wantScale.data(), rows, width, 1e-6);
    EXPECT_LT(relativeError(scale[0], wantScale), 1e-5);
    EXPECT_LT(relativeError(out[0], want), 1e-2); // one bf16 rounding
  }
}

// The RMSNorm backward into a fresh input gradient (never read: NaNs here)
// gives the bits of the add into a zero-filled one it replaces, on the
// vector path (C = 2048) and the element path (C = 60), and the add into a
// gradient that holds something still adds.
TEST_F(CudaBf16Kernels, RmsNormBackwardIntoAFreshGradientGivesTheBitsOfAnAddIntoZeros) {
  for (int64_t width : {2048, 60}) {
    SCOPED_TRACE("C " + std::to_string(width));
    const int64_t rows = 70;
    auto u = random(rows * width), gain = random(width, 0.5f), dy = random(rows * width), prior = random(rows * width);
    bf16 *dU = uploadBf16(u), *dGain = uploadBf16(gain), *dDy = uploadBf16(dy);
    float *aux = allocate<float>(rows);
    cuda::rmsNormForward(*kernels_, static_cast<const bf16 *>(dU), static_cast<const bf16 *>(dGain),
                         allocate<bf16>(rows * width), aux, rows, width, 1e-6f, nullptr);
    const cuda::GradParts inputs{true, false};
    auto run = [&](const std::vector<float> *start, bool fresh) {
      bf16 *du = start ? uploadBf16(*start) : allocate<bf16>(rows * width);
      if (!start)
        cudaMemset(du, fresh ? 0xff : 0, rows * width * 2);
      cuda::rmsNormBackward(*kernels_, static_cast<const bf16 *>(dU), static_cast<const bf16 *>(dGain), aux,
                            static_cast<const bf16 *>(dDy), du, nullptr, nullptr, rows, width, inputs, nullptr, fresh);
      noErrors("rms norm backward");
      return downloadBf16(du, rows * width);
    };
    const std::vector<float> fresh = run(nullptr, true), zeros = run(nullptr, false);
    EXPECT_EQ(std::memcmp(fresh.data(), zeros.data(), fresh.size() * 4), 0) << "fresh differs from adding into zeros";
    const std::vector<float> added = run(&prior, false);
    int64_t moved = 0;
    for (size_t i = 0; i < added.size(); ++i)
      moved += added[i] != fresh[i];
    EXPECT_GT(moved, int64_t(added.size()) / 2) << "adding into a gradient that holds something ignored it";
  }
}

// Attention's and SwiGLU's backwards into a fresh input gradient (NaNs
// here: never read) write it with their first product (beta = 0) and give
// the bits of the add into a zero-filled one they replace; adding into a
// gradient that holds something still adds. Attention on the flash path
// (head dim 64), SwiGLU with its two products into dx.
TEST_F(CudaBf16Kernels, AttentionAndSwigluBackwardsIntoAFreshGradientGiveTheBitsOfAnAddIntoZeros) {
  const int64_t rows = 128, width = 128, heads = 2, seq = 128, F = 192;
  const cuda::GradParts inputs{true, false};
  auto u = random(rows * width), dy = random(rows * width), prior = random(rows * width);
  bf16 *dU = uploadBf16(u), *dDy = uploadBf16(dy);
  // into(fill, start, run): dx NaN-filled (0xff) or zero-filled, or `start`.
  auto into = [&](int fill, const std::vector<float> *start, const std::function<void(bf16 *)> &run) {
    bf16 *dx = start ? uploadBf16(*start) : allocate<bf16>(rows * width);
    if (!start)
      cudaMemset(dx, fill, rows * width * 2);
    run(dx);
    return downloadBf16(dx, rows * width);
  };
  auto compare = [&](const char *what, const std::function<void(bf16 *, bool)> &backward) {
    SCOPED_TRACE(what);
    const std::vector<float> fresh = into(0xff, nullptr, [&](bf16 *dx) { backward(dx, true); });
    const std::vector<float> zeros = into(0, nullptr, [&](bf16 *dx) { backward(dx, false); });
    const std::vector<float> added = into(0, &prior, [&](bf16 *dx) { backward(dx, false); });
    noErrors(what);
    EXPECT_EQ(std::memcmp(fresh.data(), zeros.data(), fresh.size() * 4), 0) << "fresh differs from adding into zeros";
    int64_t moved = 0;
    for (size_t i = 0; i < added.size(); ++i)
      moved += added[i] != fresh[i];
    EXPECT_GT(moved, int64_t(added.size()) / 2) << "adding into a gradient that holds something ignored it";
  };

  bf16 *wqkv = uploadBf16(random(width * 3 * width, 0.05f)), *wo = uploadBf16(random(width * width, 0.05f));
  float *attnAux = allocate<float>(cuda::attentionAuxFloats(rows, width, heads, 2));
  ASSERT_EQ(cuda::attentionForward(*kernels_, *gemms_, static_cast<const bf16 *>(dU), static_cast<const bf16 *>(wqkv),
                                   static_cast<const bf16 *>(wo), allocate<bf16>(rows * width), attnAux,
                                   allocate<float>(cuda::attentionForwardScratch(rows, width, heads, seq, 2)), rows,
                                   width, width, heads, seq, cuda::DeviceDocuments{}, nullptr),
            "");
  float *attnStash = allocate<float>(cuda::attentionBackwardStash(rows, width));
  float *attnScratch = allocate<float>(cuda::attentionBackwardScratch(rows, width, heads, seq, 2));
  compare("attention", [&](bf16 *dx, bool fresh) {
    EXPECT_EQ(cuda::attentionBackward(*kernels_, *gemms_, static_cast<const bf16 *>(dU),
                                      static_cast<const bf16 *>(wqkv), static_cast<const bf16 *>(wo), attnAux,
                                      static_cast<const bf16 *>(dDy), dx, nullptr, nullptr, attnStash, attnScratch,
                                      rows, width, width, heads, seq, inputs, cuda::DeviceDocuments{}, nullptr,
                                      fresh),
              "");
  });

  bf16 *wg = uploadBf16(random(width * F, 0.1f)), *wu = uploadBf16(random(width * F, 0.1f)),
       *wd = uploadBf16(random(F * width, 0.1f));
  float *mlpAux = allocate<float>(cuda::swigluAuxFloats(rows, F, 2));
  cuda::swigluForward(*kernels_, *gemms_, static_cast<const bf16 *>(dU), static_cast<const bf16 *>(wg),
                      static_cast<const bf16 *>(wu), static_cast<const bf16 *>(wd), allocate<bf16>(rows * width),
                      mlpAux, rows, width, F, nullptr);
  float *mlpStash = allocate<float>(cuda::swigluBackwardStash(rows, F));
  float *mlpScratch = allocate<float>(cuda::swigluBackwardScratch(rows, F));
  compare("swiglu", [&](bf16 *dx, bool fresh) {
    cuda::swigluBackward(*kernels_, *gemms_, static_cast<const bf16 *>(dU), static_cast<const bf16 *>(wg),
                         static_cast<const bf16 *>(wu), static_cast<const bf16 *>(wd), mlpAux,
                         static_cast<const bf16 *>(dDy), dx, nullptr, nullptr, nullptr, mlpStash, mlpScratch, rows,
                         width, F, inputs, nullptr, fresh);
  });
}

// AdamW moves four parameters a thread where every array is 16-byte aligned
// and one otherwise (and at a count's tail): the same bits either way.
TEST_F(CudaBf16Kernels, AdamWQuadsAndSinglesGiveTheSameBits) {
  const int64_t count = 1001; // a tail of one past the quads
  auto w = random(count), g = random(count, 0.1f), m = random(count, 0.01f), v = random(count, 0.01f);
  for (float &x : v)
    x = std::abs(x);
  std::vector<float> results[2][4];
  for (int misaligned = 0; misaligned < 2; ++misaligned) {
    float *arrays[4];
    const std::vector<float> *hosts[4] = {&w, &g, &m, &v};
    for (int a = 0; a < 4; ++a)
      arrays[a] = uploadF32(*hosts[a], misaligned);
    bf16 *low = allocate<bf16>(count + 1) + misaligned;
    cuda::adamW(arrays[0], arrays[1], arrays[2], arrays[3], count, 1e-3f, 1.0f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.05f,
                0.1f, low, nullptr);
    noErrors("adamW");
    for (int a = 0; a < 4; ++a)
      results[misaligned][a] = a == 1 ? downloadBf16(low, count) : downloadF32(arrays[a], count);
  }
  const char *names[4] = {"w", "bf16 w", "m", "v"};
  for (int a = 0; a < 4; ++a)
    EXPECT_EQ(std::memcmp(results[0][a].data(), results[1][a].data(), count * 4), 0) << names[a] << " differs";
  EXPECT_GT(relativeError(results[0][0], w), 1e-6) << "the step moved nothing";
}

// Gated DeltaNet in bf16 (d = 128) against the CPU's bf16 path, which rounds
// at the same points (the projection p, the gate g and the normed output n;
// the inputs, weights and outputs are bf16). The GPU also rounds the gate
// logits' gradient, a GEMM operand, where the CPU keeps it in fp32; the
// products' and the recurrence's sums run in other orders. So: y and dx
// within 2e-2 of max |CPU|, every weight gradient within 2e-2; and the
// GPU's bits equal on rerun.
TEST_F(CudaBf16Kernels, GatedDeltaNetAgainstTheCpuBf16Path) {
  constexpr int64_t seq = 70, rows = 2 * seq, width = 256, heads = 2, d = width / heads;
  const auto x = random(rows * width), dy = random(rows * width);
  std::vector<std::vector<float>> w = {random(width * 3 * width, 0.1f), random(k::kGdnConvWidth * 3 * width, 0.3f),
                                       random(width * 2 * heads, 0.1f),  random(heads, 0.5f),
                                       random(heads, 1.0f),              random(d, 0.1f),
                                       random(width * width, 0.1f),      random(width * width, 0.1f)};
  for (float &v : w[5])
    v = roundToBf16(v + 1.0f);
  std::vector<float> aux(rows * k::gdnAuxPerRow(width, heads)), y(rows * width), dx(rows * width, 0.0f);
  std::vector<std::vector<float>> dw;
  for (const auto &v : w)
    dw.emplace_back(v.size(), 0.0f);
  k::gdnForward<float>(x.data(), w[0].data(), w[1].data(), w[2].data(), w[3].data(), w[4].data(), w[5].data(),
                       w[6].data(), w[7].data(), y.data(), aux.data(), rows, width, heads, seq, 1e-5, roundBf16);
  roundBf16(y.data(), rows * width);
  k::gdnBackward<float>(x.data(), w[0].data(), w[1].data(), w[2].data(), w[3].data(), w[4].data(), w[5].data(),
                        w[6].data(), w[7].data(), aux.data(), dy.data(),
                        k::GdnGrads<float>{dx.data(), dw[0].data(), dw[1].data(), dw[2].data(), dw[3].data(),
                                           dw[4].data(), dw[5].data(), dw[6].data(), dw[7].data()},
                        rows, width, heads, seq, roundBf16);
  roundBf16(dx.data(), rows * width);

  bf16 *dX = uploadBf16(x), *dDy = uploadBf16(dy);
  std::vector<bf16 *> dW;
  for (const auto &v : w)
    dW.push_back(uploadBf16(v));
  const cuda::GdnWeights<bf16> gw{dW[0], dW[1], dW[2], dW[3], dW[4], dW[5], dW[6], dW[7]};
  float *gpuAux = allocate<float>(cuda::gdnAuxFloats(rows, width, heads, seq));
  float *forwardScratch = allocate<float>(cuda::gdnForwardScratch(rows, width, heads, seq, 2));
  float *stash = allocate<float>(cuda::gdnBackwardStash(rows, width, heads, 2));
  float *backwardScratch = allocate<float>(cuda::gdnBackwardScratch(rows, width, heads, seq, 2));
  std::vector<std::vector<float>> runs[2];
  for (auto &run : runs) {
    bf16 *gy = allocate<bf16>(rows * width), *gdx = uploadBf16(std::vector<float>(rows * width, 0.0f));
    std::vector<float *> gdw;
    for (const auto &v : w)
      gdw.push_back(uploadF32(std::vector<float>(v.size(), 0.0f)));
    ASSERT_EQ(cuda::gdnForward<bf16>(*gemms_, dX, gw, gy, gpuAux, forwardScratch, rows, width, width, heads, seq, 1e-5,
                                     {}, nullptr),
              "");
    ASSERT_EQ(cuda::gdnBackward<bf16>(*gemms_, dX, gw, gpuAux, dDy, gdx,
                                      cuda::GdnWeightGrads{gdw[0], gdw[1], gdw[2], gdw[3], gdw[4], gdw[5], gdw[6],
                                                           gdw[7]},
                                      stash, backwardScratch, rows, width, width, heads, seq, {}, {}, nullptr),
              "");
    noErrors("gated delta net (bf16)");
    run.push_back(downloadBf16(gy, rows * width));
    run.push_back(downloadBf16(gdx, rows * width));
    for (size_t i = 0; i < w.size(); ++i)
      run.push_back(downloadF32(gdw[i], w[i].size()));
  }
  const char *names[] = {"y", "dx", "dWqkv", "dConv", "dWab", "dALog", "dDtBias", "dOutNorm", "dWgate", "dWo"};
  std::vector<const std::vector<float> *> cpu = {&y, &dx};
  for (const auto &g : dw)
    cpu.push_back(&g);
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double error = relativeError(runs[0][i], *cpu[i]);
    std::printf("gated delta net bf16, %s: relative error against the CPU %.2e\n", names[i], error);
    EXPECT_LT(error, 2e-2) << names[i];
    EXPECT_EQ(std::memcmp(runs[0][i].data(), runs[1][i].data(), runs[0][i].size() * 4), 0)
        << names[i] << " differs between two runs";
  }
}

} // namespace
} // namespace mhcc::runtime

int main(int argc, char **argv) {
  return mhcc::runtime::runModelKernelTests(argc, argv, "a bf16 model, n = 4");
}
