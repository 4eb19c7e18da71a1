//===- MhcMixKernels.cu - mHC pre-mix, post-res mix and the residual ------------===//
//
// A part of the model's kernel library: mhcc concatenates ModelKernels.cu,
// MhcKernels.cu, MhcMixKernels.cu, MhcFusedKernels.cu, MhcBackwardKernels.cu and LayerKernels.cu (in that
// order) after the model's constants and compiles them as one file; the helpers and
// conventions are ModelKernels.cu's.
//
//===----------------------------------------------------------------------===//

/// dx += scale[t] x (the RMS term of the mHC entry's input gradient; x and
/// dx the residual stream).
template <typename R>
__device__ __forceinline__ void rowScaleAdd(const R *x, const float *scale, R *dx, int64_t rows, int64_t width) {
  if constexpr (residualAsActivations<R>()) {
    if (width % kVec == 0 && aligned16(x) && aligned16(dx)) {
      for (int64_t i = gridThread() * kVec; i < rows * width; i += gridThreads() * kVec) {
        const float sc = scale[i / width];
        float xv[kVec], dv[kVec];
        loadVec(x + i, xv);
        loadVec(dx + i, dv);
        for (int k = 0; k < kVec; ++k) {
          const float g = sc * xv[k];
          dv[k] = dv[k] + g;
        }
        storeVec(dx + i, dv);
      }
      return;
    }
  } else if (width % 4 == 0 && alignedQuad(x) && alignedQuad(dx)) {
    for (int64_t i = gridThread() * 4; i < rows * width; i += gridThreads() * 4) {
      const float sc = scale[i / width];
      float xv[4], dv[4];
      loadQuad(x + i, xv);
      loadQuad(dx + i, dv);
      for (int k = 0; k < 4; ++k) {
        const float g = sc * xv[k];
        dv[k] = dv[k] + g;
      }
      storeQuad(dx + i, dv);
    }
    return;
  }
  for (int64_t i = gridThread(); i < rows * width; i += gridThreads()) {
    const float g = scale[i / width] * load(x[i]);
    store(&dx[i], load(dx[i]) + g);
  }
}

extern "C" __global__ void mhcc_row_scale_add(const res_t *x, const float *scale, res_t *dx, int64_t rows,
                                              int64_t width) {
  kernelPrologue();
  rowScaleAdd(x, scale, dx, rows, width);
}

/// The pre-mix of kVec consecutive columns c.. of token t, u[t, c + e] =
/// sum_s h_pre[t, s] x[t, s, c + e] summed over s in order from +0, in two
/// halves so that callers can put several vectors' loads in flight (16-byte
/// accesses: C % kVec == 0, x and u aligned).
struct PreMixVector {
  float h[kStreams];
  uint4 xs[kStreams];
  __device__ __forceinline__ void fetch(const act_t *x, const float *coef, int64_t t, int64_t c, int64_t C) {
    loadCoefs(coef + t * kCoefficients, 0, h);
    for (int s = 0; s < kStreams; ++s)
      xs[s] = *reinterpret_cast<const uint4 *>(x + (t * kStreams + s) * C + c);
  }
  __device__ __forceinline__ void finish(act_t *u, int64_t t, int64_t c, int64_t C) const {
    float v[kStreams][kVec], out[kVec];
    for (int s = 0; s < kStreams; ++s)
      unpackVec(xs[s], v[s]);
    for (int e = 0; e < kVec; ++e) {
      float sum = 0;
      for (int s = 0; s < kStreams; ++s)
        sum += h[s] * v[s][e];
      out[e] = sum;
    }
    storeVec(u + t * C + c, out);
  }
};

template <typename R>
__device__ __forceinline__ void preForward(const R *x, const float *coef, act_t *u, int64_t rows, int64_t C) {
  const int K = kCoefficients;
  if constexpr (residualAsActivations<R>()) {
    if (C % kVec == 0 && aligned16(x) && aligned16(u)) {
      for (int64_t i = gridThread() * kVec; i < rows * C; i += gridThreads() * kVec) {
        PreMixVector v;
        v.fetch(x, coef, i / C, i % C, C);
        v.finish(u, i / C, i % C, C);
      }
      return;
    }
  } else if (C % 4 == 0 && alignedQuad(x) && alignedQuad(u)) {
    for (int64_t q = gridThread() * 4; q < rows * C; q += gridThreads() * 4) {
      int64_t t = q / C, c = q % C;
      float h[kStreams], xs[kStreams][4], out[4];
      loadCoefs(coef + t * K, 0, h);
      for (int s = 0; s < kStreams; ++s)
        loadQuad(x + (t * kStreams + s) * C + c, xs[s]);
      for (int e = 0; e < 4; ++e) {
        float sum = 0;
        for (int s = 0; s < kStreams; ++s)
          sum += h[s] * xs[s][e];
        out[e] = sum;
      }
      storeQuad(u + q, out);
    }
    return;
  }
  for (int64_t i = gridThread(); i < rows * C; i += gridThreads()) {
    int64_t t = i / C, c = i % C;
    float sum = 0;
    for (int s = 0; s < kStreams; ++s)
      sum += coef[t * K + s] * load(x[(t * kStreams + s) * C + c]);
    store(&u[i], sum);
  }
}

extern "C" __global__ void mhcc_mhc_pre_forward(const res_t *x, const float *coef, act_t *u, int64_t rows, int64_t C) {
  kernelPrologue();
  preForward(x, coef, u, rows, C);
}

/// The pre-mix backward in one pass over du and x, one warp per row t:
/// dCoef[t, s] += <du[t], x[t, s]> (lane l adding its elements c = l + 32 k in
/// order, then warpSum) and dx[t, s, c] += h[t, s] du[t, c] for each element.
/// du, x and (up to n = 4) dx are staged through shared memory (warpStream),
/// so the next stage's loads of all three are in flight while a stage is
/// read; the lane's own 16-byte vectors of the stage give the dx update, so
/// du is read once.
template <typename R>
__device__ __forceinline__ void preBackward(const R *x, const float *coef, const act_t *du, R *dx, float *dCoef,
                                            int64_t rows, int64_t C) {
  constexpr bool kStageDx = warpTiles<2 * kStreams + 1>() > 0;
  constexpr int A = kStageDx ? 2 * kStreams + 1 : kStreams + 1; // du, x's streams, dx's streams
  // Staged, or else straight from global memory (always for an fp32 stream).
  constexpr bool kStaged = warpTiles<A>() > 0 && residualAsActivations<R>();
  constexpr int kTiles = kStaged ? warpTiles<A>() : 1, E = kTiles * 32 * kVec;
  int64_t t = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (t >= rows)
    return;
  const int K = kCoefficients;
  float h[kStreams], dot[kStreams];
  for (int s = 0; s < kStreams; ++s) {
    h[s] = coef[t * K + s];
    dot[s] = 0;
  }
  // dx[t, s, c] = dx + h[s] du[c]: one element's expression, whatever the access width.
  auto updateDx = [&](int64_t c, float g) {
    for (int s = 0; s < kStreams; ++s) {
      R *d = dx + (t * kStreams + s) * C + c;
      const float v = load(*d) + h[s] * g;
      store(d, v);
    }
  };
  if constexpr (kStaged) {
    __shared__ uint4 staged[kThreads / 32][kStaged ? A : 1][E / kVec];
    const act_t *src[A];
    act_t *buf[A];
    for (int a = 0; a < A; ++a) {
      src[a] = a == 0 ? du + t * C
               : a <= kStreams ? x + (t * kStreams + a - 1) * C
                               : dx + (t * kStreams + a - 1 - kStreams) * C;
      buf[a] = reinterpret_cast<act_t *>(staged[threadIdx.x / 32][a]);
    }
    const bool vec = C % kVec == 0 && aligned16(x) && aligned16(du) && (!kStageDx || aligned16(dx));
    const bool vecOut = vec && aligned16(dx);
    warpStream<kTiles, A>(src, buf, C, vec, lane, [&](int64_t base, int n) {
      for (int j = 0; j < E / 32; ++j) {
        const int c = lane + 32 * j;
        if (c < n)
          for (int s = 0; s < kStreams; ++s)
            dot[s] += load(buf[0][c]) * load(buf[s + 1][c]);
      }
      for (int u = 0; u < kTiles; ++u) {
        const int o = (u * 32 + lane) * kVec;
        if (vecOut && o + kVec <= n) {
          float g[kVec], v[kVec];
          unpackVec(*reinterpret_cast<const uint4 *>(buf[0] + o), g);
          for (int s = 0; s < kStreams; ++s) {
            act_t *d = dx + (t * kStreams + s) * C + base + o;
            if (kStageDx)
              unpackVec(*reinterpret_cast<const uint4 *>(buf[kStreams + 1 + s] + o), v);
            else
              loadVec(d, v);
            for (int e = 0; e < kVec; ++e)
              v[e] = v[e] + h[s] * g[e];
            storeVec(d, v);
          }
        } else {
          for (int e = o; e < min(o + kVec, n); ++e)
            updateDx(base + e, load(buf[0][e]));
        }
      }
    });
  } else {
    if (!residualAsActivations<R>() && C % 4 == 0 && alignedQuad(x) && alignedQuad(du) && alignedQuad(dx)) {
      // An fp32 stream: a lane's quads, its dots added in their order.
      for (int64_t c = 4 * lane; c < C; c += 128) {
        float g[4], xs[kStreams][4];
        loadQuad(du + t * C + c, g);
        for (int s = 0; s < kStreams; ++s)
          loadQuad(x + (t * kStreams + s) * C + c, xs[s]);
        for (int e = 0; e < 4; ++e)
          for (int s = 0; s < kStreams; ++s)
            dot[s] += g[e] * xs[s][e];
        for (int s = 0; s < kStreams; ++s) {
          R *d = dx + (t * kStreams + s) * C + c;
          float v[4];
          loadQuad(d, v);
          for (int e = 0; e < 4; ++e)
            v[e] = v[e] + h[s] * g[e];
          storeQuad(d, v);
        }
      }
    } else {
      for (int64_t c = lane; c < C; c += 32) {
        const float g = load(du[t * C + c]);
        for (int s = 0; s < kStreams; ++s)
          dot[s] += g * load(x[(t * kStreams + s) * C + c]);
        updateDx(c, g);
      }
    }
  }
  for (int s = 0; s < kStreams; ++s) {
    const float d = warpSum(dot[s]);
    if (lane == 0)
      dCoef[t * K + s] += d;
  }
}

extern "C" __global__ void mhcc_mhc_pre_backward(const res_t *x, const float *coef, const act_t *du, res_t *dx,
                                                 float *dCoef, int64_t rows, int64_t C) {
  kernelPrologue();
  preBackward(x, coef, du, dx, dCoef, rows, C);
}

/// The post-res mix of kVec consecutive columns c.. of token t, every
/// output stream i: out[t, i, c + e] = sum_j h_res[t, i, j] x[t, j, c + e]
/// (over j in order from +0) + h_post[t, i] y[t, c + e]. The one expression
/// of the bf16 stream's forward, shared by mhcc_mhc_post_res_forward and the
/// fused post-res and entry (MhcFusedKernels.cu), so that they give these
/// bits. fetch issues the loads, mix gives the n output vectors as stored;
/// kStreaming reads x and y with the evict-first hint (read once).
struct PostResVector {
  uint4 xs[kStreams], ys;
  template <bool kStreaming>
  __device__ __forceinline__ void fetch(const act_t *x, const act_t *y, int64_t t, int64_t c, int64_t C) {
    auto load16 = [](const act_t *p) {
      if constexpr (kStreaming)
        return __ldcs(reinterpret_cast<const uint4 *>(p));
      else
        return *reinterpret_cast<const uint4 *>(p);
    };
    for (int j = 0; j < kStreams; ++j)
      xs[j] = load16(x + (t * kStreams + j) * C + c);
    ys = load16(y + t * C + c);
  }
  __device__ __forceinline__ void mix(const float *coefRow, uint4 (&out)[kStreams]) const {
    float hpost[kStreams], hres[kStreams * kStreams], xv[kStreams][kVec], yv[kVec];
    loadCoefs(coefRow, kStreams, hpost);
    loadCoefs(coefRow, 2 * kStreams, hres);
    for (int j = 0; j < kStreams; ++j)
      unpackVec(xs[j], xv[j]);
    unpackVec(ys, yv);
    for (int i = 0; i < kStreams; ++i) {
      float o[kVec];
      for (int e = 0; e < kVec; ++e) {
        float sum = 0;
        for (int j = 0; j < kStreams; ++j)
          sum += hres[i * kStreams + j] * xv[j][e];
        o[e] = sum + hpost[i] * yv[e];
      }
      out[i] = packVec(o);
    }
  }
};

template <bool kStreaming = false>
__device__ __forceinline__ void postResVector(const act_t *x, const float *coef, const act_t *y, act_t *out,
                                              int64_t t, int64_t c, int64_t C) {
  PostResVector v;
  v.fetch<kStreaming>(x, y, t, c, C);
  uint4 mixed[kStreams];
  v.mix(coef + t * kCoefficients, mixed);
  for (int i = 0; i < kStreams; ++i)
    *reinterpret_cast<uint4 *>(out + (t * kStreams + i) * C + c) = mixed[i];
}

/// kVec columns of a row, all n output streams, per thread where possible
/// (x and y read once).
template <typename R>
__device__ __forceinline__ void postResForward(const R *x, const float *coef, const act_t *y, R *out, int64_t rows,
                                               int64_t C) {
  const int K = kCoefficients;
  if constexpr (residualAsActivations<R>()) {
    if (C % kVec == 0 && aligned16(x) && aligned16(y) && aligned16(out)) {
      for (int64_t q = gridThread() * kVec; q < rows * C; q += gridThreads() * kVec)
        postResVector(x, coef, y, out, q / C, q % C, C);
      return;
    }
  } else if (C % 4 == 0 && alignedQuad(x) && alignedQuad(y) && alignedQuad(out)) {
    for (int64_t q = gridThread() * 4; q < rows * C; q += gridThreads() * 4) {
      int64_t t = q / C, c = q % C;
      float hpost[kStreams], hres[kStreams * kStreams], xs[kStreams][4], ys[4];
      loadCoefs(coef + t * K, kStreams, hpost);
      loadCoefs(coef + t * K, 2 * kStreams, hres);
      for (int j = 0; j < kStreams; ++j)
        loadQuad(x + (t * kStreams + j) * C + c, xs[j]);
      loadQuad(y + q, ys);
      for (int i = 0; i < kStreams; ++i) {
        float o[4];
        for (int e = 0; e < 4; ++e) {
          float sum = 0;
          for (int j = 0; j < kStreams; ++j)
            sum += hres[i * kStreams + j] * xs[j][e];
          o[e] = sum + hpost[i] * ys[e];
        }
        storeQuad(out + (t * kStreams + i) * C + c, o);
      }
    }
    return;
  }
  for (int64_t e = gridThread(); e < rows * kStreams * C; e += gridThreads()) {
    int64_t t = e / (kStreams * C), i = (e / C) % kStreams, c = e % C;
    const float *hpost = coef + t * K + kStreams, *hres = coef + t * K + 2 * kStreams;
    float sum = 0;
    for (int j = 0; j < kStreams; ++j)
      sum += hres[i * kStreams + j] * load(x[(t * kStreams + j) * C + c]);
    store(&out[e], sum + hpost[i] * load(y[t * C + c]));
  }
}

extern "C" __global__ void mhcc_mhc_post_res_forward(const res_t *x, const float *coef, const act_t *y, res_t *out,
                                                     int64_t rows, int64_t C) {
  kernelPrologue();
  postResForward(x, coef, y, out, rows, C);
}

/// v[e] += sum_i weight(i) element(i, e) for kVec columns, summed over i in
/// order onto v[e]: the backward mixing's one expression (dy's post terms,
/// dx's res terms), shared so that the kernels computing it agree bit for
/// bit. element(i, e): dOut's stream i at column e, widened.
template <typename Element, typename Weight>
__device__ __forceinline__ void addMixedTerms(float (&v)[kVec], Element element, Weight weight) {
  for (int e = 0; e < kVec; ++e) {
    float acc = v[e];
    for (int i = 0; i < kStreams; ++i)
      acc += weight(i) * element(i, e);
    v[e] = acc;
  }
}

/// addMixedTerms with dOut's n vectors g still packed.
template <typename Weight>
__device__ __forceinline__ void addMixed(float (&v)[kVec], const uint4 (&g)[kStreams], Weight weight) {
  addMixedTerms(v, [&](int i, int e) { return vecElement(g[i], e); }, weight);
}

/// One lane's vector of a staged stage (offset o): dOut's n vectors into g,
/// still packed, and dy's kVec elements at d given their post terms
/// (addMixed with hpost, onto +0 when `fresh`).
__device__ __forceinline__ void addPostVector(act_t *const *buf, int o, const float (&hpost)[kStreams], act_t *d,
                                              bool fresh, uint4 (&g)[kStreams]) {
  float v[kVec];
  for (int i = 0; i < kStreams; ++i)
    g[i] = *reinterpret_cast<const uint4 *>(buf[i] + o);
  loadOrZero(d, v, fresh);
  addMixed(v, g, [&](int i) { return hpost[i]; });
  storeVec(d, v);
}

/// A token's terms in the post/res backward: the coefficients it mixes with
/// (post, res) and its lane's dots of dOut with y (post) and with x (res).
struct PostResTerms {
  float hpost[kStreams], hres[kStreams * kStreams], dotY[kStreams], dot[kStreams][kStreams];
  __device__ __forceinline__ explicit PostResTerms(const float *coefRow) {
    for (int i = 0; i < kStreams; ++i) {
      hpost[i] = coefRow[kStreams + i];
      dotY[i] = 0;
      for (int j = 0; j < kStreams; ++j) {
        hres[i * kStreams + j] = coefRow[2 * kStreams + i * kStreams + j];
        dot[i][j] = 0;
      }
    }
  }
};

/// postResBackward on an fp32 stream: a lane's quads, its dots added in
/// their order; dy and dx from each element's n values of dOut as its
/// element path does.
template <typename R>
__device__ __forceinline__ void postResBackwardQuads(const R *x, const act_t *y, const R *dOut, R *dx, act_t *dy,
                                                     int64_t t, int lane, int64_t C, bool freshDx, bool freshDy,
                                                     PostResTerms &terms) {
  const float(&hpost)[kStreams] = terms.hpost;
  const float(&hres)[kStreams * kStreams] = terms.hres;
  float(&dotY)[kStreams] = terms.dotY;
  float(&dot)[kStreams][kStreams] = terms.dot;
  for (int64_t c = 4 * lane; c < C; c += 128) {
    float g[kStreams][4], xs[kStreams][4], ys[4], v[4];
    for (int i = 0; i < kStreams; ++i)
      loadQuad(dOut + (t * kStreams + i) * C + c, g[i]);
    for (int j = 0; j < kStreams; ++j)
      loadQuad(x + (t * kStreams + j) * C + c, xs[j]);
    loadQuad(y + t * C + c, ys);
    for (int e = 0; e < 4; ++e)
      for (int i = 0; i < kStreams; ++i) {
        dotY[i] += g[i][e] * ys[e];
        for (int j = 0; j < kStreams; ++j)
          dot[i][j] += g[i][e] * xs[j][e];
      }
    if (freshDy)
      v[0] = v[1] = v[2] = v[3] = 0.0f;
    else
      loadQuad(dy + t * C + c, v);
    for (int e = 0; e < 4; ++e) {
      float acc = v[e];
      for (int i = 0; i < kStreams; ++i)
        acc += hpost[i] * g[i][e];
      v[e] = acc;
    }
    storeQuad(dy + t * C + c, v);
    for (int j = 0; j < kStreams; ++j) {
      R *d = dx + (t * kStreams + j) * C + c;
      if (freshDx)
        v[0] = v[1] = v[2] = v[3] = 0.0f;
      else
        loadQuad(d, v);
      for (int e = 0; e < 4; ++e) {
        float acc = v[e];
        for (int i = 0; i < kStreams; ++i)
          acc += hres[i * kStreams + j] * g[i][e];
        v[e] = acc;
      }
      storeQuad(d, v);
    }
  }
}

/// The lane dots' warp sums into the token's dCoef row (post, res entries;
/// added to, or written where `freshCoef`, whose pre entries get +0).
__device__ __forceinline__ void addPostResDots(const PostResTerms &terms, float *dCoefRow, int lane, bool freshCoef) {
  if (freshCoef && lane == 0)
    for (int i = 0; i < kStreams; ++i)
      dCoefRow[i] = 0.0f;
  for (int i = 0; i < kStreams; ++i) {
    const float dY = warpSum(terms.dotY[i]);
    float *out = dCoefRow + kStreams + i;
    if (lane == 0)
      *out = (freshCoef ? 0.0f : *out) + dY;
    for (int j = 0; j < kStreams; ++j) {
      const float d = warpSum(terms.dot[i][j]);
      out = dCoefRow + 2 * kStreams + i * kStreams + j;
      if (lane == 0)
        *out = (freshCoef ? 0.0f : *out) + d;
    }
  }
}

/// The post/res backward in one pass over dOut, x and y, one warp per row t:
/// dCoef's post entries <dOut[t,i], y[t]> and res entries <dOut[t,i], x[t,j]>
/// (lane l adding its elements c = l + 32 k in order, then warpSum), and for
/// each element dy[t,c] += sum_i hpost[i] dOut[t,i,c] and dx[t,j,c] +=
/// sum_i hres[i,j] dOut[t,i,c] (sums over i in order, added to the old
/// value). The arrays are staged through shared memory (warpStream); the
/// lane's own 16-byte vectors of the stage give dx and dy, so dOut is read once.
/// `fresh` bits (1: dx, 2: dCoef, 4: dy) mark gradients to take as zero
/// without reading them: the sums start from +0, the bits a zero-filled
/// buffer gives (a fresh dCoef's pre entries, not this kernel's, get +0).
/// Two blocks an SM (at most 128 registers; a few bytes spill at n = 4).
template <typename R>
__device__ __forceinline__ void postResBackward(const R *x, const float *coef, const act_t *y, const R *dOut, R *dx,
                                                float *dCoef, act_t *dy, int fresh, int64_t rows, int64_t C) {
  constexpr int A = 2 * kStreams + 1;
  // Staged, or else straight from global memory (always for an fp32 stream).
  constexpr bool kStaged = warpTiles<A>() > 0 && residualAsActivations<R>();
  constexpr int kTiles = kStaged ? warpTiles<A>() : 1, E = kTiles * 32 * kVec;
  int64_t t = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (t >= rows)
    return;
  const int K = kCoefficients;
  PostResTerms terms(coef + t * K);
  const float(&hpost)[kStreams] = terms.hpost;
  const float(&hres)[kStreams * kStreams] = terms.hres;
  float(&dotY)[kStreams] = terms.dotY;
  float(&dot)[kStreams][kStreams] = terms.dot;
  // One element's dy and dx from its n values of dOut (g[i]).
  const bool freshDx = fresh & 1, freshCoef = fresh & 2, freshDy = fresh & 4;
  auto updateValues = [&](int64_t c, const float *g) {
    float acc = freshDy ? 0.0f : load(dy[t * C + c]);
    for (int i = 0; i < kStreams; ++i)
      acc += hpost[i] * g[i];
    store(&dy[t * C + c], acc);
    for (int j = 0; j < kStreams; ++j) {
      R *d = dx + (t * kStreams + j) * C + c;
      float v = freshDx ? 0.0f : load(*d);
      for (int i = 0; i < kStreams; ++i)
        v += hres[i * kStreams + j] * g[i];
      store(d, v);
    }
  };
  if constexpr (kStaged) {
    // Arrays: dOut[t, i] (i < n), x[t, j] (n + j), y[t] (2 n).
    __shared__ uint4 staged[kThreads / 32][kStaged ? A : 1][E / kVec];
    const act_t *src[A];
    act_t *buf[A];
    for (int a = 0; a < A; ++a) {
      src[a] = a < kStreams ? dOut + (t * kStreams + a) * C : a < 2 * kStreams ? x + (t * kStreams + a - kStreams) * C
                                                                               : y + t * C;
      buf[a] = reinterpret_cast<act_t *>(staged[threadIdx.x / 32][a]);
    }
    const bool vec = C % kVec == 0 && aligned16(x) && aligned16(y) && aligned16(dOut);
    const bool vecOut = vec && aligned16(dx) && aligned16(dy);
    warpStream<kTiles, A>(src, buf, C, vec, lane, [&](int64_t base, int n) {
      for (int jj = 0; jj < E / 32; ++jj) {
        const int c = lane + 32 * jj;
        if (c < n)
          for (int i = 0; i < kStreams; ++i) {
            dotY[i] += load(buf[i][c]) * load(buf[2 * kStreams][c]);
            for (int j = 0; j < kStreams; ++j)
              dot[i][j] += load(buf[i][c]) * load(buf[kStreams + j][c]);
          }
      }
      for (int u = 0; u < kTiles; ++u) {
        const int o = (u * 32 + lane) * kVec;
        if (vecOut && o + kVec <= n) {
          // dOut's vectors stay packed (fewer registers), widened element by element.
          uint4 g[kStreams];
          float v[kVec];
          addPostVector(buf, o, hpost, dy + t * C + base + o, freshDy, g);
          for (int j = 0; j < kStreams; ++j) {
            act_t *d = dx + (t * kStreams + j) * C + base + o;
            loadOrZero(d, v, freshDx);
            addMixed(v, g, [&](int i) { return hres[i * kStreams + j]; });
            storeVec(d, v);
          }
        } else {
          for (int e = o; e < min(o + kVec, n); ++e) {
            float g[kStreams];
            for (int i = 0; i < kStreams; ++i)
              g[i] = load(buf[i][e]);
            updateValues(base + e, g);
          }
        }
      }
    });
  } else if (!residualAsActivations<R>() && C % 4 == 0 && alignedQuad(x) && alignedQuad(y) && alignedQuad(dOut) &&
             alignedQuad(dx) && alignedQuad(dy)) {
    postResBackwardQuads(x, y, dOut, dx, dy, t, lane, C, freshDx, freshDy, terms);
  } else {
    for (int64_t c = lane; c < C; c += 32) {
      float g[kStreams];
      for (int i = 0; i < kStreams; ++i)
        g[i] = load(dOut[(t * kStreams + i) * C + c]);
      const float yc = load(y[t * C + c]);
      for (int i = 0; i < kStreams; ++i) {
        dotY[i] += g[i] * yc;
        for (int j = 0; j < kStreams; ++j)
          dot[i][j] += g[i] * load(x[(t * kStreams + j) * C + c]);
      }
      updateValues(c, g);
    }
  }
  addPostResDots(terms, dCoef + t * K, lane, freshCoef);
}

extern "C" __global__ void __launch_bounds__(kThreads, 2)
    mhcc_mhc_post_res_backward(const res_t *x, const float *coef, const act_t *y, const res_t *dOut, res_t *dx,
                               float *dCoef, act_t *dy, int fresh, int64_t rows, int64_t C) {
  kernelPrologue();
  postResBackward(x, coef, y, dOut, dx, dCoef, dy, fresh, rows, C);
}

/// The n = 1 residual add: out = x + y (x and out the stream, y the
/// sublayer's output). Vectors (kVec, or quads for an fp32 stream) where the
/// pointers allow, then the remaining elements one at a time.
template <typename R>
__device__ __forceinline__ void residualForward(const R *x, const act_t *y, R *out, int64_t count) {
  int64_t done = 0; // elements the vectors cover
  if constexpr (residualAsActivations<R>()) {
    const int64_t vecs = aligned16(x) && aligned16(y) && aligned16(out) ? count / kVec : 0;
    for (int64_t q = gridThread(); q < vecs; q += gridThreads()) {
      float xv[kVec], yv[kVec];
      loadVec(x + q * kVec, xv);
      loadVec(y + q * kVec, yv);
      for (int k = 0; k < kVec; ++k) {
        const float v = xv[k] + yv[k];
        xv[k] = v;
      }
      storeVec(out + q * kVec, xv);
    }
    done = vecs * kVec;
  } else {
    const int64_t quads = alignedQuad(x) && alignedQuad(y) && alignedQuad(out) ? count / 4 : 0;
    for (int64_t q = gridThread(); q < quads; q += gridThreads()) {
      float xv[4], yv[4];
      loadQuad(x + q * 4, xv);
      loadQuad(y + q * 4, yv);
      for (int k = 0; k < 4; ++k) {
        const float v = xv[k] + yv[k];
        xv[k] = v;
      }
      storeQuad(out + q * 4, xv);
    }
    done = quads * 4;
  }
  for (int64_t i = done + gridThread(); i < count; i += gridThreads()) {
    const float v = load(x[i]) + load(y[i]);
    store(&out[i], v);
  }
}

extern "C" __global__ void mhcc_residual_forward(const res_t *x, const act_t *y, res_t *out, int64_t count) {
  kernelPrologue();
  residualForward(x, y, out, count);
}

template <typename R> __device__ __forceinline__ void residualBackward(const R *dOut, R *dx, act_t *dy, int64_t count) {
  int64_t done = 0;
  if constexpr (residualAsActivations<R>()) {
    const int64_t vecs = aligned16(dOut) && aligned16(dx) && aligned16(dy) ? count / kVec : 0;
    for (int64_t q = gridThread(); q < vecs; q += gridThreads()) {
      // dx's sum stored before dOut and dy are read again, as one element a
      // step did (the same bits even were dx and dy one buffer).
      float g[kVec], v[kVec];
      loadVec(dOut + q * kVec, g);
      loadVec(dx + q * kVec, v);
      for (int k = 0; k < kVec; ++k)
        v[k] = v[k] + g[k];
      storeVec(dx + q * kVec, v);
      loadVec(dOut + q * kVec, g);
      loadVec(dy + q * kVec, v);
      for (int k = 0; k < kVec; ++k)
        v[k] = v[k] + g[k];
      storeVec(dy + q * kVec, v);
    }
    done = vecs * kVec;
  } else {
    const int64_t quads = alignedQuad(dOut) && alignedQuad(dx) && alignedQuad(dy) ? count / 4 : 0;
    for (int64_t q = gridThread(); q < quads; q += gridThreads()) {
      float g[4], v[4];
      loadQuad(dOut + q * 4, g);
      loadQuad(dx + q * 4, v);
      for (int k = 0; k < 4; ++k)
        v[k] = v[k] + g[k];
      storeQuad(dx + q * 4, v);
      loadQuad(dy + q * 4, v);
      for (int k = 0; k < 4; ++k)
        v[k] = v[k] + g[k];
      storeQuad(dy + q * 4, v);
    }
    done = quads * 4;
  }
  for (int64_t i = done + gridThread(); i < count; i += gridThreads()) {
    const float gx = load(dOut[i]);
    store(&dx[i], load(dx[i]) + gx);
    const float gy = load(dOut[i]);
    store(&dy[i], load(dy[i]) + gy);
  }
}

extern "C" __global__ void mhcc_residual_backward(const res_t *dOut, res_t *dx, act_t *dy, int64_t count) {
  kernelPrologue();
  residualBackward(dOut, dx, dy, count);
}
