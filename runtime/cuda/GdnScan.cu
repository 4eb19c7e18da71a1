//===- GdnScan.cu - the Gated DeltaNet recurrence on the GPU --------------===//
//
// GdnScan.h's scans. One thread block per (sequence, head) walks the tokens
// in order, each state row held in the registers of 4 threads (Lanes;
// MHCC_GDN_LANES=1: one thread a row), 16 tokens' inputs staged in shared
// memory at a time. That is the sequential form of the gated delta rule
// (the chunked WY form would reorder its sums for tensor cores: later
// work); it is deterministic by construction: every sum has one writer and
// a fixed order, no atomics.
//
// The backward recomputes the states: a first pass keeps one checkpoint
// every `chunk` tokens (chunk ~ sqrt(seq)), then each chunk, last first, is
// replayed from its checkpoint into global scratch and walked backwards,
// each row on its own (no barrier a token), keeping dS; then the sums over
// rows (dq, dk, the gates' gradients) run for all the chunk's tokens at once.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/GdnScan.h"
#include "runtime/cuda/DeviceKernels.h"

#include <cuda_runtime.h>

#include <cstdlib>

namespace mhcc::runtime::cuda {
namespace {

/// The scans' threads: P to a state row, D * P a block. Thread t holds row
/// r = t / P, columns j = jj P + p (jj < Q = D / P) with p = t % P:
/// interleaved, so a warp's reads of k or q spread over the shared-memory
/// banks.
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

/// Tokens between the backward's checkpoints: ~sqrt(seq).
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

} // namespace

std::string gdnScans(bool backward, const float *a, const float *gates, const float *dO, float *o, float *dA,
                     float *dAb, float *dLogAlpha, float *states, int64_t rows, int64_t C, int64_t H, int64_t seq,
                     const int32_t *firstKeys, cudaStream_t s) {
  const int64_t d = C / H;
  const ScanLaunch launch = scanLanes() == 1 ? scanFor<1>(d) : scanFor<4>(d);
  if (!launch)
    return gdnHeadDimError(d);
  launch(backward, a, gates, dO, o, dA, dAb, dLogAlpha, states, rows, C, H, seq, firstKeys, s);
  return lastError("gated_delta_net scan");
}


int64_t gdnScanStateFloats(int64_t rows, int64_t C, int64_t H, int64_t seq) {
  return (rows / seq) * H * scanStateFloats(seq, C / H);
}

} // namespace mhcc::runtime::cuda
