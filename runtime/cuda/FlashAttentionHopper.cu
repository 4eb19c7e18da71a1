//===- FlashAttentionHopper.cu - flash attention forward on wgmma (sm_90a) -===//
//
// The forward of FlashAttention.h on Hopper's warpgroup MMA: a block of two
// computing warpgroups owns 128 query rows (64 each) and a third streams
// 128-key tiles of K and V through double-buffered shared memory (TMA, with
// mbarriers, FlashAttention-3's warp specialization); per tile a
// warpgroup computes S = Q K^T (wgmma, Q and K from shared memory), the
// online softmax in registers (FlashAttentionTiles.cuh's arithmetic), and
// O += P V with P straight from registers. Same contract and precision as
// the mma.sync forward, packed documents included (a block starts at its
// first query's document, the masks add the documents' starts); the bits
// differ from it (128-key tiles rescale O half as often).
//
// Also here: wgmmaLayoutCheck, which runs the two product forms the kernel
// uses on exact small integers, so a descriptor or layout slip shows as a
// wrong product rather than as a wrong attention.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/FlashAttentionWgmma.cuh"

#include <cudaTypedefs.h>

#include <vector>

namespace mhcc::runtime::cuda {
namespace {

using namespace flash;

constexpr int kKeyTile = 128; // keys per streamed tile: one m64n128 score product per warpgroup

/// Online softmax of one warp's 16 rows over a 128-key score tile: s becomes the unnormalized probabilities,
/// rowMax and rowSum move on, corr is the factor O must be rescaled by (applied by the caller once the product
/// that is still adding the previous tile into O is done). The arithmetic of forwardTile in FlashAttention.cu.
__device__ __forceinline__ void onlineSoftmax(float (&s)[kKeyTile / 8][4], float (&rowMax)[2], float (&rowSum)[2],
                                              float (&corr)[2], float scaleLog2) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = rowMax[r];
#pragma unroll
    for (int nb = 0; nb < kKeyTile / 8; ++nb)
      mx = fmaxf(mx, fmaxf(s[nb][2 * r], s[nb][2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float safe = mx == -INFINITY ? 0.f : mx;
    const float base = safe * scaleLog2;
    corr[r] = fastExp2((rowMax[r] - safe) * scaleLog2);
    rowMax[r] = mx;
    float sum = 0.f;
#pragma unroll
    for (int nb = 0; nb < kKeyTile / 8; ++nb)
#pragma unroll
      for (int x = 2 * r; x < 2 * r + 2; ++x) {
        s[nb][x] = fastExp2(fmaf(s[nb][x], scaleLog2, -base));
        sum += s[nb][x];
      }
    rowSum[r] = rowSum[r] * corr[r] + sum;
  }
}

/// The probabilities as the A operand of O += P V: bf16 pairs, one 16-key k-step per row of `a`.
__device__ __forceinline__ void probabilityFragments(const float (&s)[kKeyTile / 8][4],
                                                     uint32_t (&a)[kKeyTile / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kKeyTile / 16; ++kk) {
    a[kk][0] = packBf16(s[2 * kk][0], s[2 * kk][1]);
    a[kk][1] = packBf16(s[2 * kk][2], s[2 * kk][3]);
    a[kk][2] = packBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[kk][3] = packBf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

template <int D>
__device__ __forceinline__ void issueScores(float (&s)[kKeyTile / 8][4], uint32_t qTile, int groupRow, uint32_t kTile) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    wg::wgmmaSS<kKeyTile>(s, wg::kMajor<kBlockRows>(qTile, groupRow, kk * 16), wg::kMajor<kKeyTile>(kTile, 0, kk * 16),
                          kk > 0);
}

template <int D>
__device__ __forceinline__ void issueValues(float (&acc)[D / 8][4], const uint32_t (&a)[kKeyTile / 16][4],
                                            uint32_t vTile) {
#pragma unroll
  for (int kk = 0; kk < kKeyTile / 16; ++kk)
    wg::wgmmaRS<D>(acc, a[kk], wg::mnMajor<kKeyTile>(vTile, kk * 16), 1);
}

constexpr int kForwardThreads = tma::kSpecializedThreads;

template <int D> constexpr int hopperForwardSmem() { return (kBlockRows + 4 * kKeyTile) * D * 2 + 1024 + 128; }

/// One block: 128 query rows of one (sequence, head), key tiles 0 .. the diagonal (from the first query's
/// document on). Warp-specialized as FlashAttention-3: one thread of the third warpgroup issues every load (Q, then
/// K_j and V_j into double buffers, each as soon as the products that read the buffer's previous tile are done), so
/// the two computing warpgroups never wait on each other, only on their data. Each is software-pipelined: while
/// the tensor cores add tile j-1's P V into O, the next scores S_j are computed and their softmax runs; O is
/// rescaled once that product is done. Rows past the sequence are loaded from the next one (or as zeros past the
/// matrix), not zeros as with cp.async: keys there are masked (P = 0, which leaves O as it is while those rows are
/// finite, as the model's values are), query rows not stored.
template <int D, bool kDocuments>
__global__ void __launch_bounds__(kForwardThreads, 1)
    hopperForwardKernel(const __grid_constant__ CUtensorMap qkvMap, Params p) {
  extern __shared__ unsigned char smem[];
  dependentPrologue();
  const uint32_t sQ = (smemAddr(smem) + 1023u) & ~1023u; // the swizzle needs 1024-byte aligned tiles
  constexpr uint32_t kQBytes = kBlockRows * D * 2, kKVBytes = kKeyTile * D * 2;
  const uint32_t sK = sQ + kQBytes, sV = sK + 2 * kKVBytes; // [2] each
  // mbarriers: Q full, then K full, V full, K empty, V empty for buffers 0 and 1.
  const uint32_t qFull = sV + 2 * kKVBytes, kFull = qFull + 8, vFull = kFull + 16, kEmpty = vFull + 16,
                 vEmpty = kEmpty + 16;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const BlockPos pos = blockPos(p, true);
  const int m0 = pos.tile * kBlockRows, rows = min(kBlockRows, p.seq - m0);
  const int nTiles = (m0 + rows + kKeyTile - 1) / kKeyTile;
  const int64_t tok0 = int64_t(pos.b) * p.seq;
  const int32_t *seqFirstKeys = kDocuments ? p.firstKeys + tok0 : nullptr;
  const int tile0 = kDocuments ? seqFirstKeys[m0] / kKeyTile : 0; // the first key tile any query sees
  // Key tile it sits in buffer (it - tile0) & 1, its ((it - tile0) / 2)-th use of that buffer.
  const auto buffer = [&](int it) { return uint32_t((it - tile0) & 1); };
  const auto use = [&](int it) { return uint32_t((it - tile0) >> 1); };
  if (tid == 0) {
    tma::init(qFull, 1);
    for (int b = 0; b < 2; ++b) {
      tma::init(kFull + 8 * b, 1);
      tma::init(vFull + 8 * b, 1);
      tma::init(kEmpty + 8 * b, 256);
      tma::init(vEmpty + 8 * b, 256);
    }
    tma::fenceInit();
  }
  __syncthreads();

  if (warp >= 8) { // the loading warpgroup
    tma::keepRegisters<tma::kLoaderRegisters>();
    if (tid == 256) {
      const int row = int(tok0), qCol = pos.h * D, kCol = int(p.C) + pos.h * D, vCol = 2 * int(p.C) + pos.h * D;
      tma::expectBytes(qFull, kQBytes);
      tma::loadTile<D, kBlockRows, kBlockRows>(sQ, qkvMap, qCol, row + m0, qFull);
      for (int it = tile0; it < nTiles; ++it) {
        const uint32_t b = buffer(it), u = use(it);
        if (u > 0)
          tma::wait(kEmpty + 8 * b, (u - 1) & 1); // S_{it-2} has read K_{it-2}
        tma::expectBytes(kFull + 8 * b, kKVBytes);
        tma::loadTile<D, kKeyTile, kKeyTile>(sK + b * kKVBytes, qkvMap, kCol, row + it * kKeyTile, kFull + 8 * b);
        if (u > 0)
          tma::wait(vEmpty + 8 * b, (u - 1) & 1); // P_{it-2} V_{it-2} is done
        tma::expectBytes(vFull + 8 * b, kKVBytes);
        tma::loadTile<D, kKeyTile, kKeyTile>(sV + b * kKVBytes, qkvMap, vCol, row + it * kKeyTile, vFull + 8 * b);
      }
    }
    return;
  }
  tma::takeRegisters<tma::kComputeRegisters>();

  const int groupRow = 64 * (warp / 4); // the warpgroup's first row in the block
  // A half-filled last block's second warpgroup computes on rows of the next sequence (or zeros) and stores nothing.
  const int row0 = m0 + groupRow + 16 * (warp % 4); // the warp's first query
  const WarpDocuments docs(seqFirstKeys, row0, g, row0 < p.seq);
  float acc[D / 8][4] = {}, s[kKeyTile / 8][4] = {}, corr[2];
  float rowMax[2] = {-INFINITY, -INFINITY}, rowSum[2] = {0.f, 0.f};
  uint32_t a[kKeyTile / 16][4];
  const auto maskedSoftmax = [&](int it) {
    const int n0 = it * kKeyTile;
    // Keys past some of the warp's queries (also those past seq), or before some of their documents.
    if (n0 + kKeyTile - 1 > row0 || (kDocuments && n0 < docs.highest))
      queryMask<kKeyTile>(s, row0 + g, n0 + 2 * t, docs.first);
    onlineSoftmax(s, rowMax, rowSum, corr, p.scaleLog2);
  };
  const auto scores = [&](int it) {
    tma::wait(kFull + 8 * buffer(it), use(it) & 1);
    wg::fence();
    issueScores<D>(s, sQ, groupRow, sK + buffer(it) * kKVBytes);
    wg::commit();
  };
  const auto values = [&](int it) {
    tma::wait(vFull + 8 * buffer(it), use(it) & 1);
    issueValues<D>(acc, a, sV + buffer(it) * kKVBytes);
    wg::commit();
  };

  tma::wait(qFull, 0);
  scores(tile0);
  wg::wait<0>();
  wg::pin<kKeyTile>(s);
  tma::arrive(kEmpty + 8 * buffer(tile0));
  maskedSoftmax(tile0); // O is still 0: nothing to rescale
  probabilityFragments(s, a);
#pragma unroll 1
  for (int it = tile0 + 1; it < nTiles; ++it) {
    scores(it);
    values(it - 1);
    wg::wait<1>(); // the scores; P V still runs
    wg::pin<kKeyTile>(s);
    tma::arrive(kEmpty + 8 * buffer(it));
    maskedSoftmax(it);
    wg::wait<0>(); // P_{it-1} V_{it-1} is in O: rescale it, and its operand registers are free
    wg::pin<D>(acc);
    tma::arrive(vEmpty + 8 * buffer(it - 1));
#pragma unroll
    for (int db = 0; db < D / 8; ++db)
#pragma unroll
      for (int x = 0; x < 4; ++x)
        acc[db][x] *= corr[x >> 1];
    probabilityFragments(s, a);
  }
  wg::fence();
  values(nTiles - 1);
  wg::wait<0>();
  wg::pin<D>(acc);
  storeForwardRows<D>(p, acc, rowMax, rowSum, tok0, row0, pos.h, g, t);
}

// ---- the layout check -----------------------------------------------------------------------

constexpr int kCheckK = 128, kCheckN = 128;

/// One warpgroup: ss = A B^T with A [64, 128] and B [128, 128] row-major (both read K-major), rs = A C with
/// A from registers and C [128 (k), 128 (n)] read MN-major. Outputs [64, 128] fp32 row-major.
__global__ void __launch_bounds__(128, 1)
    layoutCheckKernel(const bf16 *a, const bf16 *b, const bf16 *c, float *ss, float *rs) {
  extern __shared__ unsigned char smem[];
  const uint32_t sA = (smemAddr(smem) + 1023u) & ~1023u, sB = sA + 64 * kCheckK * 2, sC = sB + kCheckN * kCheckK * 2;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  wg::loadTile<kCheckK, 64, 128>(sA, a, kCheckK, 64, tid);
  wg::loadTile<kCheckK, kCheckN, 128>(sB, b, kCheckK, kCheckN, tid);
  wg::loadTile<kCheckN, kCheckK, 128>(sC, c, kCheckN, kCheckK, tid);
  cpAsyncCommit();
  cpAsyncWait<0>();
  wg::fenceProxyAsync();
  __syncthreads();
  float d[kCheckN / 8][4] = {}, e[kCheckN / 8][4] = {};
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < kCheckK / 16; ++kk)
    wg::wgmmaSS<kCheckN>(d, wg::kMajor<64>(sA, 0, kk * 16), wg::kMajor<kCheckN>(sB, 0, kk * 16), kk > 0);
  wg::commit();
  const auto at = [&](int row, int col) {
    const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162 *>(a + row * kCheckK + col);
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
  };
  const int row = 16 * warp + g;
  uint32_t frag[kCheckK / 16][4];
#pragma unroll
  for (int kk = 0; kk < kCheckK / 16; ++kk) {
    frag[kk][0] = at(row, 16 * kk + 2 * t);
    frag[kk][1] = at(row + 8, 16 * kk + 2 * t);
    frag[kk][2] = at(row, 16 * kk + 8 + 2 * t);
    frag[kk][3] = at(row + 8, 16 * kk + 8 + 2 * t);
  }
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < kCheckK / 16; ++kk)
    wg::wgmmaRS<kCheckN>(e, frag[kk], wg::mnMajor<kCheckK>(sC, kk * 16), kk > 0);
  wg::commit();
  wg::wait<0>();
  wg::pin<kCheckN>(d);
  wg::pin<kCheckN>(e);
#pragma unroll
  for (int nb = 0; nb < kCheckN / 8; ++nb)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int r = row + 8 * (x / 2), col = 8 * nb + 2 * t + x % 2;
      ss[r * kCheckN + col] = d[nb][x];
      rs[r * kCheckN + col] = e[nb][x];
    }
}

using EncodeTiled = PFN_cuTensorMapEncodeTiled_v12000;

/// The driver's cuTensorMapEncodeTiled, resolved once through the runtime (no link against libcuda).
EncodeTiled encodeTiled() {
  static EncodeTiled fn = [] {
    void *address = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &address, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess)
      address = nullptr;
    return reinterpret_cast<EncodeTiled>(address);
  }();
  return fn;
}

template <int D> std::string hopperForward(const Params &p, cudaStream_t stream) {
  static_assert(kBlockRows == kKeyTile, "one box height serves the query and the key tiles");
  CUtensorMap map;
  if (std::string problem = tma::tensorMap(map, p.qkv, p.ld, p.tokens(), kBlockRows); !problem.empty())
    return problem;
  const cudaError_t e = launchWith(p.firstKeys ? hopperForwardKernel<D, true> : hopperForwardKernel<D, false>,
                                   kForwardThreads, int64_t(p.launchTiles) * p.batchHeads, hopperForwardSmem<D>(), stream,
                                   map, p);
  return e == cudaSuccess ? "" : cudaGetErrorString(e);
}

} // namespace

std::string flash::tma::tensorMap(CUtensorMap &map, const bf16 *base, int64_t cols, int64_t rows, int boxRows) {
  EncodeTiled encode = encodeTiled();
  if (!encode)
    return "the CUDA driver has no cuTensorMapEncodeTiled (a driver for CUDA 12 or later is needed)";
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols) * 2};
  const cuuint32_t box[2] = {64, cuuint32_t(boxRows)}, elementStrides[2] = {1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<bf16 *>(base), dims, strides, box,
                            elementStrides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? "" : "cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) + ")";
}

std::string flashAttentionForwardWgmma(const Params &p, int64_t d, cudaStream_t stream) {
  const std::string problem = d == 64 ? hopperForward<64>(p, stream) : hopperForward<128>(p, stream);
  return problem.empty() ? "" : "flashAttentionForward (wgmma): " + problem;
}

std::string wgmmaLayoutCheck() {
  // Small integers: every product and sum is exact in bf16 inputs and fp32 sums, so any mismatch is a layout bug.
  std::vector<bf16> a(64 * kCheckK), b(kCheckN * kCheckK), c(kCheckK * kCheckN);
  std::vector<float> fa(a.size()), fb(b.size()), fc(c.size());
  for (size_t i = 0; i < a.size(); ++i)
    a[i] = __float2bfloat16(fa[i] = float(int((i * 7 + 3) % 9) - 4));
  for (size_t i = 0; i < b.size(); ++i)
    b[i] = __float2bfloat16(fb[i] = float(int((i * 5 + 1) % 7) - 3));
  for (size_t i = 0; i < c.size(); ++i)
    c[i] = __float2bfloat16(fc[i] = float(int((i * 11 + 2) % 5) - 2));
  bf16 *dA = nullptr, *dB = nullptr, *dC = nullptr;
  float *dSS = nullptr, *dRS = nullptr;
  const size_t outBytes = 64 * kCheckN * 4;
  std::string err;
  auto check = [&](cudaError_t e, const char *what) {
    if (e != cudaSuccess && err.empty())
      err = std::string("wgmmaLayoutCheck: ") + what + ": " + cudaGetErrorString(e);
  };
  check(cudaMalloc(&dA, a.size() * 2), "cudaMalloc");
  check(cudaMalloc(&dB, b.size() * 2), "cudaMalloc");
  check(cudaMalloc(&dC, c.size() * 2), "cudaMalloc");
  check(cudaMalloc(&dSS, outBytes), "cudaMalloc");
  check(cudaMalloc(&dRS, outBytes), "cudaMalloc");
  std::vector<float> ss(64 * kCheckN), rs(64 * kCheckN);
  if (err.empty()) {
    check(cudaMemcpy(dA, a.data(), a.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
    check(cudaMemcpy(dB, b.data(), b.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
    check(cudaMemcpy(dC, c.data(), c.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
    const int smemBytes = (64 * kCheckK + 2 * kCheckN * kCheckK) * 2 + 1024;
    check(cudaFuncSetAttribute(layoutCheckKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smemBytes),
          "cudaFuncSetAttribute");
    layoutCheckKernel<<<1, 128, smemBytes>>>(dA, dB, dC, dSS, dRS);
    check(cudaGetLastError(), "launch");
    check(cudaMemcpy(ss.data(), dSS, outBytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    check(cudaMemcpy(rs.data(), dRS, outBytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  }
  for (void *ptr : {(void *)dA, (void *)dB, (void *)dC, (void *)dSS, (void *)dRS})
    cudaFree(ptr);
  if (!err.empty())
    return err;
  int badSS = 0, badRS = 0;
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < kCheckN; ++j) {
      float wantSS = 0.f, wantRS = 0.f;
      for (int k = 0; k < kCheckK; ++k) {
        wantSS += fa[i * kCheckK + k] * fb[j * kCheckK + k];
        wantRS += fa[i * kCheckK + k] * fc[k * kCheckN + j];
      }
      badSS += ss[i * kCheckN + j] != wantSS;
      badRS += rs[i * kCheckN + j] != wantRS;
    }
  if (badSS || badRS)
    return "wgmmaLayoutCheck: " + std::to_string(badSS) + " of " + std::to_string(64 * kCheckN) +
           " elements wrong in A B^T (K-major descriptors), " + std::to_string(badRS) +
           " in A B (register A, MN-major B)";
  return "";
}

} // namespace mhcc::runtime::cuda
