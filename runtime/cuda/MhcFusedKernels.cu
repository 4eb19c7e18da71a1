//===- MhcFusedKernels.cu - the mHC sublayer's entry in one kernel (bf16) -------===//
//
// A part of the model's kernel library: mhcc concatenates ModelKernels.cu,
// MhcKernels.cu, MhcMixKernels.cu, MhcFusedKernels.cu, MhcBackwardKernels.cu and LayerKernels.cu
// (in that order) after the model's constants and compiles them as one file;
// the helpers and conventions are ModelKernels.cu's.
//
//===----------------------------------------------------------------------===//

// ---- the mHC forward's entry: RMS, projection, coefficients, pre-mix -------------------
// mhcc_mhc_coeffs_pre_forward does what mhcc_row_squares, the projection
// p = x wmap (cuBLASLt), mhcc_mhc_coeffs_forward and mhcc_mhc_pre_forward do
// one after another, reading the n C residual rows from DRAM once (the pre-mix
// reads them again right after, from L2). Same outputs, in the same places:
// coef, aux (h, r; then p and the row squares, kept for the backward) and u.
// The coefficients and u are those kernels' expressions (mhcTokenCoeffs,
// PreMixVector) of p and the squares, whose sums run here in an order
// fixed by the shapes: a lane's elements in order, its 4 lanes by butterfly,
// then the warps in order; the products' K-sums on mma.sync (bf16 in, fp32
// accumulate, fixed by the instruction). So the kernel is deterministic and
// layout-independent, but not the bits of the cuBLASLt path, which stays for
// fp32 models (their bits) and for shapes this kernel does not take.
//
// Taken by bf16 images with an even stream count (K = n^2 + 2n a multiple
// of 8: whole 16-byte chunks per wmap row, one mma n-tile each), width = nC a
// multiple of 64 and C of kVec (mhcFusedForwardApplies on the host).
//
// Tiles: a block of kFusedWarps warps (16; 8 at n = 6, 8) takes kFusedTokens = 16 tokens (one mma
// M tile: rows g and g + 8 of a lane's group g = lane / 4). Warp w walks the
// width in steps of kFusedRows columns, w, w + kFusedWarps, ...: lane (g, q =
// lane % 4) loads 16 bytes of tokens g and g + 8 at columns 32 h + 8 q (h <
// kFusedVectors), and the warp stages wmap's kFusedRows rows of the step in
// its shared buffer. mma's K order within a 16-column slice is free (the sum
// is the instruction's): a lane's 8 loaded columns 8 q + 0..7 feed two mmas,
// words 0 and 2 (columns 8q + 0,1 and 8q + 4,5) as the A fragment's k = 2q,
// 2q + 1 and 2q + 8, 2q + 9 of the first, words 1 and 3 of the second; the B
// fragments come from ldmatrix.trans with row addresses permuted the same way.
// A staged wmap row p's 16-byte chunk c sits at slot p * kFusedTiles + c + p / 4:
// the spare slot every four rows puts ldmatrix's 8 rows (p = 8 q' + b + o) in 8
// different bank groups at n = 4.

constexpr int kFusedTokens = 16;
constexpr int kFusedTiles = kCoefficients / 8 > 0 ? kCoefficients / 8 : 1; // mma n-tiles: 8 coefficients each
// Up to n = 8 (10 n-tiles): beyond, the stages outgrow 48 KB and the host
// keeps the separate kernels (mhcFusedForwardApplies).
constexpr bool kFusedSupported = sizeof(act_t) == 2 && kCoefficients % 8 == 0 && kFusedTiles <= 10;
// One block an SM at 1b's 2048 tokens a microbatch: as many warps as the
// registers (at most 128 a thread) and 48 KB of stages allow, for latency.
constexpr int kFusedWarps = kFusedTiles <= 5 ? 16 : 8;
constexpr int kFusedRows = 32;                                              // wmap rows a warp stages a step
constexpr int kFusedVectors = kFusedRows / 32;                              // 16-byte x loads a token, lane, step
constexpr int kFusedStageLoads = kFusedRows * kFusedTiles / 32;             // 16-byte wmap loads a lane, step
// Steps in flight a warp: 3 keeps 32 KB of x loads in flight an SM at n = 4
// (one a step left the SM's loads idle a third of the time: ncu, session 19);
// 20 registers a step there.
constexpr int kFusedDepth = kFusedTiles <= 5 ? 3 : 2;
// (Checked here also so that images without an entryWalk, fp32 ones, use them: nvcc warns otherwise.)
static_assert(kFusedVectors >= 1 && kFusedStageLoads >= 1 && kFusedDepth >= 2, "entryWalk's ring");
constexpr int kFusedStageSlots = kFusedSupported ? kFusedRows * kFusedTiles + kFusedRows / 4 : 1;
constexpr int kFusedStageBytes = kFusedWarps * kFusedStageSlots * 16;
constexpr int kFusedPartialBytes = kFusedSupported ? kFusedWarps * kFusedTokens * kCoefficients * 4 : 16;
constexpr int kFusedSharedBytes = kFusedStageBytes > kFusedPartialBytes ? kFusedStageBytes : kFusedPartialBytes;
extern "C" __device__ const int mhcc_abi_fused_tokens = kFusedTokens;
extern "C" __device__ const int mhcc_abi_fused_warps = kFusedWarps;

__device__ __forceinline__ float squareSum(const uint4 &raw, float sum) {
  float v[kVec];
  unpackVec(raw, v);
  for (int e = 0; e < kVec; ++e)
    sum += v[e] * v[e];
  return sum;
}

__device__ __forceinline__ uint32_t word(const uint4 &v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/// acc += A B for one 16-column slice: A's rows g and g + 8 from the words
/// (lo, lo + 2) of xg and xg8, B from b0 and b1.
__device__ __forceinline__ void fusedMma(float (&acc)[4], const uint4 &xg, const uint4 &xg8, int lo, uint32_t b0,
                                         uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
               "{%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
               : "r"(word(xg, lo)), "r"(word(xg8, lo)), "r"(word(xg, lo + 2)), "r"(word(xg8, lo + 2)), "r"(b0),
                 "r"(b1));
}

/// The entry's walk over the width for warp `walker` of the kFusedWarps
/// (the section comment): the products of its columns on mma.sync into acc,
/// and the squares of tokens g and g + 8 in order. xRow(h, column) gives
/// the 16 bytes of token g (h = 0) or g + 8 (h = 1) at a column (zero for a
/// token past the rows); `stage` is the warp's kFusedStageSlots.
template <typename XRow>
__device__ __forceinline__ void entryWalk(XRow xRow, const act_t *wmap, int walker, int64_t width, uint4 *stage,
                                          float (&acc)[kFusedTiles][4], float &squareG, float &squareG8) {
  constexpr int K = kCoefficients;
  const int lane = threadIdx.x % 32, q = lane % 4;
  // ldmatrix row addresses: lane L gives row L % 8 of matrix L / 8, whose
  // rows are the staged rows 8 q' + b + {0, 4, 2, 6}[matrix] (q' = row / 2, b = row % 2).
  const int matrix = lane / 8, row = lane % 8;
  const int rowBase = 8 * (row / 2) + row % 2 + (matrix == 1 ? 4 : matrix == 2 ? 2 : matrix == 3 ? 6 : 0);
  const uint32_t stageAddress = uint32_t(__cvta_generic_to_shared(stage));
#pragma unroll
  for (int nt = 0; nt < kFusedTiles; ++nt)
    acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0;
  squareG = squareG8 = 0;
  // A ring of kFusedDepth steps' loads in registers: while a step's
  // products run, the next kFusedDepth - 1 steps' x and wmap are in flight.
  uint4 ringG[kFusedDepth][kFusedVectors], ringG8[kFusedDepth][kFusedVectors];
  uint4 ringW[kFusedDepth][kFusedStageLoads];
  auto fetch = [&](int slot, int64_t j) {
#pragma unroll
    for (int h = 0; h < kFusedVectors; ++h) {
      const int64_t column = j + 32 * h + 8 * q;
      ringG[slot][h] = xRow(0, column);
      ringG8[slot][h] = xRow(1, column);
    }
    const uint4 *src = reinterpret_cast<const uint4 *>(wmap + j * K); // kFusedRows rows, contiguous
#pragma unroll
    for (int i = 0; i < kFusedStageLoads; ++i)
      ringW[slot][i] = src[lane + 32 * i];
  };
  const int64_t stride = int64_t(kFusedWarps) * kFusedRows, first = int64_t(walker) * kFusedRows;
#pragma unroll
  for (int d = 0; d + 1 < kFusedDepth; ++d)
    if (first + d * stride < width)
      fetch(d, first + d * stride);
  // Steps j = first + k stride in order (the sums' order), kFusedDepth at a time so
  // that every ring slot is a register.
  for (int64_t base = first; base < width; base += kFusedDepth * stride) {
#pragma unroll
    for (int d = 0; d < kFusedDepth; ++d) {
      const int64_t j = base + d * stride;
      if (j >= width)
        break;
      __syncwarp(); // the previous step's ldmatrix reads are done
#pragma unroll
      for (int i = 0; i < kFusedStageLoads; ++i) {
        const int v = lane + 32 * i, r = v / kFusedTiles, c = v % kFusedTiles;
        stage[r * kFusedTiles + c + r / 4] = ringW[d][i];
      }
      __syncwarp();
      if (j + (kFusedDepth - 1) * stride < width)
        fetch((d + kFusedDepth - 1) % kFusedDepth, j + (kFusedDepth - 1) * stride);
#pragma unroll
      for (int h = 0; h < kFusedVectors; ++h) {
        squareG = squareSum(ringG[d][h], squareG);
        squareG8 = squareSum(ringG8[d][h], squareG8);
        const int r = 32 * h + rowBase;
#pragma unroll
        for (int nt = 0; nt < kFusedTiles; ++nt) {
          uint32_t b[4];
          const uint32_t address = stageAddress + uint32_t(r * kFusedTiles + nt + r / 4) * 16u;
          asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                       : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                       : "r"(address));
          fusedMma(acc[nt], ringG[d][h], ringG8[d][h], 0, b[0], b[1]);
          fusedMma(acc[nt], ringG[d][h], ringG8[d][h], 1, b[2], b[3]);
        }
      }
    }
  }
  // The row squares: a token's 4 lanes by butterfly.
  for (int offset = 1; offset < 4; offset *= 2) {
    squareG += __shfl_xor_sync(0xffffffffu, squareG, offset);
    squareG8 += __shfl_xor_sync(0xffffffffu, squareG8, offset);
  }
}

/// A walker's sums into shared memory: its squares (lane q = 0 of each
/// token's four) into squarePartials[warp], then, once every warp's stage is
/// read (the barrier), its products' D fragments (rows g and g + 8, columns
/// nt * 8 + 2q and + 1) into `shared` as partial[warp][token][K].
template <int kWarps>
__device__ __forceinline__ void storeWalkSums(float (&squarePartials)[kWarps][kFusedTokens], unsigned char *shared,
                                              const float (&acc)[kFusedTiles][4], float squareG, float squareG8) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  if (q == 0) {
    squarePartials[warp][g] = squareG;
    squarePartials[warp][g + 8] = squareG8;
  }
  __syncthreads(); // every stage is read: the buffer takes the partial products
  float(*partial)[kFusedTokens][kCoefficients] = reinterpret_cast<float(*)[kFusedTokens][kCoefficients]>(shared);
#pragma unroll
  for (int nt = 0; nt < kFusedTiles; ++nt) {
    partial[warp][g][nt * 8 + 2 * q] = acc[nt][0];
    partial[warp][g][nt * 8 + 2 * q + 1] = acc[nt][1];
    partial[warp][g + 8][nt * 8 + 2 * q] = acc[nt][2];
    partial[warp][g + 8][nt * 8 + 2 * q + 1] = acc[nt][3];
  }
}

/// The entry for this block's kFusedTokens tokens (the section comment):
/// the body of both kernels below.
__device__ __forceinline__ void coeffsPreEntry(const act_t *x, const act_t *wmap, const act_t *bias,
                                               const act_t *alpha, float *coef, float *aux, act_t *u, int64_t rows,
                                               int64_t C) {
  if constexpr (kFusedSupported) {
    constexpr int K = kCoefficients;
    __shared__ __align__(16) unsigned char shared[kFusedSharedBytes]; // the stages, then the warps' partial p
    __shared__ float squarePartials[kFusedWarps][kFusedTokens];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
    const int64_t t0 = int64_t(blockIdx.x) * kFusedTokens, width = kStreams * C;
    float *p = aux + rows * (K + 1), *squares = p + rows * K; // as mhcCoeffsForward lays them out
    const bool validG = t0 + g < rows, validG8 = t0 + g + 8 < rows;
    const act_t *xg = x + (t0 + g) * width, *xg8 = x + (t0 + g + 8) * width;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    float acc[kFusedTiles][4], squareG, squareG8;
    entryWalk(
        [&](int h, int64_t column) {
          return (h ? validG8 : validG) ? *reinterpret_cast<const uint4 *>((h ? xg8 : xg) + column) : zero;
        },
        wmap, warp, width, reinterpret_cast<uint4 *>(shared) + warp * kFusedStageSlots, acc, squareG, squareG8);
    storeWalkSums(squarePartials, shared, acc, squareG, squareG8);
    __syncthreads();
    // The sums over the warps in order.
    float(*partial)[kFusedTokens][K] = reinterpret_cast<float(*)[kFusedTokens][K]>(shared);
    for (int i = threadIdx.x; i < kFusedTokens * (K + 1); i += blockDim.x) {
      const int token = i / (K + 1), m = i % (K + 1);
      if (t0 + token >= rows)
        continue;
      float sum = 0;
      for (int w = 0; w < kFusedWarps; ++w)
        sum += m < K ? partial[w][token][m] : squarePartials[w][token];
      if (m < K)
        p[(t0 + token) * K + m] = sum;
      else
        squares[t0 + token] = sum;
    }
    __syncthreads(); // p and the squares are written (global, this block's tokens)
    // The coefficients: kCoeffTokensPerWarp tokens a warp, in rounds over the tile.
    const int group = lane / kCoeffLanes, cq = lane % kCoeffLanes, base = group * kCoeffLanes;
    constexpr int kRound = kFusedWarps * kCoeffTokensPerWarp;
    for (int first = 0; first < kFusedTokens; first += kRound) {
      const int token = first + warp * kCoeffTokensPerWarp + group;
      const int64_t t = t0 + token;
      const bool valid = group < kCoeffTokensPerWarp && token < kFusedTokens && t < rows;
      mhcTokenCoeffs(valid ? squares[t] : 0.0f, p + t * K, bias, alpha, coef + t * K, aux + t * (K + 1), width,
                     valid, cq, base);
    }
    __syncthreads(); // coef is written
    // The pre-mix, kVec columns a thread and two vectors' loads in flight;
    // x comes back from L2.
    const int vectors = int(C / kVec), count = kFusedTokens * vectors, threads = 32 * kFusedWarps;
    for (int i = threadIdx.x; i < count; i += 2 * threads) {
      const int j = i + threads;
      const int64_t ti = t0 + i / vectors, tj = t0 + j / vectors;
      const bool first = ti < rows, second = j < count && tj < rows;
      PreMixVector a, b;
      if (first)
        a.fetch(x, coef, ti, int64_t(i % vectors) * kVec, C);
      if (second)
        b.fetch(x, coef, tj, int64_t(j % vectors) * kVec, C);
      if (first)
        a.finish(u, ti, int64_t(i % vectors) * kVec, C);
      if (second)
        b.finish(u, tj, int64_t(j % vectors) * kVec, C);
    }
  }
}

/// Launch: block 32 kFusedWarps threads, grid ceil(rows / kFusedTokens).
extern "C" __global__ void __launch_bounds__(32 * kFusedWarps)
    mhcc_mhc_coeffs_pre_forward(const act_t *x, const act_t *wmap, const act_t *bias, const act_t *alpha,
                                float *coef, float *aux, act_t *u, int64_t rows, int64_t C) {
  kernelPrologue();
  coeffsPreEntry(x, wmap, bias, alpha, coef, aux, u, rows, C);
}

// ---- the previous sublayer's post-res mix and this entry in one kernel ----------------
// The post-res mix of sublayer L writes the residual x' that the entry of
// L + 1 reads right after; as two kernels x' goes to DRAM and comes back
// (32 MiB each way a 1b sublayer). Here each block first writes x' for its
// own kFusedTokens tokens with mhcc_mhc_post_res_forward's expression
// (postResVector: the same bits), reading the previous x and y once with
// the evict-first hint so that x' stays in L2, then runs the entry on its
// x' (coeffsPreEntry: the same walk, the same sums), which the barrier
// makes visible to every warp of the block. Outputs: x' and the entry's.
// Taken where the entry kernel is (mhcFusedForwardApplies).

/// Launch: as mhcc_mhc_coeffs_pre_forward.
extern "C" __global__ void __launch_bounds__(32 * kFusedWarps)
    mhcc_mhc_post_res_coeffs_pre_forward(const act_t *xPrev, const float *coefPrev, const act_t *y, act_t *x,
                                         const act_t *wmap, const act_t *bias, const act_t *alpha, float *coef,
                                         float *aux, act_t *u, int64_t rows, int64_t C) {
  kernelPrologue();
  if constexpr (kFusedSupported) {
    const int64_t t0 = int64_t(blockIdx.x) * kFusedTokens;
    const int vectors = int(C / kVec);
    const int count = int(min(int64_t(kFusedTokens), rows - t0)) * vectors;
    for (int i = threadIdx.x; i < count; i += blockDim.x)
      postResVector<true>(xPrev, coefPrev, y, x, t0 + i / vectors, int64_t(i % vectors) * kVec, C);
    __syncthreads(); // x' of the block's tokens is written and visible to the block
    coeffsPreEntry(x, wmap, bias, alpha, coef, aux, u, rows, C);
  }
}

// ---- the same over a cluster of blocks ------------------------------------------------
// mhcc_mhc_post_res_coeffs_pre_forward runs one 16-token block an SM at 1b
// (128 blocks): its phases (the post-res mix from DRAM, the walk and the
// pre-mix reading x' back from L2, the Sinkhorn between) follow one another
// on each SM with nothing beside them. Here a cluster of kClusterBlocks
// blocks takes the 16 tokens, block r the columns of walkers r
// kClusterWarps .. (r + 1) kClusterWarps - 1 of that kernel's walk (the
// same columns of every stream where C is a multiple of the walk's stride,
// kClusterStride): it writes x' of those columns to DRAM and to its shared
// memory (a quarter of the tile), walks them from there as those walkers
// do, and the blocks read one another's partials through distributed
// shared memory: block r sums every walker's partial in walker order (that
// kernel's p and squares, the same bits) for kClusterTokens tokens and
// computes their coefficients; then each block's pre-mix takes its columns
// from its x' and every token's h_pre from the block that owns it. Four
// times the blocks, several an SM, whose phases overlap. Outputs and bits:
// that kernel's. Taken, with MHCC_MHC_FORWARD=cluster (opt-in until
// measured on a GPU), where that kernel is, C % kClusterStride == 0 and the
// tile fits kClusterTileBytes (mhcClusterForwardApplies on the host).

constexpr int kClusterBlocks = 4;
constexpr int kClusterWarps = kFusedWarps / kClusterBlocks;
constexpr int kClusterSpan = kClusterWarps * kFusedRows;   // a block's columns of one walk step
constexpr int kClusterStride = kFusedWarps * kFusedRows;   // the walk's step
constexpr int kClusterTokens = kFusedTokens / kClusterBlocks; // tokens whose coefficients a block computes
constexpr int kClusterPad = 64; // bytes after each token's row of the tile: lanes g, g + 1 in other banks
constexpr int kClusterStageBytes = kClusterWarps * kFusedStageSlots * 16;
constexpr int kClusterPartialBytes = kFusedSupported ? kClusterWarps * kFusedTokens * kCoefficients * 4 : 16;
constexpr int kClusterSharedBytes =
    kClusterStageBytes > kClusterPartialBytes ? kClusterStageBytes : kClusterPartialBytes;
extern "C" __device__ const int mhcc_abi_cluster_blocks = kClusterBlocks;
extern "C" __device__ const int mhcc_abi_cluster_pad = kClusterPad;

__device__ __forceinline__ unsigned clusterBlockRank() {
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}
__device__ __forceinline__ unsigned clusterIndex() {
  unsigned index;
  asm volatile("mov.u32 %0, %%clusterid.x;\n" : "=r"(index));
  return index;
}
/// Every thread of the cluster: shared-memory writes before it are visible
/// to the cluster's blocks after it.
__device__ __forceinline__ void clusterArrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void clusterWait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }
/// The float at `local`'s place in block `rank`'s shared memory.
__device__ __forceinline__ float loadClusterShared(const float *local, unsigned rank) {
  uint32_t remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(remote)
               : "r"(uint32_t(__cvta_generic_to_shared(local))), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

/// Launch: cluster kClusterBlocks, block 32 kClusterWarps threads, grid
/// kClusterBlocks ceil(rows / kFusedTokens), dynamic shared memory
/// kFusedTokens (n C / 2 + kClusterPad) bytes (the x' tile).
extern "C" __global__ void __cluster_dims__(kClusterBlocks, 1, 1) __launch_bounds__(32 * kClusterWarps)
    mhcc_mhc_post_res_coeffs_pre_forward_cluster(const act_t *xPrev, const float *coefPrev, const act_t *y, act_t *x,
                                                 const act_t *wmap, const act_t *bias, const act_t *alpha, float *coef,
                                                 float *aux, act_t *u, int64_t rows, int64_t C) {
  kernelPrologue();
  if constexpr (kFusedSupported) {
    constexpr int K = kCoefficients;
    extern __shared__ __align__(16) unsigned char tile[];                // x' of the block's columns, a row a token
    __shared__ __align__(16) unsigned char shared[kClusterSharedBytes]; // the stages, then the walkers' partial p
    __shared__ float squarePartials[kClusterWarps][kFusedTokens];
    __shared__ float own[kClusterTokens][K + 1];       // p and the square of the block's tokens
    __shared__ __align__(16) float ownCoef[kClusterTokens][K]; // their coefficients
    __shared__ float hPre[kFusedTokens][kStreams];
    const unsigned rank = clusterBlockRank();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
    const int64_t t0 = int64_t(clusterIndex()) * kFusedTokens, width = kStreams * C, share = C / kClusterBlocks;
    const int64_t pitch = kStreams * share * int64_t(sizeof(act_t)) + kClusterPad;
    const int tokens = int(min(int64_t(kFusedTokens), rows - t0));
    // Stream column c of this block's columns <-> its place lc in a stream's share of the tile row.
    auto columnOf = [&](int64_t lc) {
      return lc / kClusterSpan * kClusterStride + int64_t(rank) * kClusterSpan + lc % kClusterSpan;
    };
    auto placeOf = [](uint32_t c) { return c / kClusterStride * kClusterSpan + c % kClusterSpan; };
    auto tileVector = [&](int token, int64_t stream, int64_t lc) {
      return reinterpret_cast<uint4 *>(tile + token * pitch + (stream * share + lc) * int64_t(sizeof(act_t)));
    };
    // The post-res mix of the block's columns (postResVector's bits), two
    // vectors' loads in flight a thread: x' to DRAM and to the tile.
    const int vectors = int(share / kVec), count = tokens * vectors, threads = 32 * kClusterWarps;
    auto store = [&](const PostResVector &v, int item) {
      const int token = item / vectors;
      const int64_t lc = int64_t(item % vectors) * kVec, c = columnOf(lc), t = t0 + token;
      uint4 mixed[kStreams];
      v.mix(coefPrev + t * K, mixed);
      for (int s = 0; s < kStreams; ++s) {
        *reinterpret_cast<uint4 *>(x + (t * kStreams + s) * C + c) = mixed[s];
        *tileVector(token, s, lc) = mixed[s];
      }
    };
    for (int i = threadIdx.x; i < count; i += 2 * threads) {
      const int j = i + threads;
      PostResVector a, b;
      a.fetch<true>(xPrev, y, t0 + i / vectors, columnOf(int64_t(i % vectors) * kVec), C);
      if (j < count)
        b.fetch<true>(xPrev, y, t0 + j / vectors, columnOf(int64_t(j % vectors) * kVec), C);
      store(a, i);
      if (j < count)
        store(b, j);
    }
    __syncthreads(); // the tile is written
    // The walk of walkers rank kClusterWarps + warp, from the tile.
    const uint4 zero = make_uint4(0, 0, 0, 0);
    float acc[kFusedTiles][4], squareG, squareG8;
    entryWalk(
        [&](int h, int64_t column) {
          const int token = g + 8 * h;
          if (token >= tokens)
            return zero;
          // 32-bit: n C < 2^31 here (the tile bound), and a 64-bit division is a long subroutine.
          const uint32_t stream = uint32_t(column) / uint32_t(C), c = uint32_t(column) - stream * uint32_t(C);
          return loadShared16(tileVector(token, stream, placeOf(c)));
        },
        wmap, int(rank) * kClusterWarps + warp, width, reinterpret_cast<uint4 *>(shared) + warp * kFusedStageSlots,
        acc, squareG, squareG8);
    storeWalkSums(squarePartials, shared, acc, squareG, squareG8);
    float(*partial)[kFusedTokens][K] = reinterpret_cast<float(*)[kFusedTokens][K]>(shared);
    clusterArrive();
    clusterWait(); // every block's partials are written
    // p and the squares of the block's tokens: every walker's partial in
    // walker order, as the one-block kernel sums its warps'.
    float *p = aux + rows * (K + 1), *squares = p + rows * K;
    for (int i = threadIdx.x; i < kClusterTokens * (K + 1); i += threads) {
      const int mine = i / (K + 1), m = i % (K + 1), token = int(rank) * kClusterTokens + mine;
      float sum = 0;
      for (int w = 0; w < kFusedWarps; ++w) {
        const int ow = w % kClusterWarps;
        sum += loadClusterShared(m < K ? &partial[ow][token][m] : &squarePartials[ow][token], w / kClusterWarps);
      }
      own[mine][m] = sum;
      if (token < tokens)
        (m < K ? p[(t0 + token) * K + m] : squares[t0 + token]) = sum;
    }
    __syncthreads();
    // Their coefficients (into ownCoef, then coef), as the one-block kernel's.
    const int group = lane / kCoeffLanes, cq = lane % kCoeffLanes, base = group * kCoeffLanes;
    constexpr int kRound = kClusterWarps * kCoeffTokensPerWarp;
    for (int first = 0; first < kClusterTokens; first += kRound) {
      const int mine = first + warp * kCoeffTokensPerWarp + group, token = int(rank) * kClusterTokens + mine;
      const bool valid = group < kCoeffTokensPerWarp && mine < kClusterTokens && token < tokens;
      const int slot = valid ? mine : 0;
      mhcTokenCoeffs(valid ? own[slot][K] : 0.0f, own[slot], bias, alpha, ownCoef[slot],
                     aux + (t0 + (valid ? token : 0)) * (K + 1), width, valid, cq, base);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kClusterTokens * K; i += threads) {
      const int token = int(rank) * kClusterTokens + i / K;
      if (token < tokens)
        coef[(t0 + token) * K + i % K] = ownCoef[i / K][i % K];
    }
    clusterArrive();
    clusterWait(); // every block's coefficients are in its ownCoef
    for (int i = threadIdx.x; i < kFusedTokens * kStreams; i += threads)
      hPre[i / kStreams][i % kStreams] =
          loadClusterShared(&ownCoef[(i / kStreams) % kClusterTokens][i % kStreams], (i / kStreams) / kClusterTokens);
    clusterArrive(); // this block reads no other's shared memory after this
    __syncthreads();
    // The pre-mix of the block's columns (PreMixVector's bits), x' from the tile.
    for (int i = threadIdx.x; i < count; i += threads) {
      const int token = i / vectors;
      const int64_t lc = int64_t(i % vectors) * kVec;
      PreMixVector v;
      for (int s = 0; s < kStreams; ++s) {
        v.h[s] = hPre[token][s];
        v.xs[s] = loadShared16(tileVector(token, s, lc));
      }
      v.finish(u, t0 + token, columnOf(lc), C);
    }
    clusterWait(); // no block leaves while another may still read its shared memory
  }
}
