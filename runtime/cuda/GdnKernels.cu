//===- GdnKernels.cu - Gated DeltaNet on the GPU, forward and backward -----===//
//
// The GPU twin of runtime/cpu/GdnKernels.h (its math, its aux layout, its
// rounding points in bf16), declared in DeviceKernels.h. The projections go
// through Gemms; the conv, the norms and the gates are one thread or one
// warp per element or head row; the recurrence is one thread block per
// (sequence, head) walking the tokens in order, each state row held in the
// registers of 4 threads (Lanes; MHCC_GDN_LANES=1: one thread a row). That
// is the sequential form of the gated delta rule (the chunked WY form would
// reorder its sums for tensor cores: later work); it is deterministic by
// construction: every sum has one writer and a fixed order, no atomics.
//
// The backward recomputes the states: a first pass keeps one checkpoint
// every `chunk` tokens (chunk ~ sqrt(seq)), then each chunk, last first, is
// replayed from its checkpoint into global scratch and walked backwards,
// each row on its own (no barrier a token), keeping dS; then the sums over
// rows (dq, dk, the gates' gradients) run for all the chunk's tokens at once.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/DeviceKernelsImpl.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>

namespace mhcc::runtime::cuda {
namespace {

__device__ inline float widen(float v) { return v; }
__device__ inline float widen(bf16 v) { return __bfloat162float(v); }
template <typename A> __device__ inline A narrow(float v) {
  if constexpr (std::is_same_v<A, float>)
    return v;
  else
    return __float2bfloat16_rn(v);
}
__device__ inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ inline float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/// Sum over a warp, the same butterfly on every call (deterministic).
__device__ inline float warpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

/// First key of row t's document in its sequence (0: one document).
__device__ inline int64_t firstKeyOf(const int32_t *firstKeys, int64_t t) { return firstKeys ? firstKeys[t] : 0; }

/// The row conv tap j of row t reads, or -1 before its document (gdnTapRow).
__device__ inline int64_t tapRow(int64_t t, int64_t j, int64_t seq, const int32_t *firstKeys) {
  const int64_t back = kGdnConvWidth - 1 - j, i = t % seq;
  return i - back >= firstKeyOf(firstKeys, t) ? t - back : -1;
}

/// bf16 models round what the CPU rounds (its `stored` points): a product
/// kept in fp32 aux is rounded in place.
__global__ void roundToBf16Kernel(float *p, int64_t count) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < count)
    p[i] = __bfloat162float(__float2bfloat16_rn(p[i]));
}

template <typename A> __global__ void toStorageKernel(const float *src, A *dst, int64_t count) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < count)
    dst[i] = narrow<A>(src[i]);
}

/// z = causal depthwise conv of p, a = silu(z); one thread per element.
template <typename A>
__global__ void convForwardKernel(const float *p, const A *conv, float *z, float *a, int64_t rows, int64_t width,
                                  int64_t seq, const int32_t *firstKeys) {
  int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= rows * width)
    return;
  const int64_t t = e / width, c = e % width;
  float acc = 0;
  for (int64_t j = 0; j < kGdnConvWidth; ++j)
    if (const int64_t r = tapRow(t, j, seq, firstKeys); r >= 0)
      acc += widen(conv[j * width + c]) * p[r * width + c];
  z[e] = acc;
  a[e] = acc * sigmoidf(acc);
}

/// q and k L2-normalized per head in place; one warp per (row, part, head).
__global__ void l2NormKernel(float *a, float *inv, int64_t rows, int64_t C, int64_t H) {
  const int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= rows * 2 * H)
    return;
  const int64_t t = w / (2 * H), part = (w / H) % 2, h = w % H, d = C / H;
  float *v = a + t * 3 * C + part * C + h * d, sq = 0;
  for (int64_t e = lane; e < d; e += 32)
    sq += v[e] * v[e];
  const float r = 1.0f / sqrtf(warpSum(sq) + float(kGdnL2Eps));
  if (lane == 0)
    inv[t * 2 * H + part * H + h] = r;
  for (int64_t e = lane; e < d; e += 32)
    v[e] *= r;
}

/// The decay alpha and the write strength beta of every (row, head):
/// out[t, h] = alpha, out[t, H + h] = beta.
template <typename A>
__global__ void gatesKernel(const float *ab, const A *aLog, const A *dtBias, float *out, int64_t rows, int64_t H) {
  int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= rows * H)
    return;
  const int64_t t = e / H, h = e % H;
  out[t * 2 * H + h] = expf(-expf(widen(aLog[h])) * softplusf(ab[t * 2 * H + H + h] + widen(dtBias[h])));
  out[t * 2 * H + H + h] = sigmoidf(ab[t * 2 * H + h]);
}

/// The scans' threads: P to a state row, D * P a block. Thread t holds row
/// r = t / P, columns j = jj P + p (jj < Q = D / P) with p = t % P:
/// interleaved, so a warp's reads of k or q and its tile writes spread over
/// the shared-memory banks.
template <int D, int P> struct Lanes {
  static constexpr int Q = D / P;
  int r = int(threadIdx.x) / P, p = int(threadIdx.x) % P;
  __device__ int col(int jj) const { return jj * P + p; }
};

/// Tokens of the block's (sequence, head) in shared memory: q, k, v (and,
/// backwards, the output gradient) and the gates of up to kTokenBlock
/// consecutive tokens, loaded together: one trip to memory for all of them,
/// where a token at a time left the scans waiting on every load.
constexpr int kTokenBlock = 16;
template <int D> struct TokenBlock {
  float q[kTokenBlock][D], k[kTokenBlock][D], v[kTokenBlock][D], gO[kTokenBlock][D];
  float alpha[kTokenBlock], beta[kTokenBlock];
};

/// Loads tokens t0 + first .. + count into `b` between two barriers (the
/// first lets the block finish reading what it held).
template <int D>
__device__ inline void loadTokens(TokenBlock<D> &b, const float *a, const float *gates, const float *dO, int64_t t0,
                                  int64_t first, int count, int64_t C, int64_t H, int64_t h) {
  __syncthreads();
  for (int idx = threadIdx.x; idx < count * D; idx += blockDim.x) {
    const int tt = idx / D, e = idx % D;
    const int64_t t = t0 + first + tt;
    const float *row = a + t * 3 * C + h * D;
    b.q[tt][e] = row[e];
    b.k[tt][e] = row[C + e];
    b.v[tt][e] = row[2 * C + e];
    if (dO)
      b.gO[tt][e] = dO[t * C + h * D + e];
  }
  for (int tt = threadIdx.x; tt < count; tt += blockDim.x) {
    const int64_t t = t0 + first + tt;
    b.alpha[tt] = gates[t * 2 * H + h];
    b.beta[tt] = gates[t * 2 * H + H + h];
  }
  __syncthreads();
}

/// Dot products in four interleaved partial sums (index mod 4), added
/// pairwise: a fixed order with a quarter of the dependent chain.
struct Dot4 {
  float part[4] = {0, 0, 0, 0};
  __device__ void add(int j, float v) { part[j & 3] += v; }
  __device__ float sum() const { return (part[0] + part[1]) + (part[2] + part[3]); }
};

/// The sum over a row's P lanes (adjacent): a butterfly, every lane ending
/// with the same bits (each level adds the same two values).
template <int P> __device__ inline float rowSum(float v) {
#pragma unroll
  for (int offset = 1; offset < P; offset <<= 1)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

/// One token of the recurrence on this thread's part of state row r:
/// S = alpha S (I - beta k k^T) + beta v k^T, row-wise as gdnScan does it.
template <int D, int P>
__device__ inline void stepRow(float (&S)[D / P], const TokenBlock<D> &b, int tt, bool restart,
                               const Lanes<D, P> &l) {
  const float alpha = b.alpha[tt], beta = b.beta[tt];
  const float *k = b.k[tt];
  Dot4 dot;
#pragma unroll
  for (int jj = 0; jj < l.Q; ++jj) {
    S[jj] = restart ? 0.0f : S[jj] * alpha;
    dot.add(jj, S[jj] * k[l.col(jj)]);
  }
  const float e = beta * (b.v[tt][l.r] - rowSum<P>(dot.sum()));
#pragma unroll
  for (int jj = 0; jj < l.Q; ++jj)
    S[jj] += e * k[l.col(jj)];
}

/// The forward scan: o = scale S_t q_t for every token of one (sequence, head).
template <int D, int P>
__global__ void __launch_bounds__(D *P) scanForwardKernel(const float *a, const float *gates, float *o, int64_t seq,
                                                          int64_t C, int64_t H, const int32_t *firstKeys,
                                                          float scale) {
  __shared__ TokenBlock<D> b;
  const Lanes<D, P> l;
  const int64_t t0 = blockIdx.x * seq, h = blockIdx.y;
  float S[D / P];
#pragma unroll
  for (int jj = 0; jj < l.Q; ++jj)
    S[jj] = 0;
  for (int64_t i0 = 0; i0 < seq; i0 += kTokenBlock) {
    const int count = int(seq - i0 < kTokenBlock ? seq - i0 : kTokenBlock);
    loadTokens(b, a, gates, nullptr, t0, i0, count, C, H, h);
    for (int tt = 0; tt < count; ++tt) {
      const int64_t i = i0 + tt;
      stepRow<D, P>(S, b, tt, i == firstKeyOf(firstKeys, t0 + i), l);
      Dot4 out;
#pragma unroll
      for (int jj = 0; jj < l.Q; ++jj)
        out.add(jj, S[jj] * b.q[tt][l.col(jj)]);
      const float sum = rowSum<P>(out.sum());
      if (l.p == 0)
        o[(t0 + i) * C + h * D + l.r] = sum * scale;
    }
  }
}

/// A stored d x d state: thread t's jj-th value at base[jj D P + t] (each
/// thread reads back only what it wrote; coalesced).
template <int D, int P> __device__ inline void storeRow(float *base, const float (&S)[D / P]) {
#pragma unroll
  for (int jj = 0; jj < D / P; ++jj)
    base[jj * D * P + threadIdx.x] = S[jj];
}
template <int D, int P> __device__ inline void loadRow(const float *base, float (&S)[D / P]) {
#pragma unroll
  for (int jj = 0; jj < D / P; ++jj)
    S[jj] = base ? base[jj * D * P + threadIdx.x] : 0.0f;
}

/// Floats of state scratch one (sequence, head) block keeps.
__host__ __device__ inline int64_t scanChunk(int64_t seq) {
  int64_t chunk = 1;
  while (chunk * chunk < seq)
    ++chunk;
  return chunk;
}
/// Per (sequence, head): a checkpoint per chunk, then for the chunk being
/// walked its states and state gradients, the carried gradient, and four
/// numbers per token and row (ScanRows).
__host__ __device__ inline int64_t scanStateFloats(int64_t seq, int64_t d) {
  const int64_t chunk = scanChunk(seq);
  return ((seq + chunk - 1) / chunk + 2 * chunk + 1) * d * d + 4 * chunk * d;
}

/// Runs the state forward over tokens [from, to) of the block's sequence.
template <int D, int P>
__device__ void replay(float (&S)[D / P], TokenBlock<D> &b, const float *a, const float *gates, int64_t t0,
                       int64_t from, int64_t to, int64_t C, int64_t H, const int32_t *firstKeys, float *keep,
                       int64_t keepEvery, float *checkpoints, const Lanes<D, P> &l) {
  for (int64_t i0 = from; i0 < to; i0 += kTokenBlock) {
    const int count = int(to - i0 < kTokenBlock ? to - i0 : kTokenBlock);
    loadTokens(b, a, gates, nullptr, t0, i0, count, C, H, blockIdx.y);
    for (int tt = 0; tt < count; ++tt) {
      const int64_t i = i0 + tt;
      if (checkpoints && i % keepEvery == 0)
        storeRow<D, P>(checkpoints + (i / keepEvery) * D * D, S);
      stepRow<D, P>(S, b, tt, i == firstKeyOf(firstKeys, t0 + i), l);
      if (keep)
        storeRow<D, P>(keep + (i - from) * D * D, S);
    }
  }
}

/// What the walk back keeps per token and row for the sums over rows that
/// follow it: e = v - u, du, and the row terms of beta's and alpha's
/// gradients.
enum ScanRows { kRowE, kRowDu, kRowBeta, kRowAlpha, kScanRows };

/// Element (r, j) of a state stored by storeRow<D, P>.
template <int D, int P> __device__ inline int64_t stateIndex(int r, int j) {
  return int64_t(j / P) * D * P + r * P + j % P;
}

/// The backward scan of one (sequence, head): the gradients of q, k, v (into
/// dA), of beta's logit (dAb[t, h]) and of log alpha (dLogAlpha[t, h]).
/// Chunk by chunk, last first: replay the chunk's states from its
/// checkpoint, walk it back carrying dS (each row on its own: no barrier a
/// token, keeping dS and the row terms), then the sums over rows (dq, dk,
/// beta's and alpha's gradients) for every token of the chunk at once.
template <int D, int P>
__global__ void __launch_bounds__(D *P)
    scanBackwardKernel(const float *a, const float *gates, const float *dO, float *dA, float *dAb, float *dLogAlpha,
                       float *stateScratch, int64_t seq, int64_t C, int64_t H, const int32_t *firstKeys, float scale) {
  constexpr int kThreads = D * P;
  __shared__ TokenBlock<D> b;
  const Lanes<D, P> l;
  const int64_t t0 = blockIdx.x * seq, h = blockIdx.y, chunk = scanChunk(seq), chunks = (seq + chunk - 1) / chunk;
  float *checkpoints = stateScratch + (blockIdx.x * H + h) * scanStateFloats(seq, D);
  float *states = checkpoints + chunks * D * D, *grads = states + chunk * D * D, *carry = grads + chunk * D * D;
  float *rows = carry + D * D; // [token in chunk][kScanRows][D]
  float X[D / P]; // the state while replaying, the gradient dS while walking back
#pragma unroll
  for (int jj = 0; jj < l.Q; ++jj)
    X[jj] = 0;
  replay<D, P>(X, b, a, gates, t0, 0, seq, C, H, firstKeys, nullptr, chunk, checkpoints, l);
#pragma unroll
  for (int jj = 0; jj < l.Q; ++jj)
    X[jj] = 0;
  storeRow<D, P>(carry, X);
  for (int64_t k = chunks - 1; k >= 0; --k) {
    const int64_t from = k * chunk, to = from + chunk < seq ? from + chunk : seq;
    loadRow<D, P>(checkpoints + k * D * D, X);
    replay<D, P>(X, b, a, gates, t0, from, to, C, H, firstKeys, states, chunk, nullptr, l);
    loadRow<D, P>(carry, X);
    for (int64_t hi = to; hi > from; hi -= kTokenBlock) { // tokens [lo, hi), walked back
      const int64_t lo = hi - kTokenBlock > from ? hi - kTokenBlock : from;
      loadTokens(b, a, gates, dO, t0, lo, int(hi - lo), C, H, h);
      for (int64_t i = hi - 1; i >= lo; --i) {
        const int64_t t = t0 + i;
        const int tt = int(i - lo);
        const bool restart = i == firstKeyOf(firstKeys, t);
        const float *prev = restart ? nullptr
                                    : (i > from ? states + (i - from - 1) * D * D : checkpoints + k * D * D) +
                                          threadIdx.x;
        const float al = b.alpha[tt], beta = b.beta[tt], g = b.gO[tt][l.r];
        const float *kk = b.k[tt];
        // o = scale S q: dS += scale gO q^T (dq = scale S^T gO comes after the walk).
#pragma unroll
        for (int jj = 0; jj < l.Q; ++jj)
          X[jj] += scale * g * b.q[tt][l.col(jj)];
        storeRow<D, P>(grads + (i - from) * D * D, X);
        // S = al prev + beta e k^T, u = al prev k, e = v - u.
        Dot4 u, dSk;
#pragma unroll
        for (int jj = 0; jj < l.Q; ++jj) {
          u.add(jj, (prev ? al * prev[jj * kThreads] : 0.0f) * kk[l.col(jj)]);
          dSk.add(jj, X[jj] * kk[l.col(jj)]);
        }
        const float rowDSk = rowSum<P>(dSk.sum());
        const float e = b.v[tt][l.r] - rowSum<P>(u.sum()), de = beta * rowDSk, du = -de;
        Dot4 dAlpha;
#pragma unroll
        for (int jj = 0; jj < l.Q; ++jj) {
          const float before = prev ? prev[jj * kThreads] : 0.0f;
          const float dSt = X[jj] + du * kk[l.col(jj)];
          dAlpha.add(jj, dSt * before);
          X[jj] = prev ? al * dSt : 0.0f;
        }
        const float rowDAlpha = rowSum<P>(dAlpha.sum());
        if (l.p == 0) {
          float *mine = rows + (i - from) * kScanRows * D + l.r;
          mine[kRowE * D] = e;
          mine[kRowDu * D] = du;
          mine[kRowBeta * D] = e * rowDSk;
          mine[kRowAlpha * D] = rowDAlpha;
          dA[t * 3 * C + 2 * C + h * D + l.r] = de;
        }
      }
    }
    storeRow<D, P>(carry, X);
    __syncthreads(); // the chunk's dS and row terms, from every thread
    // The sums over rows, every token of the chunk: thread t takes column
    // c = t / P over the rows rr P + q (q = t % P), the P lanes then add up.
    const int c = threadIdx.x / P, q = threadIdx.x % P;
    for (int64_t i0 = from; i0 < to; i0 += kTokenBlock) {
      const int count = int(to - i0 < kTokenBlock ? to - i0 : kTokenBlock);
      loadTokens(b, a, gates, dO, t0, i0, count, C, H, h);
      for (int tt = 0; tt < count; ++tt) {
        const int64_t i = i0 + tt, t = t0 + i;
        const bool restart = i == firstKeyOf(firstKeys, t);
        const float *S = states + (i - from) * D * D, *G = grads + (i - from) * D * D;
        const float *prev = restart ? nullptr : i > from ? S - D * D : checkpoints + k * D * D;
        const float *row = rows + (i - from) * kScanRows * D;
        const float al = b.alpha[tt], beta = b.beta[tt];
        Dot4 dq, dk;
#pragma unroll
        for (int rr = 0; rr < D / P; ++rr) {
          const int r = rr * P + q;
          const int64_t at = stateIndex<D, P>(r, c);
          dq.add(rr, S[at] * b.gO[tt][r]);
          dk.add(rr, beta * G[at] * row[kRowE * D + r] + (prev ? al * prev[at] : 0.0f) * row[kRowDu * D + r]);
        }
        const float dqSum = rowSum<P>(dq.sum()), dkSum = rowSum<P>(dk.sum());
        if (q == 0) {
          dA[t * 3 * C + h * D + c] = scale * dqSum;
          dA[t * 3 * C + C + h * D + c] = dkSum;
        }
      }
      // beta's and alpha's gradients: one thread a token, the rows in order.
      for (int tt = threadIdx.x; tt < count; tt += kThreads) {
        const int64_t i = i0 + tt, t = t0 + i;
        const float *row = rows + (i - from) * kScanRows * D;
        Dot4 sumBeta, sumAlpha;
        for (int r = 0; r < D; ++r) {
          sumBeta.add(r, row[kRowBeta * D + r]);
          sumAlpha.add(r, row[kRowAlpha * D + r]);
        }
        const float beta = b.beta[tt];
        dAb[t * 2 * H + h] = sumBeta.sum() * beta * (1.0f - beta);
        dLogAlpha[t * H + h] = sumAlpha.sum() * b.alpha[tt];
      }
    }
  }
}

/// n = rmsnorm(o) per head * out_norm * silu(g), keeping 1 / rms; one warp
/// per (row, head).
template <typename A>
__global__ void gatedNormKernel(const float *o, const float *g, const A *outNorm, float *rms, A *n, int64_t rows,
                                int64_t C, int64_t H, float eps) {
  const int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= rows * H)
    return;
  const int64_t t = w / H, h = w % H, d = C / H, base = t * C + h * d;
  float sq = 0;
  for (int64_t e = lane; e < d; e += 32)
    sq += o[base + e] * o[base + e];
  const float r = 1.0f / sqrtf(warpSum(sq) / float(d) + eps);
  if (lane == 0)
    rms[t * H + h] = r;
  for (int64_t e = lane; e < d; e += 32) {
    const float gate = g[base + e];
    n[base + e] = narrow<A>(o[base + e] * r * widen(outNorm[e]) * gate * sigmoidf(gate));
  }
}

/// The same n from the kept 1 / rms (the backward's recompute).
template <typename A>
__global__ void gatedNormAgainKernel(const float *o, const float *g, const A *outNorm, const float *rms, A *n,
                                     int64_t rows, int64_t C, int64_t H) {
  int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= rows * C)
    return;
  const int64_t t = e / C, d = C / H, h = (e % C) / d, i = e % d;
  const float gate = g[e];
  n[e] = narrow<A>(o[e] * rms[t * H + h] * widen(outNorm[i]) * gate * sigmoidf(gate));
}

/// The gated norm's backward, one warp per (row, head): dG (A), the
/// out_norm summands dm * hat (fp32, summed over rows later), dO (fp32).
template <typename A>
__global__ void gatedNormBackwardKernel(const float *o, const float *g, const A *outNorm, const float *rms,
                                        const float *dn, A *dG, float *outNormTerms, float *dO, int64_t rows, int64_t C,
                                        int64_t H) {
  const int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= rows * H)
    return;
  const int64_t t = w / H, h = w % H, d = C / H, base = t * C + h * d;
  const float r = rms[t * H + h];
  float dot = 0;
  for (int64_t e = lane; e < d; e += 32) {
    const int64_t c = base + e;
    const float gate = g[c], sg = sigmoidf(gate), hat = o[c] * r, w8 = widen(outNorm[e]);
    dG[c] = narrow<A>(dn[c] * hat * w8 * sg * (1.0f + gate * (1.0f - sg)));
    const float dm = dn[c] * gate * sg;
    outNormTerms[c] = dm * hat;
    dot += dm * w8 * hat;
  }
  dot = warpSum(dot);
  for (int64_t e = lane; e < d; e += 32) {
    const int64_t c = base + e;
    const float gate = g[c], dm = dn[c] * gate * sigmoidf(gate);
    dO[c] = r * (dm * widen(outNorm[e]) - o[c] * r * dot / float(d));
  }
}

/// Through alpha = exp(-exp(a_log) softplus(ab + dt_bias)): dAb[t, H + h],
/// and the per-row summands of dt_bias and a_log (small[t, h], small[t, H + h]).
template <typename A>
__global__ void decayBackwardKernel(const float *ab, const A *aLog, const A *dtBias, const float *dLogAlpha, float *dAb,
                                    float *small, int64_t rows, int64_t H) {
  int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= rows * H)
    return;
  const int64_t t = e / H, h = e % H;
  const float z = ab[t * 2 * H + H + h] + widen(dtBias[h]), dl = dLogAlpha[e], decay = expf(widen(aLog[h]));
  const float dz = dl * -decay * sigmoidf(z);
  dAb[t * 2 * H + H + h] = dz;
  small[t * 2 * H + h] = dz;
  small[t * 2 * H + H + h] = dl * -decay * softplusf(z);
}

/// From the gradient of a = [q k v] (q, k normalized) to that of z: the L2
/// norms' backward then silu's; one warp per (row, part, head).
__global__ void activationBackwardKernel(const float *aux_a, const float *z, const float *inv, float *dA, float *dZ,
                                         int64_t rows, int64_t C, int64_t H) {
  const int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= rows * 3 * H)
    return;
  const int64_t t = w / (3 * H), part = (w / H) % 3, h = w % H, d = C / H, base = t * 3 * C + part * C + h * d;
  if (part < 2) {
    float dot = 0;
    for (int64_t e = lane; e < d; e += 32)
      dot += aux_a[base + e] * dA[base + e];
    dot = warpSum(dot);
    const float r = inv[t * 2 * H + part * H + h];
    for (int64_t e = lane; e < d; e += 32)
      dA[base + e] = r * (dA[base + e] - aux_a[base + e] * dot);
  }
  for (int64_t e = lane; e < d; e += 32) {
    const float zz = z[base + e], s = sigmoidf(zz);
    dZ[base + e] = dA[base + e] * s * (1.0f + zz * (1.0f - s));
  }
}

/// dP[r, c] = sum over the rows t whose conv taps read row r (t ascending).
template <typename A>
__global__ void convBackwardKernel(const float *dZ, const A *conv, A *dP, int64_t rows, int64_t width, int64_t seq,
                                   const int32_t *firstKeys) {
  int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= rows * width)
    return;
  const int64_t r = e / width, c = e % width;
  float acc = 0;
  for (int64_t back = 0; back < kGdnConvWidth; ++back) {
    const int64_t t = r + back, j = kGdnConvWidth - 1 - back;
    if (t < rows && t / seq == r / seq && tapRow(t, j, seq, firstKeys) == r)
      acc += dZ[t * width + c] * widen(conv[j * width + c]);
  }
  dP[e] = narrow<A>(acc);
}

/// Partial sums of dConv[j, c] = sum over t of dZ[t, c] p[tap(t, j), c]
/// over chunks of kColumnChunkRows rows (t ascending).
__global__ void convWeightPartialsKernel(const float *dZ, const float *p, int64_t rows, int64_t width, int64_t seq,
                                         const int32_t *firstKeys, float *partial) {
  const int64_t col = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, chunk = blockIdx.y;
  if (col >= kGdnConvWidth * width)
    return;
  const int64_t j = col / width, c = col % width,
                end = (chunk + 1) * kColumnChunkRows < rows ? (chunk + 1) * kColumnChunkRows : rows;
  float acc = 0;
  for (int64_t t = chunk * kColumnChunkRows; t < end; ++t)
    if (const int64_t r = tapRow(t, j, seq, firstKeys); r >= 0)
      acc += dZ[t * width + c] * p[r * width + c];
  partial[chunk * kGdnConvWidth * width + col] = acc;
}

/// Partial column sums of a [rows, cols] fp32 matrix over row chunks.
__global__ void columnPartialsKernel(const float *m, int64_t rows, int64_t cols, float *partial) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, chunk = blockIdx.y;
  if (c >= cols)
    return;
  const int64_t end = (chunk + 1) * kColumnChunkRows < rows ? (chunk + 1) * kColumnChunkRows : rows;
  float acc = 0;
  for (int64_t t = chunk * kColumnChunkRows; t < end; ++t)
    acc += m[t * cols + c];
  partial[chunk * cols + c] = acc;
}

/// dst (and dst2 from column `split`) += the column sums of m.
void addColumnSumsOf(const float *m, int64_t rows, int64_t cols, float *partial, float *dst, cudaStream_t s,
                     int64_t split = INT64_MAX, float *dst2 = nullptr) {
  if (!rows)
    return;
  columnPartialsKernel<<<dim3(blocks(cols), unsigned(columnChunks(rows))), kThreads, 0, s>>>(m, rows, cols, partial);
  addColumnPartialsKernel<<<blocks(cols), kThreads, 0, s>>>(partial, columnChunks(rows), cols, dst, split, dst2);
}

template <typename A> void roundLikeStorage(float *p, int64_t count, cudaStream_t s) {
  if constexpr (!std::is_same_v<A, float>)
    if (count)
      roundToBf16Kernel<<<blocks(count), kThreads, 0, s>>>(p, count);
}

/// Byte-sized pieces of raw float memory, laid out one after another.
struct Carver {
  char *next;
  template <typename T> T *take(int64_t count) {
    T *p = reinterpret_cast<T *>(next);
    next += ((count * int64_t(sizeof(T)) + 255) / 256) * 256;
    return p;
  }
};
struct CarvedSize {
  int64_t bytes = 0;
  CarvedSize &add(int64_t count, int64_t size) {
    bytes += ((count * size + 255) / 256) * 256;
    return *this;
  }
  int64_t floats() const { return bytes / 4; }
};

/// The aux pieces (GdnAux on the CPU).
struct Aux {
  float *p, *z, *a, *inv, *ab, *o, *rms, *g;
  Aux(float *aux, int64_t rows, int64_t C, int64_t H)
      : p(aux), z(p + rows * 3 * C), a(z + rows * 3 * C), inv(a + rows * 3 * C), ab(inv + rows * 2 * H),
        o(ab + rows * 2 * H), rms(o + rows * C), g(rms + rows * H) {}
};

/// What B leaves for W (A-typed pieces are GEMM operands).
template <typename A> struct Stash {
  A *dG, *dAb, *dP;
  float *outNormTerms, *small, *dZ;
  Stash(float *raw, int64_t rows, int64_t C, int64_t H) {
    Carver c{reinterpret_cast<char *>(raw)};
    dG = c.take<A>(rows * C);
    dAb = c.take<A>(rows * 2 * H);
    dP = c.take<A>(rows * 3 * C);
    outNormTerms = c.take<float>(rows * C);
    small = c.take<float>(rows * 2 * H);
    dZ = c.take<float>(rows * 3 * C);
  }
};
int64_t stashFloats(int64_t rows, int64_t C, int64_t H, int actBytes) {
  return CarvedSize{}
      .add(rows * C, actBytes)
      .add(rows * 2 * H, actBytes)
      .add(rows * 3 * C, actBytes)
      .add(rows * C, 4)
      .add(rows * 2 * H, 4)
      .add(rows * 3 * C, 4)
      .floats();
}

template <int D, int P>
void launchScans(bool backward, const float *a, const float *gates, const float *dO, float *o, float *dA,
                 float *dAb, float *dLogAlpha, float *states, int64_t rows, int64_t C, int64_t H, int64_t seq,
                 const int32_t *firstKeys, cudaStream_t s) {
  const dim3 grid(unsigned(rows / seq), unsigned(H));
  const float scale = 1.0f / sqrtf(float(D));
  if (!backward) {
    scanForwardKernel<D, P><<<grid, D * P, 0, s>>>(a, gates, o, seq, C, H, firstKeys, scale);
    return;
  }
  scanBackwardKernel<D, P><<<grid, D * P, 0, s>>>(a, gates, dO, dA, dAb, dLogAlpha, states, seq, C, H, firstKeys,
                                                   scale);
}

using ScanLaunch = decltype(&launchScans<16, 1>);
template <int P> ScanLaunch scanFor(int64_t d) {
  return d == 16 ? launchScans<16, P> : d == 32 ? launchScans<32, P> : d == 64 ? launchScans<64, P>
                                                     : d == 128 ? launchScans<128, P> : nullptr;
}

/// Threads a state row (Lanes' P): 4, or MHCC_GDN_LANES=1 (one thread a
/// row, for comparisons). Each gives its own fixed summation order.
int scanLanes() {
  const char *lanes = std::getenv("MHCC_GDN_LANES");
  return lanes && std::string(lanes) == "1" ? 1 : 4;
}

std::string scans(bool backward, const float *a, const float *gates, const float *dO, float *o, float *dA,
                  float *dAb, float *dLogAlpha, float *states, int64_t rows, int64_t C, int64_t H, int64_t seq,
                  const int32_t *firstKeys, cudaStream_t s) {
  const int64_t d = C / H;
  const ScanLaunch launch = scanLanes() == 1 ? scanFor<1>(d) : scanFor<4>(d);
  if (!launch)
    return gdnHeadDimError(d);
  launch(backward, a, gates, dO, o, dA, dAb, dLogAlpha, states, rows, C, H, seq, firstKeys, s);
  return lastError("gated_delta_net scan");
}

} // namespace

std::string gdnHeadDimError(int64_t d) {
  return "gated_delta_net on the GPU takes head dims 16, 32, 64 or 128 (hidden / heads), not " + std::to_string(d) +
         ": change heads, or train on the CPU backend (--backend cpu)";
}
bool gdnHeadDimSupported(int64_t d) { return d == 16 || d == 32 || d == 64 || d == 128; }

int64_t gdnForwardScratch(int64_t rows, int64_t C, int64_t H, int actBytes) {
  return CarvedSize{}.add(rows * 2 * H, 4).add(rows * C, actBytes).floats();
}
int64_t gdnBackwardStash(int64_t rows, int64_t C, int64_t H, int actBytes) { return stashFloats(rows, C, H, actBytes); }
int64_t gdnBackwardScratch(int64_t rows, int64_t C, int64_t H, int64_t seq, int actBytes) {
  const int64_t partials = std::max<int64_t>(
      {columnChunks(rows) * kGdnConvWidth * 3 * C, columnChunks(rows * H) * (C / H), columnChunks(rows) * 2 * H});
  return CarvedSize{}
      .add(rows * C, actBytes)                                // n
      .add(rows * C, 4)                                       // dn
      .add(rows * C, 4)                                       // dO
      .add(rows * 2 * H, 4)                                   // gates
      .add(rows * 3 * C, 4)                                   // dA
      .add(rows * 2 * H, 4)                                   // dAb (fp32)
      .add(rows * H, 4)                                       // dLogAlpha
      .add((rows / seq) * H * scanStateFloats(seq, C / H), 4) // the scans' states
      .add(partials, 4)
      .floats();
}

template <typename A>
std::string gdnForward(Gemms &g, const A *x, const GdnWeights<A> &w, A *y, float *auxData, float *scratch, int64_t rows,
                       int64_t C, int64_t H, int64_t seq, double eps, DeviceDocuments docs, cudaStream_t s) {
  if (!gdnHeadDimSupported(C / H))
    return gdnHeadDimError(C / H);
  Aux aux(auxData, rows, C, H);
  Carver carve{reinterpret_cast<char *>(scratch)};
  float *gates = carve.take<float>(rows * 2 * H);
  A *n = carve.take<A>(rows * C);
  matmul<A, float>(g, x, w.wqkv, aux.p, rows, C, 3 * C, false);
  roundLikeStorage<A>(aux.p, rows * 3 * C, s);
  convForwardKernel<A>
      <<<blocks(rows * 3 * C), kThreads, 0, s>>>(aux.p, w.conv, aux.z, aux.a, rows, 3 * C, seq, docs.firstKeys);
  l2NormKernel<<<warpBlocks(rows * 2 * H), kThreads, 0, s>>>(aux.a, aux.inv, rows, C, H);
  matmul<A, float>(g, x, w.wab, aux.ab, rows, C, 2 * H, false);
  gatesKernel<A><<<blocks(rows * H), kThreads, 0, s>>>(aux.ab, w.aLog, w.dtBias, gates, rows, H);
  std::string error = scans(false, aux.a, gates, nullptr, aux.o, nullptr, nullptr, nullptr, nullptr, rows, C, H, seq,
                            docs.firstKeys, s);
  if (!error.empty())
    return error;
  matmul<A, float>(g, x, w.wgate, aux.g, rows, C, C, false);
  roundLikeStorage<A>(aux.g, rows * C, s);
  gatedNormKernel<A>
      <<<warpBlocks(rows * H), kThreads, 0, s>>>(aux.o, aux.g, w.outNorm, aux.rms, n, rows, C, H, float(eps));
  matmul<A, A>(g, n, w.wo, y, rows, C, C, false);
  return lastError("gated_delta_net forward");
}

template <typename A>
std::string gdnBackward(Gemms &g, const A *x, const GdnWeights<A> &w, const float *auxData, const A *dy, A *dx,
                        const GdnWeightGrads &dw, float *stashData, float *scratch, int64_t rows, int64_t C, int64_t H,
                        int64_t seq, GradParts parts, DeviceDocuments docs, cudaStream_t s) {
  if (!gdnHeadDimSupported(C / H))
    return gdnHeadDimError(C / H);
  Aux aux(const_cast<float *>(auxData), rows, C, H);
  Stash<A> kept(stashData, rows, C, H);
  Carver carve{reinterpret_cast<char *>(scratch)};
  A *n = carve.take<A>(rows * C);
  float *dn = carve.take<float>(rows * C), *dO = carve.take<float>(rows * C);
  float *gates = carve.take<float>(rows * 2 * H), *dA = carve.take<float>(rows * 3 * C);
  float *dAb = carve.take<float>(rows * 2 * H), *dLogAlpha = carve.take<float>(rows * H);
  float *states = carve.take<float>((rows / seq) * H * scanStateFloats(seq, C / H));
  float *partial = reinterpret_cast<float *>(carve.next);
  if (parts.inputs) {
    fill(dn, rows * C, 0.0f, s);
    matmulTransBAcc<A, float>(g, dy, w.wo, dn, rows, C, C);
    gatedNormBackwardKernel<A><<<warpBlocks(rows * H), kThreads, 0, s>>>(aux.o, aux.g, w.outNorm, aux.rms, dn, kept.dG,
                                                                         kept.outNormTerms, dO, rows, C, H);
    matmulTransBAcc<A, A>(g, kept.dG, w.wgate, dx, rows, C, C);
    gatesKernel<A><<<blocks(rows * H), kThreads, 0, s>>>(aux.ab, w.aLog, w.dtBias, gates, rows, H);
    std::string error =
        scans(true, aux.a, gates, dO, nullptr, dA, dAb, dLogAlpha, states, rows, C, H, seq, docs.firstKeys, s);
    if (!error.empty())
      return error;
    decayBackwardKernel<A>
        <<<blocks(rows * H), kThreads, 0, s>>>(aux.ab, w.aLog, w.dtBias, dLogAlpha, dAb, kept.small, rows, H);
    toStorageKernel<A><<<blocks(rows * 2 * H), kThreads, 0, s>>>(dAb, kept.dAb, rows * 2 * H);
    matmulTransBAcc<A, A>(g, kept.dAb, w.wab, dx, rows, 2 * H, C);
    activationBackwardKernel<<<warpBlocks(rows * 3 * H), kThreads, 0, s>>>(aux.a, aux.z, aux.inv, dA, kept.dZ, rows, C,
                                                                           H);
    convBackwardKernel<A>
        <<<blocks(rows * 3 * C), kThreads, 0, s>>>(kept.dZ, w.conv, kept.dP, rows, 3 * C, seq, docs.firstKeys);
    matmulTransBAcc<A, A>(g, kept.dP, w.wqkv, dx, rows, 3 * C, C);
  }
  if (parts.weights) {
    gatedNormAgainKernel<A><<<blocks(rows * C), kThreads, 0, s>>>(aux.o, aux.g, w.outNorm, aux.rms, n, rows, C, H);
    matmulTransAAcc<A, float>(g, n, dy, dw.wo, rows, C, C);
    addColumnSumsOf(kept.outNormTerms, rows * H, C / H, partial, dw.outNorm, s);
    matmulTransAAcc<A, float>(g, x, kept.dG, dw.wgate, rows, C, C);
    matmulTransAAcc<A, float>(g, x, kept.dAb, dw.wab, rows, C, 2 * H);
    addColumnSumsOf(kept.small, rows, 2 * H, partial, dw.dtBias, s, H, dw.aLog);
    const int64_t width = 3 * C;
    convWeightPartialsKernel<<<dim3(blocks(kGdnConvWidth * width), unsigned(columnChunks(rows))), kThreads, 0, s>>>(
        kept.dZ, aux.p, rows, width, seq, docs.firstKeys, partial);
    addColumnPartialsKernel<<<blocks(kGdnConvWidth * width), kThreads, 0, s>>>(partial, columnChunks(rows),
                                                                               kGdnConvWidth * width, dw.conv);
    matmulTransAAcc<A, float>(g, x, kept.dP, dw.wqkv, rows, C, 3 * C);
  }
  return lastError("gated_delta_net backward");
}

template std::string gdnForward<float>(Gemms &, const float *, const GdnWeights<float> &, float *, float *, float *,
                                       int64_t, int64_t, int64_t, int64_t, double, DeviceDocuments, cudaStream_t);
template std::string gdnForward<bf16>(Gemms &, const bf16 *, const GdnWeights<bf16> &, bf16 *, float *, float *,
                                      int64_t, int64_t, int64_t, int64_t, double, DeviceDocuments, cudaStream_t);
template std::string gdnBackward<float>(Gemms &, const float *, const GdnWeights<float> &, const float *, const float *,
                                        float *, const GdnWeightGrads &, float *, float *, int64_t, int64_t, int64_t,
                                        int64_t, GradParts, DeviceDocuments, cudaStream_t);
template std::string gdnBackward<bf16>(Gemms &, const bf16 *, const GdnWeights<bf16> &, const float *, const bf16 *,
                                       bf16 *, const GdnWeightGrads &, float *, float *, int64_t, int64_t, int64_t,
                                       int64_t, GradParts, DeviceDocuments, cudaStream_t);

} // namespace mhcc::runtime::cuda
