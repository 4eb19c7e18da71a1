//===- GdnWyBlock.cuh - a thread block's building blocks for GdnWy.cu -*- CUDA -*-===//
//
// What the WY-form kernels (GdnWy.cu) compute with inside a block: the chunk
// a block owns and its gates (the gate table wyGatesKernel writes), padded
// shared-memory matrices filled by float4 loads issued together, products on
// 4 x 4 register tiles with a fixed order of summation, row sums over eight
// lanes, and the inverse of a unit lower-triangular chunk matrix. Included
// only by GdnWy.cu (nvcc).
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CUDA_GDNWYBLOCK_CUH
#define MHCC_RUNTIME_CUDA_GDNWYBLOCK_CUH

#include "runtime/cuda/GdnScan.h"

#include <cuda_runtime.h>

namespace mhcc::runtime::cuda::wy {

constexpr int kChunk = 64;    // tokens a chunk: L
constexpr int kThreads = 512; // every kernel's block (16 warps: the products wait on shared memory)
constexpr int kRows = 16;     // state rows a block of the chains over chunks
constexpr float kMinLogDecay = -80.0f; // exp(-80) is 0 beside fp32 sums; keeps g finite where alpha underflowed

__host__ __device__ constexpr int rowsOf(int d) { return d < kRows ? d : kRows; }
__host__ __device__ inline int64_t chunksOf(int64_t seq) { return (seq + kChunk - 1) / kChunk; }
/// A shared-memory matrix of `cols` columns is stored with cols + 1 floats a row: row and column walks both
/// spread over the banks.
__host__ __device__ constexpr int padded(int cols) { return cols + 1; }
template <int Cols> constexpr int matFloats(int rows) { return rows * padded(Cols); }

/// The chunk's gates (GdnScan.h: alpha, then beta, per token and head), in shared memory; tokens past the
/// sequence are padding (k = v = q = 0, beta 0, alpha 1): they change nothing.
struct ChunkGates {
  float g[kChunk], gam[kChunk], rho[kChunk], beta[kChunk];
  int seg[kChunk];
  bool reset[kChunk];
  float gamEnd;
  __device__ float decay(int r, int i) const { // Gam[r][i]
    return r >= i && seg[r] == seg[i] ? expf(g[r] - g[i]) : 0.0f;
  }
};

/// Where a block's chunk sits: blockIdx.x = sequence x chunks + chunk (or the chunk given).
struct Chunk {
  int64_t seqIdx, index, from, t0;
  int n; // tokens in the chunk (<= kChunk)
  __device__ Chunk(int64_t seq, int64_t seqIdx_, int64_t chunk)
      : seqIdx(seqIdx_), index(chunk), from(chunk * kChunk), t0(seqIdx_ * seq),
        n(int(seq - chunk * kChunk < kChunk ? seq - chunk * kChunk : kChunk)) {}
  __device__ int64_t token(int r) const { return t0 + from + r; }
};
__device__ inline Chunk blockChunk(int64_t seq) {
  const int64_t chunks = chunksOf(seq);
  return Chunk(seq, int64_t(blockIdx.x) / chunks, int64_t(blockIdx.x) % chunks);
}

/// The gate table: per (sequence x chunk, head), kGateRows rows of kChunk floats (g, gam, rho, beta, the
/// document index within the chunk, 1 where a document starts), written once by wyGatesKernel and read by every
/// kernel after it: a prefix over the chunk is a serial chain that no kernel should wait on per chunk.
enum GateRow { kRowG, kRowGam, kRowRho, kRowBeta, kRowSeg, kRowReset, kGateRows };
__device__ inline int64_t gateSlot(int64_t blockChunk, int64_t H, int64_t h) {
  return (blockChunk * H + h) * kGateRows * kChunk;
}

/// A thread's value of a chunk's gate table (fetched into a register, published to shared memory later, so
/// the chain over chunks can fetch the next chunk's while it computes).
struct GateFetch {
  static_assert(kGateRows * kChunk <= kThreads, "a value a thread");
  float v = 0.0f;
  __device__ GateFetch(const float *table, int64_t blockChunk, int64_t H, int64_t h) {
    if (threadIdx.x < kGateRows * kChunk)
      v = table[gateSlot(blockChunk, H, h) + threadIdx.x];
  }
  __device__ void publish(ChunkGates &G) const {
    const int e = threadIdx.x, r = e % kChunk;
    if (e >= kGateRows * kChunk)
      return;
    switch (e / kChunk) {
    case kRowG: G.g[r] = v; break;
    case kRowGam:
      G.gam[r] = v;
      if (r == kChunk - 1)
        G.gamEnd = v;
      break;
    case kRowRho: G.rho[r] = v; break;
    case kRowBeta: G.beta[r] = v; break;
    case kRowSeg: G.seg[r] = int(v); break;
    default: G.reset[r] = v != 0.0f; break;
    }
  }
};

/// The chunk's gate table into shared memory, visible to the block (the barrier first lets the last chunk's
/// readers finish).
__device__ void loadGates(ChunkGates &G, const float *table, int64_t blockChunk, int64_t H, int64_t h) {
  const GateFetch fetch(table, blockChunk, H, h);
  __syncthreads();
  fetch.publish(G);
  __syncthreads();
}

/// out(m, n, sum over k of a(m, k) b(k, n)) for an M x N product. A thread holds a 4 x 4 tile (rows m0 ..
/// m0 + 3, columns n0, n0 + N/4, ..: a warp reads consecutive columns of b); where the tiles are fewer than
/// the threads, `kSlices` adjacent lanes share a tile, each summing every kSlices-th k, and their sums are
/// added pairwise across the lanes (a butterfly: every lane ends with the same bits). Every output's order
/// of summation is fixed.
template <int M, int N, int K> constexpr int productSlices() {
  int slices = 1;
  while (slices < 32 && (M / 4) * (N / 4) * slices * 2 <= kThreads && K % (slices * 2) == 0 && K / (slices * 2) >= 4)
    slices *= 2;
  return slices;
}
template <int M, int N, int K, class A, class B, class Out>
__device__ __forceinline__ void blockProduct(const A &a, const B &b, const Out &out) {
  static_assert(M % 4 == 0 && N % 4 == 0, "4 x 4 tiles");
  constexpr int NT = N / 4, kTiles = (M / 4) * NT, kSlices = productSlices<M, N, K>();
  static_assert((kTiles * kSlices) % 32 == 0 && (kTiles * kSlices <= kThreads || kSlices == 1),
                "whole warps, one pass (the butterfly needs every lane)");
  const int slice = threadIdx.x % kSlices;
  for (int tile = threadIdx.x / kSlices; tile < kTiles; tile += kThreads / kSlices) {
    const int m0 = tile / NT * 4, n0 = tile % NT;
    float acc[4][4] = {};
#pragma unroll 4
    for (int k = slice; k < K; k += kSlices) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        av[i] = a(m0 + i, k);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        bv[j] = b(k, n0 + j * NT);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
#pragma unroll
    for (int offset = 1; offset < kSlices; offset <<= 1)
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          acc[i][j] += __shfl_xor_sync(0xffffffffu, acc[i][j], offset);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if ((i * 4 + j) % kSlices == slice)
          out(m0 + i, n0 + j * NT, acc[i][j]);
  }
}

/// Eight threads to each of the chunk's rows (r = threadIdx.x / 8): the sum over j < len of f(r, j), j mod 8
/// apart then pairwise; all eight lanes get the same bits.
constexpr int kRowLanes = kThreads / kChunk;
static_assert(kRowLanes == 8, "eight lanes a row");
template <class F> __device__ inline float rowSum(int len, const F &f) {
  const int r = threadIdx.x / kRowLanes;
  float sum = 0.0f;
  for (int j = threadIdx.x % kRowLanes; j < len; j += kRowLanes)
    sum += f(r, j);
#pragma unroll
  for (int offset = 1; offset < kRowLanes; offset <<= 1)
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  return sum;
}
__device__ inline bool rowLeader() { return threadIdx.x % kRowLanes == 0; }
__device__ inline int myRow() { return threadIdx.x / kRowLanes; }

/// Rows r < n of a [tokens, ld] global matrix's D columns, `Rows` rows (zero after n), for a padded shared
/// matrix: the constructor issues a thread's float4 loads, store() writes them; a kernel starts every load it
/// needs before it stores any (one trip to memory, not one a matrix).
template <int D, int Rows = kChunk> struct RowLoad {
  static_assert(D % 4 == 0, "float4 rows");
  static constexpr int V = D / 4, kVecs = Rows * V, kPer = (kVecs + kThreads - 1) / kThreads;
  float4 held[kPer];
  __device__ RowLoad(const float *src, int64_t ld64, int n) {
    const int ld = int(ld64); // a chunk's rows span less than 2^31 floats
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int e = threadIdx.x + k * kThreads, r = e / V;
      held[k] = e < kVecs && r < n ? *reinterpret_cast<const float4 *>(src + r * ld + (e % V) * 4)
                                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  __device__ void store(float *dst) const {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int e = threadIdx.x + k * kThreads;
      if (e < kVecs) {
        float *d = dst + (e / V) * padded(D) + (e % V) * 4;
        d[0] = held[k].x;
        d[1] = held[k].y;
        d[2] = held[k].z;
        d[3] = held[k].w;
      }
    }
  }
};

/// T = (I + A)^-1 for A strictly lower triangular (both padded L x L), by 16 x 16 blocks: the four diagonal
/// blocks by forward substitution at once (row r of T_bb is e_r - sum over m < r of A[r][m] T[m], eight
/// lanes to an entry, m mod 8 added pairwise), then the blocks below, a diagonal at a time: T_ij = -T_ii Y_ij
/// with Y_ij = sum over j <= m < i of A_im T_mj (kept in A's upper triangle, which nothing reads: it is
/// overwritten). 21 barriers where row-by-row substitution took 63.
__device__ void invertUnitLower(float *A, float *T) {
  constexpr int P = padded(kChunk), B = 16, kBlocks = kChunk / B;
  static_assert(kThreads == kBlocks * B * kRowLanes, "a lane group to each column of each diagonal block");
  for (int e = threadIdx.x; e < kChunk * kChunk; e += kThreads)
    T[(e / kChunk) * P + e % kChunk] = e / kChunk == e % kChunk ? 1.0f : 0.0f;
  __syncthreads();
  {
    const int b = threadIdx.x / (B * kRowLanes), i = b * B + (threadIdx.x / kRowLanes) % B,
              part = threadIdx.x % kRowLanes;
    for (int rr = 1; rr < B; ++rr) {
      const int r = b * B + rr;
      float sum = 0.0f;
      if (i < r)
        for (int m = i + part; m < r; m += kRowLanes)
          sum = fmaf(A[r * P + m], T[m * P + i], sum);
#pragma unroll
      for (int offset = 1; offset < kRowLanes; offset <<= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      if (part == 0 && i < r)
        T[r * P + i] = -sum;
      __syncthreads();
    }
  }
  for (int d = 1; d < kBlocks; ++d) {
    const int entries = (kBlocks - d) * B * B; // blocks (j + d, j), j < kBlocks - d
    for (int e = threadIdx.x; e < entries; e += kThreads) {
      const int j = e / (B * B), r = (j + d) * B + (e / B) % B, c = j * B + e % B;
      float sum = 0.0f;
      for (int m = j * B; m < (j + d) * B; ++m)
        sum = fmaf(A[r * P + m], T[m * P + c], sum);
      A[c * P + r] = sum; // Y_ij[r][c], transposed into the upper triangle
    }
    __syncthreads();
    for (int e = threadIdx.x; e < entries; e += kThreads) {
      const int j = e / (B * B), r = (j + d) * B + (e / B) % B, c = j * B + e % B;
      float sum = 0.0f;
      for (int m = (j + d) * B; m <= r; ++m)
        sum = fmaf(T[r * P + m], A[c * P + m], sum);
      T[r * P + c] = -sum;
    }
    __syncthreads();
  }
}

/// The scratch: U (U~ until the chain makes it U), W (dW in the backward), dU, by [token, C] as the inputs;
/// the state at every chunk's start (checkpoints) and, backward, the state gradient at its end (carries),
/// D x D row-major by (sequence, head, chunk); the gate table; the decay's gradient terms of the first
/// gradient kernel.
struct WyLayout {
  int64_t rows, C, H, D, seqs, chunks;
  WyLayout(int64_t rows_, int64_t C_, int64_t H_, int64_t seq)
      : rows(rows_), C(C_), H(H_), D(C_ / H_), seqs(rows_ / seq), chunks(chunksOf(seq)) {}
  int64_t stateFloats() const { return seqs * H * chunks * D * D; }
  int64_t tableFloats() const { return seqs * chunks * H * kGateRows * kChunk; }
  /// What the forward keeps for the backward (in the GDN aux): U, W, each
  /// chunk's starting state, the gate table.
  int64_t keptFloats() const { return 2 * rows * C + stateFloats() + tableFloats(); }
  float *u(float *kept) const { return kept; }
  float *w(float *kept) const { return kept + rows * C; }
  float *checkpoints(float *kept) const { return kept + 2 * rows * C; }
  float *gateTable(float *kept) const { return checkpoints(kept) + stateFloats(); }
  /// The backward's own scratch (it leaves `kept` as it found it): dU, dW,
  /// the carried state gradients, the decay terms.
  int64_t scratchFloats() const { return 2 * rows * C + stateFloats() + seqs * chunks * H * kChunk; }
  float *du(float *scratch) const { return scratch; }
  float *dw(float *scratch) const { return du(scratch) + rows * C; }
  float *carries(float *scratch) const { return dw(scratch) + rows * C; }
  float *decayTerms(float *scratch) const { return carries(scratch) + stateFloats(); }
};
__device__ inline int64_t stateSlot(int64_t seqIdx, int64_t h, int64_t chunk, int64_t H, int64_t chunks, int D) {
  return ((seqIdx * H + h) * chunks + chunk) * D * D;
}

} // namespace mhcc::runtime::cuda::wy

#endif // MHCC_RUNTIME_CUDA_GDNWYBLOCK_CUH
