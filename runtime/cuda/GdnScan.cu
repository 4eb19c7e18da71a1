//===- GdnScan.cu - the Gated DeltaNet recurrence on the GPU --------------===//
//
// GdnScan.h's scans, over chunks of kChunk tokens that run in parallel. A
// token's step is affine in the state: S_t = S_{t-1} M_t + beta_t v_t k_t^T
// with M_t = alpha_t (I - beta_t k_t k_t^T) (0 where a document starts), so
// a chunk maps the state at its start to S A_c + B_c. Forward: every chunk
// computes its A_c (the recurrence run on the identity, v = 0) and B_c (run
// from zero) at once; a scan over the chunks, in order, gives each chunk's
// starting state (a product of D x D matrices a chunk, not D tokens' chain);
// then every chunk runs its tokens from that state for the outputs. The
// backward is the same shape: dS flows back through a chunk as dS A_c^T +
// D_c (M_t is symmetric; D_c, the chunk's own output gradients walked back
// from zero, needs no states), so a reverse scan gives each chunk's dS at
// its end, and every chunk replays its states from its start and walks back
// from its end at once, in waves that bound the scratch. Within a chunk the
// tokens run in order, each state row in the registers of 4 threads (Lanes;
// MHCC_GDN_LANES=1: one thread a row), 8 tokens' inputs staged in shared
// memory at a time; rows are independent, so blocks take 16 rows each.
// Deterministic by construction: every sum has one writer and a fixed
// order, no atomics, and no result depends on the waves. Since session 15
// the WY form (GdnWy.cu: products over each chunk, no token's state stored)
// runs by default, 1.86x these scans on hybrid_1b; these stay as the
// comparison path (MHCC_GDN_SCAN=affine), tested like it.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/GdnScan.h"
#include "runtime/cuda/DeviceKernels.h"

#include <cuda_runtime.h>

#include <cstdlib>

namespace mhcc::runtime::cuda {
namespace {

/// Rows of the state one block holds: the rows of the recurrence are
/// independent (row r needs only its own past, k, v[r] and the gates), so a
/// (sequence, head, chunk) is split over D / rowsPerGroup(D) blocks (one
/// block a (sequence, head) left 116 of 132 SMs idle at 16 heads, session 11).
constexpr int kGroupRows = 16;
__host__ __device__ constexpr int rowsPerGroup(int64_t d) { return d < kGroupRows ? int(d) : kGroupRows; }
/// Tokens a chunk. The chunk's serial chain and the scan's D x D products
/// a chunk (D^3 / kChunk a token) balance near D / 2.
constexpr int kChunk = 64;
__host__ __device__ inline int64_t chunksOf(int64_t seq) { return (seq + kChunk - 1) / kChunk; }

/// The scans' threads: P to a state row, R rows a block (its group: rows
/// blockIdx.z R ..). Thread t holds the block's row r = t / P, columns
/// j = jj P + p (jj < Q = D / P) with p = t % P: interleaved, so a warp's
/// reads of k or q spread over the shared-memory banks.
template <int D, int P, int R> struct Lanes {
  static constexpr int Q = D / P;
  int r, p, row; // the block's row, the lane, the state row
  __device__ explicit Lanes(int group)
      : r(int(threadIdx.x) / P), p(int(threadIdx.x) % P), row(group * R + int(threadIdx.x) / P) {}
  __device__ int col(int jj) const { return jj * P + p; }
};

/// Tokens of the block's (sequence, head) in shared memory: q, k, v (and,
/// with kGrad, the output gradient) and the gates of up to kTokenBlock
/// consecutive tokens, loaded together: one trip to memory for all of them,
/// where a token at a time left the scans waiting on every load. Shared
/// memory bounds the blocks an SM holds (8 tokens: 13 of the backward's, 16
/// tokens: 6; hybrid_1b's backward scan 12.0 -> 5.5 ms a layer), and the
/// kernels that read no gradient leave its rows out.
constexpr int kTokenBlock = 8;
template <int D, bool kGrad> struct TokenBlock {
  float q[kTokenBlock][D], k[kTokenBlock][D], v[kTokenBlock][D], gO[kGrad ? kTokenBlock : 1][D];
  float alpha[kTokenBlock], beta[kTokenBlock];
};

/// Loads tokens t0 + first .. + count into `b` between two barriers (the
/// first lets the block finish reading what it held).
template <int D, bool kGrad>
__device__ inline void loadTokens(TokenBlock<D, kGrad> &b, const float *a, const float *gates, const float *dO,
                                  int64_t t0, int64_t first, int count, int64_t C, int64_t H, int64_t h) {
  __syncthreads();
  for (int idx = threadIdx.x; idx < count * D; idx += blockDim.x) {
    const int tt = idx / D, e = idx % D;
    const int64_t t = t0 + first + tt;
    const float *row = a + t * 3 * C + h * D;
    b.q[tt][e] = row[e];
    b.k[tt][e] = row[C + e];
    b.v[tt][e] = row[2 * C + e];
    if constexpr (kGrad)
      if (dO) // the backward's replay loads no gradient
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
/// S = alpha S (I - beta k k^T) + beta v k^T, row-wise as gdnScan does it
/// (`v`: the row's value, v[l.row], or 0 for a chunk's transition rows).
template <int D, int P, int R, bool kGrad>
__device__ inline void stepRow(float (&S)[D / P], const TokenBlock<D, kGrad> &b, int tt, bool restart,
                               const Lanes<D, P, R> &l, float v) {
  const float alpha = b.alpha[tt], beta = b.beta[tt];
  const float *k = b.k[tt];
  Dot4 dot;
#pragma unroll
  for (int jj = 0; jj < l.Q; ++jj) {
    S[jj] = restart ? 0.0f : S[jj] * alpha;
    dot.add(jj, S[jj] * k[l.col(jj)]);
  }
  const float e = beta * (v - rowSum<P>(dot.sum()));
#pragma unroll
  for (int jj = 0; jj < l.Q; ++jj)
    S[jj] += e * k[l.col(jj)];
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
    S[jj] = base[jj * R * P + threadIdx.x];
}
/// Element (block row r, column j) of a state part stored by storeRow.
template <int D, int P, int R> __host__ __device__ inline int64_t stateIndex(int r, int j) {
  return int64_t(j / P) * R * P + r * P + j % P;
}

/// What the walk back keeps per token and row for the sums over rows that
/// follow it: e = v - u, du, and the row terms of beta's and alpha's
/// gradients.
enum ScanRows { kRowE, kRowDu, kRowBeta, kRowAlpha, kScanRows };

/// Per (sequence, head, row group) and token: the group's sums over its rows
/// of dq and dk (d each), then of beta's and alpha's row terms.
__host__ __device__ inline int64_t scanPartialFloats(int64_t d) { return 2 * d + 2; }

/// The backward's scratch for chunks in flight at once is bounded (2 GiB:
/// hybrid_1b's 64 chunks of 16 heads, 136 MB a chunk, run in waves of 13,
/// the blocks an H200 holds at once; 1 GiB, waves of 7, measured 0.7 ms a
/// layer slower and 1 GB lighter at its peak).
constexpr int64_t kWaveBudgetFloats = int64_t(512) << 20;

/// Where the scans keep their state in scratch: the chunks' transitions
/// (A_c then B_c, D x D row-major each) by (sequence, head, chunk); each
/// row group's R x D state at every chunk's start (storeRow's layout) by
/// (sequence, head, group, chunk); backward also the state gradient at
/// every chunk's end, one wave's slots (a chunk's replayed states, dS and
/// row terms) and the partial sums over rows by (sequence, head, group, token).
struct ScanLayout {
  int64_t seqs, H, D, R, G, chunks, wave;
  ScanLayout(int64_t rows, int64_t C, int64_t heads, int64_t seq)
      : seqs(rows / seq), H(heads), D(C / heads), R(rowsPerGroup(C / heads)), G(D / R), chunks(chunksOf(seq)),
        wave(1) {
    const int64_t perChunk = seqs * H * G * slotFloats();
    wave = kWaveBudgetFloats / perChunk < 1 ? 1 : kWaveBudgetFloats / perChunk;
    wave = wave > chunks ? chunks : wave;
  }
  int64_t transFloats() const { return seqs * H * chunks * 2 * D * D; }
  int64_t stateFloats() const { return seqs * H * G * chunks * R * D; }
  int64_t slotFloats() const { return 2 * int64_t(kChunk) * R * D + int64_t(kScanRows) * kChunk * R; }
  int64_t forwardFloats() const { return transFloats() + stateFloats(); }
  int64_t backwardFloats(int64_t rows) const {
    return transFloats() + 2 * stateFloats() + wave * seqs * H * G * slotFloats() +
           rows * H * G * scanPartialFloats(D);
  }
  float *checkpoints(float *base) const { return base + transFloats(); }
  float *carries(float *base) const { return checkpoints(base) + stateFloats(); }
  float *slots(float *base) const { return carries(base) + stateFloats(); }
  float *partials(float *base) const { return slots(base) + wave * seqs * H * G * slotFloats(); }
};

/// Rows a block of chunkTransitionKernel.
constexpr int kTransitionRows = 64;

/// Where a row group's R x D state at a chunk (a checkpoint, a carry) starts:
/// by (sequence, head, row group, chunk).
template <int D, int R>
__device__ inline int64_t stateSlot(int64_t seqIdx, int64_t h, int64_t group, int64_t chunk, int64_t H,
                                    int64_t chunks) {
  return (((seqIdx * H + h) * (D / R) + group) * chunks + chunk) * R * D;
}

/// The block's chunk of its sequence: blockIdx.x = sequence x chunks + chunk.
struct ChunkOf {
  int64_t seqIdx, chunk, from, to, t0;
  __device__ ChunkOf(int64_t seq, int64_t blockChunk) {
    const int64_t chunks = chunksOf(seq);
    seqIdx = blockChunk / chunks;
    chunk = blockChunk % chunks;
    from = chunk * kChunk;
    to = from + kChunk < seq ? from + kChunk : seq;
    t0 = seqIdx * seq;
  }
};

/// A chunk's transition: rows z < G of the grid run the recurrence on the
/// identity with v = 0 (A_c: where the chunk takes the state it starts from),
/// the others from zero with the chunk's values (B_c). A document starting
/// in the chunk zeroes A_c's rows, as it forgets the state. Its R rows a
/// block are its own (it writes plain row-major matrices): more than the
/// other kernels', for more warps an SM under the shared-memory bound.
template <int D, int P, int R>
__global__ void __launch_bounds__(R *P) chunkTransitionKernel(const float *a, const float *gates, float *trans,
                                                              int64_t seq, int64_t C, int64_t H,
                                                              const int32_t *firstKeys) {
  constexpr int G = D / R;
  __shared__ TokenBlock<D, false> b;
  const bool identity = int(blockIdx.z) < G;
  const Lanes<D, P, R> l(int(blockIdx.z) % G);
  const ChunkOf c(seq, blockIdx.x);
  const int64_t h = blockIdx.y;
  float S[D / P];
#pragma unroll
  for (int jj = 0; jj < l.Q; ++jj)
    S[jj] = identity && l.col(jj) == l.row ? 1.0f : 0.0f;
  for (int64_t i0 = c.from; i0 < c.to; i0 += kTokenBlock) {
    const int count = int(c.to - i0 < kTokenBlock ? c.to - i0 : kTokenBlock);
    loadTokens(b, a, gates, nullptr, c.t0, i0, count, C, H, h);
    for (int tt = 0; tt < count; ++tt) {
      const int64_t i = i0 + tt;
      stepRow<D, P, R>(S, b, tt, i == firstKeyOf(firstKeys, c.t0 + i), l, identity ? 0.0f : b.v[tt][l.row]);
    }
  }
  float *out = trans + ((c.seqIdx * H + h) * chunksOf(seq) + c.chunk) * 2 * D * D + (identity ? 0 : D * D) +
               int64_t(l.row) * D;
#pragma unroll
  for (int jj = 0; jj < l.Q; ++jj)
    out[l.col(jj)] = S[jj];
}

/// The scan over a (sequence, head, row group)'s chunks, the block's R rows
/// X in shared memory (zero at the start). Forward, in order: the state at
/// each chunk's start is stored, then X = X A_c + B_c. Reverse (the
/// backward), last chunk first: the slot holds D_c and gets the state
/// gradient at the chunk's end, then X = X A_c^T + D_c. Sums over m in
/// order (Dot4); A_c staged in shared memory, rows padded by one float; a
/// thread an output or two (the chain of chunks is the kernel's latency).
template <int D, int P, int R> constexpr int scanThreads() { return R * D < 1024 ? R * D : 1024; }
template <int D, int P, int R> constexpr int scanSmemBytes() { return (R * D + D * (D + 1)) * 4; }
template <int D, int P, int R, bool kReverse>
__global__ void __launch_bounds__(scanThreads<D, P, R>()) chunkScanKernel(const float *trans, float *states,
                                                                          int64_t seq, int64_t H) {
  constexpr int T = scanThreads<D, P, R>(), kPer = R * D / T;
  extern __shared__ float smem[];
  float *X = smem, *M = smem + R * D;
  const int64_t chunks = chunksOf(seq), h = blockIdx.y, g = blockIdx.z;
  float *slots = states + stateSlot<D, R>(blockIdx.x, h, g, 0, H, chunks);
  for (int e = threadIdx.x; e < R * D; e += T)
    X[e] = 0.0f;
  for (int64_t step = 0; step < chunks; ++step) {
    const int64_t c = kReverse ? chunks - 1 - step : step;
    float *slot = slots + c * R * D;
    const float *A = trans + ((int64_t(blockIdx.x) * H + h) * chunks + c) * 2 * D * D, *B = A + D * D;
    __syncthreads(); // X's last update is in, M's last readers are done
    for (int e = threadIdx.x; e < D * D; e += T) // M[m][j]: A_c, or (reverse) A_c^T
      M[kReverse ? (e % D) * (D + 1) + e / D : (e / D) * (D + 1) + e % D] = A[e];
    float add[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int o = threadIdx.x + k * T, r = o / D, j = o % D;
      const int64_t at = stateIndex<D, P, R>(r, j);
      if (kReverse) {
        add[k] = slot[at];
        slot[at] = X[o];
      } else {
        slot[at] = X[o];
        add[k] = B[(g * R + r) * D + j];
      }
    }
    __syncthreads();
    float next[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int o = threadIdx.x + k * T, r = o / D, j = o % D;
      Dot4 acc;
      for (int m = 0; m < D; ++m)
        acc.add(m, X[r * D + m] * M[m * (D + 1) + j]);
      next[k] = acc.sum() + add[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kPer; ++k)
      X[threadIdx.x + k * T] = next[k];
  }
}

/// The forward's outputs, every chunk at once from its starting state:
/// o = scale S_t q_t for the block's rows.
template <int D, int P, int R>
__global__ void __launch_bounds__(R *P) chunkOutputKernel(const float *a, const float *gates, const float *checkpoints,
                                                          float *o, int64_t seq, int64_t C, int64_t H,
                                                          const int32_t *firstKeys, float scale) {
  __shared__ TokenBlock<D, false> b;
  const Lanes<D, P, R> l(int(blockIdx.z));
  const ChunkOf c(seq, blockIdx.x);
  const int64_t h = blockIdx.y, chunks = chunksOf(seq);
  float S[D / P];
  loadRow<D, P, R>(checkpoints + stateSlot<D, R>(c.seqIdx, h, blockIdx.z, c.chunk, H, chunks), S);
  for (int64_t i0 = c.from; i0 < c.to; i0 += kTokenBlock) {
    const int count = int(c.to - i0 < kTokenBlock ? c.to - i0 : kTokenBlock);
    loadTokens(b, a, gates, nullptr, c.t0, i0, count, C, H, h);
    for (int tt = 0; tt < count; ++tt) {
      const int64_t i = i0 + tt;
      stepRow<D, P, R>(S, b, tt, i == firstKeyOf(firstKeys, c.t0 + i), l, b.v[tt][l.row]);
      Dot4 out;
#pragma unroll
      for (int jj = 0; jj < l.Q; ++jj)
        out.add(jj, S[jj] * b.q[tt][l.col(jj)]);
      const float sum = rowSum<P>(out.sum());
      if (l.p == 0)
        o[(c.t0 + i) * C + h * D + l.row] = sum * scale;
    }
  }
}

/// One token of the walk back on this thread's part of dS (X): the output's
/// term scale gO q^T in, then through the step's M_t (0 at a document's
/// start). Returns rowDSk = dS k (before M_t) for the caller's terms.
template <int D, int P, int R>
__device__ inline float walkBack(float (&X)[D / P], const TokenBlock<D, true> &b, int tt, bool restart, float scale,
                                 const Lanes<D, P, R> &l) {
  const float al = b.alpha[tt], beta = b.beta[tt], g = b.gO[tt][l.row];
  const float *kk = b.k[tt];
#pragma unroll
  for (int jj = 0; jj < l.Q; ++jj)
    X[jj] += scale * g * b.q[tt][l.col(jj)];
  Dot4 dSk;
#pragma unroll
  for (int jj = 0; jj < l.Q; ++jj)
    dSk.add(jj, X[jj] * kk[l.col(jj)]);
  return rowSum<P>(dSk.sum());
}

/// D_c, every chunk at once: its outputs' gradients walked back from dS = 0
/// at its end (no states needed), into the carries' slots for the reverse scan.
template <int D, int P, int R>
__global__ void __launch_bounds__(R *P) chunkGradKernel(const float *a, const float *gates, const float *dO,
                                                        float *carries, int64_t seq, int64_t C, int64_t H,
                                                        const int32_t *firstKeys, float scale) {
  __shared__ TokenBlock<D, true> b;
  const Lanes<D, P, R> l(int(blockIdx.z));
  const ChunkOf c(seq, blockIdx.x);
  const int64_t h = blockIdx.y, chunks = chunksOf(seq);
  float X[D / P];
#pragma unroll
  for (int jj = 0; jj < l.Q; ++jj)
    X[jj] = 0.0f;
  for (int64_t hi = c.to; hi > c.from; hi -= kTokenBlock) {
    const int64_t lo = hi - kTokenBlock > c.from ? hi - kTokenBlock : c.from;
    loadTokens(b, a, gates, dO, c.t0, lo, int(hi - lo), C, H, h);
    for (int64_t i = hi - 1; i >= lo; --i) {
      const int tt = int(i - lo);
      const bool restart = i == firstKeyOf(firstKeys, c.t0 + i);
      const float du = -b.beta[tt] * walkBack<D, P, R>(X, b, tt, restart, scale, l);
#pragma unroll
      for (int jj = 0; jj < l.Q; ++jj)
        X[jj] = restart ? 0.0f : b.alpha[tt] * (X[jj] + du * b.k[tt][l.col(jj)]);
    }
  }
  storeRow<D, P, R>(carries + stateSlot<D, R>(c.seqIdx, h, blockIdx.z, c.chunk, H, chunks), X);
}

/// Runs the block's rows of the state over tokens [from, to), keeping the
/// state after each token at keep + (i - from) R D (storeRow's layout).
template <int D, int P, int R>
__device__ void replay(float (&S)[D / P], TokenBlock<D, true> &b, const float *a, const float *gates, int64_t t0,
                       int64_t from, int64_t to, int64_t C, int64_t H, const int32_t *firstKeys, float *keep,
                       const Lanes<D, P, R> &l) {
  for (int64_t i0 = from; i0 < to; i0 += kTokenBlock) {
    const int count = int(to - i0 < kTokenBlock ? to - i0 : kTokenBlock);
    loadTokens(b, a, gates, nullptr, t0, i0, count, C, H, blockIdx.y);
    for (int tt = 0; tt < count; ++tt) {
      const int64_t i = i0 + tt;
      stepRow<D, P, R>(S, b, tt, i == firstKeyOf(firstKeys, t0 + i), l, b.v[tt][l.row]);
      storeRow<D, P, R>(keep + (i - from) * R * D, S);
    }
  }
}

/// The backward of one chunk of a (sequence, head) and the block's rows,
/// every chunk of the wave at once (blockIdx.x = sequence x wave + chunk -
/// first): replay the chunk's states from its start into the block's slot,
/// walk it back from the state gradient at its end (each row on its own: no
/// barrier a token), keeping dS and the row terms; then the sums over the
/// block's rows for every token of the chunk (into `partials`, added over
/// the row groups by scanReduceKernel) and the gradient of v (into dA).
template <int D, int P, int R>
__global__ void __launch_bounds__(R *P)
    scanBackwardKernel(const float *a, const float *gates, const float *dO, float *dA, const float *checkpoints,
                       const float *carries, float *slots, int64_t slotFloats, float *partials, int64_t seq,
                       int64_t C, int64_t H, const int32_t *firstKeys, float scale, int64_t firstChunk,
                       int64_t wave) {
  constexpr int kThreads = R * P, G = D / R;
  __shared__ TokenBlock<D, true> b;
  const Lanes<D, P, R> l(int(blockIdx.z));
  const int64_t chunks = chunksOf(seq), k = firstChunk + blockIdx.x % wave;
  if (k >= chunks)
    return;
  const ChunkOf c(seq, blockIdx.x / wave * chunks + k);
  const int64_t h = blockIdx.y, from = c.from, to = c.to;
  const int64_t group = (c.seqIdx * H + h) * G + blockIdx.z;
  const float *start = checkpoints + stateSlot<D, R>(c.seqIdx, h, blockIdx.z, k, H, chunks);
  float *states = slots + ((int64_t(blockIdx.x) * H + h) * G + blockIdx.z) * slotFloats;
  float *grads = states + kChunk * R * D, *rows = grads + kChunk * R * D; // rows: [token in chunk][kScanRows][R]
  float *partial = partials + group * seq * scanPartialFloats(D);
  float X[D / P]; // the state while replaying, the gradient dS while walking back
  loadRow<D, P, R>(start, X);
  replay<D, P, R>(X, b, a, gates, c.t0, from, to, C, H, firstKeys, states, l);
  loadRow<D, P, R>(carries + stateSlot<D, R>(c.seqIdx, h, blockIdx.z, k, H, chunks), X);
  for (int64_t hi = to; hi > from; hi -= kTokenBlock) { // tokens [lo, hi), walked back
    const int64_t lo = hi - kTokenBlock > from ? hi - kTokenBlock : from;
    loadTokens(b, a, gates, dO, c.t0, lo, int(hi - lo), C, H, h);
    for (int64_t i = hi - 1; i >= lo; --i) {
      const int64_t t = c.t0 + i;
      const int tt = int(i - lo);
      const bool restart = i == firstKeyOf(firstKeys, t);
      const float *prev =
          restart ? nullptr : (i > from ? states + (i - from - 1) * R * D : start) + threadIdx.x;
      const float al = b.alpha[tt], beta = b.beta[tt];
      const float *kk = b.k[tt];
      // o = scale S q: dS += scale gO q^T (dq = scale S^T gO comes after the walk).
      const float rowDSk = walkBack<D, P, R>(X, b, tt, restart, scale, l);
      storeRow<D, P, R>(grads + (i - from) * R * D, X);
      // S = al prev + beta e k^T, u = al prev k, e = v - u.
      Dot4 u;
#pragma unroll
      for (int jj = 0; jj < l.Q; ++jj)
        u.add(jj, (prev ? al * prev[jj * kThreads] : 0.0f) * kk[l.col(jj)]);
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
  __syncthreads(); // the chunk's dS and row terms, from every thread
  // The sums over the block's rows, every token of the chunk: a thread a
  // column (the rows in order), then a thread a token for the gates.
  for (int64_t i0 = from; i0 < to; i0 += kTokenBlock) {
    const int count = int(to - i0 < kTokenBlock ? to - i0 : kTokenBlock);
    loadTokens(b, a, gates, dO, c.t0, i0, count, C, H, h);
    for (int tt = 0; tt < count; ++tt) {
      const int64_t i = i0 + tt;
      const bool restart = i == firstKeyOf(firstKeys, c.t0 + i);
      const float *S = states + (i - from) * R * D, *Gr = grads + (i - from) * R * D;
      const float *prev = restart ? nullptr : i > from ? S - R * D : start;
      const float *row = rows + (i - from) * kScanRows * R;
      const float al = b.alpha[tt], beta = b.beta[tt];
      for (int col = threadIdx.x; col < D; col += kThreads) {
        Dot4 dq, dk;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const int64_t at = stateIndex<D, P, R>(r, col);
          dq.add(r, S[at] * b.gO[tt][blockIdx.z * R + r]);
          dk.add(r, beta * Gr[at] * row[kRowE * R + r] + (prev ? al * prev[at] : 0.0f) * row[kRowDu * R + r]);
        }
        partial[i * scanPartialFloats(D) + col] = dq.sum();
        partial[i * scanPartialFloats(D) + D + col] = dk.sum();
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

/// The row groups' sums added in group order, one block a (token, head):
/// dq and dk into dA, beta's and alpha's gradients.
template <int D>
__global__ void __launch_bounds__(D) scanReduceKernel(const float *partials, const float *gates, float *dA,
                                                      float *dAb, float *dLogAlpha, int64_t seq, int64_t C, int64_t H,
                                                      float scale) {
  constexpr int G = D / rowsPerGroup(D);
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

/// The transitions and the forward scan: every chunk's starting state in
/// the checkpoints (both passes begin with them).
template <int D, int P>
void startingStates(const ScanLayout &L, const float *a, const float *gates, float *scratch, int64_t C, int64_t seq,
                    const int32_t *firstKeys, cudaStream_t s) {
  constexpr int R = rowsPerGroup(D), G = D / R, RT = D < kTransitionRows ? D : kTransitionRows;
  const unsigned seqChunks = unsigned(L.seqs * L.chunks), heads = unsigned(L.H);
  chunkTransitionKernel<D, P, RT><<<dim3(seqChunks, heads, 2 * (D / RT)), RT * P, 0, s>>>(a, gates, scratch, seq,
                                                                                          C, L.H, firstKeys);
  chunkScanKernel<D, P, R, false><<<dim3(unsigned(L.seqs), heads, G), scanThreads<D, P, R>(),
                                    scanSmemBytes<D, P, R>(), s>>>(scratch, L.checkpoints(scratch), seq, L.H);
}

template <int D, int P>
void launchScans(bool backward, const float *a, const float *gates, const float *dO, float *o, float *dA,
                 float *dAb, float *dLogAlpha, float *scratch, int64_t rows, int64_t C, int64_t H, int64_t seq,
                 const int32_t *firstKeys, cudaStream_t s) {
  constexpr int R = rowsPerGroup(D), G = D / R;
  const ScanLayout L(rows, C, H, seq);
  const float scale = 1.0f / sqrtf(float(D));
  const unsigned seqChunks = unsigned(L.seqs * L.chunks), heads = unsigned(H);
  cudaFuncSetAttribute(chunkScanKernel<D, P, R, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       scanSmemBytes<D, P, R>());
  cudaFuncSetAttribute(chunkScanKernel<D, P, R, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       scanSmemBytes<D, P, R>());
  startingStates<D, P>(L, a, gates, scratch, C, seq, firstKeys, s);
  if (!backward) {
    chunkOutputKernel<D, P, R><<<dim3(seqChunks, heads, G), R * P, 0, s>>>(a, gates, L.checkpoints(scratch), o, seq,
                                                                          C, H, firstKeys, scale);
    return;
  }
  float *carries = L.carries(scratch), *partials = L.partials(scratch);
  chunkGradKernel<D, P, R><<<dim3(seqChunks, heads, G), R * P, 0, s>>>(a, gates, dO, carries, seq, C, H, firstKeys,
                                                                      scale);
  chunkScanKernel<D, P, R, true><<<dim3(unsigned(L.seqs), heads, G), scanThreads<D, P, R>(),
                                   scanSmemBytes<D, P, R>(), s>>>(scratch, carries, seq, H);
  // A wave no larger than the blocks the GPU holds at once (a second round
  // of blocks would run after the first, as another wave would), nor than
  // the scratch holds; the results do not depend on it.
  int perSm = 0, sms = 0, device = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, scanBackwardKernel<D, P, R>, R * P, 0);
  const int64_t resident = int64_t(perSm) * sms / (L.seqs * H * G);
  const int64_t wave = resident < 1 ? 1 : resident < L.wave ? resident : L.wave;
  for (int64_t first = 0; first < L.chunks; first += wave)
    scanBackwardKernel<D, P, R><<<dim3(unsigned(L.seqs * wave), heads, G), R * P, 0, s>>>(
        a, gates, dO, dA, L.checkpoints(scratch), carries, L.slots(scratch), L.slotFloats(), partials, seq, C, H,
        firstKeys, scale, first, wave);
  scanReduceKernel<D><<<dim3(unsigned(rows), heads), D, 0, s>>>(partials, gates, dA, dAb, dLogAlpha, seq, C, H,
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

/// Which form runs the scans: the WY products (GdnWy.cu), or with
/// MHCC_GDN_SCAN=affine the chunks' affine maps here (for comparisons).
bool affineScans() {
  const char *form = std::getenv("MHCC_GDN_SCAN");
  return form && std::string(form) == "affine";
}

} // namespace

std::string gdnScans(bool backward, const float *a, const float *gates, const float *dO, float *o, float *dA,
                     float *dAb, float *dLogAlpha, float *scratch, int64_t rows, int64_t C, int64_t H, int64_t seq,
                     const int32_t *firstKeys, cudaStream_t s) {
  if (!affineScans())
    return gdnWyScans(backward, a, gates, dO, o, dA, dAb, dLogAlpha, scratch, rows, C, H, seq, firstKeys, s);
  const int64_t d = C / H;
  const ScanLaunch launch = scanLanes() == 1 ? scanFor<1>(d) : scanFor<4>(d);
  if (!launch)
    return gdnHeadDimError(d);
  launch(backward, a, gates, dO, o, dA, dAb, dLogAlpha, scratch, rows, C, H, seq, firstKeys, s);
  return lastError("gated_delta_net scan");
}

int64_t gdnScanScratchFloats(bool backward, int64_t rows, int64_t C, int64_t H, int64_t seq) {
  if (!affineScans())
    return gdnWyScratchFloats(backward, rows, C, H, seq);
  const ScanLayout L(rows, C, H, seq);
  return backward ? L.backwardFloats(rows) : L.forwardFloats();
}

} // namespace mhcc::runtime::cuda
