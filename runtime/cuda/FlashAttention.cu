//===- FlashAttention.cu - bf16 causal flash attention: the forward --------===//
//
// The forward kernel and its launch (FlashAttentionTiles.cuh says how the
// kernels work).
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/FlashAttentionTiles.cuh"

namespace mhcc::runtime::cuda {
namespace {

using namespace flash;

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
  dependentPrologue();
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
  if (active)
    storeForwardRows<D>(p, acc, rowMax, rowSum, tok0, row0, pos.h, g, t);
}

FlashKernels kernelChoice = FlashKernels::kWgmma;

template <int D> cudaError_t forward(const Params &p, cudaStream_t stream) {
  return launch(p.firstKeys ? forwardKernel<D, true> : forwardKernel<D, false>, p,
                int64_t(p.launchTiles) * p.batchHeads, forwardSmem<D>(), stream);
}

} // namespace

std::string flashAttentionForward(const __nv_bfloat16 *qkv, __nv_bfloat16 *o, float *lse, int64_t T, int64_t C,
                                  int64_t heads, int64_t seq, const int32_t *firstKeys, cudaStream_t stream,
                                  FlashRowRanges rows) {
  const char *what = "flashAttentionForward";
  std::string err = checkShapes(what, T, C, heads, seq, {{qkv, 16}, {o, 16}, {lse, 4}});
  if (!err.empty() || T == 0)
    return err;
  Params p = makeParams(T, C, heads, seq);
  p.qkv = qkv;
  p.firstKeys = firstKeys;
  p.oOut = o;
  p.lseOut = lse;
  restrictTiles(p, rows);
  if (kernelChoice == FlashKernels::kWgmma)
    return flashAttentionForwardWgmma(p, C / heads, stream);
  const cudaError_t e = C / heads == 64 ? forward<64>(p, stream) : forward<128>(p, stream);
  return e == cudaSuccess ? "" : std::string(what) + ": " + cudaGetErrorString(e);
}

void setFlashAttentionKernels(FlashKernels kernels) { kernelChoice = kernels; }
FlashKernels flashKernels() { return kernelChoice; }

} // namespace mhcc::runtime::cuda
