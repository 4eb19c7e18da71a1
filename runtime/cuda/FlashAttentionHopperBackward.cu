//===- FlashAttentionHopperBackward.cu - flash attention backward on wgmma -===//
//
// The dK/dV and dQ kernels of FlashAttentionBackward.cu on Hopper's
// warpgroup MMA (FlashAttentionWgmma.cuh), same contract, same arithmetic,
// deterministic the same way (no atomics; each output written once by one
// block, summed in tile order). A block of two warpgroups owns 128 rows (64
// each): keys in the dK/dV kernel, queries in the dQ kernel, and a third
// warpgroup streams 64-row tiles of the other side through three shared-memory
// buffers (TMA and mbarriers, as the forward in FlashAttentionHopper.cu).
// Per tile a warpgroup computes its two 64 x 64 score products from shared
// memory, the probabilities and dS in registers, and adds the two 64 x d
// products with P (or dS) straight from registers and the streamed tile read
// MN-major. rowDotKernel (D = rowsum(dO * O)) stays in
// FlashAttentionBackward.cu.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/FlashAttentionWgmma.cuh"

namespace mhcc::runtime::cuda {
namespace {

using namespace flash;

constexpr int kStream = 64; // rows of the streamed tiles
// Buffers of the streamed tiles: 3 measured 2-3.5% faster than 2 at d = 128 and d = 64, 4 within 1% of 3 but
// for packed documents (up to 5% slower, noisy) (docs/gpu_results.md, session 17 call 4).
constexpr int kStages = 3;
constexpr int kBarrierBytes = 8 + 16 * kStages;     // StreamBarriers' mbarriers

// Shared memory: the block's two [128, D] tiles, kStages buffers of the two streamed [64, D] tiles, 1024 for
// alignment, the mbarriers; dK/dV also streams the queries' lse, D and document starts.
template <int D> constexpr int hopperDqSmem() {
  return (2 * kBlockRows + 2 * kStages * kStream) * D * 2 + 1024 + kBarrierBytes;
}
template <int D> constexpr int hopperDkdvSmem() { return hopperDqSmem<D>() + 3 * kStages * kStream * 4; }

/// A 64 x 64 C-fragment tile, rounded to bf16, as the A operand of the next product: one 16-wide k-step per row.
__device__ __forceinline__ void operandFragments(const float (&c)[kStream / 8][4], uint32_t (&a)[kStream / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kStream / 16; ++kk) {
    a[kk][0] = packBf16(c[2 * kk][0], c[2 * kk][1]);
    a[kk][1] = packBf16(c[2 * kk][2], c[2 * kk][3]);
    a[kk][2] = packBf16(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[kk][3] = packBf16(c[2 * kk + 1][2], c[2 * kk + 1][3]);
  }
}

/// x (64 x kStream) = the warpgroup's 64 rows from row0 of tile a times the kStream rows of tile b, transposed.
template <int D, int kRowsA>
__device__ __forceinline__ void issueABt(float (&x)[kStream / 8][4], uint32_t a, int row0, uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    wg::wgmmaSS<kStream>(x, wg::kMajor<kRowsA>(a, row0, kk * 16), wg::kMajor<kStream>(b, 0, kk * 16), kk > 0);
}

/// acc (64 x D) += the operand fragments (64 x kStream) times the kStream x D tile b.
template <int D>
__device__ __forceinline__ void issueAB(float (&acc)[D / 8][4], const uint32_t (&a)[kStream / 16][4], uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < kStream / 16; ++kk)
    wg::wgmmaRS<D>(acc, a[kk], wg::mnMajor<kStream>(b, kk * 16), 1);
}

/// Barriers of a warp-specialized backward block (addresses, computed so no array lands in local memory): its own
/// two tiles, then full and empty for each streamed buffer.
struct StreamBarriers {
  uint32_t own;
  __device__ uint32_t full(int b) const { return own + 8 + 16 * b; }
  __device__ uint32_t empty(int b) const { return own + 16 + 16 * b; }
  __device__ StreamBarriers(uint32_t at, int fullArrivals) : own(at) {
    if (threadIdx.x == 0) {
      tma::init(own, 1);
      for (int b = 0; b < kStages; ++b) {
        tma::init(full(b), fullArrivals);
        tma::init(empty(b), 256); // every thread of the computing warpgroups
      }
      tma::fenceInit();
    }
    __syncthreads();
  }
};

/// One block: dK and dV of 128 keys of one (sequence, head), query tiles from the first key to the sequence's end
/// (or the first tile past the keys' documents). Warp-specialized as the forward: the third warpgroup's first warp
/// loads K and V, then each query tile (Q and dO by TMA, the queries' lse, D and document starts by its lanes) as
/// soon as the products that read the buffer's previous tile are done.
template <int D, bool kDocuments>
__global__ void __launch_bounds__(tma::kSpecializedThreads, 1)
    hopperDkdvKernel(const __grid_constant__ CUtensorMap qkvMap, const __grid_constant__ CUtensorMap dOMap, Params p) {
  extern __shared__ unsigned char smem[];
  dependentPrologue();
  const uint32_t sK = (smemAddr(smem) + 1023u) & ~1023u;
  constexpr uint32_t kOwnBytes = kBlockRows * D * 2, kStreamBytes = kStream * D * 2;
  const uint32_t sV = sK + kOwnBytes, sQ = sV + kOwnBytes, sdO = sQ + kStages * kStreamBytes; // [kStages] each
  float *sLse = reinterpret_cast<float *>(smem + (sdO + kStages * kStreamBytes - smemAddr(smem))); // [kStages][kStream]
  float *sDot = sLse + kStages * kStream;                                                       // [kStages][kStream]
  int *sFirst = reinterpret_cast<int *>(sDot + kStages * kStream); // [kStages][kStream]: the queries' documents' starts
  // A query tile's barrier: the TMA bytes (one arrival) and the loading warp's 32 lanes after their stores.
  const StreamBarriers bars(smemAddr(sFirst + kStages * kStream), 33);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const BlockPos pos = blockPos(p, false);
  const int n0 = pos.tile * kBlockRows, keys = min(kBlockRows, p.seq - n0);
  int nTiles = (p.seq - n0) / kStream;                // query tiles n0 .. seq - 1
  const int64_t first = int64_t(pos.b) * p.seq + n0; // token of the first key and of the first query
  const int32_t *queryFirstKeys = kDocuments ? p.firstKeys + first : nullptr;
  if (kDocuments) {
    nTiles = tilesSeeingKeys(queryFirstKeys, nTiles, kStream, n0 + keys - 1);
  }

  if (warp >= 8) { // the loading warpgroup
    tma::keepRegisters<tma::kLoaderRegisters>();
    if (warp != 8)
      return;
    const int row = int(first), col = pos.h * D;
    if (lane == 0) {
      tma::expectBytes(bars.own, 2 * kOwnBytes);
      tma::loadTile<D, kBlockRows, kStream>(sK, qkvMap, int(p.C) + col, row, bars.own);
      tma::loadTile<D, kBlockRows, kStream>(sV, qkvMap, 2 * int(p.C) + col, row, bars.own);
    }
    for (int it = 0; it < nTiles; ++it) {
      const int b = it % kStages, u = it / kStages;
      if (u > 0)
        tma::wait(bars.empty(b), (u - 1) & 1);
      if (lane == 0) { // the tiles first: the lanes' loads below take a round trip
        tma::expectBytes(bars.full(b), 2 * kStreamBytes);
        tma::loadTile<D, kStream, kStream>(sQ + b * kStreamBytes, qkvMap, col, row + it * kStream, bars.full(b));
        tma::loadTile<D, kStream, kStream>(sdO + b * kStreamBytes, dOMap, col, row + it * kStream, bars.full(b));
      }
      for (int q = lane; q < kStream; q += 32) { // lse and D are [T, heads]: one float per query
        const int64_t i = (first + int64_t(it) * kStream + q) * p.heads + pos.h;
        sLse[b * kStream + q] = p.lse[i];
        sDot[b * kStream + q] = p.rowDot[i];
        if (kDocuments)
          sFirst[b * kStream + q] = queryFirstKeys[it * kStream + q];
      }
      tma::arrive(bars.full(b)); // after this lane's stores
    }
    return;
  }
  tma::takeRegisters<tma::kComputeRegisters>();

  // A half-filled last block's second warpgroup computes on the next sequence's keys (or zeros; masked: every
  // query is before them) and stores nothing; wgmma must not sit in divergent code.
  const int groupRow = 64 * (warp / 4);
  const int key0 = n0 + groupRow + 16 * (warp % 4); // the warp's first key
  float dk[D / 8][4] = {}, dv[D / 8][4] = {}, st[kStream / 8][4], dpt[kStream / 8][4];
  uint32_t a[kStream / 16][4], b[kStream / 16][4]; // P^T and dS^T as operands
  tma::wait(bars.own, 0);
#pragma unroll 1
  for (int it = 0; it < nTiles; ++it) {
    const int buf = it % kStages;
    tma::wait(bars.full(buf), (it / kStages) & 1);
    const uint32_t qTile = sQ + buf * kStreamBytes, doTile = sdO + buf * kStreamBytes;
    wg::fence();
    issueABt<D, kBlockRows>(st, sK, groupRow, qTile);  // S^T = K Q^T
    issueABt<D, kBlockRows>(dpt, sV, groupRow, doTile); // dP^T = V dO^T
    wg::commit();
    wg::wait<0>();
    wg::pin<kStream>(st);
    wg::pin<kStream>(dpt);
    const int q0 = n0 + it * kStream; // the tile's first query
    const float *lse = sLse + buf * kStream, *rowDot = sDot + buf * kStream;
    const int *firstOf = kDocuments ? sFirst + buf * kStream : nullptr;
    // Some query before some key of the warp, or (documents) some query whose document starts after a key.
    if (q0 < key0 + 15 || (kDocuments && firstOf[kStream - 1] > key0))
      keyMask<kStream>(st, key0 + g, q0 + 2 * t, firstOf, t);
#pragma unroll
    for (int nb = 0; nb < kStream / 8; ++nb) {
      const float2 l = *reinterpret_cast<const float2 *>(lse + nb * 8 + 2 * t); // columns 2t, 2t+1
      const float2 d = *reinterpret_cast<const float2 *>(rowDot + nb * 8 + 2 * t);
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const float prob = fastExp2(fmaf(st[nb][x], p.scaleLog2, -((x & 1) ? l.y : l.x) * kLog2e)); // masked: 0
        st[nb][x] = prob;
        dpt[nb][x] = prob * (dpt[nb][x] - ((x & 1) ? d.y : d.x));
      }
    }
    operandFragments(st, a);
    operandFragments(dpt, b);
    wg::fence();
    issueAB<D>(dv, a, doTile); // dV += P^T dO
    issueAB<D>(dk, b, qTile);  // dK += dS^T Q
    wg::commit();
    wg::wait<0>();
    wg::pin<D>(dk);
    wg::pin<D>(dv);
    tma::arrive(bars.empty(buf)); // this thread is done with `buf`
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key0 + g + 8 * r - n0;
    if (key >= keys)
      continue;
    bf16 *outK = p.dqkv + (first + key) * p.ld + p.C + pos.h * D + 2 * t, *outV = outK + p.C;
    storeAccumulatorRow<D>(outK, dk, r, p.scale);
    storeAccumulatorRow<D>(outV, dv, r, 1.0f); // x * 1 is x, exactly
  }
}

/// One block: dQ of 128 query rows of one (sequence, head), key tiles 0 .. the diagonal (from the first query's
/// document on). Warp-specialized: one thread of the third warpgroup loads Q and dO, then each K and V tile.
template <int D, bool kDocuments>
__global__ void __launch_bounds__(tma::kSpecializedThreads, 1)
    hopperDqKernel(const __grid_constant__ CUtensorMap qkvMap, const __grid_constant__ CUtensorMap dOMap, Params p) {
  extern __shared__ unsigned char smem[];
  dependentPrologue();
  const uint32_t sQ = (smemAddr(smem) + 1023u) & ~1023u;
  constexpr uint32_t kOwnBytes = kBlockRows * D * 2, kStreamBytes = kStream * D * 2;
  const uint32_t sdO = sQ + kOwnBytes, sK = sdO + kOwnBytes, sV = sK + kStages * kStreamBytes; // [kStages] each
  const StreamBarriers bars(sV + kStages * kStreamBytes, 1);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const BlockPos pos = blockPos(p, true);
  const int m0 = pos.tile * kBlockRows, rows = min(kBlockRows, p.seq - m0);
  const int nTiles = (m0 + rows) / kStream;
  const int64_t tok0 = int64_t(pos.b) * p.seq;
  const int32_t *seqFirstKeys = kDocuments ? p.firstKeys + tok0 : nullptr;
  const int tile0 = kDocuments ? seqFirstKeys[m0] / kStream : 0; // the first key tile any query sees

  if (warp >= 8) { // the loading warpgroup
    tma::keepRegisters<tma::kLoaderRegisters>();
    if (tid != 256)
      return;
    const int row = int(tok0), col = pos.h * D;
    tma::expectBytes(bars.own, 2 * kOwnBytes);
    tma::loadTile<D, kBlockRows, kStream>(sQ, qkvMap, col, row + m0, bars.own);
    tma::loadTile<D, kBlockRows, kStream>(sdO, dOMap, col, row + m0, bars.own);
    for (int it = tile0; it < nTiles; ++it) {
      const int b = (it - tile0) % kStages, u = (it - tile0) / kStages;
      if (u > 0)
        tma::wait(bars.empty(b), (u - 1) & 1);
      tma::expectBytes(bars.full(b), 2 * kStreamBytes);
      tma::loadTile<D, kStream, kStream>(sK + b * kStreamBytes, qkvMap, int(p.C) + col, row + it * kStream,
                                         bars.full(b));
      tma::loadTile<D, kStream, kStream>(sV + b * kStreamBytes, qkvMap, 2 * int(p.C) + col, row + it * kStream,
                                         bars.full(b));
    }
    return;
  }
  tma::takeRegisters<tma::kComputeRegisters>();

  // A half-filled last block's second warpgroup computes on the next sequence's rows (or zeros) and stores nothing.
  const int groupRow = 64 * (warp / 4);
  const int row0 = m0 + groupRow + 16 * (warp % 4); // the warp's first query
  const bool active = row0 < p.seq;
  const WarpDocuments docs(seqFirstKeys, row0, g, active);
  const RowStats stats(p, tok0 + row0 + g, pos.h, active);
  const float(&lseLog2)[2] = stats.lseLog2, (&rowDot)[2] = stats.rowDot;
  float dq[D / 8][4] = {}, s[kStream / 8][4], dp[kStream / 8][4];
  uint32_t a[kStream / 16][4];
  tma::wait(bars.own, 0);
#pragma unroll 1
  for (int it = tile0; it < nTiles; ++it) {
    const int b = (it - tile0) % kStages;
    const uint32_t buf = uint32_t(b) * kStreamBytes;
    tma::wait(bars.full(b), ((it - tile0) / kStages) & 1);
    wg::fence();
    issueABt<D, kBlockRows>(s, sQ, groupRow, sK + buf);   // S = Q K^T
    issueABt<D, kBlockRows>(dp, sdO, groupRow, sV + buf); // dP = dO V^T
    wg::commit();
    wg::wait<0>();
    wg::pin<kStream>(s);
    wg::pin<kStream>(dp);
    const int n0 = it * kStream;
    if (n0 + kStream - 1 > row0 || (kDocuments && n0 < docs.highest))
      queryMask<kStream>(s, row0 + g, n0 + 2 * t, docs.first);
#pragma unroll
    for (int nb = 0; nb < kStream / 8; ++nb)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const float prob = fastExp2(fmaf(s[nb][x], p.scaleLog2, -lseLog2[x >> 1])); // masked: 0
        s[nb][x] = prob * (dp[nb][x] - rowDot[x >> 1]);
      }
    operandFragments(s, a);
    wg::fence();
    issueAB<D>(dq, a, sK + buf); // dQ += dS K
    wg::commit();
    wg::wait<0>();
    wg::pin<D>(dq);
    tma::arrive(bars.empty(b));
  }
  if (!active)
    return;
#pragma unroll
  for (int r = 0; r < 2; ++r)
    storeAccumulatorRow<D>(p.dqkv + (tok0 + row0 + g + 8 * r) * p.ld + pos.h * D + 2 * t, dq, r, p.scale);
}

template <int D> std::string hopperBackward(const Params &p, cudaStream_t stream) {
  CUtensorMap qkvMap, dOMap;
  std::string problem = tma::tensorMap(qkvMap, p.qkv, p.ld, p.tokens(), kStream);
  if (problem.empty())
    problem = tma::tensorMap(dOMap, p.dO, p.C, p.tokens(), kStream);
  if (!problem.empty())
    return problem;
  const int64_t blocks = int64_t(p.launchTiles) * p.batchHeads;
  cudaError_t e = launchWith(p.firstKeys ? hopperDkdvKernel<D, true> : hopperDkdvKernel<D, false>,
                             tma::kSpecializedThreads, blocks, hopperDkdvSmem<D>(), stream, qkvMap, dOMap, p);
  if (e == cudaSuccess)
    e = launchWith(p.firstKeys ? hopperDqKernel<D, true> : hopperDqKernel<D, false>, tma::kSpecializedThreads, blocks,
                   hopperDqSmem<D>(), stream, qkvMap, dOMap, p);
  return e == cudaSuccess ? "" : cudaGetErrorString(e);
}

} // namespace

std::string flashAttentionBackwardWgmma(const flash::Params &p, int64_t d, cudaStream_t stream) {
  return d == 64 ? hopperBackward<64>(p, stream) : hopperBackward<128>(p, stream);
}

} // namespace mhcc::runtime::cuda
