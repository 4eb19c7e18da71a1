//===- attention_bench.cu - flash attention: checks and TFLOP/s -----------===//
//
// On one GPU, for runtime/cuda/FlashAttention:
//  - correctness of the forward (o, lse) and backward (dq, dk, dv) against
//    naive fp32 CUDA kernels below (one thread per (token, head), scores
//    recomputed per key), on several shapes, with and without packed
//    documents (per-document causal masks: lengths drawn from 1 to twice a
//    mean, so some span tiles and blocks and some are single tokens). bf16 outputs pass when
//    max |x - ref| <= 2e-2 * max |ref| over the tensor; lse (fp32) when
//    max |x - ref| <= 1e-3;
//  - determinism: fwd + bwd run twice, into buffers pre-filled with
//    different garbage, must give the same bits (which also shows every
//    output element is written);
//  - the refusals: an unsupported head dim and a bad seq return an error;
//  - the kernels on wgmma (the default) and on mma.sync, both checked;
//  - speed: T = 8192 tokens (4 x 2048), d = 128 (16 heads) and d = 64
//    (32 heads), medians of 20 timed runs after 3 warm-ups (CUDA events),
//    causal FLOPs: fwd 4 * B * H * S^2 * d / 2, bwd 2.5 x fwd; with packed
//    documents (mean 512 tokens, S = 4096) the FLOPs of the visible pairs
//    only, and the time against the same shape without documents. Speed is
//    printed, not asserted.
// Exit 1 on any failed check or CUDA error.
//
// usage: attention_bench
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/FlashAttention.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "tools/BenchTiming.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace fa = mhcc::runtime::cuda;
using bf16 = __nv_bfloat16;

#define CHECK_OK(call)                                                                              \
  do {                                                                                              \
    std::string err_ = (call);                                                                      \
    if (!err_.empty()) {                                                                            \
      std::fprintf(stderr, "attention_bench: %s\n", err_.c_str());                                  \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

unsigned blocksFor(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

// ---- fp32 reference: one thread per (token, head), every score recomputed ------------------

__device__ float dot(const bf16 *a, const bf16 *b, int d) {
  float s = 0.f;
  for (int e = 0; e < d; ++e)
    s += __bfloat162float(a[e]) * __bfloat162float(b[e]);
  return s;
}

/// The first key token t sees: its document's start (firstKeys null: its sequence's).
__device__ int firstKey(const int32_t *firstKeys, int64_t t) { return firstKeys ? firstKeys[t] : 0; }

/// o[t, h*d..] and lse[t, h] of the causal softmax over keys first..i of t's sequence.
template <int D>
__global__ void refForward(const bf16 *qkv, const int32_t *firstKeys, float *o, float *lse, int64_t T, int64_t C,
                           int heads, int seq, float scale) {
  int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= T * heads)
    return;
  const int64_t t = idx / heads, t0 = t - t % seq;
  const int h = int(idx % heads), i = int(t % seq), first = firstKey(firstKeys, t);
  const bf16 *q = qkv + t * 3 * C + h * D;
  float mx = -INFINITY;
  for (int j = first; j <= i; ++j)
    mx = fmaxf(mx, scale * dot(q, qkv + (t0 + j) * 3 * C + C + h * D, D));
  float sum = 0.f, acc[D];
  for (int e = 0; e < D; ++e)
    acc[e] = 0.f;
  for (int j = first; j <= i; ++j) {
    const float p = expf(scale * dot(q, qkv + (t0 + j) * 3 * C + C + h * D, D) - mx);
    const bf16 *v = qkv + (t0 + j) * 3 * C + 2 * C + h * D;
    sum += p;
    for (int e = 0; e < D; ++e)
      acc[e] += p * __bfloat162float(v[e]);
  }
  for (int e = 0; e < D; ++e)
    o[t * C + h * D + e] = acc[e] / sum;
  lse[idx] = mx + logf(sum);
}

/// rowDot[t, h] = dO . o over the head (the reference o: the exact identity sum_j P dP).
template <int D>
__global__ void refRowDot(const float *o, const bf16 *dO, float *rowDot, int64_t T, int64_t C, int heads) {
  int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= T * heads)
    return;
  const int64_t off = (idx / heads) * C + (idx % heads) * D;
  float s = 0.f;
  for (int e = 0; e < D; ++e)
    s += o[off + e] * __bfloat162float(dO[off + e]);
  rowDot[idx] = s;
}

/// dq[t] = scale * sum over keys first <= j <= i of P_ij (dP_ij - D_i) k_j.
template <int D>
__global__ void refDq(const bf16 *qkv, const int32_t *firstKeys, const bf16 *dO, const float *lse,
                      const float *rowDot, float *dq, int64_t T, int64_t C, int heads, int seq, float scale) {
  int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= T * heads)
    return;
  const int64_t t = idx / heads, t0 = t - t % seq;
  const int h = int(idx % heads), i = int(t % seq), first = firstKey(firstKeys, t);
  const bf16 *q = qkv + t * 3 * C + h * D, *g = dO + t * C + h * D;
  float acc[D];
  for (int e = 0; e < D; ++e)
    acc[e] = 0.f;
  for (int j = first; j <= i; ++j) {
    const bf16 *k = qkv + (t0 + j) * 3 * C + C + h * D, *v = k + C;
    const float p = expf(scale * dot(q, k, D) - lse[idx]);
    const float ds = p * (dot(g, v, D) - rowDot[idx]);
    for (int e = 0; e < D; ++e)
      acc[e] += ds * __bfloat162float(k[e]);
  }
  for (int e = 0; e < D; ++e)
    dq[t * C + h * D + e] = scale * acc[e];
}

/// dk[t] = scale * sum over queries r >= j of j's document of dS_rj q_r, dv[t] = sum of P_rj dO_r (t is key j).
template <int D>
__global__ void refDkDv(const bf16 *qkv, const int32_t *firstKeys, const bf16 *dO, const float *lse,
                        const float *rowDot, float *dk, float *dv, int64_t T, int64_t C, int heads, int seq,
                        float scale) {
  int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= T * heads)
    return;
  const int64_t t = idx / heads, t0 = t - t % seq;
  const int h = int(idx % heads), j = int(t % seq);
  const bf16 *k = qkv + t * 3 * C + C + h * D, *v = k + C;
  float accK[D], accV[D];
  for (int e = 0; e < D; ++e)
    accK[e] = accV[e] = 0.f;
  for (int r = j; r < seq && firstKey(firstKeys, t0 + r) <= j; ++r) {
    const int64_t tr = t0 + r, pr = tr * heads + h;
    const bf16 *q = qkv + tr * 3 * C + h * D, *g = dO + tr * C + h * D;
    const float p = expf(scale * dot(q, k, D) - lse[pr]);
    const float ds = p * (dot(g, v, D) - rowDot[pr]);
    for (int e = 0; e < D; ++e) {
      accK[e] += ds * __bfloat162float(q[e]);
      accV[e] += p * __bfloat162float(g[e]);
    }
  }
  for (int e = 0; e < D; ++e) {
    dk[t * C + h * D + e] = scale * accK[e];
    dv[t * C + h * D + e] = accV[e];
  }
}

// ---- host helpers ------------------------------------------------------------------------

float bf16ToFloat(uint16_t bits) {
  uint32_t x = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

template <typename T> std::vector<T> download(const T *p, size_t n) {
  std::vector<T> h(n);
  CHECK_CUDA(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

bool sameBytes(const void *a, const void *b, size_t bytes) {
  std::vector<char> x(bytes), y(bytes);
  CHECK_CUDA(cudaMemcpy(x.data(), a, bytes, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(y.data(), b, bytes, cudaMemcpyDeviceToHost));
  return std::memcmp(x.data(), y.data(), bytes) == 0;
}

/// Compares `rows` rows of `cols` values, row stride `ld` from column `col0` (bf16 or fp32) with a dense fp32
/// reference; prints one line and returns whether it passes. relTol: on max |ref|; else absTol on the error.
template <typename T>
bool compare(const char *name, const std::vector<T> &got, int64_t ld, int64_t col0, const std::vector<float> &ref,
             int64_t rows, int64_t cols, double relTol, double absTol) {
  double maxErr = 0, maxRef = 0;
  bool nan = false;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      double x;
      if constexpr (sizeof(T) == 2)
        x = bf16ToFloat(got[r * ld + col0 + c]);
      else
        x = got[r * ld + col0 + c];
      const double y = ref[r * cols + c];
      nan |= !std::isfinite(x);
      maxErr = std::max(maxErr, std::fabs(x - y));
      maxRef = std::max(maxRef, std::fabs(y));
    }
  const double rel = maxErr / std::max(maxRef, 1e-30);
  const bool ok = !nan && (relTol > 0 ? rel <= relTol : maxErr <= absTol);
  std::printf("  %-4s max abs err %.3e  max |ref| %.3e  rel %.3e%s  %s\n", name, maxErr, maxRef, rel,
              nan ? "  (non-finite values)" : "", ok ? "ok" : "FAIL");
  return ok;
}

struct Shape {
  int64_t batches, seq, heads, d;
  int64_t meanDocument = 0; // packed documents of 1 .. 2 x this many tokens; 0: one per sequence
};

/// Each token's document start in its sequence, documents of 1 .. 2 x mean tokens (a fixed LCG draws them).
std::vector<int32_t> packedFirstKeys(const Shape &s) {
  std::vector<int32_t> firstKeys(s.batches * s.seq);
  uint64_t state = 12345;
  for (int64_t b = 0; b < s.batches; ++b)
    for (int64_t start = 0; start < s.seq;) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const int64_t length = std::min<int64_t>(1 + int64_t((state >> 33) % uint64_t(2 * s.meanDocument)), s.seq - start);
      for (int64_t i = start; i < start + length; ++i)
        firstKeys[b * s.seq + i] = int32_t(start);
      start += length;
    }
  return firstKeys;
}

/// Query-key pairs attention computes: causal, and within documents.
double visiblePairs(const Shape &s, const std::vector<int32_t> &firstKeys) {
  double pairs = 0;
  for (int64_t t = 0; t < s.batches * s.seq; ++t)
    pairs += double(t % s.seq - (firstKeys.empty() ? 0 : firstKeys[t]) + 1);
  return pairs;
}

/// Device buffers of one shape: inputs, two sets of outputs, the reference.
struct Buffers {
  int64_t T, C;
  bf16 *qkv, *dO, *o[2], *dqkv[2];
  float *lse[2], *scratch, *oRef, *lseRef, *dotRef, *dqRef, *dkRef, *dvRef;
  std::vector<int32_t> hostFirstKeys;
  int32_t *firstKeys = nullptr; // null without documents
  explicit Buffers(const Shape &s) : T(s.batches * s.seq), C(s.heads * s.d) {
    if (s.meanDocument > 0) {
      hostFirstKeys = packedFirstKeys(s);
      CHECK_CUDA(cudaMalloc(&firstKeys, T * 4));
      CHECK_CUDA(cudaMemcpy(firstKeys, hostFirstKeys.data(), T * 4, cudaMemcpyHostToDevice));
    }
    const int64_t tc = T * C, th = T * s.heads;
    CHECK_CUDA(cudaMalloc(&qkv, 3 * tc * 2));
    CHECK_CUDA(cudaMalloc(&dO, tc * 2));
    for (int i = 0; i < 2; ++i) {
      CHECK_CUDA(cudaMalloc(&o[i], tc * 2));
      CHECK_CUDA(cudaMalloc(&dqkv[i], 3 * tc * 2));
      CHECK_CUDA(cudaMalloc(&lse[i], th * 4));
    }
    CHECK_CUDA(cudaMalloc(&scratch, fa::flashAttentionBackwardScratch(T, C, s.heads) * 4));
    for (float **p : {&oRef, &dqRef, &dkRef, &dvRef})
      CHECK_CUDA(cudaMalloc(p, tc * 4));
    for (float **p : {&lseRef, &dotRef})
      CHECK_CUDA(cudaMalloc(p, th * 4));
    fillRandom<<<blocksFor(3 * tc, 256), 256>>>(qkv, 3 * tc, 1, 2.0f); // scores up to ~|4|: a peaked softmax
    fillRandom<<<blocksFor(tc, 256), 256>>>(dO, tc, 2, 1.0f);
    CHECK_CUDA(cudaGetLastError());
  }
  ~Buffers() {
    for (void *p : {(void *)qkv, (void *)dO, (void *)o[0], (void *)o[1], (void *)dqkv[0], (void *)dqkv[1],
                    (void *)lse[0], (void *)lse[1], (void *)scratch, (void *)oRef, (void *)lseRef, (void *)dotRef,
                    (void *)dqRef, (void *)dkRef, (void *)dvRef, (void *)firstKeys})
      cudaFree(p);
  }
  /// fwd + bwd into output set i, its buffers first filled with `garbage` bytes.
  void run(const Shape &s, int i, int garbage) {
    CHECK_CUDA(cudaMemset(o[i], garbage, T * C * 2));
    CHECK_CUDA(cudaMemset(dqkv[i], garbage, 3 * T * C * 2));
    CHECK_CUDA(cudaMemset(lse[i], garbage, T * s.heads * 4));
    CHECK_CUDA(cudaMemset(scratch, garbage, fa::flashAttentionBackwardScratch(T, C, s.heads) * 4));
    CHECK_OK(fa::flashAttentionForward(qkv, o[i], lse[i], T, C, s.heads, s.seq, firstKeys, nullptr));
    CHECK_OK(
        fa::flashAttentionBackward(qkv, o[i], dO, lse[i], dqkv[i], scratch, T, C, s.heads, s.seq, firstKeys, nullptr));
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  template <int D> void reference(const Shape &s) {
    const float scale = 1.0f / std::sqrt(float(D));
    const int64_t n = T * s.heads;
    const int h = int(s.heads), seq = int(s.seq);
    refForward<D><<<blocksFor(n, 128), 128>>>(qkv, firstKeys, oRef, lseRef, T, C, h, seq, scale);
    refRowDot<D><<<blocksFor(n, 128), 128>>>(oRef, dO, dotRef, T, C, h);
    refDq<D><<<blocksFor(n, 128), 128>>>(qkv, firstKeys, dO, lseRef, dotRef, dqRef, T, C, h, seq, scale);
    refDkDv<D><<<blocksFor(n, 128), 128>>>(qkv, firstKeys, dO, lseRef, dotRef, dkRef, dvRef, T, C, h, seq, scale);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
  }
};

/// Context parallelism's use (runtime/cuda/CudaContextParallel.cpp): a cp 2
/// rank's rows of each sequence (chunks r and 3 - r of 4) with the rowDot
/// given, into garbage-filled outputs, against the whole run (output set 0):
/// those rows' o, lse, dq, dk and dv bit for bit. Whole tiles narrow the
/// launch; the others run every tile.
bool checkContextRanks(const Shape &s, Buffers &b) {
  const int64_t T = b.T, C = b.C, chunk = s.seq / 4;
  bool same = true; // seq not in 4 chunks: nothing to compare
  float *rowDot = nullptr;
  CHECK_CUDA(cudaMalloc(&rowDot, T * s.heads * 4));
  CHECK_OK(fa::flashAttentionRowDot(b.o[0], b.dO, rowDot, T, C, s.heads, nullptr));
  for (int64_t r = 0; r < 2 && s.seq % 4 == 0; ++r) {
    fa::FlashRowRanges rows;
    rows.first[0] = r * chunk;
    rows.first[1] = (3 - r) * chunk;
    rows.count[0] = rows.count[1] = chunk;
    CHECK_CUDA(cudaMemset(b.o[1], 0xff, T * C * 2));
    CHECK_CUDA(cudaMemset(b.lse[1], 0xff, T * s.heads * 4));
    CHECK_CUDA(cudaMemset(b.dqkv[1], 0xff, 3 * T * C * 2));
    CHECK_OK(fa::flashAttentionForward(b.qkv, b.o[1], b.lse[1], T, C, s.heads, s.seq, b.firstKeys, nullptr, rows));
    // The keys' gradients read every query's log-sum-exp: the whole run's (as the ranks gather them).
    CHECK_OK(fa::flashAttentionBackward(b.qkv, nullptr, b.dO, b.lse[0], b.dqkv[1], b.scratch, T, C, s.heads, s.seq,
                                        b.firstKeys, nullptr, rowDot, rows));
    CHECK_CUDA(cudaDeviceSynchronize());
    for (int64_t q = 0; q < T / s.seq; ++q)
      for (int part = 0; part < 2; ++part) {
        const int64_t row = q * s.seq + rows.first[part];
        same = same && sameBytes(b.o[0] + row * C, b.o[1] + row * C, chunk * C * 2) &&
               sameBytes(b.lse[0] + row * s.heads, b.lse[1] + row * s.heads, chunk * s.heads * 4) &&
               sameBytes(b.dqkv[0] + row * 3 * C, b.dqkv[1] + row * 3 * C, chunk * 3 * C * 2);
      }
  }
  cudaFree(rowDot);
  std::printf("  cp 2 ranks' rows (rowDot given, %s): %s\n",
              s.seq % 512 == 0 ? "their tiles only" : "every tile", same ? "ok" : "FAIL");
  return same;
}

bool checkShape(const Shape &s, const char *kernel) {
  std::printf("check %s B=%lld S=%lld H=%lld d=%lld%s\n", kernel, (long long)s.batches, (long long)s.seq,
              (long long)s.heads, (long long)s.d,
              s.meanDocument ? (" documents of 1.." + std::to_string(2 * s.meanDocument)).c_str() : "");
  Buffers b(s);
  b.run(s, 0, 0xff); // 0xffff: a bf16 NaN, so an unwritten element fails the comparison
  b.run(s, 1, 0x7f);
  if (s.d == 64)
    b.reference<64>(s);
  else
    b.reference<128>(s);
  const int64_t T = b.T, C = b.C;
  const auto o = download(reinterpret_cast<uint16_t *>(b.o[0]), T * C);
  const auto dqkv = download(reinterpret_cast<uint16_t *>(b.dqkv[0]), 3 * T * C);
  const auto lse = download(b.lse[0], T * s.heads);
  const auto oRef = download(b.oRef, T * C), lseRef = download(b.lseRef, T * s.heads);
  const auto dqRef = download(b.dqRef, T * C), dkRef = download(b.dkRef, T * C), dvRef = download(b.dvRef, T * C);
  bool ok = compare("o", o, C, 0, oRef, T, C, 2e-2, 0);
  ok &= compare("lse", lse, s.heads, 0, lseRef, T, s.heads, 0, 1e-3);
  ok &= compare("dq", dqkv, 3 * C, 0, dqRef, T, C, 2e-2, 0);
  ok &= compare("dk", dqkv, 3 * C, C, dkRef, T, C, 2e-2, 0);
  ok &= compare("dv", dqkv, 3 * C, 2 * C, dvRef, T, C, 2e-2, 0);
  const bool same = sameBytes(b.o[0], b.o[1], T * C * 2) && sameBytes(b.lse[0], b.lse[1], T * s.heads * 4) &&
                    sameBytes(b.dqkv[0], b.dqkv[1], 3 * T * C * 2);
  std::printf("  determinism (two runs, bitwise): %s\n", same ? "ok" : "FAIL");
  ok &= same;
  ok &= checkContextRanks(s, b);
  std::printf("  %s\n", ok ? "PASS" : "FAIL");
  return ok;
}

/// The launch functions refuse what they do not handle, with a message, before touching memory.
bool checkRefusals() {
  const std::string badDim =
      fa::flashAttentionForward(nullptr, nullptr, nullptr, 256, 2 * 96, 2, 128, nullptr, nullptr);
  const std::string badSeq = fa::flashAttentionBackward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 200,
                                                        128, 2, 100, nullptr, nullptr);
  const bool ok = badDim.find("head dim 96") != std::string::npos && badSeq.find("seq 100") != std::string::npos;
  std::printf("refusals: \"%s\" / \"%s\": %s\n", badDim.c_str(), badSeq.c_str(), ok ? "PASS" : "FAIL");
  return ok;
}


/// Times fwd and bwd; returns their medians (ms).
std::pair<float, float> bench(const Shape &s, const char *kernel = "") {
  Buffers b(s);
  const int64_t T = b.T, C = b.C;
  const float fwdMs = medianMs(
      [&] { CHECK_OK(fa::flashAttentionForward(b.qkv, b.o[0], b.lse[0], T, C, s.heads, s.seq, b.firstKeys, nullptr)); });
  const float bwdMs = medianMs([&] {
    CHECK_OK(fa::flashAttentionBackward(b.qkv, b.o[0], b.dO, b.lse[0], b.dqkv[0], b.scratch, T, C, s.heads, s.seq,
                                        b.firstKeys, nullptr));
  });
  // Causal without documents: S^2 / 2 pairs per sequence, as FlashAttention's benchmarks count.
  const double pairs = s.meanDocument ? visiblePairs(s, b.hostFirstKeys) : double(s.batches) * s.seq * s.seq / 2;
  const double fwdFlops = 4.0 * s.heads * s.d * pairs, bwdFlops = 2.5 * fwdFlops;
  const char *names[2] = {"fwd", "bwd"};
  const float ms[2] = {fwdMs, bwdMs};
  const double flops[2] = {fwdFlops, bwdFlops};
  for (int i = 0; i < 2; ++i)
    std::printf("attention %s%s d=%lld S=%lld H=%lld B=%lld%s: %.3f ms  %.1f TFLOP/s\n", names[i], kernel,
                (long long)s.d, (long long)s.seq, (long long)s.heads, (long long)s.batches,
                s.meanDocument ? (" documents of mean ~" + std::to_string(s.meanDocument)).c_str() : "", ms[i],
                flops[i] / ms[i] / 1e9);
  return {fwdMs, bwdMs};
}

} // namespace

/// attention_bench [--small]: --small checks the short sequences only and
/// times nothing (for compute-sanitizer, which runs kernels 10-100x slower).
/// A context-parallel rank's share (runtime/cuda/CudaContextParallel.cpp):
/// each cp 2 rank's launch (its chunks r and 3 - r, rowDot given) against
/// the whole launch; the two ranks' times add up to about the whole's when
/// the split saves the work.
void benchContextRanks(const Shape &s) {
  Buffers b(s);
  const int64_t T = b.T, C = b.C, chunk = s.seq / 4;
  float *rowDot = nullptr;
  CHECK_CUDA(cudaMalloc(&rowDot, T * s.heads * 4));
  CHECK_OK(fa::flashAttentionForward(b.qkv, b.o[0], b.lse[0], T, C, s.heads, s.seq, b.firstKeys, nullptr));
  CHECK_OK(fa::flashAttentionRowDot(b.o[0], b.dO, rowDot, T, C, s.heads, nullptr));
  auto run = [&](const fa::FlashRowRanges &rows) {
    const float fwd = medianMs([&] {
      CHECK_OK(fa::flashAttentionForward(b.qkv, b.o[1], b.lse[1], T, C, s.heads, s.seq, b.firstKeys, nullptr, rows));
    });
    const float bwd = medianMs([&] {
      CHECK_OK(fa::flashAttentionBackward(b.qkv, nullptr, b.dO, b.lse[0], b.dqkv[1], b.scratch, T, C, s.heads, s.seq,
                                          b.firstKeys, nullptr, rowDot, rows));
    });
    return std::pair<float, float>{fwd, bwd};
  };
  const auto whole = run({});
  std::pair<float, float> ranks{0, 0};
  for (int64_t r = 0; r < 2; ++r) {
    fa::FlashRowRanges rows;
    rows.first[0] = r * chunk;
    rows.first[1] = (3 - r) * chunk;
    rows.count[0] = rows.count[1] = chunk;
    const auto mine = run(rows);
    std::printf("attention cp 2 rank %lld d=%lld S=%lld H=%lld B=%lld: fwd %.3f ms, bwd %.3f ms (whole: %.3f, %.3f)\n",
                (long long)r, (long long)s.d, (long long)s.seq, (long long)s.heads, (long long)s.batches, mine.first,
                mine.second, whole.first, whole.second);
    ranks.first += mine.first;
    ranks.second += mine.second;
  }
  std::printf("attention cp 2 d=%lld S=%lld: the two ranks' launches / the whole: fwd %.2f, bwd %.2f\n", (long long)s.d,
              (long long)s.seq, ranks.first / whole.first, ranks.second / whole.second);
  cudaFree(rowDot);
}

int main(int argc, char **argv) {
  // --small: the checks of short sequences only; --checks: every check, no
  // benchmark; --context: the context-parallel ranks' benchmark alone.
  const bool small = argc > 1 && std::string(argv[1]) == "--small";
  const bool checksOnly = argc > 1 && std::string(argv[1]) == "--checks";
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("attention_bench: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  const std::string layout = fa::wgmmaLayoutCheck();
  std::printf("wgmma layouts: %s\n", layout.empty() ? "PASS" : layout.c_str());
  if (argc > 1 && std::string(argv[1]) == "--context") {
    for (int64_t d : {128, 64})
      benchContextRanks({2, 4096, 2048 / d, d});
    return 0;
  }
  bool ok = layout.empty() && checkRefusals();
  // seq 64 and 192 exercise a block tile (128 rows) only half inside the sequence.
  const Shape checks[] = {{1, 128, 2, 64},   {2, 256, 4, 128}, {3, 64, 2, 64},
                          {2, 192, 3, 128},  {1, 2048, 16, 128}, {1, 2048, 32, 64},
                          {2, 256, 4, 128, 20}, {3, 192, 2, 64, 7},  {1, 2048, 16, 128, 300},
                          {2, 1024, 8, 64, 90}, {1, 256, 2, 64, 1}};
  // The kernels run on wgmma by default; the mma.sync kernels are checked on the same shapes.
  for (const Shape &s : checks)
    if (!small || s.seq <= 256) {
      ok &= checkShape(s, "wgmma");
      fa::setFlashAttentionKernels(fa::FlashKernels::kMmaSync);
      ok &= checkShape(s, "mma.sync");
      fa::setFlashAttentionKernels(fa::FlashKernels::kWgmma);
    }
  if (!small && !checksOnly) {
    for (const Shape &s : {Shape{4, 2048, 16, 128}, Shape{4, 2048, 32, 64}}) {
      fa::setFlashAttentionKernels(fa::FlashKernels::kMmaSync);
      const auto mma = bench(s, " (mma.sync)");
      fa::setFlashAttentionKernels(fa::FlashKernels::kWgmma);
      const auto wgmma = bench(s, " (wgmma)");
      std::printf("attention d=%lld S=2048: wgmma / mma.sync speed: fwd %.2fx, bwd %.2fx\n", (long long)s.d,
                  mma.first / wgmma.first, mma.second / wgmma.second);
    }
    for (int64_t d : {128, 64})
      benchContextRanks({2, 4096, 2048 / d, d});
    for (int64_t d : {128, 64}) {
      const auto whole = bench({2, 4096, 2048 / d, d});
      const auto packed = bench({2, 4096, 2048 / d, d, 512});
      std::printf("attention d=%lld S=4096, documents of mean ~512 vs none: fwd %.2fx, bwd %.2fx faster\n",
                  (long long)d, whole.first / packed.first, whole.second / packed.second);
    }
  }
  std::printf("%s\n", ok ? "all checks PASS" : "some checks FAILED");
  return ok ? 0 : 1;
}
