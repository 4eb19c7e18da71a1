//===- FlashAttention.cu - bf16 causal flash attention on tensor cores ----===//
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
#include "runtime/cuda/FlashAttention.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <initializer_list>

namespace mhcc::runtime::cuda {
namespace {

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

/// The block's tile index (heaviest first) and its (sequence, head).
struct BlockPos {
  int tile, b, h;
};
__device__ __forceinline__ BlockPos blockPos(const Params &p, bool lastTilesHeaviest) {
  const int order = int(blockIdx.x) / p.batchHeads, bh = int(blockIdx.x) % p.batchHeads;
  return {lastTilesHeaviest ? p.numTiles - 1 - order : order, bh / p.heads, bh % p.heads};
}

// ---- forward ------------------------------------------------------------------------------

/// One warp, one key tile: scores, online softmax (running max and per-lane partial sums of rows g and g+8,
/// scores kept unscaled), O += P V.
template <int D>
__device__ __forceinline__ void forwardTile(const uint32_t (&qf)[D / 16][4], float (&acc)[D / 8][4],
                                            float (&rowMax)[2], float (&rowSum)[2], uint32_t kSm, uint32_t vSm,
                                            int laneOff, int qRow, int key0, bool masked, const int (&first)[2],
                                            float scaleLog2) {
  float s[kTile / 8][4] = {};
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    mmaABt<D, kTile>(s, qf[kk], kSm, 0, kk * 16, laneOff);
  if (masked)
    queryMask<kTile>(s, qRow, key0, first);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = rowMax[r];
#pragma unroll
    for (int nb = 0; nb < kTile / 8; ++nb)
      mx = fmaxf(mx, fmaxf(s[nb][2 * r], s[nb][2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1)); // the 4 lanes of a quad share the row
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // mx is -inf only while a row has met no key of its document yet (packed documents): then rescale by
    // 2^-inf = 0 from a base of 0, not by 2^NaN. On a row's first tile with a key, 2^-inf = 0 too.
    const float safe = mx == -INFINITY ? 0.f : mx;
    const float corr = fastExp2((rowMax[r] - safe) * scaleLog2), base = safe * scaleLog2;
    rowMax[r] = mx;
    float sum = 0.f;
#pragma unroll
    for (int nb = 0; nb < kTile / 8; ++nb)
#pragma unroll
      for (int x = 2 * r; x < 2 * r + 2; ++x) {
        s[nb][x] = fastExp2(fmaf(s[nb][x], scaleLog2, -base)); // masked: 2^-inf = 0
        sum += s[nb][x];
      }
    rowSum[r] = rowSum[r] * corr + sum;
#pragma unroll
    for (int db = 0; db < D / 8; ++db) {
      acc[db][2 * r] *= corr;
      acc[db][2 * r + 1] *= corr;
    }
  }
  mmaPV<D, kTile>(acc, s, vSm, 0, laneOff);
}

/// One block: 128 query rows of one (sequence, head), key tiles 0 .. the diagonal, double-buffered.
template <int D, bool kDocuments> __global__ void __launch_bounds__(kThreads, 1) forwardKernel(Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16 *sQ = reinterpret_cast<bf16 *>(smem);
  bf16 *sK = sQ + kBlockRows * D; // [2][kTile][D]
  bf16 *sV = sK + 2 * kTile * D;  // [2][kTile][D]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const BlockPos pos = blockPos(p, true);
  const int m0 = pos.tile * kBlockRows, rows = min(kBlockRows, p.seq - m0);
  const int nTiles = (m0 + rows) / kTile; // the key tiles holding keys 0 .. m0 + rows - 1
  const int64_t tok0 = int64_t(pos.b) * p.seq;
  const bf16 *gK = p.qkv + tok0 * p.ld + p.C + pos.h * D, *gV = gK + p.C;
  const int32_t *seqFirstKeys = kDocuments ? p.firstKeys + tok0 : nullptr;
  const int tile0 = seqFirstKeys ? seqFirstKeys[m0] / kTile : 0; // the first key tile any query sees

  // cp.async groups: Q, then key tile i is group i - tile0 + 1.
  loadTile<D, kBlockRows>(sQ, p.qkv + (tok0 + m0) * p.ld + pos.h * D, p.ld, rows, tid);
  cpAsyncCommit();
  loadTile<D, kTile>(sK, gK + int64_t(tile0) * kTile * p.ld, p.ld, kTile, tid);
  loadTile<D, kTile>(sV, gV + int64_t(tile0) * kTile * p.ld, p.ld, kTile, tid);
  cpAsyncCommit();

  const int laneOff = laneOffset<D>(lane), wRow = warp * 16, row0 = m0 + wRow; // the warp's first query
  const bool active = wRow < rows;
  const WarpDocuments docs(seqFirstKeys, row0, g, active);
  cpAsyncWait<1>(); // Q has landed
  __syncthreads();
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    ldsm16<D, false>(qf[kk], smemAddr(sQ), wRow, kk * 16, laneOff); // rows past seq: zero-filled

  float acc[D / 8][4] = {};
  float rowMax[2] = {-INFINITY, -INFINITY}, rowSum[2] = {0.f, 0.f};
#pragma unroll 1
  for (int it = tile0; it < nTiles; ++it) {
    const int buf = (it - tile0) & 1;
    if (it + 1 < nTiles) {
      const int64_t next = int64_t(it + 1) * kTile * p.ld;
      loadTile<D, kTile>(sK + (buf ^ 1) * kTile * D, gK + next, p.ld, kTile, tid);
      loadTile<D, kTile>(sV + (buf ^ 1) * kTile * D, gV + next, p.ld, kTile, tid);
    }
    cpAsyncCommit();  // possibly empty: keeps "tile it is group it - tile0 + 1"
    cpAsyncWait<1>(); // tile it has landed (for this thread; the barrier makes it everyone's)
    __syncthreads();
    const int n0 = it * kTile;
    // Else every key of the tile is after every query of the warp, or before all their documents.
    if (active && n0 <= row0 + 15 && n0 + kTile > docs.lowest)
      forwardTile<D>(qf, acc, rowMax, rowSum, smemAddr(sK + buf * kTile * D), smemAddr(sV + buf * kTile * D),
                     laneOff, row0 + g, n0 + 2 * t, n0 + kTile - 1 > row0 || n0 < docs.highest, docs.first,
                     p.scaleLog2);
    __syncthreads(); // everyone is done with `buf` before the next iteration refills it
  }
  if (!active)
    return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float total = rowSum[r]; // the quad's partial sums, added in the same order on all 4 lanes
    total += __shfl_xor_sync(0xffffffffu, total, 1);
    total += __shfl_xor_sync(0xffffffffu, total, 2);
    const int64_t tok = tok0 + row0 + g + 8 * r;
    bf16 *out = p.oOut + tok * p.C + pos.h * D + 2 * t;
#pragma unroll
    for (int db = 0; db < D / 8; ++db)
      *reinterpret_cast<__nv_bfloat162 *>(out + db * 8) =
          __floats2bfloat162_rn(acc[db][2 * r] / total, acc[db][2 * r + 1] / total);
    if (t == 0)
      p.lseOut[tok * p.heads + pos.h] = rowMax[r] * p.scale + logf(total);
  }
}

// ---- backward -----------------------------------------------------------------------------

/// D[token, head] = sum over e of dO * O, in fp32: one warp per (token, head), a fixed butterfly sum.
template <int D> __global__ void __launch_bounds__(kThreads) rowDotKernel(Params p, int64_t pairs) {
  const int64_t pair = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (pair >= pairs)
    return; // whole warps
  const int64_t off = (pair / p.heads) * p.C + (pair % p.heads) * D;
  float sum = 0.f;
#pragma unroll
  for (int e = 2 * lane; e < D; e += 64) {
    const float2 o = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(p.o + off + e));
    const float2 d = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(p.dO + off + e));
    sum = fmaf(o.x, d.x, sum);
    sum = fmaf(o.y, d.y, sum);
  }
#pragma unroll
  for (int m = 16; m >= 1; m /= 2)
    sum += __shfl_xor_sync(0xffffffffu, sum, m);
  if (lane == 0)
    p.rowDotOut[pair] = sum;
}

/// One warp, one key tile of dQ: S = Q K^T, dP = dO V^T, dS = P * (dP - D), dQ += dS K (unscaled).
template <int D>
__device__ __forceinline__ void dqTile(float (&dq)[D / 8][4], uint32_t qSm, uint32_t doSm, int wRow, uint32_t kSm,
                                       uint32_t vSm, int laneOff, int qRow, int key0, bool masked,
                                       const int (&first)[2], const float (&lseLog2)[2], const float (&rowDot)[2],
                                       float scaleLog2) {
  float s[kTile / 8][4] = {}, dp[kTile / 8][4] = {};
  mmaABtSmem<D, kTile>(s, qSm, wRow, kSm, 0, laneOff);
  mmaABtSmem<D, kTile>(dp, doSm, wRow, vSm, 0, laneOff);
  if (masked)
    queryMask<kTile>(s, qRow, key0, first);
#pragma unroll
  for (int nb = 0; nb < kTile / 8; ++nb)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const float prob = fastExp2(fmaf(s[nb][x], scaleLog2, -lseLog2[x >> 1])); // masked: 0
      s[nb][x] = prob * (dp[nb][x] - rowDot[x >> 1]);
    }
  mmaPV<D, kTile>(dq, s, kSm, 0, laneOff);
}

/// One block: dQ of 128 query rows of one (sequence, head), key tiles 0 .. the diagonal, double-buffered.
template <int D, bool kDocuments> __global__ void __launch_bounds__(kThreads, 1) dqKernel(Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16 *sQ = reinterpret_cast<bf16 *>(smem);
  bf16 *sdO = sQ + kBlockRows * D;
  bf16 *sK = sdO + kBlockRows * D; // [2][kTile][D]
  bf16 *sV = sK + 2 * kTile * D;   // [2][kTile][D]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const BlockPos pos = blockPos(p, true);
  const int m0 = pos.tile * kBlockRows, rows = min(kBlockRows, p.seq - m0);
  const int nTiles = (m0 + rows) / kTile;
  const int64_t tok0 = int64_t(pos.b) * p.seq;
  const bf16 *gK = p.qkv + tok0 * p.ld + p.C + pos.h * D, *gV = gK + p.C;
  const int32_t *seqFirstKeys = kDocuments ? p.firstKeys + tok0 : nullptr;
  const int tile0 = seqFirstKeys ? seqFirstKeys[m0] / kTile : 0; // the first key tile any query sees

  // cp.async groups: Q and dO with key tile tile0, then key tile i is group i - tile0.
  loadTile<D, kBlockRows>(sQ, p.qkv + (tok0 + m0) * p.ld + pos.h * D, p.ld, rows, tid);
  loadTile<D, kBlockRows>(sdO, p.dO + (tok0 + m0) * p.C + pos.h * D, p.C, rows, tid);
  loadTile<D, kTile>(sK, gK + int64_t(tile0) * kTile * p.ld, p.ld, kTile, tid);
  loadTile<D, kTile>(sV, gV + int64_t(tile0) * kTile * p.ld, p.ld, kTile, tid);
  cpAsyncCommit();

  const int laneOff = laneOffset<D>(lane), wRow = warp * 16, row0 = m0 + wRow;
  const bool active = wRow < rows;
  const WarpDocuments docs(seqFirstKeys, row0, g, active);
  float lseLog2[2] = {0.f, 0.f}, rowDot[2] = {0.f, 0.f};
  if (active)
    for (int r = 0; r < 2; ++r) {
      const int64_t i = (tok0 + row0 + g + 8 * r) * p.heads + pos.h;
      lseLog2[r] = p.lse[i] * kLog2e;
      rowDot[r] = p.rowDot[i];
    }
  float dq[D / 8][4] = {};
#pragma unroll 1
  for (int it = tile0; it < nTiles; ++it) {
    const int buf = (it - tile0) & 1;
    if (it + 1 < nTiles) {
      const int64_t next = int64_t(it + 1) * kTile * p.ld;
      loadTile<D, kTile>(sK + (buf ^ 1) * kTile * D, gK + next, p.ld, kTile, tid);
      loadTile<D, kTile>(sV + (buf ^ 1) * kTile * D, gV + next, p.ld, kTile, tid);
    }
    cpAsyncCommit();
    cpAsyncWait<1>(); // group it - tile0 (tile it, and first Q and dO) has landed
    __syncthreads();
    const int n0 = it * kTile;
    if (active && n0 <= row0 + 15 && n0 + kTile > docs.lowest)
      dqTile<D>(dq, smemAddr(sQ), smemAddr(sdO), wRow, smemAddr(sK + buf * kTile * D),
                smemAddr(sV + buf * kTile * D), laneOff, row0 + g, n0 + 2 * t,
                n0 + kTile - 1 > row0 || n0 < docs.highest, docs.first, lseLog2, rowDot, p.scaleLog2);
    __syncthreads();
  }
  if (!active)
    return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    bf16 *out = p.dqkv + (tok0 + row0 + g + 8 * r) * p.ld + pos.h * D + 2 * t;
#pragma unroll
    for (int db = 0; db < D / 8; ++db)
      *reinterpret_cast<__nv_bfloat162 *>(out + db * 8) =
          __floats2bfloat162_rn(dq[db][2 * r] * p.scale, dq[db][2 * r + 1] * p.scale);
  }
}

/// One warp, N queries from query-tile row qRow0: S^T = K Q^T, dP^T = V dO^T, P^T, dS^T = P^T * (dP^T - D),
/// dV += P^T dO, dK += dS^T Q (unscaled). lse and rowDot point at the pass's first query in shared memory.
template <int D, int N>
__device__ __forceinline__ void dkdvPass(float (&dk)[D / 8][4], float (&dv)[D / 8][4], uint32_t kSm, uint32_t vSm,
                                         int wRow, uint32_t qSm, uint32_t doSm, int qRow0, const float *lse,
                                         const float *rowDot, int laneOff, int keyRow, int query0, bool masked,
                                         const int *firstOf, float scaleLog2, int t) {
  float st[N / 8][4] = {}, dpt[N / 8][4] = {};
  mmaABtSmem<D, N>(st, kSm, wRow, qSm, qRow0, laneOff);
  mmaABtSmem<D, N>(dpt, vSm, wRow, doSm, qRow0, laneOff);
  if (masked)
    keyMask<N>(st, keyRow, query0, firstOf, t);
#pragma unroll
  for (int nb = 0; nb < N / 8; ++nb) {
    const float2 l = *reinterpret_cast<const float2 *>(lse + nb * 8 + 2 * t); // columns 2t, 2t+1
    const float2 d = *reinterpret_cast<const float2 *>(rowDot + nb * 8 + 2 * t);
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const float prob = fastExp2(fmaf(st[nb][x], scaleLog2, -((x & 1) ? l.y : l.x) * kLog2e)); // masked: 0
      st[nb][x] = prob;
      dpt[nb][x] = prob * (dpt[nb][x] - ((x & 1) ? d.y : d.x));
    }
  }
  mmaPV<D, N>(dv, st, doSm, qRow0, laneOff);
  mmaPV<D, N>(dk, dpt, qSm, qRow0, laneOff);
}

/// One block: dK and dV of 128 keys of one (sequence, head), query tiles from the first key to the sequence's
/// end, double-buffered with their lse and D.
template <int D, bool kDocuments> __global__ void __launch_bounds__(kThreads, 1) dkdvKernel(Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16 *sK = reinterpret_cast<bf16 *>(smem);
  bf16 *sV = sK + kBlockRows * D;
  bf16 *sQ = sV + kBlockRows * D;                                // [2][kTile][D]
  bf16 *sdO = sQ + 2 * kTile * D;                                // [2][kTile][D]
  float *sLse = reinterpret_cast<float *>(sdO + 2 * kTile * D); // [2][kTile]
  float *sDot = sLse + 2 * kTile;                                // [2][kTile]
  int *sFirst = reinterpret_cast<int *>(sDot + 2 * kTile);      // [2][kTile]: the queries' documents' starts
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const BlockPos pos = blockPos(p, false);
  const int n0 = pos.tile * kBlockRows, keys = min(kBlockRows, p.seq - n0);
  int nTiles = (p.seq - n0) / kTile; // query tiles n0 .. seq - 1
  const int64_t first = int64_t(pos.b) * p.seq + n0; // token of the first key and the first query
  const int32_t *queryFirstKeys = kDocuments ? p.firstKeys + first : nullptr; // from the first query on
  if (queryFirstKeys) {
    // Query tiles whose first query's document starts after the block's last key see none of its keys, nor do
    // later ones (firstKeys never decreases): end before the first of them (a binary search, same on all threads).
    int lo = 0, hi = nTiles;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (queryFirstKeys[mid * kTile] > n0 + keys - 1)
        hi = mid;
      else
        lo = mid + 1;
    }
    nTiles = lo;
  }
  const bf16 *gQ = p.qkv + first * p.ld + pos.h * D, *gdO = p.dO + first * p.C + pos.h * D;
  auto loadQueries = [&](int it, int buf) {
    loadTile<D, kTile>(sQ + buf * kTile * D, gQ + int64_t(it) * kTile * p.ld, p.ld, kTile, tid);
    loadTile<D, kTile>(sdO + buf * kTile * D, gdO + int64_t(it) * kTile * p.C, p.C, kTile, tid);
    if (tid < 2 * kTile) { // lse and D are [T, heads]: 4-byte copies
      const int q = tid % kTile;
      const int64_t i = (first + int64_t(it) * kTile + q) * p.heads + pos.h;
      cpAsync4(smemAddr((tid < kTile ? sLse : sDot) + buf * kTile + q), tid < kTile ? p.lse + i : p.rowDot + i);
    } else if (queryFirstKeys && tid < 3 * kTile) {
      const int q = tid - 2 * kTile;
      cpAsync4(smemAddr(sFirst + buf * kTile + q), queryFirstKeys + it * kTile + q);
    }
  };
  // cp.async groups: K and V with query tile 0, then query tile i is group i.
  loadTile<D, kBlockRows>(sK, p.qkv + first * p.ld + p.C + pos.h * D, p.ld, keys, tid);
  loadTile<D, kBlockRows>(sV, p.qkv + first * p.ld + 2 * p.C + pos.h * D, p.ld, keys, tid);
  loadQueries(0, 0);
  cpAsyncCommit();

  constexpr int kSub = dkdvSub<D>();
  const int laneOff = laneOffset<D>(lane), wRow = warp * 16, key0 = n0 + wRow; // the warp's first key
  const bool active = wRow < keys;
  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
#pragma unroll 1
  for (int it = 0; it < nTiles; ++it) {
    const int buf = it & 1;
    if (it + 1 < nTiles)
      loadQueries(it + 1, buf ^ 1);
    cpAsyncCommit();
    cpAsyncWait<1>(); // group it has landed
    __syncthreads();
    if (active) {
#pragma unroll 1
      for (int sub = 0; sub < kTile; sub += kSub) {
        const int q0 = n0 + it * kTile + sub; // the pass's first query
        if (q0 + kSub - 1 < key0)
          continue; // every query before every key of the warp
        const int *firstOf = queryFirstKeys ? sFirst + buf * kTile + sub : nullptr;
        if (firstOf && firstOf[0] > key0 + 15)
          continue; // every query's document starts after every key of the warp
        // The pass needs the document mask unless its last query's document holds the warp's first key.
        const bool outside = firstOf && firstOf[kSub - 1] > key0;
        dkdvPass<D, kSub>(dk, dv, smemAddr(sK), smemAddr(sV), wRow, smemAddr(sQ + buf * kTile * D),
                          smemAddr(sdO + buf * kTile * D), sub, sLse + buf * kTile + sub,
                          sDot + buf * kTile + sub, laneOff, key0 + g, q0 + 2 * t, q0 < key0 + 15 || outside,
                          firstOf, p.scaleLog2, t);
      }
    }
    __syncthreads();
  }
  if (!active)
    return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    bf16 *outK = p.dqkv + (first + wRow + g + 8 * r) * p.ld + p.C + pos.h * D + 2 * t, *outV = outK + p.C;
#pragma unroll
    for (int db = 0; db < D / 8; ++db) {
      *reinterpret_cast<__nv_bfloat162 *>(outK + db * 8) =
          __floats2bfloat162_rn(dk[db][2 * r] * p.scale, dk[db][2 * r + 1] * p.scale);
      *reinterpret_cast<__nv_bfloat162 *>(outV + db * 8) = __floats2bfloat162_rn(dv[db][2 * r], dv[db][2 * r + 1]);
    }
  }
}

// ---- host side ----------------------------------------------------------------------------

struct Aligned {
  const void *ptr;
  unsigned bytes;
};

/// "" when the kernels handle these shapes and pointers, else the one-line reason.
std::string checkShapes(const char *what, int64_t T, int64_t C, int64_t heads, int64_t seq,
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

Params makeParams(int64_t T, int64_t C, int64_t heads, int64_t seq) {
  Params p{};
  p.ld = 3 * C;
  p.C = C;
  p.heads = int(heads);
  p.seq = int(seq);
  p.batchHeads = int(T / seq * heads);
  p.numTiles = int((seq + kBlockRows - 1) / kBlockRows);
  p.scale = 1.0f / std::sqrt(float(C / heads)); // as the CPU kernels: T(1) / sqrt(T(d))
  p.scaleLog2 = p.scale * kLog2e;
  return p;
}

/// Raises the kernel's dynamic shared-memory limit (above the default 48 KiB) and launches it.
template <typename Kernel>
cudaError_t launch(Kernel kernel, const Params &p, int64_t blocks, int smemBytes, cudaStream_t stream) {
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smemBytes);
  if (e != cudaSuccess)
    return e;
  kernel<<<unsigned(blocks), kThreads, smemBytes, stream>>>(p);
  return cudaGetLastError();
}

template <int D> cudaError_t forward(const Params &p, cudaStream_t stream) {
  return launch(p.firstKeys ? forwardKernel<D, true> : forwardKernel<D, false>, p,
                int64_t(p.numTiles) * p.batchHeads, forwardSmem<D>(), stream);
}

template <int D> cudaError_t backward(const Params &p, int64_t T, cudaStream_t stream) {
  const int64_t pairs = T * p.heads;
  rowDotKernel<D><<<unsigned((pairs + kWarps - 1) / kWarps), kThreads, 0, stream>>>(p, pairs);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess)
    e = launch(p.firstKeys ? dkdvKernel<D, true> : dkdvKernel<D, false>, p, int64_t(p.numTiles) * p.batchHeads,
               dkdvSmem<D>(), stream);
  if (e == cudaSuccess)
    e = launch(p.firstKeys ? dqKernel<D, true> : dqKernel<D, false>, p, int64_t(p.numTiles) * p.batchHeads,
               dqSmem<D>(), stream);
  return e;
}

} // namespace

std::string flashAttentionForward(const __nv_bfloat16 *qkv, __nv_bfloat16 *o, float *lse, int64_t T, int64_t C,
                                  int64_t heads, int64_t seq, const int32_t *firstKeys, cudaStream_t stream) {
  const char *what = "flashAttentionForward";
  std::string err = checkShapes(what, T, C, heads, seq, {{qkv, 16}, {o, 16}, {lse, 4}});
  if (!err.empty() || T == 0)
    return err;
  Params p = makeParams(T, C, heads, seq);
  p.qkv = qkv;
  p.firstKeys = firstKeys;
  p.oOut = o;
  p.lseOut = lse;
  const cudaError_t e = C / heads == 64 ? forward<64>(p, stream) : forward<128>(p, stream);
  return e == cudaSuccess ? "" : std::string(what) + ": " + cudaGetErrorString(e);
}

int64_t flashAttentionBackwardScratch(int64_t T, int64_t C, int64_t heads) {
  (void)C;
  return T * heads; // D = rowsum(dO * O) per (token, head)
}

std::string flashAttentionBackward(const __nv_bfloat16 *qkv, const __nv_bfloat16 *o, const __nv_bfloat16 *dO,
                                   const float *lse, __nv_bfloat16 *dqkv, float *scratch, int64_t T, int64_t C,
                                   int64_t heads, int64_t seq, const int32_t *firstKeys, cudaStream_t stream) {
  const char *what = "flashAttentionBackward";
  std::string err = checkShapes(what, T, C, heads, seq,
                                {{qkv, 16}, {o, 16}, {dO, 16}, {dqkv, 16}, {lse, 4}, {scratch, 4}});
  if (!err.empty() || T == 0)
    return err;
  Params p = makeParams(T, C, heads, seq);
  p.qkv = qkv;
  p.firstKeys = firstKeys;
  p.o = o;
  p.dO = dO;
  p.lse = lse;
  p.rowDot = scratch;
  p.rowDotOut = scratch;
  p.dqkv = dqkv;
  const cudaError_t e = C / heads == 64 ? backward<64>(p, T, stream) : backward<128>(p, T, stream);
  return e == cudaSuccess ? "" : std::string(what) + ": " + cudaGetErrorString(e);
}

} // namespace mhcc::runtime::cuda
