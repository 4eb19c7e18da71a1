//===- GdnScan.cu - the Gated DeltaNet recurrence on the GPU --------------===//
//
// GdnScan.h's scans. One thread block per (sequence, head) walks the tokens
// in order forward (backward: per group of 16 state rows; the rows are
// independent), each state row held in the registers of 4 threads (Lanes;
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
// the block's rows (dq, dk, the gates' gradients) run for all the chunk's
// tokens at once, and a last kernel adds the groups' sums in group order.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/GdnScan.h"
#include "runtime/cuda/DeviceKernels.h"

#include <cuda_runtime.h>

#include <cstdlib>

namespace mhcc::runtime::cuda {
namespace {

/// Rows of the state one backward block holds: the rows of the recurrence
/// are independent (row r needs only its own past, k, v[r] and the gates),
/// so a (sequence, head) is split over D / kGroupRows blocks. One block a
/// (sequence, head) left 116 of 132 SMs idle at 16 heads, its backward bound
/// by that one SM's L1 (ncu, hybrid_1b: 74% busy, 400 GB/s in all; split:
/// 17%, the scan 48.7 -> 38.8 ms).
constexpr int kGroupRows = 16;
template <int D> constexpr int groupRows() { return D < kGroupRows ? D : kGroupRows; }

/// The scans' threads: P to a state row, R rows a block (its group: rows
/// blockIdx.z R ..). Thread t holds the block's row r = t / P, columns
/// j = jj P + p (jj < Q = D / P) with p = t % P: interleaved, so a warp's
/// reads of k or q spread over the shared-memory banks.
template <int D, int P, int R> struct Lanes {
  static constexpr int Q = D / P;
  int r = int(threadIdx.x) / P, p = int(threadIdx.x) % P;
  int row = int(blockIdx.z) * R + int(threadIdx.x) / P; // the state row
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

/// One token of the recurrence on this thread's part of state row l.row:
/// S = alpha S (I - beta k k^T) + beta v k^T, row-wise as gdnScan does it.
template <int D, int P, int R>
__device__ inline void stepRow(float (&S)[D / P], const TokenBlock<D> &b, int tt, bool restart,
                               const Lanes<D, P, R> &l) {
  const float alpha = b.alpha[tt], beta = b.beta[tt];
  const float *k = b.k[tt];
  Dot4 dot;
#pragma unroll
  for (int jj = 0; jj < l.Q; ++jj) {
    S[jj] = restart ? 0.0f : S[jj] * alpha;
    dot.add(jj, S[jj] * k[l.col(jj)]);
  }
  const float e = beta * (b.v[tt][l.row] - rowSum<P>(dot.sum()));
#pragma unroll
  for (int jj = 0; jj < l.Q; ++jj)
    S[jj] += e * k[l.col(jj)];
}

/// The forward scan: o = scale S_t q_t for every token of one (sequence,
/// head) and the block's rows.
template <int D, int P, int R>
__global__ void __launch_bounds__(R *P) scanForwardKernel(const float *a, const float *gates, float *o, int64_t seq,
                                                          int64_t C, int64_t H, const int32_t *firstKeys,
                                                          float scale) {
  __shared__ TokenBlock<D> b;
  const Lanes<D, P, R> l;
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
      stepRow<D, P, R>(S, b, tt, i == firstKeyOf(firstKeys, t0 + i), l);
      Dot4 out;
#pragma unroll
      for (int jj = 0; jj < l.Q; ++jj)
        out.add(jj, S[jj] * b.q[tt][l.col(jj)]);
      const float sum = rowSum<P>(out.sum());
      if (l.p == 0)
        o[(t0 + i) * C + h * D + l.row] = sum * scale;
    }
  }
}

/// A block's stored R x D part of a state: thread t's jj-th value at
/// base[jj R P + t] (each thread reads back only what it wrote; coalesced).
template <int D, int P, int R> __device__ inline void storeRow(float *base, const float (&S)[D / P]) {
#pragma unroll
  for (int jj = 0; jj < D / P; ++jj)
    base[jj * R * P + threadIdx.x] = S[jj];
}
template <int D, int P, int R> __device__ inline void loadRow(const float *base, float (&S)[D / P]) {
#pragma unroll
  for (int jj = 0; jj < D / P; ++jj)
    S[jj] = base ? base[jj * R * P + threadIdx.x] : 0.0f;
}

/// Tokens between the backward's checkpoints: ~sqrt(seq).
__host__ __device__ inline int64_t scanChunk(int64_t seq) {
  int64_t chunk = 1;
  while (chunk * chunk < seq)
    ++chunk;
  return chunk;
}
/// Per (sequence, head, row group) of R rows: a checkpoint per chunk, then
/// for the chunk being walked its states and state gradients, the carried
/// gradient, and four numbers per token and row (ScanRows).
__host__ __device__ inline int64_t scanStateFloats(int64_t seq, int64_t d, int64_t r) {
  const int64_t chunk = scanChunk(seq);
  return ((seq + chunk - 1) / chunk + 2 * chunk + 1) * r * d + 4 * chunk * r;
}
/// Per (sequence, head, row group) and token: the group's sums over its rows
/// of dq and dk (d each), then of beta's and alpha's row terms.
__host__ __device__ inline int64_t scanPartialFloats(int64_t d) { return 2 * d + 2; }

/// Runs the block's rows of the state forward over tokens [from, to).
template <int D, int P, int R>
__device__ void replay(float (&S)[D / P], TokenBlock<D> &b, const float *a, const float *gates, int64_t t0,
                       int64_t from, int64_t to, int64_t C, int64_t H, const int32_t *firstKeys, float *keep,
                       int64_t keepEvery, float *checkpoints, const Lanes<D, P, R> &l) {
  for (int64_t i0 = from; i0 < to; i0 += kTokenBlock) {
    const int count = int(to - i0 < kTokenBlock ? to - i0 : kTokenBlock);
    loadTokens(b, a, gates, nullptr, t0, i0, count, C, H, blockIdx.y);
    for (int tt = 0; tt < count; ++tt) {
      const int64_t i = i0 + tt;
      if (checkpoints && i % keepEvery == 0)
        storeRow<D, P, R>(checkpoints + (i / keepEvery) * R * D, S);
      stepRow<D, P, R>(S, b, tt, i == firstKeyOf(firstKeys, t0 + i), l);
      if (keep)
        storeRow<D, P, R>(keep + (i - from) * R * D, S);
    }
  }
}

/// What the walk back keeps per token and row for the sums over rows that
/// follow it: e = v - u, du, and the row terms of beta's and alpha's
/// gradients.
enum ScanRows { kRowE, kRowDu, kRowBeta, kRowAlpha, kScanRows };

/// Element (block row r, column j) of a state part stored by storeRow.
template <int D, int P, int R> __device__ inline int64_t stateIndex(int r, int j) {
  return int64_t(j / P) * R * P + r * P + j % P;
}

/// The backward scan of one (sequence, head) and the block's rows: the
/// gradient of v (into dA) and the block's sums over its rows of dq, dk and
/// the gates' row terms (into `partials`, added over the row groups by
/// scanReduceKernel). Chunk by chunk, last first: replay the chunk's states
/// from its checkpoint, walk it back carrying dS (each row on its own: no
/// barrier a token, keeping dS and the row terms), then the sums over the
/// block's rows for every token of the chunk at once.
template <int D, int P, int R>
__global__ void __launch_bounds__(R *P)
    scanBackwardKernel(const float *a, const float *gates, const float *dO, float *dA, float *stateScratch,
                       float *partials, int64_t seq, int64_t C, int64_t H, const int32_t *firstKeys, float scale) {
  constexpr int kThreads = R * P, G = D / R;
  __shared__ TokenBlock<D> b;
  const Lanes<D, P, R> l;
  const int64_t t0 = blockIdx.x * seq, h = blockIdx.y, chunk = scanChunk(seq), chunks = (seq + chunk - 1) / chunk;
  const int64_t group = (int64_t(blockIdx.x) * H + h) * G + blockIdx.z;
  float *checkpoints = stateScratch + group * scanStateFloats(seq, D, R);
  float *states = checkpoints + chunks * R * D, *grads = states + chunk * R * D, *carry = grads + chunk * R * D;
  float *rows = carry + R * D; // [token in chunk][kScanRows][R]
  float *partial = partials + group * seq * scanPartialFloats(D);
  float X[D / P]; // the state while replaying, the gradient dS while walking back
#pragma unroll
  for (int jj = 0; jj < l.Q; ++jj)
    X[jj] = 0;
  replay<D, P, R>(X, b, a, gates, t0, 0, seq, C, H, firstKeys, nullptr, chunk, checkpoints, l);
#pragma unroll
  for (int jj = 0; jj < l.Q; ++jj)
    X[jj] = 0;
  storeRow<D, P, R>(carry, X);
  for (int64_t k = chunks - 1; k >= 0; --k) {
    const int64_t from = k * chunk, to = from + chunk < seq ? from + chunk : seq;
    loadRow<D, P, R>(checkpoints + k * R * D, X);
    replay<D, P, R>(X, b, a, gates, t0, from, to, C, H, firstKeys, states, chunk, nullptr, l);
    loadRow<D, P, R>(carry, X);
    for (int64_t hi = to; hi > from; hi -= kTokenBlock) { // tokens [lo, hi), walked back
      const int64_t lo = hi - kTokenBlock > from ? hi - kTokenBlock : from;
      loadTokens(b, a, gates, dO, t0, lo, int(hi - lo), C, H, h);
      for (int64_t i = hi - 1; i >= lo; --i) {
        const int64_t t = t0 + i;
        const int tt = int(i - lo);
        const bool restart = i == firstKeyOf(firstKeys, t);
        const float *prev = restart ? nullptr
                                    : (i > from ? states + (i - from - 1) * R * D : checkpoints + k * R * D) +
                                          threadIdx.x;
        const float al = b.alpha[tt], beta = b.beta[tt], g = b.gO[tt][l.row];
        const float *kk = b.k[tt];
        // o = scale S q: dS += scale gO q^T (dq = scale S^T gO comes after the walk).
#pragma unroll
        for (int jj = 0; jj < l.Q; ++jj)
          X[jj] += scale * g * b.q[tt][l.col(jj)];
        storeRow<D, P, R>(grads + (i - from) * R * D, X);
        // S = al prev + beta e k^T, u = al prev k, e = v - u.
        Dot4 u, dSk;
#pragma unroll
        for (int jj = 0; jj < l.Q; ++jj) {
          u.add(jj, (prev ? al * prev[jj * kThreads] : 0.0f) * kk[l.col(jj)]);
          dSk.add(jj, X[jj] * kk[l.col(jj)]);
        }
        const float rowDSk = rowSum<P>(dSk.sum());
        const float e = b.v[tt][l.row] - rowSum<P>(u.sum()), de = beta * rowDSk, du = -de;
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
          float *mine = rows + (i - from) * kScanRows * R + l.r;
          mine[kRowE * R] = e;
          mine[kRowDu * R] = du;
          mine[kRowBeta * R] = e * rowDSk;
          mine[kRowAlpha * R] = rowDAlpha;
          dA[t * 3 * C + 2 * C + h * D + l.row] = de;
        }
      }
    }
    storeRow<D, P, R>(carry, X);
    __syncthreads(); // the chunk's dS and row terms, from every thread
    // The sums over the block's rows, every token of the chunk: a thread a
    // column (the rows in order), then a thread a token for the gates.
    for (int64_t i0 = from; i0 < to; i0 += kTokenBlock) {
      const int count = int(to - i0 < kTokenBlock ? to - i0 : kTokenBlock);
      loadTokens(b, a, gates, dO, t0, i0, count, C, H, h);
      for (int tt = 0; tt < count; ++tt) {
        const int64_t i = i0 + tt;
        const bool restart = i == firstKeyOf(firstKeys, t0 + i);
        const float *S = states + (i - from) * R * D, *Gr = grads + (i - from) * R * D;
        const float *prev = restart ? nullptr : i > from ? S - R * D : checkpoints + k * R * D;
        const float *row = rows + (i - from) * kScanRows * R;
        const float al = b.alpha[tt], beta = b.beta[tt];
        for (int c = threadIdx.x; c < D; c += kThreads) {
          Dot4 dq, dk;
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const int64_t at = stateIndex<D, P, R>(r, c);
            dq.add(r, S[at] * b.gO[tt][blockIdx.z * R + r]);
            dk.add(r, beta * Gr[at] * row[kRowE * R + r] + (prev ? al * prev[at] : 0.0f) * row[kRowDu * R + r]);
          }
          partial[i * scanPartialFloats(D) + c] = dq.sum();
          partial[i * scanPartialFloats(D) + D + c] = dk.sum();
        }
      }
      for (int tt = threadIdx.x; tt < count; tt += kThreads) {
        const int64_t i = i0 + tt;
        const float *row = rows + (i - from) * kScanRows * R;
        Dot4 sumBeta, sumAlpha;
        for (int r = 0; r < R; ++r) {
          sumBeta.add(r, row[kRowBeta * R + r]);
          sumAlpha.add(r, row[kRowAlpha * R + r]);
        }
        partial[i * scanPartialFloats(D) + 2 * D] = sumBeta.sum();
        partial[i * scanPartialFloats(D) + 2 * D + 1] = sumAlpha.sum();
      }
    }
  }
}

/// The row groups' sums added in group order, one block a (token, head):
/// dq and dk into dA, beta's and alpha's gradients.
template <int D>
__global__ void __launch_bounds__(D) scanReduceKernel(const float *partials, const float *gates, float *dA,
                                                      float *dAb, float *dLogAlpha, int64_t seq, int64_t C, int64_t H,
                                                      float scale) {
  constexpr int G = D / groupRows<D>();
  const int64_t t = blockIdx.x, h = blockIdx.y, b = t / seq, i = t % seq;
  const int c = threadIdx.x;
  const float *part = partials + (b * H + h) * G * seq * scanPartialFloats(D) + i * scanPartialFloats(D);
  const int64_t stride = seq * scanPartialFloats(D); // from one group's partials to the next
  float dq = part[c], dk = part[D + c];
  for (int g = 1; g < G; ++g) {
    dq += part[g * stride + c];
    dk += part[g * stride + D + c];
  }
  dA[t * 3 * C + h * D + c] = scale * dq;
  dA[t * 3 * C + C + h * D + c] = dk;
  if (c == 0) {
    float sumBeta = part[2 * D], sumAlpha = part[2 * D + 1];
    for (int g = 1; g < G; ++g) {
      sumBeta += part[g * stride + 2 * D];
      sumAlpha += part[g * stride + 2 * D + 1];
    }
    const float alpha = gates[t * 2 * H + h], beta = gates[t * 2 * H + H + h];
    dAb[t * 2 * H + h] = sumBeta * beta * (1.0f - beta);
    dLogAlpha[t * H + h] = sumAlpha * alpha;
  }
}

/// The partials follow the states in the backward's scratch.
int64_t scanStatesOnly(int64_t rows, int64_t d, int64_t H, int64_t seq) {
  return (rows / seq) * H * (d / (d < kGroupRows ? d : kGroupRows)) *
         scanStateFloats(seq, d, d < kGroupRows ? d : kGroupRows);
}

template <int D, int P>
void launchScans(bool backward, const float *a, const float *gates, const float *dO, float *o, float *dA,
                 float *dAb, float *dLogAlpha, float *states, int64_t rows, int64_t C, int64_t H, int64_t seq,
                 const int32_t *firstKeys, cudaStream_t s) {
  // The forward keeps one block a (sequence, head): its token loop is
  // latency-bound, and 16 warps on an SM hide more of it than 2 (hybrid_1b,
  // S = 4096: 4.4 ms a layer, 5.4 split in groups of 16 rows).
  const float scale = 1.0f / sqrtf(float(D));
  if (!backward) {
    scanForwardKernel<D, P, D><<<dim3(unsigned(rows / seq), unsigned(H)), D * P, 0, s>>>(a, gates, o, seq, C, H,
                                                                                         firstKeys, scale);
    return;
  }
  constexpr int R = groupRows<D>();
  const dim3 grid(unsigned(rows / seq), unsigned(H), unsigned(D / R));
  float *partials = states + scanStatesOnly(rows, D, H, seq);
  scanBackwardKernel<D, P, R><<<grid, R * P, 0, s>>>(a, gates, dO, dA, states, partials, seq, C, H, firstKeys,
                                                      scale);
  scanReduceKernel<D><<<dim3(unsigned(rows), unsigned(H)), D, 0, s>>>(partials, gates, dA, dAb, dLogAlpha, seq, C,
                                                                       H, scale);
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
  const int64_t d = C / H, groups = d / (d < kGroupRows ? d : kGroupRows);
  return scanStatesOnly(rows, d, H, seq) + rows * H * groups * scanPartialFloats(d);
}

} // namespace mhcc::runtime::cuda
