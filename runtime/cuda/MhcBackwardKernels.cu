//===- MhcBackwardKernels.cu - one sublayer's backward mixing in three passes --===//
//
// A part of the model's kernel library: mhcc concatenates ModelKernels.cu,
// MhcKernels.cu, MhcMixKernels.cu, MhcFusedKernels.cu, MhcBackwardKernels.cu
// and LayerKernels.cu (in that order) after the model's constants and
// compiles them as one file; the helpers and conventions are
// ModelKernels.cu's. First the coefficient projection's input gradient
// (mhcc_mhc_coeffs_backward_input), whose tiles pass C reuses.
//
//===----------------------------------------------------------------------===//

// ---- the projection's input gradient on tensor cores (bf16 images) ------------------
// dx[t, j] = bf16(bf16(dx + sum_m dp[t, m] wmap[j, m]) + rScale[t] x[t, j]):
// the product into dx followed by mhcc_row_scale_add, with the same two
// roundings, in one pass over x and dx. The K = n^2 + 2n term sums run on
// mma.sync (bf16 in, fp32 accumulate, K zero-padded to a multiple of 16):
// fixed by the instruction, so deterministic; fp32 models keep cuBLAS and
// mhcc_row_scale_add, and their bits.
// Tiles: a warp takes 16 tokens x kInputGradColumns columns, a block
// kInputGradWarps warps along the tokens; grid (ceil(width / 64), ceil(rows / 32)).
// 64 columns (not 128) keep a lane's x and dx vectors in 32 registers: 80 a
// thread instead of 122, 24 warps an SM instead of 16 (the sums do not depend
// on the column tiling).
// A warp's products go through shared memory so that the pass over x and dx
// moves 16 contiguous bytes a lane (mma's fragments hold 2 columns a row).
constexpr int kInputGradWarps = 2, kInputGradColumns = 64;
// Shared memory fits up to n = 8 (K = 80); beyond, the host keeps cuBLAS and
// mhcc_row_scale_add (mhcCoeffsBackward checks n <= 8).
constexpr bool kInputGradSupported = sizeof(act_t) == 2 && kCoefficients <= 80;
constexpr int kInputGradPitch = kInputGradColumns + 8; // floats a staged row (+8: fewer bank conflicts)
constexpr int kInputGradKSteps = (kCoefficients + 15) / 16;
extern "C" __device__ const int mhcc_abi_input_grad_columns = kInputGradColumns;
extern "C" __device__ const int mhcc_abi_input_grad_tokens = 16 * kInputGradWarps;

/// Two consecutive bf16 (index i and i + 1, each only when below `count`, else
/// 0) packed as mma.sync operands hold them: the lower index in the low half.
__device__ __forceinline__ uint32_t packedPair(const act_t *p, int64_t i, int64_t count) {
  if (count % 2 == 0 && i % 2 == 0) // one aligned 4-byte access (p: an even element offset)
    return i < count ? *reinterpret_cast<const uint32_t *>(p + i) : 0u;
  uint16_t lo = 0, hi = 0;
  if (i < count)
    memcpy(&lo, p + i, 2);
  if (i + 1 < count)
    memcpy(&hi, p + i + 1, 2);
  return uint32_t(lo) | uint32_t(hi) << 16;
}

/// A warp's A operand for stageProducts: dp rows t0 + group (+ 8), columns
/// k + pairCol (+ 8), k < K else 0 (rows past `rows` zero).
using ProductRows = uint32_t[kInputGradKSteps][4];
__device__ __forceinline__ void loadProductRows(const act_t *dp, int64_t t0, int64_t rows, int lane, ProductRows &a) {
  constexpr int K = kCoefficients;
  const int group = lane / 4, pairCol = 2 * (lane % 4);
  for (int ks = 0; ks < kInputGradKSteps; ++ks)
    for (int q = 0; q < 4; ++q) {
      const int64_t t = t0 + group + 8 * (q % 2);
      const int k = 16 * ks + pairCol + 8 * (q / 2);
      a[ks][q] = t < rows && k < K ? packedPair(dp + t * K, k, K) : 0u;
    }
}

/// A warp's 16 x kColumns tile of dp wmap^T (A: loadProductRows; B's
/// columns: `slice`'s rows, K wide, in shared memory) on tensor cores,
/// stored as fp32 rows of `pitch` floats from `tile`. Each element sums its
/// K products in the mma's fixed order, whichever tile or column it sits in:
/// the kernels that share it get the same bits for the same element.
template <int kColumns>
__device__ __forceinline__ void stageProducts(const ProductRows &a, const act_t *slice, float *tile, int pitch,
                                              int lane) {
  constexpr int K = kCoefficients;
  const int group = lane / 4, pairCol = 2 * (lane % 4);
#pragma unroll 4
  for (int nt = 0; nt < kColumns / 8; ++nt) {
    const act_t *column = slice + (nt * 8 + group) * K; // B's column (a wmap row), from shared memory
    float d[4] = {0, 0, 0, 0};
    for (int ks = 0; ks < kInputGradKSteps; ++ks) {
      const int k = 16 * ks + pairCol;
      const uint32_t b0 = packedPair(column, k, K), b1 = packedPair(column, k + 8, K);
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                   "{%8,%9}, {%0,%1,%2,%3};\n"
                   : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                   : "r"(a[ks][0]), "r"(a[ks][1]), "r"(a[ks][2]), "r"(a[ks][3]), "r"(b0), "r"(b1));
    }
    // D: rows group (+ 8), columns nt * 8 + pairCol (+ 1).
    *reinterpret_cast<float2 *>(&tile[group * pitch + nt * 8 + pairCol]) = make_float2(d[0], d[1]);
    *reinterpret_cast<float2 *>(&tile[(group + 8) * pitch + nt * 8 + pairCol]) = make_float2(d[2], d[3]);
  }
}

/// v rounded to an activation and widened again: the value a kernel reads
/// back after another stored v.
__device__ __forceinline__ float roundedActivation(float v) {
  act_t r;
  store(&r, v);
  return load(r);
}

/// roundedActivation of kVec values, a pair a conversion for bf16
/// (cvt.rn.bf16x2.f32 rounds each half as cvt.rn.bf16.f32 does, in one
/// instruction off the slow conversion pipe).
__device__ __forceinline__ void roundedVec(float (&v)[kVec]) {
  if constexpr (sizeof(act_t) == 2) {
    for (int k = 0; k < kVec; k += 2) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(v[k], v[k + 1]);
      v[k] = __low2float(pair);
      v[k + 1] = __high2float(pair);
    }
  } else {
    for (int k = 0; k < kVec; ++k)
      v[k] = roundedActivation(v[k]);
  }
}

/// The RMS term added to an input gradient element as stored (rounded).
__device__ __forceinline__ float addRmsTerm(float rounded, float scale, float x) {
  const float g = scale * x;
  return rounded + g;
}

/// One element: the product's sum added to dx and rounded, then the RMS term.
__device__ __forceinline__ float inputGradElement(float dx, float product, float scale, float x) {
  return addRmsTerm(roundedActivation(dx + product), scale, x);
}

extern "C" __global__ void __launch_bounds__(32 * kInputGradWarps)
    mhcc_mhc_coeffs_backward_input(const act_t *x, const act_t *wmap, const act_t *dp, const float *rScale, act_t *dx,
                                   int64_t rows, int64_t width) {
  kernelPrologue();
  if constexpr (kInputGradSupported) {
    constexpr int K = kCoefficients;
    __shared__ float products[kInputGradWarps][16][kInputGradPitch];
    // The block's kInputGradColumns rows of wmap (contiguous), zero past width: B's source.
    __shared__ __align__(16) act_t slice[kInputGradSupported ? kInputGradColumns * K : 1];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t t0 = (int64_t(blockIdx.y) * kInputGradWarps + warp) * 16;
    const int64_t j0 = int64_t(blockIdx.x) * kInputGradColumns;
    const int64_t sliceCount = min(int64_t(kInputGradColumns), width - j0) * K;
    const act_t *sliceSrc = wmap + j0 * K;
    if (sliceCount == kInputGradColumns * K && (kInputGradColumns * K) % kVec == 0 && aligned16(sliceSrc)) {
      for (int v = threadIdx.x; v < kInputGradColumns * K / kVec; v += blockDim.x)
        reinterpret_cast<uint4 *>(slice)[v] = reinterpret_cast<const uint4 *>(sliceSrc)[v];
    } else {
      for (int e = threadIdx.x; e < kInputGradColumns * K; e += blockDim.x)
        slice[e] = e < sliceCount ? sliceSrc[e] : act_t(0.0f);
    }
    __syncthreads();
    if (t0 >= rows)
      return; // the whole warp
    ProductRows a;
    loadProductRows(dp, t0, rows, lane, a);
    float(*tile)[kInputGradPitch] = products[warp];
    // The lane's vectors of x and dx (a row's kInputGradColumns / kVec by
    // consecutive lanes), loaded before the products so that they are in
    // flight meanwhile.
    constexpr int kRowVectors = kInputGradColumns / kVec, kLaneVectors = 16 * kRowVectors / 32;
    const bool vec = width % kVec == 0 && aligned16(x) && aligned16(dx);
    uint4 xRaw[kLaneVectors], dxRaw[kLaneVectors];
    if (vec)
#pragma unroll
      for (int i = 0; i < kLaneVectors; ++i) {
        const int v = lane + 32 * i, r = v / kRowVectors, c = v % kRowVectors * kVec;
        const int64_t t = t0 + r, j = j0 + c;
        if (t < rows && j < width) { // then j + kVec <= width
          xRaw[i] = *reinterpret_cast<const uint4 *>(x + t * width + j);
          dxRaw[i] = *reinterpret_cast<const uint4 *>(dx + t * width + j);
        }
      }
    stageProducts<kInputGradColumns>(a, slice, &tile[0][0], kInputGradPitch, lane);
    __syncwarp();
    if (vec) {
#pragma unroll
      for (int i = 0; i < kLaneVectors; ++i) {
        const int v = lane + 32 * i, r = v / kRowVectors, c = v % kRowVectors * kVec;
        const int64_t t = t0 + r, j = j0 + c;
        if (t >= rows || j >= width)
          continue;
        const float sc = rScale[t];
        float dv[kVec], xv[kVec];
        unpackVec(dxRaw[i], dv);
        unpackVec(xRaw[i], xv);
        for (int e = 0; e < kVec; ++e)
          dv[e] = inputGradElement(dv[e], tile[r][c + e], sc, xv[e]);
        storeVecUnsplit(dx + t * width + j, dv);
      }
    } else {
      for (int v = lane; v < 16 * kRowVectors; v += 32) {
        const int r = v / kRowVectors, c = v % kRowVectors * kVec;
        const int64_t t = t0 + r, j = j0 + c;
        if (t >= rows || j >= width)
          continue;
        const float sc = rScale[t];
        act_t *dst = dx + t * width + j;
        for (int e = 0; e < kVec && j + e < width; ++e)
          store(dst + e, inputGradElement(load(dst[e]), tile[r][c + e], sc, load(x[t * width + j + e])));
      }
    }
  }
}

// ---- the backward's mixing in three passes (bf16 images) ------------------------------
// mhcc_mhc_post_res_backward, mhcc_mhc_pre_backward and
// mhcc_mhc_coeffs_backward_input each read and write the sublayer's input
// gradient dx (n C wide): the first writes it, the other two read it back
// and rewrite it, 312 MiB of traffic a 1b sublayer. Where one sublayer's
// three backwards own dx (runtime/program/MixGroups.h; the output gradient
// dOut and the pre-mix's du stay untouched meanwhile), the same work runs as:
//   A  mhcc_mhc_post_backward, where the post/res backward ran: dy and
//      dCoef's post entries, from dOut and y;
//   B  mhcc_mhc_mix_backward_dots, where the pre backward ran: dCoef's res
//      and pre entries, from dOut, x and du (reads only);
//   C  mhcc_mhc_mix_backward_input, where the projection's input gradient
//      ran (after the Sinkhorn backward): dx, written once, from dOut, du, x
//      and the products (224 MiB in all).
// The bits are the three kernels': each dot is the same expression summed in
// the same order (lane l's elements c = l + 32 k, then warpSum), and pass C
// rounds dx to bf16 at each point where one of the three kernels stored it;
// but for dCoef's post entries, which pass A sums in tile order (below).
// Where the sublayer before (L - 1) ends in a post-res mix whose output
// gradient is this dx, pass C of L does pass A of L - 1 as well
// (mhcc_mhc_mix_backward_input_post: its dy, the bits of pass A, and its
// post dots by column tiles, which pass B of L - 1 sums in tile order, the
// order pass A apart uses: the same bits), and dx is not read back (32 MiB
// less a 1b sublayer).

// Pass C's tiles (below): kMixColumns columns of kMixTokens tokens.
constexpr int kMixColumns = 64;
constexpr int kMixTokens = 16;
constexpr int kMixThreads = 128;
constexpr int kMixMaxStreams = 4; // a warp a stream's products; 42 KiB shared at n = 4
constexpr bool kMixSupported = kInputGradSupported && kStreams <= kMixMaxStreams;
constexpr int kMixRowVectors = kMixColumns / kVec, kMixPitch = kMixColumns + 8;
static_assert(kMixTokens * (kMixColumns / 8) == kMixThreads, "one bf16 vector of one token a thread");
static_assert(kMixRowVectors <= 16 && 32 % kMixRowVectors == 0, "a tile's vectors are lanes of one warp");
extern "C" __device__ const int mhcc_abi_mix_columns = kMixColumns;
extern "C" __device__ const int mhcc_abi_mix_tokens = kMixTokens;

// The post dots <dOut[t, i], y[t]> in tile order, as pass A computes them
// where C % kMixColumns == 0 and pass C of the next sublayer computes them
// when it does that pass A: a 16-byte vector's kVec products summed in order
// from +0 (postVectorDot), a tile's kMixRowVectors vectors (consecutive
// lanes) by butterfly (postTileSum), the tiles in order from +0. The same
// bits either way, so pipeline layouts agree (a stage's last sublayer
// cannot join: the pass C after it runs on the next stage).
__device__ __forceinline__ float postVectorDot(const float (&g)[kVec], const float (&y)[kVec]) {
  float dot = 0.0f;
  for (int e = 0; e < kVec; ++e)
    dot += g[e] * y[e];
  return dot;
}
__device__ __forceinline__ float postTileSum(float v, unsigned lanes) {
  for (int offset = 1; offset < kMixRowVectors; offset *= 2)
    v += __shfl_xor_sync(lanes, v, offset);
  return v;
}

/// Pass A: mhcc_mhc_post_res_backward's dy (the same expression) and post
/// entries of dCoef (in tile order where C % kMixColumns == 0 and the arrays
/// take 16-byte vectors, as always where the three passes run; else that
/// kernel's order), its res entries and dx left to passes B and C. `fresh`
/// bits as there (2: dCoef, 4: dy); with dCoef fresh its pre entries get +0
/// and its res entries nothing yet.
extern "C" __global__ void mhcc_mhc_post_backward(const float *coef, const act_t *y, const act_t *dOut, float *dCoef,
                                                  act_t *dy, int fresh, int64_t rows, int64_t C) {
  kernelPrologue();
  constexpr int A = kStreams + 1;
  constexpr bool kStaged = warpTiles<A>() > 0;
  constexpr int kTiles = kStaged ? warpTiles<A>() : 1, E = kTiles * 32 * kVec;
  const int64_t t = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (t >= rows)
    return;
  const int K = kCoefficients;
  float hpost[kStreams], dotY[kStreams];
  for (int i = 0; i < kStreams; ++i) {
    hpost[i] = coef[t * K + kStreams + i];
    dotY[i] = 0;
  }
  const bool freshCoef = fresh & 2, freshDy = fresh & 4;
  auto updateDy = [&](int64_t c, const float *g) {
    float acc = freshDy ? 0.0f : load(dy[t * C + c]);
    for (int i = 0; i < kStreams; ++i)
      acc += hpost[i] * g[i];
    store(&dy[t * C + c], acc);
  };
  // The post dots in tile order: 16-byte vectors, every staged chunk whole tiles.
  const bool tileOrder = kStaged && C % kMixColumns == 0 && aligned16(y) && aligned16(dOut) && aligned16(dy);
  if constexpr (kStaged) {
    // Arrays: dOut[t, i] (i < n), y[t] (n).
    __shared__ uint4 staged[kThreads / 32][kStaged ? A : 1][E / kVec];
    const act_t *src[A];
    act_t *buf[A];
    for (int a = 0; a < A; ++a) {
      src[a] = a < kStreams ? dOut + (t * kStreams + a) * C : y + t * C;
      buf[a] = reinterpret_cast<act_t *>(staged[threadIdx.x / 32][a]);
    }
    const bool vec = C % kVec == 0 && aligned16(y) && aligned16(dOut);
    const bool vecOut = vec && aligned16(dy);
    static_assert(E % kMixColumns == 0, "a staged chunk holds whole tiles");
    warpStream<kTiles, A>(src, buf, C, vec, lane, [&](int64_t base, int n) {
      if (tileOrder) {
        for (int u = 0; u < kTiles; ++u) {
          const int o = (u * 32 + lane) * kVec;
          float dots[kStreams] = {};
          if (o + kVec <= n) {
            uint4 g[kStreams];
            addPostVector(buf, o, hpost, dy + t * C + base + o, freshDy, g);
            float ys[kVec];
            unpackVec(*reinterpret_cast<const uint4 *>(buf[kStreams] + o), ys);
            for (int i = 0; i < kStreams; ++i) {
              float gi[kVec];
              unpackVec(g[i], gi);
              dots[i] = postVectorDot(gi, ys);
            }
          }
          for (int i = 0; i < kStreams; ++i)
            dots[i] = postTileSum(dots[i], 0xffffffffu);
          for (int first = 0; first < 32; first += kMixRowVectors) // the tiles in order
            if ((u * 32 + first) * kVec < n)
              for (int i = 0; i < kStreams; ++i)
                dotY[i] += __shfl_sync(0xffffffffu, dots[i], first);
        }
        return;
      }
      for (int jj = 0; jj < E / 32; ++jj) {
        const int c = lane + 32 * jj;
        if (c < n)
          for (int i = 0; i < kStreams; ++i)
            dotY[i] += load(buf[i][c]) * load(buf[kStreams][c]);
      }
      for (int u = 0; u < kTiles; ++u) {
        const int o = (u * 32 + lane) * kVec;
        if (vecOut && o + kVec <= n) {
          uint4 g[kStreams];
          addPostVector(buf, o, hpost, dy + t * C + base + o, freshDy, g);
        } else {
          for (int e = o; e < min(o + kVec, n); ++e) {
            float g[kStreams];
            for (int i = 0; i < kStreams; ++i)
              g[i] = load(buf[i][e]);
            updateDy(base + e, g);
          }
        }
      }
    });
  } else {
    for (int64_t c = lane; c < C; c += 32) {
      float g[kStreams];
      for (int i = 0; i < kStreams; ++i)
        g[i] = load(dOut[(t * kStreams + i) * C + c]);
      const float yc = load(y[t * C + c]);
      for (int i = 0; i < kStreams; ++i)
        dotY[i] += g[i] * yc;
      updateDy(c, g);
    }
  }
  if (freshCoef && lane == 0)
    for (int i = 0; i < kStreams; ++i)
      dCoef[t * K + i] = 0.0f;
  for (int i = 0; i < kStreams; ++i) {
    const float dY = tileOrder ? dotY[i] : warpSum(dotY[i]); // tile order: every lane holds the sum
    float *out = dCoef + t * K + kStreams + i;
    if (lane == 0)
      *out = (freshCoef ? 0.0f : *out) + dY;
  }
}

/// Pass B: dCoef's res entries <dOut[t, i], x[t, j]> (written, as
/// mhcc_mhc_post_res_backward writes them into a fresh dCoef) and pre
/// entries <du[t], x[t, s]> (added, as mhcc_mhc_pre_backward adds them), one
/// warp per row, each dot in those kernels' order. Reads only. Where the
/// next sublayer's pass C did pass A (postPartials, [rows][tiles][n]), dCoef
/// is fresh here: the post entries are the partials summed over the tiles
/// in order from +0, the pre entries +0 + the dot. With `early`, the first
/// stage of dOut and x (written by the next sublayer's pass C and the
/// forward, two or more kernels back: kernelPrologue's comment) is loaded
/// before the dependent-launch wait, beside the kernel before (the F
/// backward's last, which writes du).
extern "C" __global__ void mhcc_mhc_mix_backward_dots(const act_t *x, const act_t *dOut, const act_t *du,
                                                      float *dCoef, const float *postPartials, int64_t tiles,
                                                      int64_t rows, int64_t C, int early) {
  if (!early)
    kernelPrologue();
  constexpr int A = 2 * kStreams + 1;
  constexpr bool kStaged = warpTiles<A>() > 0;
  constexpr int kTiles = kStaged ? warpTiles<A>() : 1, E = kTiles * 32 * kVec;
  const int64_t t = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (t >= rows)
    return;
  const int K = kCoefficients;
  float dot[kStreams][kStreams], dotPre[kStreams];
  for (int i = 0; i < kStreams; ++i) {
    dotPre[i] = 0;
    for (int j = 0; j < kStreams; ++j)
      dot[i][j] = 0;
  }
  if constexpr (kStaged) {
    // Arrays: dOut[t, i] (i < n), x[t, j] (n + j), du[t] (2 n).
    __shared__ uint4 staged[kThreads / 32][kStaged ? A : 1][E / kVec];
    const act_t *src[A];
    act_t *buf[A];
    for (int a = 0; a < A; ++a) {
      src[a] = a < kStreams ? dOut + (t * kStreams + a) * C : a < 2 * kStreams ? x + (t * kStreams + a - kStreams) * C
                                                                               : du + t * C;
      buf[a] = reinterpret_cast<act_t *>(staged[threadIdx.x / 32][a]);
    }
    const bool vec = C % kVec == 0 && aligned16(x) && aligned16(dOut) && aligned16(du);
    warpStream<kTiles, A>(
        src, buf, C, vec, lane,
        [&](int64_t, int n) {
          for (int jj = 0; jj < E / 32; ++jj) {
            const int c = lane + 32 * jj;
            if (c < n)
              for (int i = 0; i < kStreams; ++i) {
                for (int j = 0; j < kStreams; ++j)
                  dot[i][j] += load(buf[i][c]) * load(buf[kStreams + j][c]);
                dotPre[i] += load(buf[2 * kStreams][c]) * load(buf[kStreams + i][c]);
              }
          }
        },
        2 * kStreams, [&] {
          if (early)
            kernelPrologue();
        });
  } else {
    if (early) // unstaged (n > 4, where the host never launches it): no early loads
      kernelPrologue();
    for (int64_t c = lane; c < C; c += 32) {
      const float g = load(du[t * C + c]);
      for (int i = 0; i < kStreams; ++i) {
        const float dOutI = load(dOut[(t * kStreams + i) * C + c]);
        for (int j = 0; j < kStreams; ++j)
          dot[i][j] += dOutI * load(x[(t * kStreams + j) * C + c]);
        dotPre[i] += g * load(x[(t * kStreams + i) * C + c]);
      }
    }
  }
  for (int i = 0; i < kStreams; ++i) {
    for (int j = 0; j < kStreams; ++j) {
      const float d = warpSum(dot[i][j]);
      if (lane == 0)
        dCoef[t * K + 2 * kStreams + i * kStreams + j] = 0.0f + d;
    }
    const float d = warpSum(dotPre[i]);
    if (lane == 0)
      dCoef[t * K + i] = (postPartials ? 0.0f : dCoef[t * K + i]) + d;
  }
  if (postPartials && lane < kStreams) { // as pass A: the tiles in order, onto a fresh +0
    float sum = 0.0f;
    for (int64_t tile = 0; tile < tiles; ++tile)
      sum += postPartials[(t * tiles + tile) * kStreams + lane];
    dCoef[t * K + kStreams + lane] = 0.0f + sum;
  }
}

// Pass C's tiles: a block of kMixThreads takes kMixTokens tokens x
// kMixColumns columns c of every stream; grid (C / kMixColumns, ceil(rows /
// kMixTokens)). The block copies dOut's and du's tile, wmap's slice and the
// rows of coef into shared memory with cp.async while each thread loads its
// x vectors into registers (with `early`, before the dependent-launch wait:
// beside the Sinkhorn backward's end), then rScale's rows and dp. Warp s
// makes stream s's products (16 x kMixColumns on tensor cores, the kernel
// it replaces' tile); then a thread owns one 16-byte vector (kVec columns)
// of one token in every stream: the n dOut vectors it mixes are widened
// once for the n streams it writes, and a row's 128 bytes go to
// kMixRowVectors consecutive threads.

/// 16 bytes global -> shared without registers (cp.async; waitCopies before reading).
__device__ __forceinline__ void copyAsync16(void *dst, const void *src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(uint32_t(__cvta_generic_to_shared(dst))),
               "l"(src));
}
__device__ __forceinline__ void waitCopies() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

/// The previous sublayer's pass A, done by pass C (kPost): that sublayer's
/// output gradient is the dx pass C writes, so a thread forms its dy from
/// the n rounded dx vectors it holds (addPostVector's expression: the bits
/// of pass A) and its post dots' partial over the tile's kMixColumns
/// columns (its kVec elements in order, then the token's kMixRowVectors
/// threads by butterfly), which pass B of that sublayer adds over the
/// column tiles in order. coef and y are that sublayer's; dy is fresh.
struct PostTerms {
  const float *coef;
  const act_t *y;
  act_t *dy;
  float *partials; // [rows][C / kMixColumns][n]
};

/// Pass C: dx[t, s, c] for a fresh dx, as the three kernels left it:
/// bf16(sum_i hres[i, s] dOut[t, i, c]) (the post/res backward's sum from
/// +0), + h_pre[t, s] du[t, c] rounded (the pre backward's), then the
/// product's and the RMS term's two roundings (inputGradElement). Needs C %
/// kMixColumns == 0, n <= 4 and 16-byte aligned x, dOut, du, dx and wmap
/// (the host checks: mhcMixBackwardApplies). kPost: post's terms too.
template <bool kPost>
__device__ __forceinline__ void mixBackwardInput(const act_t *x, const act_t *wmap, const act_t *dp,
                                                 const float *rScale, const float *coef, const act_t *dOut,
                                                 const act_t *du, act_t *dx, int64_t rows, int64_t C,
                                                 const PostTerms &post, int early) {
  if constexpr (kMixSupported) {
    constexpr int K = kCoefficients;
    // A token's vectors of dOut (streams 0..n-1), then of du.
    __shared__ uint4 staged[kMixTokens][kStreams + 1][kMixRowVectors];
    __shared__ __align__(16) float products[kStreams][kMixTokens][kMixPitch];
    // wmap's rows s C + c0 + [0, kMixColumns) of each stream s, in that order: B's source.
    __shared__ __align__(16) act_t slice[kStreams * kMixColumns * K];
    __shared__ float coefs[kMixTokens * K], scales[kMixTokens];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t t0 = int64_t(blockIdx.y) * kMixTokens, c0 = int64_t(blockIdx.x) * kMixColumns;
    const int tokens = int(min(int64_t(kMixTokens), rows - t0));
    // The thread's token r and vector.
    const int r = threadIdx.x / kMixRowVectors, vector = threadIdx.x % kMixRowVectors;
    const int64_t t = t0 + r, c = c0 + vector * kVec;
    const bool valid = r < tokens;
    uint4 xs[kStreams];
    if (valid) {
      for (int s = 0; s < kStreams; ++s)
        xs[s] = *reinterpret_cast<const uint4 *>(x + (t * kStreams + s) * C + c);
      for (int a = 0; a <= kStreams; ++a)
        copyAsync16(&staged[r][a][vector], (a < kStreams ? dOut + (t * kStreams + a) * C : du + t * C) + c);
    }
    constexpr int kStreamSliceVectors = kMixColumns * K / kVec;
    for (int v = threadIdx.x; v < kStreams * kStreamSliceVectors; v += kMixThreads) {
      const int s = v / kStreamSliceVectors, o = v % kStreamSliceVectors;
      copyAsync16(reinterpret_cast<uint4 *>(slice) + v, reinterpret_cast<const uint4 *>(wmap + (s * C + c0) * K) + o);
    }
    for (int e = threadIdx.x; e < tokens * K; e += kMixThreads)
      coefs[e] = coef[t0 * K + e];
    // With `early`, every load above is of an array written two or more
    // kernels back (x and coef by the forward, dOut by the next sublayer's
    // backward, du by this sublayer's F backward, before pass B and the
    // Sinkhorn backward; wmap by the optimizer), complete once this grid is
    // launched (kernelPrologue's comment): so they are in flight while the
    // Sinkhorn backward finishes. rScale and dp are its outputs: after the wait.
    if (early)
      kernelPrologue();
    if (threadIdx.x < tokens)
      scales[threadIdx.x] = rScale[t0 + threadIdx.x];
    ProductRows a;
    if (warp < kStreams)
      loadProductRows(dp, t0, rows, lane, a);
    waitCopies();
    __syncthreads();
    if (warp < kStreams)
      stageProducts<kMixColumns>(a, slice + warp * kMixColumns * K, &products[warp][0][0], kMixPitch, lane);
    __syncthreads();
    if (!valid)
      return;
    float g[kStreams][kVec]; // dOut's vectors, widened once for the n streams
    for (int i = 0; i < kStreams; ++i)
      unpackVec(loadShared16(&staged[r][i][vector]), g[i]);
    float duV[kVec];
    unpackVec(loadShared16(&staged[r][kStreams][vector]), duV);
    const float *row = coefs + r * K;
    const float sc = scales[r];
    float rounded[kPost ? kStreams : 1][kVec]; // dx as stored: the next pass A's dOut
#pragma unroll
    for (int s = 0; s < kStreams; ++s) {
      float weight[kStreams]; // hres[i, s]
      for (int i = 0; i < kStreams; ++i)
        weight[i] = row[2 * kStreams + i * kStreams + s];
      const float hPre = row[s];
      float xv[kVec], v[kVec], product[kVec];
      unpackVec(xs[s], xv);
      const float *tileRow = &products[s][r][vector * kVec];
      *reinterpret_cast<float4 *>(product) = *reinterpret_cast<const float4 *>(tileRow);
      *reinterpret_cast<float4 *>(product + 4) = *reinterpret_cast<const float4 *>(tileRow + 4);
      for (int e = 0; e < kVec; ++e)
        v[e] = 0.0f; // the post/res backward's sum into a fresh dx, stored
      addMixedTerms(v, [&](int i, int e) { return g[i][e]; }, [&](int i) { return weight[i]; });
      roundedVec(v);
      for (int e = 0; e < kVec; ++e) // the pre backward's term, stored
        v[e] = v[e] + hPre * duV[e];
      roundedVec(v);
      for (int e = 0; e < kVec; ++e) // the product (inputGradElement), stored, then the RMS term
        v[e] = v[e] + product[e];
      roundedVec(v);
      for (int e = 0; e < kVec; ++e)
        v[e] = addRmsTerm(v[e], sc, xv[e]);
      if constexpr (kPost) {
        roundedVec(v);
        for (int e = 0; e < kVec; ++e)
          rounded[s][e] = v[e];
      }
      storeVecUnsplit(dx + (t * kStreams + s) * C + c, v);
    }
    if constexpr (kPost) {
      float hpost[kStreams], ys[kVec], dy[kVec], dots[kStreams];
      loadCoefs(post.coef + t * K, kStreams, hpost);
      loadVec(post.y + t * C + c, ys);
      for (int e = 0; e < kVec; ++e)
        dy[e] = 0.0f; // fresh, as pass A's loadOrZero
      addMixedTerms(dy, [&](int i, int e) { return rounded[i][e]; }, [&](int i) { return hpost[i]; });
      storeVec(post.dy + t * C + c, dy);
      // The token's kMixRowVectors threads are consecutive lanes, all valid.
      const unsigned group = ((1u << kMixRowVectors) - 1) << (lane & ~(kMixRowVectors - 1));
      for (int i = 0; i < kStreams; ++i)
        dots[i] = postTileSum(postVectorDot(rounded[i], ys), group);
      if (vector == 0)
        for (int i = 0; i < kStreams; ++i)
          post.partials[(t * gridDim.x + blockIdx.x) * kStreams + i] = dots[i];
    }
  }
}

extern "C" __global__ void __launch_bounds__(kMixThreads)
    mhcc_mhc_mix_backward_input(const act_t *x, const act_t *wmap, const act_t *dp, const float *rScale,
                                const float *coef, const act_t *dOut, const act_t *du, act_t *dx, int64_t rows,
                                int64_t C, int early) {
  if (!early)
    kernelPrologue();
  mixBackwardInput<false>(x, wmap, dp, rScale, coef, dOut, du, dx, rows, C, PostTerms{}, early);
}

/// Launch: as mhcc_mhc_mix_backward_input (grid.x = C / kMixColumns).
extern "C" __global__ void __launch_bounds__(kMixThreads)
    mhcc_mhc_mix_backward_input_post(const act_t *x, const act_t *wmap, const act_t *dp, const float *rScale,
                                     const float *coef, const act_t *dOut, const act_t *du, act_t *dx,
                                     const float *postCoef, const act_t *postY, act_t *postDy, float *postPartials,
                                     int64_t rows, int64_t C, int early) {
  if (!early)
    kernelPrologue();
  mixBackwardInput<true>(x, wmap, dp, rScale, coef, dOut, du, dx, rows, C,
                         PostTerms{postCoef, postY, postDy, postPartials}, early);
}
