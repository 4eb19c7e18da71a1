//===- MhcBackwardKernels.cu - one sublayer's backward mixing in three passes --===//
//
// A part of the model's kernel library: mhcc concatenates ModelKernels.cu,
// MhcKernels.cu, MhcMixKernels.cu, MhcFusedKernels.cu, MhcBackwardKernels.cu
// and LayerKernels.cu (in that order) after the model's constants and
// compiles them as one file; the helpers and conventions are
// ModelKernels.cu's, the input gradient's tiles MhcKernels.cu's.
//
//===----------------------------------------------------------------------===//

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
// rounds dx to bf16 at each point where one of the three kernels stored it.

/// v rounded to an activation and widened again: the value a kernel reads
/// back after another stored v.
__device__ __forceinline__ float roundedActivation(float v) {
  act_t r;
  store(&r, v);
  return load(r);
}

/// Pass A: mhcc_mhc_post_res_backward's dy and post entries of dCoef (the
/// same expressions and orders), its res entries and dx left to passes B
/// and C. `fresh` bits as there (2: dCoef, 4: dy); with dCoef fresh its pre
/// entries get +0 and its res entries nothing yet.
extern "C" __global__ void mhcc_mhc_post_backward(const float *coef, const act_t *y, const act_t *dOut, float *dCoef,
                                                  act_t *dy, int fresh, int64_t rows, int64_t C) {
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
    warpStream<kTiles, A>(src, buf, C, vec, lane, [&](int64_t base, int n) {
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
          float v[kVec];
          for (int i = 0; i < kStreams; ++i)
            g[i] = *reinterpret_cast<const uint4 *>(buf[i] + o);
          act_t *d = dy + t * C + base + o;
          loadOrZero(d, v, freshDy);
          for (int e = 0; e < kVec; ++e) {
            float acc = v[e];
            for (int i = 0; i < kStreams; ++i)
              acc += hpost[i] * vecElement(g[i], e);
            v[e] = acc;
          }
          storeVec(d, v);
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
    const float dY = warpSum(dotY[i]);
    float *out = dCoef + t * K + kStreams + i;
    if (lane == 0)
      *out = (freshCoef ? 0.0f : *out) + dY;
  }
}

/// Pass B: dCoef's res entries <dOut[t, i], x[t, j]> (written, as
/// mhcc_mhc_post_res_backward writes them into a fresh dCoef) and pre
/// entries <du[t], x[t, s]> (added, as mhcc_mhc_pre_backward adds them), one
/// warp per row, each dot in those kernels' order. Reads only.
extern "C" __global__ void mhcc_mhc_mix_backward_dots(const act_t *x, const act_t *dOut, const act_t *du,
                                                      float *dCoef, int64_t rows, int64_t C) {
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
    warpStream<kTiles, A>(src, buf, C, vec, lane, [&](int64_t, int n) {
      for (int jj = 0; jj < E / 32; ++jj) {
        const int c = lane + 32 * jj;
        if (c < n)
          for (int i = 0; i < kStreams; ++i) {
            for (int j = 0; j < kStreams; ++j)
              dot[i][j] += load(buf[i][c]) * load(buf[kStreams + j][c]);
            dotPre[i] += load(buf[2 * kStreams][c]) * load(buf[kStreams + i][c]);
          }
      }
    });
  } else {
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
      dCoef[t * K + i] += d;
  }
}

// Pass C's tiles: a warp takes 16 tokens x kMixColumns columns c of every
// stream (n kMixColumns product columns: the columns s C + c of wmap's
// rows), a block kInputGradWarps warps along the tokens; grid (C /
// kMixColumns, ceil(rows / (16 kInputGradWarps))). A lane owns one token
// row r and kVec columns of it, in every stream: all the res mix's terms
// of an element are the lane's, and du's vector is loaded once for the n
// streams.
constexpr int kMixColumns = 16; // two lanes' 16-byte vectors (bf16)
constexpr int kMixTileColumns = kStreams * kMixColumns;
extern "C" __device__ const int mhcc_abi_mix_columns = kMixColumns;

/// Pass C: dx[t, s, c] for a fresh dx, as the three kernels left it:
/// bf16(sum_i hres[i, s] dOut[t, i, c]) (the post/res backward's sum from
/// +0), + h_pre[t, s] du[t, c] rounded (the pre backward's), then the
/// product's and the RMS term's two roundings (inputGradElement). Needs C %
/// kMixColumns == 0 and 16-byte aligned x, dOut, du, dx and wmap (the host
/// checks: mhcMixBackwardApplies).
extern "C" __global__ void __launch_bounds__(32 * kInputGradWarps)
    mhcc_mhc_mix_backward_input(const act_t *x, const act_t *wmap, const act_t *dp, const float *rScale,
                                const float *coef, const act_t *dOut, const act_t *du, act_t *dx, int64_t rows,
                                int64_t C) {
  if constexpr (kInputGradSupported && 2 * kVec == kMixColumns) {
    constexpr int K = kCoefficients, kPitch = kMixTileColumns + 8;
    __shared__ float products[kInputGradWarps][16][kPitch];
    // wmap's rows s C + c0 + [0, kMixColumns) of each stream s, in that order: B's source.
    __shared__ __align__(16) act_t slice[kMixTileColumns * K];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = lane / 4, pairCol = 2 * (lane % 4);
    const int64_t t0 = (int64_t(blockIdx.y) * kInputGradWarps + warp) * 16;
    const int64_t c0 = int64_t(blockIdx.x) * kMixColumns;
    constexpr int kStreamSliceVectors = kMixColumns * K / kVec;
    for (int v = threadIdx.x; v < kStreams * kStreamSliceVectors; v += blockDim.x) {
      const int s = v / kStreamSliceVectors, o = v % kStreamSliceVectors;
      reinterpret_cast<uint4 *>(slice)[v] = reinterpret_cast<const uint4 *>(wmap + (s * C + c0) * K)[o];
    }
    // The lane's row and columns, loaded before the products so that they
    // are in flight meanwhile.
    const int r = lane / 2, h = lane % 2;
    const int64_t t = t0 + r, c = c0 + h * kVec;
    const bool valid = t < rows;
    uint4 g[kStreams], xs[kStreams], duRaw = make_uint4(0, 0, 0, 0);
    if (valid) {
#pragma unroll
      for (int s = 0; s < kStreams; ++s) {
        g[s] = *reinterpret_cast<const uint4 *>(dOut + (t * kStreams + s) * C + c);
        xs[s] = *reinterpret_cast<const uint4 *>(x + (t * kStreams + s) * C + c);
      }
      duRaw = *reinterpret_cast<const uint4 *>(du + t * C + c);
    }
    __syncthreads();
    if (t0 >= rows)
      return; // the whole warp
    // A: dp rows t0 + group (+ 8), columns k + pairCol (+ 8), k < K else 0.
    uint32_t a[kInputGradKSteps][4];
    for (int ks = 0; ks < kInputGradKSteps; ++ks)
      for (int q = 0; q < 4; ++q) {
        const int64_t row = t0 + group + 8 * (q % 2);
        const int k = 16 * ks + pairCol + 8 * (q / 2);
        a[ks][q] = row < rows && k < K ? packedPair(dp + row * K, k, K) : 0u;
      }
    float(*tile)[kPitch] = products[warp];
#pragma unroll 4
    for (int nt = 0; nt < kMixTileColumns / 8; ++nt) {
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
      *reinterpret_cast<float2 *>(&tile[group][nt * 8 + pairCol]) = make_float2(d[0], d[1]);
      *reinterpret_cast<float2 *>(&tile[group + 8][nt * 8 + pairCol]) = make_float2(d[2], d[3]);
    }
    __syncwarp();
    if (!valid)
      return;
    const float *row = coef + t * K;
    const float sc = rScale[t];
    float duV[kVec];
    unpackVec(duRaw, duV);
#pragma unroll
    for (int s = 0; s < kStreams; ++s) {
      float xv[kVec], v[kVec];
      unpackVec(xs[s], xv);
      const float hPre = row[s];
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        float acc = 0.0f; // the post/res backward's sum into a fresh dx
#pragma unroll
        for (int i = 0; i < kStreams; ++i)
          acc += row[2 * kStreams + i * kStreams + s] * vecElement(g[i], e);
        const float afterRes = roundedActivation(acc);
        const float afterPre = roundedActivation(afterRes + hPre * duV[e]);
        v[e] = inputGradElement(afterPre, tile[r][s * kMixColumns + h * kVec + e], sc, xv[e]);
      }
      storeVecUnsplit(dx + (t * kStreams + s) * C + c, v);
    }
  }
}
