//===- FlashAttentionTiles.cuh - what the flash attention kernels share -*- CUDA -*-===//
//
// FlashAttention-2 forward and backward on mma.sync m16n8k16 (bf16 operands,
// fp32 accumulation), ldmatrix from XOR-swizzled shared memory and cp.async
// double buffering. Every block has 8 warps and every warp owns 16 rows of
// the block's 128-row tile: query rows in the forward and dQ kernels, key
// rows in the dK/dV kernel. Scores, probabilities and accumulators therefore
// stay in one warp's registers, and warps meet only at the tile barriers.
// Within a sequence the blocks stream 64-row tiles of the other side (keys
// for forward and dQ, queries for dK/dV) in ascending order; blocks are
// numbered heaviest first so the causal triangle balances over the SMs.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .bf16), lane l, g = l / 4,
// t = l % 4; a 32-bit register holds two bf16, the lower column (or k) in its
// low half:
//   A 16x16 row-major: a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   B 16x8 (k x n):    b0 (k 2t..2t+1, n g)  b1 (k 2t+8..2t+9, n g)
//   C 16x8 fp32:       c0 c1 (g, 2t..2t+1)  c2 c3 (g+8, 2t..2t+1)
// ldmatrix.x4: lanes 8i..8i+7 address the 8 rows (16 bytes each) of 8x8
// matrix i; register i of lane l gets row g, columns 2t..2t+1 of matrix i
// (.trans: rows 2t..2t+1 of column g). The C fragments of two adjacent
// 8-column blocks, rounded to bf16, are the A fragment of the 16-wide k-step
// they span (block 0: c0c1 = a0, c2c3 = a1; block 1: a2, a3), so P and dS
// feed the next product straight from registers.
//
// Backward (deterministic, no atomics): rowDotKernel stores D = rowsum(dO*O);
// dkdvKernel owns 128 keys and loops over the query tiles at or after them;
// dqKernel owns 128 queries and loops over the key tiles up to the diagonal.
// Both recompute P = exp(scale*q.k - lse) and dS = P * (dP - D).
//
// Packed documents (firstKeys: per token its document's start): a query sees
// keys [firstKeys[q], q]. The masks add that lower bound; since documents
// are contiguous, firstKeys never decreases along a sequence, so a block
// starts at the key tile of its first query's document (forward, dQ) or
// stops at the first query tile past its keys' documents (dK/dV), and a
// warp skips tiles wholly outside its rows' documents. A row can then meet a
// tile it sees none of: the online softmax keeps its running max at -inf
// and rescales by 0 (FlashAttention-2's guard), the same bits otherwise.
// The kernels take kDocuments as a template flag, so that without documents
// none of this is compiled in.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CUDA_FLASHATTENTIONTILES_CUH
#define MHCC_RUNTIME_CUDA_FLASHATTENTIONTILES_CUH

#include "runtime/cuda/DependentLaunch.cuh"
#include "runtime/cuda/FlashAttention.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>

// Included by the flash attention sources only: FlashAttention.cu, FlashAttentionBackward.cu, and through
// FlashAttentionWgmma.cuh the wgmma kernels (which share Params, the masks, blockPos, the output writer and
// the launch checks).
namespace mhcc::runtime::cuda::flash {

using bf16 = __nv_bfloat16;

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kBlockRows = 16 * kWarps; // rows a block owns: 16 per warp
constexpr int kTile = 64;               // rows of the streamed tiles; seq must be a multiple of it

template <int D> constexpr int forwardSmem() { return (kBlockRows + 4 * kTile) * D * 2; }     // Q, 2x K, 2x V
template <int D> constexpr int dqSmem() { return (2 * kBlockRows + 4 * kTile) * D * 2; }      // Q, dO, 2x K, 2x V
template <int D> constexpr int dkdvSmem() { return dqSmem<D>() + 3 * 2 * kTile * 4; } // + 2x (lse, D, doc start)
// One block per SM (registers: 150-250 per thread, no spills; 2 blocks at d=64 would need <= 128 and spill).
// dK/dV: queries per pass of a warp over its tile, bounding the live scores (d=128: 128 accumulators already).
template <int D> constexpr int dkdvSub() { return D == 128 ? 32 : 64; }

struct Params {
  const bf16 *qkv;          // [T, 3C]
  const bf16 *o, *dO;       // [T, C]
  const float *lse;         // [T, heads]
  const float *rowDot;      // [T, heads]: D = rowsum(dO * O)
  bf16 *oOut;               // forward output [T, C]
  float *lseOut;            // forward output [T, heads]
  bf16 *dqkv;               // backward output [T, 3C]
  float *rowDotOut;         // backward scratch [T, heads]
  const int32_t *firstKeys; // [T] or null: each token's document start in its sequence
  int64_t ld;               // 3C: row stride of qkv and dqkv
  int64_t C;                // row stride of o and dO
  int heads, seq, batchHeads, numTiles; // numTiles = ceil(seq / kBlockRows)
  // The tiles of each sequence the launch runs (FlashRowRanges): launchTiles
  // of them, tileCount[0] from tileFirst[0] then tileCount[1] from
  // tileFirst[1]; every tile (numTiles from 0) unless restricted.
  int launchTiles, tileFirst[2], tileCount[2];
  __host__ __device__ int64_t tokens() const { return int64_t(batchHeads / heads) * seq; } // T
  float scale, scaleLog2;   // 1/sqrt(d) and 1/sqrt(d) * log2(e)
};

// ---- PTX wrappers -------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smemAddr(const void *p) { return uint32_t(__cvta_generic_to_shared(p)); }

/// 16 bytes global -> shared without blocking; zero-filled, reading nothing, when !valid.
__device__ __forceinline__ void cpAsync16(uint32_t dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cpAsync4(uint32_t dst, const void *src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
/// Returns once at most N of this thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void cpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

template <bool kTrans> __device__ __forceinline__ void ldsm(uint32_t (&r)[4], uint32_t addr) {
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/// 2^x, one MUFU op (exp2f adds subnormal fix-ups; here inputs are <= ~0 and tiny results may flush to 0).
__device__ __forceinline__ float fastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// c += a b (16x8x16).
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Two floats rounded to bf16 (RNE), `lo` in the low half.
__device__ __forceinline__ uint32_t packBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}

// ---- shared-memory tiles --------------------------------------------------------------------

/// Element offset of (row, col) in a [rows, D] bf16 tile whose 16-byte chunks are XOR-swizzled by row % 8: the
/// 8 rows one ldmatrix phase reads at one logical chunk sit in 8 different bank groups (no conflicts, no padding).
template <int D> __device__ __forceinline__ int swz(int row, int col) {
  return row * D + (((col >> 3) ^ (row & 7)) << 3) + (col & 7);
}

/// This lane's ldmatrix row for the 16x16 block at (0, 0): lanes 0-7 rows 0-7 / cols 0-7 (matrix 0), 8-15 rows
/// 8-15 / cols 0-7, 16-23 rows 0-7 / cols 8-15, 24-31 rows 8-15 / cols 8-15. For row0 % 8 == 0 and
/// col0 % 16 == 0, (row0 + r) % 8 == r % 8 and (col0 + c) / 8 == col0 / 8 ^ c / 8, so the lane's row of the block
/// at (row0, col0) is at row0 * D + (laneOffset ^ col0): one XOR per ldmatrix.
template <int D> __device__ __forceinline__ int laneOffset(int lane) { return swz<D>(lane & 15, (lane >> 4) << 3); }

/// The four 8x8 matrices of the 16x16 block at (row0, col0): r0 rows 0-7 / cols 0-7, r1 rows 8-15 / cols 0-7,
/// r2 rows 0-7 / cols 8-15, r3 rows 8-15 / cols 8-15 (each as the lane's part, see the file header).
template <int D, bool kTrans>
__device__ __forceinline__ void ldsm16(uint32_t (&r)[4], uint32_t tile, int row0, int col0, int laneOff) {
  ldsm<kTrans>(r, tile + 2u * uint32_t(row0 * D + (laneOff ^ col0)));
}

/// Starts copying `rows` rows (the first `valid` of them real, the rest zeros) of D bf16, `ld` elements apart in
/// global memory, into a swizzled tile; 16 bytes per cp.async, consecutive threads on consecutive chunks.
template <int D, int kRows>
__device__ __forceinline__ void loadTile(bf16 *tile, const bf16 *src, int64_t ld, int valid, int tid) {
  constexpr int kChunksPerRow = D / 8, kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "tile chunks must split evenly over the threads");
#pragma unroll
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const int c = tid + i * kThreads, row = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    const bool ok = row < valid;
    cpAsync16(smemAddr(tile + swz<D>(row, col)), ok ? src + row * ld + col : src, ok);
  }
}

// ---- warp-level products ------------------------------------------------------------------

/// c[16, N] += a[16, 16] B^T for one 16-wide k-step at column col0, B the N rows from bRow0 of a [*, D] tile.
template <int D, int N>
__device__ __forceinline__ void mmaABt(float (&c)[N / 8][4], const uint32_t (&a)[4], uint32_t bTile, int bRow0,
                                       int col0, int laneOff) {
#pragma unroll
  for (int nb = 0; nb < N / 16; ++nb) {
    uint32_t b[4];
    ldsm16<D, false>(b, bTile, bRow0 + nb * 16, col0, laneOff);
    mma(c[2 * nb], a, b[0], b[2]); // tile rows (the n index) 0-7: k 0-7 in r0, k 8-15 in r2
    mma(c[2 * nb + 1], a, b[1], b[3]);
  }
}

/// c[16, N] += A B^T over k = D, A the 16 rows from aRow0 of one tile, B the N rows from bRow0 of another.
template <int D, int N>
__device__ __forceinline__ void mmaABtSmem(float (&c)[N / 8][4], uint32_t aTile, int aRow0, uint32_t bTile,
                                           int bRow0, int laneOff) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    ldsm16<D, false>(a, aTile, aRow0, kk * 16, laneOff);
    mmaABt<D, N>(c, a, bTile, bRow0, kk * 16, laneOff);
  }
}

/// c[16, D] += bf16(p)[16, N] V[N, D]: p as fp32 C fragments, V the N rows from vRow0 of a [*, D] tile
/// (ldmatrix.trans: V's rows are the k index).
template <int D, int N>
__device__ __forceinline__ void mmaPV(float (&c)[D / 8][4], const float (&p)[N / 8][4], uint32_t vTile, int vRow0,
                                      int laneOff) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    const uint32_t a[4] = {packBf16(p[2 * kk][0], p[2 * kk][1]), packBf16(p[2 * kk][2], p[2 * kk][3]),
                           packBf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                           packBf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int db = 0; db < D / 16; ++db) {
      uint32_t b[4];
      ldsm16<D, true>(b, vTile, vRow0 + kk * 16, db * 16, laneOff);
      mma(c[2 * db], a, b[0], b[1]); // columns 0-7: k 0-7 in r0, k 8-15 in r1
      mma(c[2 * db + 1], a, b[2], b[3]);
    }
  }
}

/// Masks (to -inf) the C-fragment elements of query rows whose key column is after the query or before its
/// document's start, first[0] / first[1] for the lane's rows g / g + 8 (0 without documents). row: the lane's row
/// g; col0: its column 2t of block 0.
template <int N>
__device__ __forceinline__ void queryMask(float (&s)[N / 8][4], int row, int col0, const int (&first)[2]) {
#pragma unroll
  for (int nb = 0; nb < N / 8; ++nb)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int r = row + (x >> 1) * 8, c = col0 + nb * 8 + (x & 1);
      if (c > r || c < first[x >> 1])
        s[nb][x] = -INFINITY;
    }
}

/// The same for transposed scores (rows are keys, columns queries): masked where the query is before the key or
/// the key before the query's document; firstOf: the documents' starts of the pass's queries (null: none),
/// indexed by column - col0 + 2t.
template <int N>
__device__ __forceinline__ void keyMask(float (&s)[N / 8][4], int row, int col0, const int *firstOf, int t) {
#pragma unroll
  for (int nb = 0; nb < N / 8; ++nb)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int r = row + (x >> 1) * 8, c = col0 + nb * 8 + (x & 1);
      if (c < r || (firstOf && r < firstOf[nb * 8 + 2 * t + (x & 1)]))
        s[nb][x] = -INFINITY;
    }
}

/// A lane's two rows of the backward's per-query statistics (row r: g + 8 r of
/// the warp's 16 from token `row`): the log-sum-exp in log2 units and
/// rowDot = dO . O; zeros for an inactive warp.
struct RowStats {
  float lseLog2[2] = {0.f, 0.f}, rowDot[2] = {0.f, 0.f};
  __device__ RowStats(const Params &p, int64_t row, int h, bool active) {
    if (active)
      for (int r = 0; r < 2; ++r) {
        const int64_t i = (row + 8 * r) * p.heads + h;
        lseLog2[r] = p.lse[i] * kLog2e;
        rowDot[r] = p.rowDot[i];
      }
  }
};

/// Row r (g + 8 r) of a lane's m16 accumulator tiles, times `scale`, as bf16
/// at `out` (columns 2 t, 2 t + 1 of each 8-column block; `out` at the row's
/// column 2 t).
template <int D>
__device__ __forceinline__ void storeAccumulatorRow(bf16 *out, const float (&acc)[D / 8][4], int r, float scale) {
#pragma unroll
  for (int db = 0; db < D / 8; ++db)
    *reinterpret_cast<__nv_bfloat162 *>(out + db * 8) =
        __floats2bfloat162_rn(acc[db][2 * r] * scale, acc[db][2 * r + 1] * scale);
}

/// Where a warp's 16 query rows from row0 find their keys (packed documents): the lane's rows' document starts,
/// and the smallest and largest of the warp (firstKeys never decreases along a sequence). All 0 without documents.
struct WarpDocuments {
  int first[2] = {0, 0};
  int lowest = 0, highest = 0;
  __device__ WarpDocuments(const int32_t *seqFirstKeys, int row0, int g, bool active) {
    if (seqFirstKeys && active) {
      first[0] = seqFirstKeys[row0 + g];
      first[1] = seqFirstKeys[row0 + g + 8];
      lowest = seqFirstKeys[row0];
      highest = seqFirstKeys[row0 + 15];
    }
  }
};

/// Of nTiles query tiles (tileRows rows each, queryFirstKeys from the first one's first query), how many see some
/// key up to lastKey: a tile whose first query's document starts after lastKey sees none, nor does any later one
/// (firstKeys never decreases), so the count is the first such tile (a binary search, the same on all threads).
__device__ __forceinline__ int tilesSeeingKeys(const int32_t *queryFirstKeys, int nTiles, int tileRows, int lastKey) {
  int lo = 0, hi = nTiles;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (queryFirstKeys[mid * tileRows] > lastKey)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

/// The forward's output for a warp's 16 query rows from row0 (lane rows g and g + 8): o = acc / the row's sum,
/// rounded to bf16, and the log-sum-exp. The quad's partial sums are added in one order on all 4 lanes; rows at or
/// past the sequence's end are not written.
template <int D>
__device__ __forceinline__ void storeForwardRows(const Params &p, const float (&acc)[D / 8][4], const float (&rowMax)[2],
                                                 const float (&rowSum)[2], int64_t tok0, int row0, int h, int g,
                                                 int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + g + 8 * r;
    float total = rowSum[r];
    total += __shfl_xor_sync(0xffffffffu, total, 1);
    total += __shfl_xor_sync(0xffffffffu, total, 2);
    if (row >= p.seq)
      continue;
    const int64_t tok = tok0 + row;
    bf16 *out = p.oOut + tok * p.C + h * D + 2 * t;
#pragma unroll
    for (int db = 0; db < D / 8; ++db)
      *reinterpret_cast<__nv_bfloat162 *>(out + db * 8) =
          __floats2bfloat162_rn(acc[db][2 * r] / total, acc[db][2 * r + 1] / total);
    if (t == 0)
      p.lseOut[tok * p.heads + h] = rowMax[r] * p.scale + logf(total);
  }
}

/// The block's tile index (heaviest first) and its (sequence, head).
struct BlockPos {
  int tile, b, h;
};
__device__ __forceinline__ BlockPos blockPos(const Params &p, bool lastTilesHeaviest) {
  const int order = int(blockIdx.x) / p.batchHeads, bh = int(blockIdx.x) % p.batchHeads;
  const int k = lastTilesHeaviest ? p.launchTiles - 1 - order : order; // among the launch's tiles, ascending
  const int tile = k < p.tileCount[0] ? p.tileFirst[0] + k : p.tileFirst[1] + (k - p.tileCount[0]);
  return {tile, bh / p.heads, bh % p.heads};
}

// ---- host side ----------------------------------------------------------------------------

struct Aligned {
  const void *ptr;
  unsigned bytes;
};

/// "" when the kernels handle these shapes and pointers, else the one-line reason.
inline std::string checkShapes(const char *what, int64_t T, int64_t C, int64_t heads, int64_t seq,
                        std::initializer_list<Aligned> ptrs) {
  const std::string w = what;
  if (heads <= 0 || C <= 0 || C % heads != 0)
    return w + ": C " + std::to_string(C) + " is not a positive multiple of heads " + std::to_string(heads);
  const int64_t d = C / heads;
  if (d != 64 && d != 128)
    return w + ": head dim " + std::to_string(d) + " (C " + std::to_string(C) + " / heads " + std::to_string(heads) +
           ") is not supported; supported head dims: 64, 128";
  if (seq <= 0 || seq % kTile != 0)
    return w + ": seq " + std::to_string(seq) + " is not a positive multiple of " + std::to_string(kTile);
  if (T < 0 || T % seq != 0)
    return w + ": T " + std::to_string(T) + " is not a multiple of seq " + std::to_string(seq);
  const int64_t tiles = (seq + kBlockRows - 1) / kBlockRows;
  if (seq > INT_MAX / 2 || (T / seq) * heads > INT_MAX / tiles || T * heads / kWarps > INT_MAX)
    return w + ": " + std::to_string(T) + " tokens x " + std::to_string(heads) + " heads is too large for one launch";
  for (const Aligned &a : ptrs)
    if (reinterpret_cast<uintptr_t>(a.ptr) % a.bytes != 0)
      return w + ": a pointer is not " + std::to_string(a.bytes) + "-byte aligned";
  return "";
}

inline Params makeParams(int64_t T, int64_t C, int64_t heads, int64_t seq) {
  Params p{};
  p.ld = 3 * C;
  p.C = C;
  p.heads = int(heads);
  p.seq = int(seq);
  p.batchHeads = int(T / seq * heads);
  p.numTiles = int((seq + kBlockRows - 1) / kBlockRows);
  p.launchTiles = p.tileCount[0] = p.numTiles; // every tile (restrictTiles narrows it)
  p.scale = 1.0f / std::sqrt(float(C / heads)); // as the CPU kernels: T(1) / sqrt(T(d))
  p.scaleLog2 = p.scale * kLog2e;
  return p;
}

/// Narrows the launch to `rows`' tiles where they are whole tiles (else it
/// runs every tile: the same rows' results, with more work).
inline void restrictTiles(Params &p, const FlashRowRanges &rows) {
  if (rows.count[0] + rows.count[1] == 0)
    return;
  for (int r = 0; r < 2; ++r)
    if (rows.first[r] % kBlockRows || rows.count[r] % kBlockRows || rows.first[r] + rows.count[r] > p.seq)
      return;
  for (int r = 0; r < 2; ++r) {
    p.tileFirst[r] = int(rows.first[r] / kBlockRows);
    p.tileCount[r] = int(rows.count[r] / kBlockRows);
  }
  p.launchTiles = p.tileCount[0] + p.tileCount[1];
}

/// Raises the kernel's dynamic shared-memory limit (above the default 48 KiB) and launches it with `threads`
/// threads a block on `args` (the warp-specialized kernels: their tensor maps, then Params), as a
/// dependent launch: every kernel launched here begins with dependentPrologue (DependentLaunch.cuh).
template <typename Kernel, typename... Args>
cudaError_t launchWith(Kernel kernel, unsigned threads, int64_t blocks, int smemBytes, cudaStream_t stream,
                       const Args &...args) {
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smemBytes);
  if (e != cudaSuccess)
    return e;
  return launchDependent(kernel, dim3(unsigned(blocks)), dim3(threads), size_t(smemBytes), stream, args...);
}

/// launchWith for the kernels of kThreads threads that take Params alone.
template <typename Kernel>
cudaError_t launch(Kernel kernel, const Params &p, int64_t blocks, int smemBytes, cudaStream_t stream) {
  return launchWith(kernel, kThreads, blocks, smemBytes, stream, p);
}

} // namespace mhcc::runtime::cuda::flash

namespace mhcc::runtime::cuda {
/// The kernels setFlashAttentionKernels chose (FlashAttention.cu).
FlashKernels flashKernels();
/// The forward on wgmma (FlashAttentionHopper.cu); d is 64 or 128.
std::string flashAttentionForwardWgmma(const flash::Params &p, int64_t d, cudaStream_t stream);
/// The dK/dV and dQ kernels on wgmma (FlashAttentionHopperBackward.cu), p.rowDot already written; d is 64 or 128.
/// "" or the error.
std::string flashAttentionBackwardWgmma(const flash::Params &p, int64_t d, cudaStream_t stream);
} // namespace mhcc::runtime::cuda

#endif // MHCC_RUNTIME_CUDA_FLASHATTENTIONTILES_CUH
