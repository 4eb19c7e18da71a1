//===- MhcMixKernels.cu - mHC pre-mix, post-res mix and the residual ------------===//
//
// A part of the model's kernel library: mhcc concatenates ModelKernels.cu,
// MhcKernels.cu, MhcMixKernels.cu and LayerKernels.cu (in that order) after
// the model's constants and compiles them as one file; the helpers and
// conventions are ModelKernels.cu's.
//
//===----------------------------------------------------------------------===//

extern "C" __global__ void mhcc_mhc_pre_forward(const act_t *x, const float *coef, act_t *u, int64_t rows, int64_t C) {
  const int K = kCoefficients;
  if (C % kVec == 0 && aligned16(x) && aligned16(u)) {
    for (int64_t i = gridThread() * kVec; i < rows * C; i += gridThreads() * kVec) {
      int64_t t = i / C, c = i % C;
      float h[kStreams], xs[kStreams][kVec], out[kVec];
      for (int s = 0; s < kStreams; ++s) {
        h[s] = coef[t * K + s];
        loadVec(x + (t * kStreams + s) * C + c, xs[s]);
      }
      for (int e = 0; e < kVec; ++e) {
        float sum = 0;
        for (int s = 0; s < kStreams; ++s)
          sum += h[s] * xs[s][e];
        out[e] = sum;
      }
      storeVec(u + i, out);
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

/// kVec columns of a row, all n streams, per thread where possible (du read once).
extern "C" __global__ void mhcc_mhc_pre_backward_x(const float *coef, const act_t *du, act_t *dx, int64_t rows,
                                                   int64_t C) {
  const int K = kCoefficients;
  if (C % kVec == 0 && aligned16(du) && aligned16(dx)) {
    for (int64_t i = gridThread() * kVec; i < rows * C; i += gridThreads() * kVec) {
      int64_t t = i / C, c = i % C;
      float h[kStreams], g[kVec], v[kStreams][kVec];
      loadVec(du + i, g);
      for (int s = 0; s < kStreams; ++s) {
        h[s] = coef[t * K + s];
        loadVec(dx + (t * kStreams + s) * C + c, v[s]);
      }
      for (int s = 0; s < kStreams; ++s) {
        for (int e = 0; e < kVec; ++e)
          v[s][e] = v[s][e] + h[s] * g[e];
        storeVec(dx + (t * kStreams + s) * C + c, v[s]);
      }
    }
    return;
  }
  for (int64_t i = gridThread(); i < rows * kStreams * C; i += gridThreads()) {
    int64_t t = i / (kStreams * C), s = (i / C) % kStreams, c = i % C;
    store(&dx[i], load(dx[i]) + coef[t * K + s] * load(du[t * C + c]));
  }
}

/// One warp per row t: dCoef[t, s] += <du[t], x[t, s]> for every s, lane l
/// adding its elements c = l + 32 k in order, then warpSum.
extern "C" __global__ void mhcc_mhc_pre_backward_coef(const act_t *x, const act_t *du, float *dCoef, int64_t rows,
                                                      int64_t C) {
  constexpr int A = kStreams + 1;
  constexpr bool kStaged = warpTiles<A>() > 0; // else straight from global memory
  constexpr int kTiles = kStaged ? warpTiles<A>() : 1, E = kTiles * 32 * kVec;
  int64_t t = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (t >= rows)
    return;
  const int K = kCoefficients;
  float dot[kStreams];
  for (int s = 0; s < kStreams; ++s)
    dot[s] = 0;
  if constexpr (kStaged) {
    __shared__ uint4 staged[kThreads / 32][kStaged ? A : 1][E / kVec];
    const act_t *src[A];
    act_t *buf[A];
    for (int a = 0; a < A; ++a) {
      src[a] = a == 0 ? du + t * C : x + (t * kStreams + a - 1) * C;
      buf[a] = reinterpret_cast<act_t *>(staged[threadIdx.x / 32][a]);
    }
    const bool vec = C % kVec == 0 && aligned16(x) && aligned16(du);
    warpStream<kTiles, A>(src, buf, C, vec, lane, [&](int64_t, int n) {
      for (int j = 0; j < E / 32; ++j) {
        const int c = lane + 32 * j;
        if (c < n)
          for (int s = 0; s < kStreams; ++s)
            dot[s] += load(buf[0][c]) * load(buf[s + 1][c]);
      }
    });
  } else {
    for (int64_t c = lane; c < C; c += 32)
      for (int s = 0; s < kStreams; ++s)
        dot[s] += load(du[t * C + c]) * load(x[(t * kStreams + s) * C + c]);
  }
  for (int s = 0; s < kStreams; ++s) {
    const float d = warpSum(dot[s]);
    if (lane == 0)
      dCoef[t * K + s] += d;
  }
}

/// kVec columns of a row, all n output streams, per thread where possible
/// (x and y read once).
extern "C" __global__ void mhcc_mhc_post_res_forward(const act_t *x, const float *coef, const act_t *y, act_t *out,
                                                     int64_t rows, int64_t C) {
  const int K = kCoefficients;
  if (C % kVec == 0 && aligned16(x) && aligned16(y) && aligned16(out)) {
    for (int64_t q = gridThread() * kVec; q < rows * C; q += gridThreads() * kVec) {
      int64_t t = q / C, c = q % C;
      float hpost[kStreams], hres[kStreams * kStreams], xs[kStreams][kVec], ys[kVec];
      for (int i = 0; i < kStreams; ++i)
        hpost[i] = coef[t * K + kStreams + i];
      for (int e = 0; e < kStreams * kStreams; ++e)
        hres[e] = coef[t * K + 2 * kStreams + e];
      for (int j = 0; j < kStreams; ++j)
        loadVec(x + (t * kStreams + j) * C + c, xs[j]);
      loadVec(y + q, ys);
      for (int i = 0; i < kStreams; ++i) {
        float o[kVec];
        for (int e = 0; e < kVec; ++e) {
          float sum = 0;
          for (int j = 0; j < kStreams; ++j)
            sum += hres[i * kStreams + j] * xs[j][e];
          o[e] = sum + hpost[i] * ys[e];
        }
        storeVec(out + (t * kStreams + i) * C + c, o);
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

/// dy[t,c] and dx[t,j,c]: sums over the output streams i, in order. kVec
/// columns of a row, dy and every dx stream, per thread where possible (dOut
/// read once).
extern "C" __global__ void mhcc_mhc_post_res_backward_values(const float *coef, const act_t *dOut, act_t *dx, act_t *dy,
                                                             int64_t rows, int64_t C) {
  const int K = kCoefficients;
  if (C % kVec == 0 && aligned16(dOut) && aligned16(dx) && aligned16(dy)) {
    for (int64_t q = gridThread() * kVec; q < rows * C; q += gridThreads() * kVec) {
      int64_t t = q / C, c = q % C;
      float hpost[kStreams], hres[kStreams * kStreams], g[kStreams][kVec], yv[kVec], xv[kStreams][kVec];
      for (int i = 0; i < kStreams; ++i)
        hpost[i] = coef[t * K + kStreams + i];
      for (int e = 0; e < kStreams * kStreams; ++e)
        hres[e] = coef[t * K + 2 * kStreams + e];
      for (int i = 0; i < kStreams; ++i)
        loadVec(dOut + (t * kStreams + i) * C + c, g[i]);
      loadVec(dy + q, yv);
      for (int j = 0; j < kStreams; ++j)
        loadVec(dx + (t * kStreams + j) * C + c, xv[j]);
      for (int e = 0; e < kVec; ++e) {
        float acc = yv[e];
        for (int i = 0; i < kStreams; ++i)
          acc += hpost[i] * g[i][e];
        yv[e] = acc;
      }
      storeVec(dy + q, yv);
      for (int j = 0; j < kStreams; ++j) {
        for (int e = 0; e < kVec; ++e) {
          float acc = xv[j][e];
          for (int i = 0; i < kStreams; ++i)
            acc += hres[i * kStreams + j] * g[i][e];
          xv[j][e] = acc;
        }
        storeVec(dx + (t * kStreams + j) * C + c, xv[j]);
      }
    }
    return;
  }
  for (int64_t e = gridThread(); e < rows * kStreams * C; e += gridThreads()) {
    if (e < rows * C) {
      int64_t t = e / C, c = e % C;
      const float *hpost = coef + t * K + kStreams;
      float acc = load(dy[e]);
      for (int i = 0; i < kStreams; ++i)
        acc += hpost[i] * load(dOut[(t * kStreams + i) * C + c]);
      store(&dy[e], acc);
    }
    {
      int64_t t = e / (kStreams * C), j = (e / C) % kStreams, c = e % C;
      const float *hres = coef + t * K + 2 * kStreams;
      float acc = load(dx[e]);
      for (int i = 0; i < kStreams; ++i)
        acc += hres[i * kStreams + j] * load(dOut[(t * kStreams + i) * C + c]);
      store(&dx[e], acc);
    }
  }
}

/// One warp per row t: dCoef's post entries <dOut[t,i], y[t]> and res entries
/// <dOut[t,i], x[t,j]>, lane l adding its elements c = l + 32 k in order, then
/// warpSum.
extern "C" __global__ void mhcc_mhc_post_res_backward_coef(const act_t *x, const act_t *y, const act_t *dOut,
                                                           float *dCoef, int64_t rows, int64_t C) {
  constexpr int A = 2 * kStreams + 1;
  constexpr bool kStaged = warpTiles<A>() > 0; // else straight from global memory
  constexpr int kTiles = kStaged ? warpTiles<A>() : 1, E = kTiles * 32 * kVec;
  int64_t t = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (t >= rows)
    return;
  const int K = kCoefficients;
  float dotY[kStreams], dot[kStreams][kStreams];
  for (int i = 0; i < kStreams; ++i) {
    dotY[i] = 0;
    for (int j = 0; j < kStreams; ++j)
      dot[i][j] = 0;
  }
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
    warpStream<kTiles, A>(src, buf, C, vec, lane, [&](int64_t, int n) {
      for (int jj = 0; jj < E / 32; ++jj) {
        const int c = lane + 32 * jj;
        if (c < n)
          for (int i = 0; i < kStreams; ++i) {
            dotY[i] += load(buf[i][c]) * load(buf[2 * kStreams][c]);
            for (int j = 0; j < kStreams; ++j)
              dot[i][j] += load(buf[i][c]) * load(buf[kStreams + j][c]);
          }
      }
    });
  } else {
    for (int64_t c = lane; c < C; c += 32)
      for (int i = 0; i < kStreams; ++i) {
        const act_t *g = dOut + (t * kStreams + i) * C;
        dotY[i] += load(g[c]) * load(y[t * C + c]);
        for (int j = 0; j < kStreams; ++j)
          dot[i][j] += load(g[c]) * load(x[(t * kStreams + j) * C + c]);
      }
  }
  for (int i = 0; i < kStreams; ++i) {
    const float dY = warpSum(dotY[i]);
    if (lane == 0)
      dCoef[t * K + kStreams + i] += dY;
    for (int j = 0; j < kStreams; ++j) {
      const float d = warpSum(dot[i][j]);
      if (lane == 0)
        dCoef[t * K + 2 * kStreams + i * kStreams + j] += d;
    }
  }
}

extern "C" __global__ void mhcc_residual_forward(const act_t *x, const act_t *y, act_t *out, int64_t count) {
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
  for (int64_t i = vecs * kVec + gridThread(); i < count; i += gridThreads()) {
    const float v = load(x[i]) + load(y[i]);
    store(&out[i], v);
  }
}

extern "C" __global__ void mhcc_residual_backward(const act_t *dOut, act_t *dx, act_t *dy, int64_t count) {
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
  for (int64_t i = vecs * kVec + gridThread(); i < count; i += gridThreads()) {
    const float gx = load(dOut[i]);
    store(&dx[i], load(dx[i]) + gx);
    const float gy = load(dOut[i]);
    store(&dy[i], load(dy[i]) + gy);
  }
}
