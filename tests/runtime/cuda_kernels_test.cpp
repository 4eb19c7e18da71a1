// Every CUDA kernel against its CPU twin on random data (fp32; relative
// error of the whole output under 1e-4, differences come from summation
// order only), and every GPU result bit-identical when run twice. The
// model kernels are the ones mhcc generated into the artifact given on the
// command line (n = 4, 20 Sinkhorn iterations). Skips cleanly where no GPU
// is visible.
#include "runtime/artifact/Artifact.h"
#include "runtime/cpu/Bf16.h"
#include "runtime/cpu/Kernels.h"
#include "runtime/cuda/DeviceKernels.h"
#include "runtime/train/ParamRemainders.h"
#include "tests/runtime/ModelKernelsTest.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <random>

namespace mhcc::runtime {
namespace {

namespace k = kernels;

class CudaKernels : public ModelKernelsTest {
protected:
  CudaKernels() : ModelKernelsTest(4, 4, 20) {}

  template <typename T> T *upload(const std::vector<T> &host) {
    T *p = allocate<T>(host.size());
    cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
    return p;
  }
  std::vector<float> download(const float *device, size_t count) {
    std::vector<float> host(count);
    cudaDeviceSynchronize();
    cudaMemcpy(host.data(), device, count * sizeof(float), cudaMemcpyDeviceToHost);
    return host;
  }
  std::vector<float> random(size_t count, float scale = 1.0f) { return normalValues(rng_, count, scale, false); }

  /// Runs `gpu` twice on fresh copies of `outputs` and compares with `cpu`.
  void check(const std::string &what, std::vector<std::vector<float>> outputs,
             const std::function<void(std::vector<std::vector<float>> &)> &cpu,
             const std::function<void(std::vector<float *> &)> &gpu) {
    std::vector<std::vector<float>> expected = outputs;
    cpu(expected);
    std::vector<std::vector<float>> runs[2];
    for (auto &run : runs) {
      std::vector<float *> device;
      for (auto &o : outputs)
        device.push_back(upload(o));
      gpu(device);
      ASSERT_EQ(kernels_->takeError(), "");
      ASSERT_EQ(cuda::lastError(what.c_str()), "");
      for (size_t i = 0; i < outputs.size(); ++i)
        run.push_back(download(device[i], outputs[i].size()));
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      double maxDiff = 0, maxRef = 0;
      for (size_t e = 0; e < expected[i].size(); ++e) {
        ASSERT_TRUE(std::isfinite(runs[0][i][e])) << what << " output " << i << "[" << e << "]";
        maxDiff = std::max(maxDiff, double(std::abs(runs[0][i][e] - expected[i][e])));
        maxRef = std::max(maxRef, double(std::abs(expected[i][e])));
      }
      EXPECT_LT(maxDiff / std::max(maxRef, 1e-30), 1e-4) << what << " output " << i;
      EXPECT_EQ(std::memcmp(runs[0][i].data(), runs[1][i].data(), runs[0][i].size() * 4), 0)
          << what << " output " << i << " differs between two runs";
    }
  }

  /// A backward with a zero-bubble split: check() with both parts in one
  /// call, then B (inputs) followed by W (weights) must give the same bits.
  void checkParts(const std::string &what, std::vector<std::vector<float>> outputs,
                  const std::function<void(std::vector<std::vector<float>> &)> &cpu,
                  const std::function<void(std::vector<float *> &, cuda::GradParts)> &gpu) {
    check(what, outputs, cpu, [&](std::vector<float *> &o) { gpu(o, cuda::GradParts{}); });
    std::vector<float *> both, split;
    for (auto &o : outputs) {
      both.push_back(upload(o));
      split.push_back(upload(o));
    }
    gpu(both, cuda::GradParts{});
    gpu(split, cuda::GradParts{true, false});
    gpu(split, cuda::GradParts{false, true});
    ASSERT_EQ(cuda::lastError(what.c_str()), "");
    for (size_t i = 0; i < outputs.size(); ++i)
      EXPECT_EQ(std::memcmp(download(both[i], outputs[i].size()).data(), download(split[i], outputs[i].size()).data(),
                            outputs[i].size() * 4),
                0)
          << what << " output " << i << ": B then W differs from the whole backward";
  }

  void checkAttention(int64_t rows, int64_t seq, int64_t width, int64_t heads, bool packed = false);
  void checkGatedDeltaNet(int64_t rows, int64_t seq, int64_t width, int64_t heads, bool packed);

  /// Per token, its RoPE position and its document's first key: documents
  /// of lengths 1, 8, 15, ... 36, 6, ..., restarting at each sequence.
  static std::pair<std::vector<int32_t>, std::vector<int32_t>> packedDocuments(int64_t rows, int64_t seq) {
    std::vector<int32_t> positions(rows), firstKeys(rows);
    for (int64_t t = 0, length = 1, start = 0; t < rows; ++t) {
      if (t % seq == 0 || t - start == length) {
        start = t;
        length = 1 + (length + 6) % 37;
      }
      positions[t] = int32_t(t - start);
      firstKeys[t] = int32_t(start % seq);
    }
    return {positions, firstKeys};
  }

  std::mt19937 rng_{42};
};

constexpr int64_t T = 96, S = 48, C = 64, N = 4, H = 4, F = 96, V = 53, K = N * N + 2 * N;

/// The gradient statistics of a tensor computed whole and by the
/// distributed optimizer's parts (Artifact::shardOf over 3 and 2 parts):
/// the same chunk sums bit for bit, and their sum the float64 definition's.
TEST_F(CudaKernels, GradientStatisticsByPartsGiveTheWholeBits) {
  for (int64_t count : {int64_t(300000) + 17, int64_t(4096), int64_t(100)}) {
    std::vector<float> g = random(size_t(count));
    for (int64_t i = 0; i < count; i += 7)
      g[i] = 0.0f;
    const int64_t chunk = Artifact::gradientChunk(count), chunks = (count + chunk - 1) / chunk;
    ASSERT_LE(chunks, 256);
    const float *device = upload(g);
    auto statistics = [&](int64_t parts) {
      Artifact a;
      a.dp = parts;
      a.distributedOptimizer = parts > 1;
      std::vector<cuda::StatsTensor> tensors;
      for (int64_t m = 0; m < a.optimizerParts(); ++m) {
        const auto [begin, end] = a.shardOf(count, m);
        EXPECT_EQ(begin % chunk, 0) << "part " << m << " of " << parts << " starts inside a chunk";
        if (end > begin)
          tensors.push_back({device + begin, end - begin, chunk, begin / chunk});
      }
      auto *table = upload(tensors);
      double *out = allocate<double>(size_t(2 * chunks));
      cudaMemset(out, 0xff, 2 * chunks * sizeof(double)); // NaN: every chunk must be written
      cuda::squaresAndZeros(table, int64_t(tensors.size()), out, nullptr);
      std::vector<double> host(size_t(2 * chunks));
      cudaDeviceSynchronize();
      cudaMemcpy(host.data(), out, host.size() * sizeof(double), cudaMemcpyDeviceToHost);
      return host;
    };
    const std::vector<double> whole = statistics(1);
    for (int64_t parts : {2, 3})
      EXPECT_EQ(std::memcmp(whole.data(), statistics(parts).data(), whole.size() * sizeof(double)), 0)
          << parts << " parts of " << count << " elements";
    double squares = 0, zeros = 0, want = 0, wantZeros = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      squares += whole[2 * c];
      zeros += whole[2 * c + 1];
    }
    for (float v : g) {
      want += double(v) * v;
      wantZeros += v == 0.0f;
    }
    EXPECT_NEAR(squares, want, 1e-12 * want) << count;
    EXPECT_EQ(zeros, wantZeros) << count;
  }
}

/// The bits of a float.
uint32_t bitsOf(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

/// --store-param-remainders' updates (runtime/train/ParamRemainders.h):
/// AdamW and SGD on masters kept as their bf16 copy and low 16 bits give the
/// plain kernels' moments, and the copy and low bits of the plain kernels'
/// masters settled off bf16 ties; over 2^20 elements some updated masters
/// land on a tie, so the device's settling runs.
TEST_F(CudaKernels, OptimizerOnRemaindersIsThePlainUpdateSettled) {
  const int64_t count = int64_t(1) << 20;
  std::vector<float> w = random(count), g = random(count, 0.1f), m = random(count, 0.01f), v = random(count, 0.01f);
  for (float &x : v)
    x = std::abs(x);
  std::vector<uint16_t> copy(count), low(count);
  for (int64_t e = 0; e < count; ++e) { // the masters as a run keeps them: settled
    const uint32_t bits = settleOffBf16Tie(bitsOf(w[e]));
    std::memcpy(&w[e], &bits, 4);
    copy[e] = bf16BitsOf(bits);
    low[e] = uint16_t(bits & 0xFFFFu);
  }
  for (bool sgd : {false, true}) {
    float *dw = upload(w), *dm = upload(m), *dv = upload(v), *dm2 = upload(m), *dv2 = upload(v);
    const float *dg = upload(g);
    uint16_t *dcopy = upload(copy), *dlow = upload(low);
    auto *dcopyBf16 = reinterpret_cast<__nv_bfloat16 *>(dcopy);
    if (sgd) {
      cuda::sgd(dw, dg, count, 1e-3f, 0.5f, nullptr, nullptr);
      cuda::sgdRemainders(dlow, dcopyBf16, dg, count, 1e-3f, 0.5f, nullptr);
    } else {
      cuda::adamW(dw, dg, dm, dv, count, 1e-3f, 1.0f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.05f, 0.1f, nullptr, nullptr);
      cuda::adamWRemainders(dlow, dcopyBf16, dg, dm2, dv2, count, 1e-3f, 1.0f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.05f,
                            0.1f, nullptr);
    }
    ASSERT_EQ(cuda::lastError("the optimizer kernels"), "");
    const std::vector<float> plain = download(dw, count);
    std::vector<uint16_t> gotCopy(count), gotLow(count);
    cudaMemcpy(gotCopy.data(), dcopy, count * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(gotLow.data(), dlow, count * 2, cudaMemcpyDeviceToHost);
    int64_t ties = 0, wrong = 0, moved = 0;
    for (int64_t e = 0; e < count; ++e) {
      const uint32_t bits = bitsOf(plain[e]), settled = settleOffBf16Tie(bits);
      ties += settled != bits;
      moved += bits != bitsOf(w[e]);
      wrong += gotCopy[e] != bf16BitsOf(settled) || gotLow[e] != uint16_t(settled & 0xFFFFu);
    }
    const char *what = sgd ? "sgd" : "adamW";
    EXPECT_EQ(wrong, 0) << what << ": elements whose copy or low bits are not the plain update's, settled";
    EXPECT_GT(ties, 0) << what << ": no updated master landed on a tie";
    EXPECT_GT(moved, count / 2) << what << ": the step moved few masters";
    if (!sgd) {
      EXPECT_EQ(std::memcmp(download(dm, count).data(), download(dm2, count).data(), count * 4), 0);
      EXPECT_EQ(std::memcmp(download(dv, count).data(), download(dv2, count).data(), count * 4), 0);
    }
  }
}

TEST_F(CudaKernels, MatrixProducts) {
  auto a = random(T * C), b = random(C * F), dy = random(T * F);
  float *da = upload(a), *db = upload(b), *ddy = upload(dy);
  check("matmul", {std::vector<float>(T * F, 0.5f)},
        [&](auto &o) { k::matmul(a.data(), b.data(), o[0].data(), T, C, F); },
        [&](auto &o) { cuda::matmul(*gemms_, da, db, o[0], T, C, F, false); });
  check("matmulTransAAcc", {random(C * F)},
        [&](auto &o) { k::matmulTransAAcc(a.data(), dy.data(), o[0].data(), T, C, F); },
        [&](auto &o) { cuda::matmulTransAAcc(*gemms_, da, ddy, o[0], T, C, F); });
  check("matmulTransBAcc", {random(T * C)},
        [&](auto &o) { k::matmulTransBAcc(dy.data(), b.data(), o[0].data(), T, F, C); },
        [&](auto &o) { cuda::matmulTransBAcc(*gemms_, ddy, db, o[0], T, F, C); });
}

TEST_F(CudaKernels, EmbeddingExpandContract) {
  std::vector<int32_t> tokens(T);
  for (auto &t : tokens)
    t = rng_() % V;
  auto table = random(V * C), dOut = random(T * C), x = random(T * N * C);
  for (int64_t shift : {0, 2}) {
    check("embed", {std::vector<float>(T * C)},
          [&](auto &o) { k::embedForward(tokens.data(), table.data(), o[0].data(), T, C, shift, S); },
          [&](auto &o) { cuda::embedForward(*kernels_, upload(tokens), upload(table), o[0], T, C, shift, S, nullptr); });
    // CSR of the rows reading each vocabulary entry, ascending.
    std::vector<int32_t> offsets(V + 1, 0), positions;
    for (int64_t v = 0; v < V; ++v) {
      for (int64_t t = 0; t < T; ++t)
        if (tokens[k::shiftedRow(t, shift, S)] == v)
          positions.push_back(int32_t(t));
      offsets[v + 1] = int32_t(positions.size());
    }
    check("embed backward", {random(V * C)},
          [&](auto &o) { k::embedBackward(tokens.data(), dOut.data(), o[0].data(), T, C, shift, S); },
          [&](auto &o) { cuda::embedBackward(*kernels_, upload(offsets), upload(positions), V, upload(dOut), o[0], C, nullptr); });
  }
  float *dx = upload(x), *dh = upload(dOut);
  check("expand", {std::vector<float>(T * N * C)}, [&](auto &o) { k::expandForward(dOut.data(), o[0].data(), T, C, N); },
        [&](auto &o) { cuda::expandForward(*kernels_, dh, o[0], T, C, N, nullptr); });
  check("expand backward", {random(T * C)}, [&](auto &o) { k::expandBackward(x.data(), o[0].data(), T, C, N); },
        [&](auto &o) { cuda::expandBackward(*kernels_, dx, o[0], T, C, N, nullptr); });
  check("contract", {std::vector<float>(T * C)}, [&](auto &o) { k::contractForward(x.data(), o[0].data(), T, C, N); },
        [&](auto &o) { cuda::contractForward(*kernels_, dx, o[0], T, C, N, nullptr); });
  check("contract backward", {random(T * N * C)}, [&](auto &o) { k::contractBackward(dOut.data(), o[0].data(), T, C, N); },
        [&](auto &o) { cuda::contractBackward(*kernels_, dh, o[0], T, C, N, nullptr); });
}

TEST_F(CudaKernels, MhcCoefficientsPreAndPostRes) {
  auto x = random(T * N * C), wmap = random(N * C * K, 0.05f), bias = random(K, 0.3f);
  std::vector<float> alpha = {0.8f, 1.1f, 0.9f};
  const int64_t iters = 20;
  std::vector<float> aux(T * (K + 1));
  float *dxp = upload(x), *dw = upload(wmap), *dbias = upload(bias), *dalpha = upload(alpha);
  float *scratch = upload(std::vector<float>(cuda::mhcCoeffsBackwardScratch(T, N)));
  float *stash = upload(std::vector<float>(cuda::mhcCoeffsBackwardStash(T, N)));
  // The GPU's aux goes on with the projection p = x W_map and the rows' sums
  // of squares (mhcCoeffsAuxExtra), which its backward reuses.
  std::vector<float> extra(T * K + T);
  k::matmul(x.data(), wmap.data(), extra.data(), T, N * C, K);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < N * C; ++c)
      extra[T * K + t] += x[t * N * C + c] * x[t * N * C + c];
  ASSERT_EQ(int64_t(extra.size()), cuda::mhcCoeffsAuxExtra(T, N));
  check("mhc coeffs", {std::vector<float>(T * K), std::vector<float>(T * (K + 1) + extra.size())},
        [&](auto &o) {
          k::mhcCoeffsForward(x.data(), wmap.data(), bias.data(), alpha.data(), o[0].data(), o[1].data(), T, C, N, iters);
          std::copy(extra.begin(), extra.end(), o[1].begin() + T * (K + 1));
        },
        [&](auto &o) { cuda::mhcCoeffsForward(*kernels_, *gemms_, dxp, dw, dbias, dalpha, o[0], o[1], T, C, N, nullptr); });
  std::vector<float> coef(T * K);
  k::mhcCoeffsForward(x.data(), wmap.data(), bias.data(), alpha.data(), coef.data(), aux.data(), T, C, N, iters);
  aux.insert(aux.end(), extra.begin(), extra.end());
  auto dCoef = random(T * K);
  float *daux = upload(aux), *ddc = upload(dCoef), *dcoef = upload(coef);
  checkParts("mhc coeffs backward", {random(T * N * C), random(N * C * K), random(K), random(3)},
        [&](auto &o) {
          k::mhcCoeffsBackward(x.data(), wmap.data(), alpha.data(), aux.data(), dCoef.data(), o[0].data(), o[1].data(),
                               o[2].data(), o[3].data(), T, C, N, iters);
        },
        [&](auto &o, cuda::GradParts parts) {
          cuda::mhcCoeffsBackward(*kernels_, *gemms_, dxp, dw, dalpha, daux, ddc, o[0], o[1], o[2], o[3], stash, scratch, T,
                                  C, N, parts, nullptr);
        });
  auto y = random(T * C), du = random(T * C), dOut = random(T * N * C);
  float *dy = upload(y), *ddu = upload(du), *ddo = upload(dOut);
  check("mhc pre", {std::vector<float>(T * C)}, [&](auto &o) { k::mhcPreForward(x.data(), coef.data(), o[0].data(), T, C, N); },
        [&](auto &o) { cuda::mhcPreForward(*kernels_, dxp, dcoef, o[0], T, C, N, nullptr); });
  check("mhc pre backward", {random(T * N * C), random(T * K)},
        [&](auto &o) { k::mhcPreBackward(x.data(), coef.data(), du.data(), o[0].data(), o[1].data(), T, C, N); },
        [&](auto &o) { cuda::mhcPreBackward(*kernels_, dxp, dcoef, ddu, o[0], o[1], T, C, N, nullptr); });
  check("mhc post/res", {std::vector<float>(T * N * C)},
        [&](auto &o) { k::mhcPostResForward(x.data(), coef.data(), y.data(), o[0].data(), T, C, N); },
        [&](auto &o) { cuda::mhcPostResForward(*kernels_, dxp, dcoef, dy, o[0], T, C, N, nullptr); });
  check("mhc post/res backward", {random(T * N * C), random(T * K), random(T * C)},
        [&](auto &o) {
          k::mhcPostResBackward(x.data(), coef.data(), y.data(), dOut.data(), o[0].data(), o[1].data(), o[2].data(), T, C, N);
        },
        [&](auto &o) { cuda::mhcPostResBackward(*kernels_, dxp, dcoef, dy, ddo, o[0], o[1], o[2], 0, T, C, N, nullptr); });
  // Fresh gradients (contents undefined, written instead of added to): the
  // bits zero-filled ones give.
  const int64_t sizes[3] = {T * N * C, T * K, T * C};
  float *zeroed[3], *garbage[3];
  for (int i = 0; i < 3; ++i) {
    zeroed[i] = upload(std::vector<float>(sizes[i]));
    garbage[i] = upload(random(sizes[i]));
  }
  cuda::mhcPostResBackward(*kernels_, dxp, dcoef, dy, ddo, zeroed[0], zeroed[1], zeroed[2], 0, T, C, N, nullptr);
  cuda::mhcPostResBackward(*kernels_, dxp, dcoef, dy, ddo, garbage[0], garbage[1], garbage[2], 7, T, C, N, nullptr);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(std::memcmp(download(zeroed[i], sizes[i]).data(), download(garbage[i], sizes[i]).data(), sizes[i] * 4), 0)
        << "post/res backward, fresh gradient " << i;
}

/// Attention forward and backward, against the CPU, for `rows` tokens in
/// sequences of `seq`, width C and `heads` heads; `packed`: documents of 1
/// to 37 tokens packed into each sequence (RoPE positions and masks).
void CudaKernels::checkAttention(int64_t rows, int64_t seq, int64_t width, int64_t heads, bool packed) {
  auto u = random(rows * width), dy = random(rows * width);
  auto wqkv = random(width * 3 * width, 0.1f), wo = random(width * width, 0.1f);
  float *du_ = upload(u), *ddy = upload(dy), *dwqkv = upload(wqkv), *dwo = upload(wo);
  auto [positions, firstKeys] = packedDocuments(rows, seq);
  const k::Documents docs = packed ? k::Documents{positions.data(), firstKeys.data()} : k::Documents{};
  const cuda::DeviceDocuments deviceDocs =
      packed ? cuda::DeviceDocuments{upload(positions), upload(firstKeys)} : cuda::DeviceDocuments{};
  const int64_t attnAux = rows * 4 * width + rows * heads;
  std::vector<float> attn(attnAux);
  k::attentionForward<float>(u.data(), wqkv.data(), wo.data(), std::vector<float>(rows * width).data(), attn.data(),
                             rows, width, heads, seq, nullptr, docs);
  std::string shape = " (rows " + std::to_string(rows) + ", seq " + std::to_string(seq) + ", C " +
                      std::to_string(width) + ", heads " + std::to_string(heads) + (packed ? ", packed" : "") + ")";
  float *forwardScratch = upload(std::vector<float>(cuda::attentionForwardScratch(rows, width, heads, seq, 4)));
  check("attention" + shape, {std::vector<float>(rows * width), std::vector<float>(attnAux)},
        [&](auto &o) {
          k::attentionForward<float>(u.data(), wqkv.data(), wo.data(), o[0].data(), o[1].data(), rows, width, heads,
                                     seq, nullptr, docs);
        },
        [&](auto &o) {
          cuda::attentionForward(*kernels_, *gemms_, du_, dwqkv, dwo, o[0], o[1], forwardScratch, rows, width, width,
                                 heads, seq, deviceDocs, nullptr);
        });
  float *dattn = upload(attn);
  float *backwardScratch = upload(std::vector<float>(cuda::attentionBackwardScratch(rows, width, heads, seq, 4)));
  float *backwardStash = upload(std::vector<float>(cuda::attentionBackwardStash(rows, width)));
  checkParts("attention backward" + shape, {random(rows * width), random(width * 3 * width), random(width * width)},
        [&](auto &o) {
          k::attentionBackward<float>(u.data(), wqkv.data(), wo.data(), attn.data(), dy.data(), o[0].data(),
                                      o[1].data(), o[2].data(), rows, width, heads, seq, nullptr, docs);
        },
        [&](auto &o, cuda::GradParts parts) {
          cuda::attentionBackward(*kernels_, *gemms_, du_, dwqkv, dwo, dattn, ddy, o[0], o[1], o[2], backwardStash,
                                  backwardScratch, rows, width, width, heads, seq, parts, deviceDocs, nullptr);
        });
}

void CudaKernels::checkGatedDeltaNet(int64_t rows, int64_t seq, int64_t width, int64_t heads, bool packed) {
  ASSERT_EQ(cuda::kGdnConvWidth, k::kGdnConvWidth);
  ASSERT_EQ(cuda::kGdnL2Eps, k::kGdnL2Eps);
  const int64_t d = width / heads, auxSize = rows * k::gdnAuxPerRow(width, heads);
  auto x = random(rows * width), dy = random(rows * width);
  // Weights as a trained layer might hold them: small projections, decays
  // from ~0 to ~1 a token, the norm near one.
  std::vector<std::vector<float>> w = {random(width * 3 * width, 0.1f), random(k::kGdnConvWidth * 3 * width, 0.3f),
                                       random(width * 2 * heads, 0.1f), random(heads, 0.5f),
                                       random(heads, 1.0f),             random(d, 0.1f),
                                       random(width * width, 0.1f),     random(width * width, 0.1f)};
  for (float &v : w[5])
    v += 1.0f;
  std::vector<float *> dw;
  for (auto &v : w)
    dw.push_back(upload(v));
  const cuda::GdnWeights<float> gw{dw[0], dw[1], dw[2], dw[3], dw[4], dw[5], dw[6], dw[7]};
  auto [positions, firstKeys] = packedDocuments(rows, seq);
  const k::Documents docs = packed ? k::Documents{positions.data(), firstKeys.data()} : k::Documents{};
  const cuda::DeviceDocuments deviceDocs =
      packed ? cuda::DeviceDocuments{upload(positions), upload(firstKeys)} : cuda::DeviceDocuments{};
  auto cpuForward = [&](float *y, float *aux) {
    k::gdnForward<float>(x.data(), w[0].data(), w[1].data(), w[2].data(), w[3].data(), w[4].data(), w[5].data(),
                         w[6].data(), w[7].data(), y, aux, rows, width, heads, seq, 1e-5, nullptr, docs);
  };
  std::vector<float> aux(auxSize), y(rows * width);
  cpuForward(y.data(), aux.data());
  const std::string shape = " (rows " + std::to_string(rows) + ", seq " + std::to_string(seq) + ", C " +
                            std::to_string(width) + ", heads " + std::to_string(heads) + (packed ? ", packed" : "") +
                            ")";
  float *dx_ = upload(x), *ddy = upload(dy);
  float *forwardScratch = upload(std::vector<float>(cuda::gdnForwardScratch(rows, width, heads, seq, 4)));
  // The GPU's aux goes on with what its scans keep for the backward.
  float *daux = upload(std::vector<float>(cuda::gdnAuxFloats(rows, width, heads, seq)));
  check("gated delta net" + shape, {std::vector<float>(rows * width), std::vector<float>(auxSize)},
        [&](auto &o) { cpuForward(o[0].data(), o[1].data()); },
        [&](auto &o) {
          ASSERT_EQ(cuda::gdnForward<float>(*gemms_, dx_, gw, o[0], daux, forwardScratch, rows, width, width, heads,
                                            seq, 1e-5, deviceDocs, nullptr),
                    "");
          cudaMemcpy(o[1], daux, auxSize * sizeof(float), cudaMemcpyDeviceToDevice);
        });
  // The backward reads the CPU's aux, and the scans' part the GPU forward
  // kept from its own (the same within the forward's tolerance).
  cudaMemcpy(daux, aux.data(), auxSize * sizeof(float), cudaMemcpyHostToDevice);
  float *stash = upload(std::vector<float>(cuda::gdnBackwardStash(rows, width, heads, 4)));
  float *scratch = upload(std::vector<float>(cuda::gdnBackwardScratch(rows, width, heads, seq, 4)));
  std::vector<std::vector<float>> grads = {random(rows * width)};
  for (auto &v : w)
    grads.push_back(random(v.size()));
  checkParts("gated delta net backward" + shape, grads,
             [&](auto &o) {
               k::gdnBackward<float>(x.data(), w[0].data(), w[1].data(), w[2].data(), w[3].data(), w[4].data(),
                                     w[5].data(), w[6].data(), w[7].data(), aux.data(), dy.data(),
                                     k::GdnGrads<float>{o[0].data(), o[1].data(), o[2].data(), o[3].data(),
                                                        o[4].data(), o[5].data(), o[6].data(), o[7].data(),
                                                        o[8].data()},
                                     rows, width, heads, seq, nullptr, docs);
             },
             [&](auto &o, cuda::GradParts parts) {
               cuda::GdnWeightGrads g;
               if (parts.weights)
                 g = {o[1], o[2], o[3], o[4], o[5], o[6], o[7], o[8]};
               ASSERT_EQ(cuda::gdnBackward<float>(*gemms_, dx_, gw, daux, ddy, parts.inputs ? o[0] : nullptr, g,
                                                  stash, scratch, rows, width, width, heads, seq, parts, deviceDocs,
                                                  nullptr),
                         "");
             });
}

// The recurrence at head dims 16 (tiny's), 64 and 128 (1b's), with chunks
// that do not divide the sequence, and across packed documents.
TEST_F(CudaKernels, GatedDeltaNet) { checkGatedDeltaNet(2 * 45, 45, 64, 4, false); }
TEST_F(CudaKernels, GatedDeltaNetPackedDocuments) { checkGatedDeltaNet(2 * 150, 150, 128, 2, true); }
TEST_F(CudaKernels, GatedDeltaNetHeadDim128) { checkGatedDeltaNet(2 * 70, 70, 256, 2, true); }
// Five chunks a sequence (the chains over chunks carry the state four times), documents across them.
TEST_F(CudaKernels, GatedDeltaNetManyChunks) { checkGatedDeltaNet(2 * 300, 300, 128, 4, true); }

// Longer rows than a block has threads, head width 128, two sequences.
TEST_F(CudaKernels, AttentionLongSequencesWideHeads) { checkAttention(2 * 300, 300, 256, 2); }
TEST_F(CudaKernels, AttentionPackedDocuments) { checkAttention(2 * 300, 300, 256, 2, true); }

TEST_F(CudaKernels, RmsNormAttentionSwiGluLoss) {
  auto u = random(T * C), gain = random(C), dy = random(T * C);
  float *du_ = upload(u), *dg = upload(gain), *ddy = upload(dy);
  std::vector<float> aux(T);
  k::rmsNormForward(u.data(), gain.data(), std::vector<float>(T * C).data(), aux.data(), T, C, 1e-6);
  check("rmsnorm", {std::vector<float>(T * C), std::vector<float>(T)},
        [&](auto &o) { k::rmsNormForward(u.data(), gain.data(), o[0].data(), o[1].data(), T, C, 1e-6); },
        [&](auto &o) { cuda::rmsNormForward(*kernels_, du_, dg, o[0], o[1], T, C, 1e-6, nullptr); });
  float *daux = upload(aux);
  float *normScratch = upload(std::vector<float>(cuda::rmsNormBackwardScratch(T, C)));
  checkParts("rmsnorm backward", {random(T * C), random(C)},
        [&](auto &o) { k::rmsNormBackward(u.data(), gain.data(), aux.data(), dy.data(), o[0].data(), o[1].data(), T, C); },
        [&](auto &o, cuda::GradParts parts) {
          cuda::rmsNormBackward(*kernels_, du_, dg, daux, ddy, o[0], o[1], normScratch, T, C, parts, nullptr);
        });

  checkAttention(T, S, C, H);
  float *scratch = upload(std::vector<float>(cuda::swigluBackwardScratch(T, F)));
  float *stash = upload(std::vector<float>(cuda::swigluBackwardStash(T, F)));

  auto wg = random(C * F, 0.1f), wu = random(C * F, 0.1f), wd = random(F * C, 0.1f);
  float *dwg = upload(wg), *dwu = upload(wu), *dwd = upload(wd);
  std::vector<float> sw(3 * T * F);
  k::swigluForward(u.data(), wg.data(), wu.data(), wd.data(), std::vector<float>(T * C).data(), sw.data(), T, C, F);
  check("swiglu", {std::vector<float>(T * C), std::vector<float>(3 * T * F)},
        [&](auto &o) { k::swigluForward(u.data(), wg.data(), wu.data(), wd.data(), o[0].data(), o[1].data(), T, C, F); },
        [&](auto &o) { cuda::swigluForward(*kernels_, *gemms_, du_, dwg, dwu, dwd, o[0], o[1], T, C, F, nullptr); });
  float *dsw = upload(sw);
  checkParts("swiglu backward", {random(T * C), random(C * F), random(C * F), random(F * C)},
        [&](auto &o) {
          k::swigluBackward(u.data(), wg.data(), wu.data(), wd.data(), sw.data(), dy.data(), o[0].data(), o[1].data(),
                            o[2].data(), o[3].data(), T, C, F);
        },
        [&](auto &o, cuda::GradParts parts) {
          cuda::swigluBackward(*kernels_, *gemms_, du_, dwg, dwu, dwd, dsw, ddy, o[0], o[1], o[2], o[3], stash, scratch, T, C,
                               F, parts, nullptr);
        });

  auto logits = random(T * V, 2.0f);
  std::vector<int32_t> labels(T);
  for (auto &l : labels)
    l = rng_() % V;
  float *dl = upload(logits);
  int32_t *dlab = upload(labels);
  for (int64_t shift : {0, 1}) {
    std::vector<float> lse(T);
    float loss = k::crossEntropyForward(logits.data(), labels.data(), lse.data(), T, V, shift, S);
    check("cross entropy", {std::vector<float>(T), std::vector<float>(1)},
          [&](auto &o) { o[1][0] = k::crossEntropyForward(logits.data(), labels.data(), o[0].data(), T, V, shift, S); },
          [&](auto &o) { cuda::crossEntropyForward(*kernels_, dl, dlab, o[0], o[1], T, V, shift, S, nullptr); });
    (void)loss;
    float *dlse = upload(lse);
    check("cross entropy backward", {random(T * V)},
          [&](auto &o) { k::crossEntropyBackward(logits.data(), labels.data(), lse.data(), 0.25f, o[0].data(), T, V, shift, S); },
          [&](auto &o) { cuda::crossEntropyBackward(*kernels_, dl, dlab, dlse, 0.25f, o[0], T, V, shift, S, nullptr); });
  }
}

} // namespace
} // namespace mhcc::runtime

int main(int argc, char **argv) {
  return mhcc::runtime::runModelKernelTests(argc, argv, "compiled with CUDA kernels, n = 4");
}
