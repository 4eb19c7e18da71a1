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

/// The entry for this block's kFusedTokens tokens (the section comment):
/// the body of both kernels below.
__device__ __forceinline__ void coeffsPreEntry(const act_t *x, const act_t *wmap, const act_t *bias,
                                               const act_t *alpha, float *coef, float *aux, act_t *u, int64_t rows,
                                               int64_t C) {
  if constexpr (kFusedSupported) {
    constexpr int K = kCoefficients;
    __shared__ __align__(16) unsigned char shared[kFusedSharedBytes]; // the stages, then the warps' partial p
    __shared__ float squarePartials[kFusedWarps][kFusedTokens];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const int64_t t0 = int64_t(blockIdx.x) * kFusedTokens, width = kStreams * C;
    float *p = aux + rows * (K + 1), *squares = p + rows * K; // as mhcCoeffsForward lays them out
    const bool validG = t0 + g < rows, validG8 = t0 + g + 8 < rows;
    const act_t *xg = x + (t0 + g) * width, *xg8 = x + (t0 + g + 8) * width;
    uint4 *stage = reinterpret_cast<uint4 *>(shared) + warp * kFusedStageSlots;
    // ldmatrix row addresses: lane L gives row L % 8 of matrix L / 8, whose
    // rows are the staged rows 8 q' + b + {0, 4, 2, 6}[matrix] (q' = row / 2, b = row % 2).
    const int matrix = lane / 8, row = lane % 8;
    const int rowBase = 8 * (row / 2) + row % 2 + (matrix == 1 ? 4 : matrix == 2 ? 2 : matrix == 3 ? 6 : 0);
    const uint32_t stageAddress = uint32_t(__cvta_generic_to_shared(stage));

    float acc[kFusedTiles][4];
#pragma unroll
    for (int nt = 0; nt < kFusedTiles; ++nt)
      acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0;
    float squareG = 0, squareG8 = 0;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    // A ring of kFusedDepth steps' loads in registers: while a step's
    // products run, the next kFusedDepth - 1 steps' x and wmap are in flight.
    uint4 ringG[kFusedDepth][kFusedVectors], ringG8[kFusedDepth][kFusedVectors];
    uint4 ringW[kFusedDepth][kFusedStageLoads];
    auto fetch = [&](int slot, int64_t j) {
#pragma unroll
      for (int h = 0; h < kFusedVectors; ++h) {
        const int64_t column = j + 32 * h + 8 * q;
        ringG[slot][h] = validG ? *reinterpret_cast<const uint4 *>(xg + column) : zero;
        ringG8[slot][h] = validG8 ? *reinterpret_cast<const uint4 *>(xg8 + column) : zero;
      }
      const uint4 *src = reinterpret_cast<const uint4 *>(wmap + j * K); // kFusedRows rows, contiguous
#pragma unroll
      for (int i = 0; i < kFusedStageLoads; ++i)
        ringW[slot][i] = src[lane + 32 * i];
    };
    const int64_t stride = int64_t(kFusedWarps) * kFusedRows, first = int64_t(warp) * kFusedRows;
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
    // The row squares: a token's 4 lanes by butterfly, then the warps in order.
    for (int offset = 1; offset < 4; offset *= 2) {
      squareG += __shfl_xor_sync(0xffffffffu, squareG, offset);
      squareG8 += __shfl_xor_sync(0xffffffffu, squareG8, offset);
    }
    if (q == 0) {
      squarePartials[warp][g] = squareG;
      squarePartials[warp][g + 8] = squareG8;
    }
    __syncthreads(); // every stage is read: the buffer takes the partial products
    float(*partial)[kFusedTokens][K] = reinterpret_cast<float(*)[kFusedTokens][K]>(shared);
#pragma unroll
    for (int nt = 0; nt < kFusedTiles; ++nt) {
      // D: rows g (+ 8), columns nt * 8 + 2q (+ 1).
      partial[warp][g][nt * 8 + 2 * q] = acc[nt][0];
      partial[warp][g][nt * 8 + 2 * q + 1] = acc[nt][1];
      partial[warp][g + 8][nt * 8 + 2 * q] = acc[nt][2];
      partial[warp][g + 8][nt * 8 + 2 * q + 1] = acc[nt][3];
    }
    __syncthreads();
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
