//===- FlashAttentionBackward.cu - bf16 causal flash attention: the backward ===//
//
// rowDot, dK/dV and dQ kernels (deterministic, no atomics) and their launch
// (FlashAttentionTiles.cuh says how the kernels work).
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/FlashAttentionTiles.cuh"

namespace mhcc::runtime::cuda {
namespace {

using namespace flash;

// ---- backward -----------------------------------------------------------------------------

/// D[token, head] = sum over e of dO * O, in fp32: one warp per (token, head), a fixed butterfly sum.
template <int D> __global__ void __launch_bounds__(kThreads) rowDotKernel(Params p, int64_t pairs) {
  dependentPrologue();
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
  dependentPrologue();
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
  const RowStats stats(p, tok0 + row0 + g, pos.h, active);
  const float(&lseLog2)[2] = stats.lseLog2, (&rowDot)[2] = stats.rowDot;
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
  for (int r = 0; r < 2; ++r)
    storeAccumulatorRow<D>(p.dqkv + (tok0 + row0 + g + 8 * r) * p.ld + pos.h * D + 2 * t, dq, r, p.scale);
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
  dependentPrologue();
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
    nTiles = tilesSeeingKeys(queryFirstKeys, nTiles, kTile, n0 + keys - 1);
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
    storeAccumulatorRow<D>(outK, dk, r, p.scale);
    storeAccumulatorRow<D>(outV, dv, r, 1.0f); // x * 1 is x, exactly
  }
}

template <int D> cudaError_t rowDot(const Params &p, int64_t T, cudaStream_t stream) {
  const int64_t pairs = T * p.heads;
  return launchDependent(rowDotKernel<D>, dim3(unsigned((pairs + kWarps - 1) / kWarps)), dim3(kThreads), 0, stream, p,
                         pairs);
}

/// With `rowDotReady`, p.rowDot already holds D.
template <int D> std::string backward(const Params &p, int64_t T, cudaStream_t stream, bool rowDotReady) {
  cudaError_t e = rowDotReady ? cudaSuccess : rowDot<D>(p, T, stream);
  if (e == cudaSuccess && flashKernels() == FlashKernels::kWgmma)
    return flashAttentionBackwardWgmma(p, D, stream);
  if (e == cudaSuccess)
    e = launch(p.firstKeys ? dkdvKernel<D, true> : dkdvKernel<D, false>, p, int64_t(p.launchTiles) * p.batchHeads,
               dkdvSmem<D>(), stream);
  if (e == cudaSuccess)
    e = launch(p.firstKeys ? dqKernel<D, true> : dqKernel<D, false>, p, int64_t(p.launchTiles) * p.batchHeads,
               dqSmem<D>(), stream);
  return e == cudaSuccess ? "" : cudaGetErrorString(e);
}

} // namespace
int64_t flashAttentionBackwardScratch(int64_t T, int64_t C, int64_t heads) {
  (void)C;
  return T * heads; // D = rowsum(dO * O) per (token, head)
}

std::string flashAttentionBackward(const __nv_bfloat16 *qkv, const __nv_bfloat16 *o, const __nv_bfloat16 *dO,
                                   const float *lse, __nv_bfloat16 *dqkv, float *scratch, int64_t T, int64_t C,
                                   int64_t heads, int64_t seq, const int32_t *firstKeys, cudaStream_t stream,
                                   const float *rowDotIn, FlashRowRanges rows) {
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
  p.rowDot = rowDotIn ? rowDotIn : scratch;
  p.rowDotOut = scratch;
  p.dqkv = dqkv;
  restrictTiles(p, rows);
  const bool ready = rowDotIn != nullptr;
  const std::string problem = C / heads == 64 ? backward<64>(p, T, stream, ready) : backward<128>(p, T, stream, ready);
  return problem.empty() ? "" : std::string(what) + ": " + problem;
}

std::string flashAttentionRowDot(const __nv_bfloat16 *o, const __nv_bfloat16 *dO, float *rowDotOut, int64_t T,
                                 int64_t C, int64_t heads, cudaStream_t stream) {
  const char *what = "flashAttentionRowDot";
  if (heads <= 0 || C % heads || (C / heads != 64 && C / heads != 128))
    return std::string(what) + ": head dim " + std::to_string(heads > 0 ? C / heads : 0) + " (64 or 128 only)";
  if (T == 0)
    return "";
  Params p = makeParams(T, C, heads, 64);
  p.o = o;
  p.dO = dO;
  p.rowDotOut = rowDotOut;
  const cudaError_t e = C / heads == 64 ? rowDot<64>(p, T, stream) : rowDot<128>(p, T, stream);
  return e == cudaSuccess ? "" : std::string(what) + ": " + cudaGetErrorString(e);
}

} // namespace mhcc::runtime::cuda