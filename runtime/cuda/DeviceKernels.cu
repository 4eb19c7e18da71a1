//===- DeviceKernels.cu - CUDA kernels for stage programs ---------------------===//
#include "runtime/cuda/DeviceKernels.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>

namespace mhcc::runtime::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxStreams = 8;  // n <= 8: coefficients fit per-thread arrays
constexpr int kMaxHeadDim = 256;
constexpr double kRopeBase = 10000.0;
constexpr float kMhcRmsEps = 1e-6f;
constexpr float kSinkhornClamp = 1e-6f;

inline int blocks(int64_t count) { return static_cast<int>((count + kThreads - 1) / kThreads); }

__device__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// ---- cuBLAS: row-major products through column-major GEMMs ---------------------

void gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
          int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc,
          float beta) {
  const float one = 1.0f;
  cublasSgemm(h, ta, tb, int(m), int(n), int(k), &one, a, int(lda), b, int(ldb), &beta, c, int(ldc));
}

// ---- elementwise -------------------------------------------------------------------

__global__ void fillKernel(float *p, int64_t count, float value) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < count)
    p[i] = value;
}

__global__ void addKernel(float *dst, const float *src, int64_t count) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < count)
    dst[i] += src[i];
}

__global__ void embedForwardKernel(const int32_t *tokens, const float *table, float *out, int64_t rows,
                                   int64_t C, int64_t shift, int64_t seq) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * C)
    return;
  int64_t t = i / C, c = i % C;
  int64_t src = (t % seq) + shift < seq ? t + shift : t;
  out[i] = table[int64_t(tokens[src]) * C + c];
}

__global__ void embedBackwardKernel(const int32_t *offsets, const int32_t *positions, int64_t vocab,
                                    const float *dOut, float *dTable, int64_t C) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= vocab * C)
    return;
  int64_t v = i / C, c = i % C;
  float acc = dTable[i];
  for (int32_t p = offsets[v]; p < offsets[v + 1]; ++p)
    acc += dOut[int64_t(positions[p]) * C + c];
  dTable[i] = acc;
}

__global__ void expandForwardKernel(const float *h, float *x, int64_t rows, int64_t C, int64_t n) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * n * C)
    return;
  int64_t t = i / (n * C), c = i % C;
  x[i] = h[t * C + c];
}

__global__ void expandBackwardKernel(const float *dx, float *dh, int64_t rows, int64_t C, int64_t n) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * C)
    return;
  int64_t t = i / C, c = i % C;
  float acc = dh[i];
  for (int64_t s = 0; s < n; ++s)
    acc += dx[(t * n + s) * C + c];
  dh[i] = acc;
}

__global__ void contractForwardKernel(const float *x, float *h, int64_t rows, int64_t C, int64_t n) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * C)
    return;
  int64_t t = i / C, c = i % C;
  float sum = 0;
  for (int64_t s = 0; s < n; ++s)
    sum += x[(t * n + s) * C + c];
  h[i] = sum / float(n);
}

__global__ void contractBackwardKernel(const float *dh, float *dx, int64_t rows, int64_t C, int64_t n) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * n * C)
    return;
  int64_t t = i / (n * C), c = i % C;
  dx[i] += dh[t * C + c] / float(n);
}

// ---- mHC ------------------------------------------------------------------------------

/// Sinkhorn-Knopp on one n x n matrix, as on the CPU.
__device__ void sinkhorn(const float *logits, float *out, int n, int iters) {
  float m[kMaxStreams * kMaxStreams];
  for (int i = 0; i < n; ++i) {
    float rowMax = logits[i * n];
    for (int j = 1; j < n; ++j)
      rowMax = fmaxf(rowMax, logits[i * n + j]);
    for (int j = 0; j < n; ++j)
      m[i * n + j] = expf(logits[i * n + j] - rowMax);
  }
  for (int it = 0; it < iters; ++it) {
    for (int i = 0; i < n; ++i) {
      float sum = 0;
      for (int j = 0; j < n; ++j)
        sum += m[i * n + j];
      sum = fmaxf(sum, kSinkhornClamp);
      for (int j = 0; j < n; ++j)
        m[i * n + j] /= sum;
    }
    for (int j = 0; j < n; ++j) {
      float sum = 0;
      for (int i = 0; i < n; ++i)
        sum += m[i * n + j];
      sum = fmaxf(sum, kSinkhornClamp);
      for (int i = 0; i < n; ++i)
        m[i * n + j] /= sum;
    }
  }
  for (int e = 0; e < n * n; ++e)
    out[e] = m[e];
}

__global__ void mhcCoeffsForwardKernel(const float *x, const float *p, const float *bias,
                                       const float *alpha, float *coef, float *aux, int64_t rows,
                                       int64_t C, int n, int iters) {
  int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= rows)
    return;
  const int64_t width = n * C;
  const int K = n * n + 2 * n;
  const float *xr = x + t * width;
  float sq = 0;
  for (int64_t k = 0; k < width; ++k)
    sq += xr[k] * xr[k];
  float rms = sqrtf(sq / float(width));
  float r = 1.0f / (rms + kMhcRmsEps);
  float *h = aux + t * (K + 1);
  for (int k = 0; k < K; ++k) {
    float a = k < n ? alpha[0] : k < 2 * n ? alpha[1] : alpha[2];
    h[k] = r * p[t * K + k] * a + bias[k];
  }
  h[K] = r;
  float *out = coef + t * K;
  for (int k = 0; k < n; ++k) {
    out[k] = sigmoidf(h[k]);
    out[n + k] = 2.0f * sigmoidf(h[n + k]);
  }
  sinkhorn(h + 2 * n, out + 2 * n, n, iters);
}

/// Per token: dh (through the sigmoids and the unrolled Sinkhorn), dp and
/// the scale of the RMS term; the reductions over tokens run afterwards.
__global__ void mhcCoeffsBackwardKernel(const float *x, const float *p, const float *alpha,
                                        const float *aux, const float *dCoef, float *dh, float *dp,
                                        float *rScale, int64_t rows, int64_t C, int n, int iters) {
  int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= rows)
    return;
  const int64_t width = n * C;
  const int K = n * n + 2 * n;
  const float *h = aux + t * (K + 1);
  const float r = h[K];
  const float *dc = dCoef + t * K;
  float *g = dh + t * K;
  for (int k = 0; k < n; ++k) {
    float s = sigmoidf(h[k]);
    g[k] = dc[k] * s * (1.0f - s);
    float s2 = sigmoidf(h[n + k]);
    g[n + k] = 2.0f * dc[n + k] * s2 * (1.0f - s2);
  }
  // Sinkhorn backward, each step's input recomputed from the logits.
  {
    const int nn = n * n;
    const float *logits = h + 2 * n;
    float m0[kMaxStreams * kMaxStreams];
    for (int i = 0; i < n; ++i) {
      float rowMax = logits[i * n];
      for (int j = 1; j < n; ++j)
        rowMax = fmaxf(rowMax, logits[i * n + j]);
      for (int j = 0; j < n; ++j)
        m0[i * n + j] = expf(logits[i * n + j] - rowMax);
    }
    float gr[kMaxStreams * kMaxStreams];
    for (int e = 0; e < nn; ++e)
      gr[e] = dc[2 * n + e];
    // Walk the iterations backwards, recomputing each forward step's input
    // from m0 (iters is small; this trades work for registers).
    float xs[kMaxStreams * kMaxStreams];
    for (int it = iters - 1; it >= 0; --it) {
      for (int half = 1; half >= 0; --half) {
        // xs = the matrix entering step (2 it + half)
        for (int e = 0; e < nn; ++e)
          xs[e] = m0[e];
        for (int s2 = 0; s2 < 2 * it + half; ++s2) {
          bool rowStep = s2 % 2 == 0;
          for (int a = 0; a < n; ++a) {
            float sum = 0;
            for (int b = 0; b < n; ++b)
              sum += rowStep ? xs[a * n + b] : xs[b * n + a];
            sum = fmaxf(sum, kSinkhornClamp);
            for (int b = 0; b < n; ++b) {
              if (rowStep)
                xs[a * n + b] /= sum;
              else
                xs[b * n + a] /= sum;
            }
          }
        }
        bool rowStep = half == 0;
        for (int a = 0; a < n; ++a) {
          float sum = 0, dot = 0;
          for (int b = 0; b < n; ++b)
            sum += rowStep ? xs[a * n + b] : xs[b * n + a];
          bool clamped = sum < kSinkhornClamp;
          sum = fmaxf(sum, kSinkhornClamp);
          for (int b = 0; b < n; ++b) {
            int e = rowStep ? a * n + b : b * n + a;
            dot += gr[e] * xs[e];
          }
          for (int b = 0; b < n; ++b) {
            int e = rowStep ? a * n + b : b * n + a;
            gr[e] = gr[e] / sum - (clamped ? 0.0f : dot / (sum * sum));
          }
        }
      }
    }
    for (int e = 0; e < nn; ++e)
      g[2 * n + e] = gr[e] * m0[e];
  }
  float dr = 0;
  for (int k = 0; k < K; ++k) {
    float a = k < n ? alpha[0] : k < 2 * n ? alpha[1] : alpha[2];
    dp[t * K + k] = g[k] * r * a;
    dr += g[k] * p[t * K + k] * a;
  }
  const float *xr = x + t * width;
  float sq = 0;
  for (int64_t k = 0; k < width; ++k)
    sq += xr[k] * xr[k];
  float rms = sqrtf(sq / float(width));
  rScale[t] = rms > 0 ? -dr * r * r / (float(width) * rms) : 0.0f;
}

__global__ void mhcBiasAlphaGradKernel(const float *dh, const float *p, const float *aux,
                                       float *dBias, float *dAlpha, int64_t rows, int n) {
  const int K = n * n + 2 * n;
  int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k < K) {
    float acc = dBias[k];
    for (int64_t t = 0; t < rows; ++t)
      acc += dh[t * K + k];
    dBias[k] = acc;
  } else if (k < K + 3) {
    int group = k - K;
    int from = group == 0 ? 0 : group == 1 ? n : 2 * n;
    int to = group == 0 ? n : group == 1 ? 2 * n : K;
    float acc = dAlpha[group];
    for (int64_t t = 0; t < rows; ++t) {
      float r = aux[t * (K + 1) + K];
      for (int j = from; j < to; ++j)
        acc += dh[t * K + j] * r * p[t * K + j];
    }
    dAlpha[group] = acc;
  }
}

__global__ void rowScaleAddKernel(const float *x, const float *scale, float *dx, int64_t rows, int64_t width) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < rows * width)
    dx[i] += scale[i / width] * x[i];
}

__global__ void mhcPreForwardKernel(const float *x, const float *coef, float *u, int64_t rows, int64_t C, int n) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * C)
    return;
  const int K = n * n + 2 * n;
  int64_t t = i / C, c = i % C;
  float sum = 0;
  for (int s = 0; s < n; ++s)
    sum += coef[t * K + s] * x[(t * n + s) * C + c];
  u[i] = sum;
}

__global__ void mhcPreBackwardXKernel(const float *coef, const float *du, float *dx, int64_t rows, int64_t C, int n) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * n * C)
    return;
  const int K = n * n + 2 * n;
  int64_t t = i / (n * C), s = (i / C) % n, c = i % C;
  dx[i] += coef[t * K + s] * du[t * C + c];
}

__global__ void mhcPreBackwardCoefKernel(const float *x, const float *du, float *dCoef, int64_t rows, int64_t C, int n) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * n)
    return;
  const int K = n * n + 2 * n;
  int64_t t = i / n, s = i % n;
  float dot = 0;
  for (int64_t c = 0; c < C; ++c)
    dot += du[t * C + c] * x[(t * n + s) * C + c];
  dCoef[t * K + s] += dot;
}

__global__ void mhcPostResForwardKernel(const float *x, const float *coef, const float *y, float *out,
                                        int64_t rows, int64_t C, int n) {
  int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= rows * n * C)
    return;
  const int K = n * n + 2 * n;
  int64_t t = e / (n * C), i = (e / C) % n, c = e % C;
  const float *hpost = coef + t * K + n, *hres = coef + t * K + 2 * n;
  float sum = 0;
  for (int j = 0; j < n; ++j)
    sum += hres[i * n + j] * x[(t * n + j) * C + c];
  out[e] = sum + hpost[i] * y[t * C + c];
}

/// dy[t,c] and dx[t,j,c]: sums over the output streams i, in order.
__global__ void mhcPostResBackwardValuesKernel(const float *coef, const float *dOut, float *dx, float *dy,
                                               int64_t rows, int64_t C, int n) {
  int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int K = n * n + 2 * n;
  if (e < rows * C) {
    int64_t t = e / C, c = e % C;
    const float *hpost = coef + t * K + n;
    float acc = dy[e];
    for (int i = 0; i < n; ++i)
      acc += hpost[i] * dOut[(t * n + i) * C + c];
    dy[e] = acc;
  }
  if (e < rows * n * C) {
    int64_t t = e / (n * C), j = (e / C) % n, c = e % C;
    const float *hres = coef + t * K + 2 * n;
    float acc = dx[e];
    for (int i = 0; i < n; ++i)
      acc += hres[i * n + j] * dOut[(t * n + i) * C + c];
    dx[e] = acc;
  }
}

__global__ void mhcPostResBackwardCoefKernel(const float *x, const float *y, const float *dOut, float *dCoef,
                                             int64_t rows, int64_t C, int n) {
  int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= rows * n)
    return;
  const int K = n * n + 2 * n;
  int64_t t = e / n, i = e % n;
  const float *g = dOut + (t * n + i) * C;
  float dotY = 0;
  for (int64_t c = 0; c < C; ++c)
    dotY += g[c] * y[t * C + c];
  dCoef[t * K + n + i] += dotY;
  for (int j = 0; j < n; ++j) {
    const float *xj = x + (t * n + j) * C;
    float dot = 0;
    for (int64_t c = 0; c < C; ++c)
      dot += g[c] * xj[c];
    dCoef[t * K + 2 * n + i * n + j] += dot;
  }
}

__global__ void residualForwardKernel(const float *x, const float *y, float *out, int64_t count) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < count)
    out[i] = x[i] + y[i];
}

__global__ void residualBackwardKernel(const float *dOut, float *dx, float *dy, int64_t count) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < count) {
    dx[i] += dOut[i];
    dy[i] += dOut[i];
  }
}

// ---- RMSNorm ----------------------------------------------------------------------------

__global__ void rmsNormStatsKernel(const float *u, float *aux, int64_t rows, int64_t C, float eps) {
  int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= rows)
    return;
  float sq = 0;
  for (int64_t c = 0; c < C; ++c)
    sq += u[t * C + c] * u[t * C + c];
  aux[t] = 1.0f / sqrtf(sq / float(C) + eps);
}

__global__ void rmsNormApplyKernel(const float *u, const float *gain, const float *aux, float *y,
                                   int64_t rows, int64_t C) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < rows * C)
    y[i] = u[i] * aux[i / C] * gain[i % C];
}

__global__ void rmsNormBackwardRowKernel(const float *u, const float *gain, const float *aux,
                                         const float *dy, float *du, int64_t rows, int64_t C) {
  int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= rows)
    return;
  float s = aux[t], dot = 0;
  for (int64_t c = 0; c < C; ++c)
    dot += gain[c] * dy[t * C + c] * u[t * C + c];
  float k = s * s * s / float(C) * dot;
  for (int64_t c = 0; c < C; ++c)
    du[t * C + c] += s * gain[c] * dy[t * C + c] - k * u[t * C + c];
}

__global__ void rmsNormGainGradKernel(const float *u, const float *aux, const float *dy, float *dGain,
                                      int64_t rows, int64_t C) {
  int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C)
    return;
  float acc = dGain[c];
  for (int64_t t = 0; t < rows; ++t)
    acc += dy[t * C + c] * u[t * C + c] * aux[t];
  dGain[c] = acc;
}

// ---- attention ---------------------------------------------------------------------------

__global__ void ropeKernel(float *qkv, int64_t rows, int64_t C, int64_t heads, int64_t seq, bool inverse,
                           int64_t rowStride) {
  const int64_t d = C / heads, pairs = d / 2;
  int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= rows * 2 * heads * pairs)
    return;
  int64_t t = e / (2 * heads * pairs);
  int64_t rest = e % (2 * heads * pairs);
  int64_t which = rest / (heads * pairs); // 0: q, 1: k
  int64_t h = (rest / pairs) % heads, j = rest % pairs;
  double theta = double(t % seq) * pow(kRopeBase, -2.0 * double(j) / double(d));
  float c = float(cos(theta)), s = float(sin(theta));
  if (inverse)
    s = -s;
  float *v = qkv + t * rowStride + which * C + h * d + 2 * j;
  float a = v[0], b = v[1];
  v[0] = a * c - b * s;
  v[1] = a * s + b * c;
}

__global__ void attentionForwardKernel(const float *qkv, float *o, float *lse, int64_t rows, int64_t C,
                                       int64_t heads, int64_t seq) {
  int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= rows * heads)
    return;
  const int64_t d = C / heads;
  int64_t ti = e / heads, h = e % heads;
  int64_t b = ti / seq, i = ti % seq;
  const float scale = rsqrtf(float(d));
  const float *q = qkv + ti * 3 * C + h * d;
  float maxScore = -INFINITY;
  for (int64_t j = 0; j <= i; ++j) {
    const float *k = qkv + (b * seq + j) * 3 * C + C + h * d;
    float s = 0;
    for (int64_t x = 0; x < d; ++x)
      s += q[x] * k[x];
    maxScore = fmaxf(maxScore, s * scale);
  }
  float acc[kMaxHeadDim];
  for (int64_t x = 0; x < d; ++x)
    acc[x] = 0;
  float sum = 0;
  for (int64_t j = 0; j <= i; ++j) {
    const float *k = qkv + (b * seq + j) * 3 * C + C + h * d;
    const float *v = qkv + (b * seq + j) * 3 * C + 2 * C + h * d;
    float s = 0;
    for (int64_t x = 0; x < d; ++x)
      s += q[x] * k[x];
    float p = expf(s * scale - maxScore);
    sum += p;
    for (int64_t x = 0; x < d; ++x)
      acc[x] += p * v[x];
  }
  lse[ti * heads + h] = maxScore + logf(sum);
  for (int64_t x = 0; x < d; ++x)
    o[ti * C + h * d + x] = acc[x] / sum;
}

/// Per query row: D_i = sum_j p_ij dp_ij, then dq_i.
__global__ void attentionBackwardQueryKernel(const float *qkv, const float *lse, const float *dO,
                                             float *dQkv, float *rowDot, int64_t rows, int64_t C,
                                             int64_t heads, int64_t seq) {
  int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= rows * heads)
    return;
  const int64_t d = C / heads;
  int64_t ti = e / heads, h = e % heads;
  int64_t b = ti / seq, i = ti % seq;
  const float scale = rsqrtf(float(d));
  const float *q = qkv + ti * 3 * C + h * d;
  const float *gO = dO + ti * C + h * d;
  const float l = lse[ti * heads + h];
  float D = 0;
  for (int64_t j = 0; j <= i; ++j) {
    const float *k = qkv + (b * seq + j) * 3 * C + C + h * d;
    const float *v = qkv + (b * seq + j) * 3 * C + 2 * C + h * d;
    float s = 0, g = 0;
    for (int64_t x = 0; x < d; ++x) {
      s += q[x] * k[x];
      g += gO[x] * v[x];
    }
    D += expf(s * scale - l) * g;
  }
  rowDot[ti * heads + h] = D;
  float dq[kMaxHeadDim];
  for (int64_t x = 0; x < d; ++x)
    dq[x] = 0;
  for (int64_t j = 0; j <= i; ++j) {
    const float *k = qkv + (b * seq + j) * 3 * C + C + h * d;
    const float *v = qkv + (b * seq + j) * 3 * C + 2 * C + h * d;
    float s = 0, g = 0;
    for (int64_t x = 0; x < d; ++x) {
      s += q[x] * k[x];
      g += gO[x] * v[x];
    }
    float ds = expf(s * scale - l) * (g - D) * scale;
    for (int64_t x = 0; x < d; ++x)
      dq[x] += ds * k[x];
  }
  for (int64_t x = 0; x < d; ++x)
    dQkv[ti * 3 * C + h * d + x] = dq[x];
}

/// Per key row j: dk_j and dv_j over the queries i >= j, in order.
__global__ void attentionBackwardKeyKernel(const float *qkv, const float *lse, const float *dO,
                                           const float *rowDot, float *dQkv, int64_t rows, int64_t C,
                                           int64_t heads, int64_t seq) {
  int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= rows * heads)
    return;
  const int64_t d = C / heads;
  int64_t tj = e / heads, h = e % heads;
  int64_t b = tj / seq, j = tj % seq;
  const float scale = rsqrtf(float(d));
  const float *k = qkv + tj * 3 * C + C + h * d;
  const float *v = qkv + tj * 3 * C + 2 * C + h * d;
  float dk[kMaxHeadDim], dv[kMaxHeadDim];
  for (int64_t x = 0; x < d; ++x)
    dk[x] = dv[x] = 0;
  for (int64_t i = j; i < seq; ++i) {
    int64_t ti = b * seq + i;
    const float *q = qkv + ti * 3 * C + h * d;
    const float *gO = dO + ti * C + h * d;
    float s = 0, g = 0;
    for (int64_t x = 0; x < d; ++x) {
      s += q[x] * k[x];
      g += gO[x] * v[x];
    }
    float p = expf(s * scale - lse[ti * heads + h]);
    float ds = p * (g - rowDot[ti * heads + h]) * scale;
    for (int64_t x = 0; x < d; ++x) {
      dk[x] += ds * q[x];
      dv[x] += p * gO[x];
    }
  }
  for (int64_t x = 0; x < d; ++x) {
    dQkv[tj * 3 * C + C + h * d + x] = dk[x];
    dQkv[tj * 3 * C + 2 * C + h * d + x] = dv[x];
  }
}

// ---- SwiGLU ---------------------------------------------------------------------------------

__global__ void swigluGateKernel(const float *a, const float *b, float *hsw, int64_t count) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < count)
    hsw[i] = a[i] * sigmoidf(a[i]) * b[i];
}

__global__ void swigluBackwardGateKernel(const float *a, const float *b, const float *dh, float *da,
                                         float *db, int64_t count) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= count)
    return;
  float s = sigmoidf(a[i]);
  db[i] = dh[i] * a[i] * s;
  da[i] = dh[i] * b[i] * s * (1.0f + a[i] * (1.0f - s));
}

// ---- cross-entropy ------------------------------------------------------------------------

__global__ void logSumExpKernel(const float *logits, float *aux, int64_t rows, int64_t V) {
  int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= rows)
    return;
  const float *row = logits + t * V;
  float m = row[0];
  for (int64_t v = 1; v < V; ++v)
    m = fmaxf(m, row[v]);
  float sum = 0;
  for (int64_t v = 0; v < V; ++v)
    sum += expf(row[v] - m);
  aux[t] = m + logf(sum);
}

__global__ void lossKernel(const float *logits, const int32_t *labels, const float *aux, float *loss,
                           int64_t rows, int64_t V, int64_t shift, int64_t seq) {
  if (blockIdx.x * blockDim.x + threadIdx.x != 0)
    return;
  float total = 0;
  int64_t counted = 0;
  for (int64_t t = 0; t < rows; ++t)
    if ((t % seq) + shift < seq) {
      total += aux[t] - logits[t * V + labels[t + shift]];
      ++counted;
    }
  *loss = counted ? total / float(counted) : 0.0f;
}

__global__ void crossEntropyBackwardKernel(const float *logits, const int32_t *labels, const float *aux,
                                           float factor, float *dLogits, int64_t rows, int64_t V,
                                           int64_t shift, int64_t seq) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * V)
    return;
  int64_t t = i / V, v = i % V;
  if ((t % seq) + shift >= seq)
    return;
  float g = factor * expf(logits[i] - aux[t]);
  if (labels[t + shift] == v)
    g -= factor;
  dLogits[i] += g;
}

} // namespace

std::string lastError(const char *what) {
  cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess)
    return "";
  return std::string(what) + ": " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")";
}

void matmul(cublasHandle_t h, const float *a, const float *b, float *c, int64_t M, int64_t K, int64_t N,
            bool accumulate) {
  gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, b, N, a, K, c, N, accumulate ? 1.0f : 0.0f);
}

void matmulTransAAcc(cublasHandle_t h, const float *a, const float *b, float *c, int64_t M, int64_t K,
                     int64_t N) {
  gemm(h, CUBLAS_OP_N, CUBLAS_OP_T, N, K, M, b, N, a, K, c, N, 1.0f);
}

void matmulTransBAcc(cublasHandle_t h, const float *a, const float *b, float *c, int64_t M, int64_t N,
                     int64_t K) {
  gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, K, M, N, b, N, a, N, c, K, 1.0f);
}

void fill(float *p, int64_t count, float value, cudaStream_t s) {
  if (count)
    fillKernel<<<blocks(count), kThreads, 0, s>>>(p, count, value);
}

void addInto(float *dst, const float *src, int64_t count, cudaStream_t s) {
  if (count)
    addKernel<<<blocks(count), kThreads, 0, s>>>(dst, src, count);
}

void embedForward(const int32_t *tokens, const float *table, float *out, int64_t rows, int64_t C,
                  int64_t shift, int64_t seq, cudaStream_t s) {
  embedForwardKernel<<<blocks(rows * C), kThreads, 0, s>>>(tokens, table, out, rows, C, shift, seq);
}

void embedBackward(const int32_t *offsets, const int32_t *positions, int64_t vocab, const float *dOut,
                   float *dTable, int64_t C, cudaStream_t s) {
  embedBackwardKernel<<<blocks(vocab * C), kThreads, 0, s>>>(offsets, positions, vocab, dOut, dTable, C);
}

void expandForward(const float *h, float *x, int64_t rows, int64_t C, int64_t n, cudaStream_t s) {
  expandForwardKernel<<<blocks(rows * n * C), kThreads, 0, s>>>(h, x, rows, C, n);
}

void expandBackward(const float *dx, float *dh, int64_t rows, int64_t C, int64_t n, cudaStream_t s) {
  expandBackwardKernel<<<blocks(rows * C), kThreads, 0, s>>>(dx, dh, rows, C, n);
}

void contractForward(const float *x, float *h, int64_t rows, int64_t C, int64_t n, cudaStream_t s) {
  contractForwardKernel<<<blocks(rows * C), kThreads, 0, s>>>(x, h, rows, C, n);
}

void contractBackward(const float *dh, float *dx, int64_t rows, int64_t C, int64_t n, cudaStream_t s) {
  contractBackwardKernel<<<blocks(rows * n * C), kThreads, 0, s>>>(dh, dx, rows, C, n);
}

void mhcCoeffsForward(cublasHandle_t h, const float *x, const float *wmap, const float *bias,
                      const float *alpha, float *coef, float *aux, float *scratch, int64_t rows, int64_t C,
                      int64_t n, int64_t iters, cudaStream_t s) {
  const int64_t K = n * n + 2 * n;
  matmul(h, x, wmap, scratch, rows, n * C, K, false);
  mhcCoeffsForwardKernel<<<blocks(rows), kThreads, 0, s>>>(x, scratch, bias, alpha, coef, aux, rows, C,
                                                           int(n), int(iters));
}

void mhcCoeffsBackward(cublasHandle_t h, const float *x, const float *wmap, const float *alpha,
                       const float *aux, const float *dCoef, float *dx, float *dWmap, float *dBias,
                       float *dAlpha, float *scratch, int64_t rows, int64_t C, int64_t n, int64_t iters,
                       cudaStream_t s) {
  const int64_t K = n * n + 2 * n, width = n * C;
  float *p = scratch, *dh = scratch + rows * K, *dp = scratch + 2 * rows * K, *rScale = scratch + 3 * rows * K;
  matmul(h, x, wmap, p, rows, width, K, false);
  mhcCoeffsBackwardKernel<<<blocks(rows), kThreads, 0, s>>>(x, p, alpha, aux, dCoef, dh, dp, rScale, rows,
                                                            C, int(n), int(iters));
  mhcBiasAlphaGradKernel<<<blocks(K + 3), kThreads, 0, s>>>(dh, p, aux, dBias, dAlpha, rows, int(n));
  matmulTransBAcc(h, dp, wmap, dx, rows, K, width);
  matmulTransAAcc(h, x, dp, dWmap, rows, width, K);
  rowScaleAddKernel<<<blocks(rows * width), kThreads, 0, s>>>(x, rScale, dx, rows, width);
}

void mhcPreForward(const float *x, const float *coef, float *u, int64_t rows, int64_t C, int64_t n,
                   cudaStream_t s) {
  mhcPreForwardKernel<<<blocks(rows * C), kThreads, 0, s>>>(x, coef, u, rows, C, int(n));
}

void mhcPreBackward(const float *x, const float *coef, const float *du, float *dx, float *dCoef,
                    int64_t rows, int64_t C, int64_t n, cudaStream_t s) {
  mhcPreBackwardXKernel<<<blocks(rows * n * C), kThreads, 0, s>>>(coef, du, dx, rows, C, int(n));
  mhcPreBackwardCoefKernel<<<blocks(rows * n), kThreads, 0, s>>>(x, du, dCoef, rows, C, int(n));
}

void mhcPostResForward(const float *x, const float *coef, const float *y, float *out, int64_t rows,
                       int64_t C, int64_t n, cudaStream_t s) {
  mhcPostResForwardKernel<<<blocks(rows * n * C), kThreads, 0, s>>>(x, coef, y, out, rows, C, int(n));
}

void mhcPostResBackward(const float *x, const float *coef, const float *y, const float *dOut, float *dx,
                        float *dCoef, float *dy, int64_t rows, int64_t C, int64_t n, cudaStream_t s) {
  mhcPostResBackwardValuesKernel<<<blocks(rows * n * C), kThreads, 0, s>>>(coef, dOut, dx, dy, rows, C, int(n));
  mhcPostResBackwardCoefKernel<<<blocks(rows * n), kThreads, 0, s>>>(x, y, dOut, dCoef, rows, C, int(n));
}

void residualForward(const float *x, const float *y, float *out, int64_t count, cudaStream_t s) {
  residualForwardKernel<<<blocks(count), kThreads, 0, s>>>(x, y, out, count);
}

void residualBackward(const float *dOut, float *dx, float *dy, int64_t count, cudaStream_t s) {
  residualBackwardKernel<<<blocks(count), kThreads, 0, s>>>(dOut, dx, dy, count);
}

void rmsNormForward(const float *u, const float *gain, float *y, float *aux, int64_t rows, int64_t C,
                    double eps, cudaStream_t s) {
  rmsNormStatsKernel<<<blocks(rows), kThreads, 0, s>>>(u, aux, rows, C, float(eps));
  rmsNormApplyKernel<<<blocks(rows * C), kThreads, 0, s>>>(u, gain, aux, y, rows, C);
}

void rmsNormBackward(const float *u, const float *gain, const float *aux, const float *dy, float *du,
                     float *dGain, int64_t rows, int64_t C, cudaStream_t s) {
  rmsNormGainGradKernel<<<blocks(C), kThreads, 0, s>>>(u, aux, dy, dGain, rows, C);
  rmsNormBackwardRowKernel<<<blocks(rows), kThreads, 0, s>>>(u, gain, aux, dy, du, rows, C);
}

void attentionForward(cublasHandle_t h, const float *x, const float *wqkv, const float *wo, float *y,
                      float *aux, int64_t rows, int64_t C, int64_t heads, int64_t seq, cudaStream_t s) {
  float *qkv = aux, *o = aux + rows * 3 * C, *lse = o + rows * C;
  const int64_t pairs = (C / heads) / 2;
  matmul(h, x, wqkv, qkv, rows, C, 3 * C, false);
  ropeKernel<<<blocks(rows * 2 * heads * pairs), kThreads, 0, s>>>(qkv, rows, C, heads, seq, false, 3 * C);
  attentionForwardKernel<<<blocks(rows * heads), kThreads, 0, s>>>(qkv, o, lse, rows, C, heads, seq);
  matmul(h, o, wo, y, rows, C, C, false);
}

void attentionBackward(cublasHandle_t h, const float *x, const float *wqkv, const float *wo,
                       const float *aux, const float *dy, float *dx, float *dWqkv, float *dWo,
                       float *scratch, int64_t rows, int64_t C, int64_t heads, int64_t seq, cudaStream_t s) {
  const float *qkv = aux, *o = aux + rows * 3 * C, *lse = o + rows * C;
  float *dO = scratch, *dQkv = scratch + rows * C, *rowDot = dQkv + rows * 3 * C;
  const int64_t pairs = (C / heads) / 2;
  matmulTransAAcc(h, o, dy, dWo, rows, C, C);
  fill(dO, rows * C, 0.0f, s);
  matmulTransBAcc(h, dy, wo, dO, rows, C, C);
  attentionBackwardQueryKernel<<<blocks(rows * heads), kThreads, 0, s>>>(qkv, lse, dO, dQkv, rowDot, rows, C,
                                                                         heads, seq);
  attentionBackwardKeyKernel<<<blocks(rows * heads), kThreads, 0, s>>>(qkv, lse, dO, rowDot, dQkv, rows, C,
                                                                       heads, seq);
  ropeKernel<<<blocks(rows * 2 * heads * pairs), kThreads, 0, s>>>(dQkv, rows, C, heads, seq, true, 3 * C);
  matmulTransAAcc(h, x, dQkv, dWqkv, rows, C, 3 * C);
  matmulTransBAcc(h, dQkv, wqkv, dx, rows, 3 * C, C);
}

void swigluForward(cublasHandle_t h, const float *x, const float *wg, const float *wu, const float *wd,
                   float *y, float *aux, int64_t rows, int64_t C, int64_t F, cudaStream_t s) {
  float *a = aux, *b = aux + rows * F, *hsw = aux + 2 * rows * F;
  matmul(h, x, wg, a, rows, C, F, false);
  matmul(h, x, wu, b, rows, C, F, false);
  swigluGateKernel<<<blocks(rows * F), kThreads, 0, s>>>(a, b, hsw, rows * F);
  matmul(h, hsw, wd, y, rows, F, C, false);
}

void swigluBackward(cublasHandle_t h, const float *x, const float *wg, const float *wu, const float *wd,
                    const float *aux, const float *dy, float *dx, float *dWg, float *dWu, float *dWd,
                    float *scratch, int64_t rows, int64_t C, int64_t F, cudaStream_t s) {
  const float *a = aux, *b = aux + rows * F, *hsw = aux + 2 * rows * F;
  float *dh = scratch, *da = scratch + rows * F, *db = scratch + 2 * rows * F;
  matmulTransAAcc(h, hsw, dy, dWd, rows, F, C);
  fill(dh, rows * F, 0.0f, s);
  matmulTransBAcc(h, dy, wd, dh, rows, C, F);
  swigluBackwardGateKernel<<<blocks(rows * F), kThreads, 0, s>>>(a, b, dh, da, db, rows * F);
  matmulTransAAcc(h, x, da, dWg, rows, C, F);
  matmulTransAAcc(h, x, db, dWu, rows, C, F);
  matmulTransBAcc(h, da, wg, dx, rows, F, C);
  matmulTransBAcc(h, db, wu, dx, rows, F, C);
}

void concatProjForward(cublasHandle_t h, const float *a, const float *b, const float *w, float *z,
                       int64_t rows, int64_t C, int64_t N) {
  matmul(h, a, w, z, rows, C, N, false);
  matmul(h, b, w + C * N, z, rows, C, N, true);
}

void concatProjBackward(cublasHandle_t h, const float *a, const float *b, const float *w, const float *dz,
                        float *da, float *db, float *dW, int64_t rows, int64_t C, int64_t N) {
  matmulTransAAcc(h, a, dz, dW, rows, C, N);
  matmulTransAAcc(h, b, dz, dW + C * N, rows, C, N);
  matmulTransBAcc(h, dz, w, da, rows, N, C);
  matmulTransBAcc(h, dz, w + C * N, db, rows, N, C);
}

void crossEntropyForward(const float *logits, const int32_t *labels, float *aux, float *loss, int64_t rows,
                         int64_t V, int64_t shift, int64_t seq, cudaStream_t s) {
  logSumExpKernel<<<blocks(rows), kThreads, 0, s>>>(logits, aux, rows, V);
  lossKernel<<<1, 1, 0, s>>>(logits, labels, aux, loss, rows, V, shift, seq);
}

void crossEntropyBackward(const float *logits, const int32_t *labels, const float *aux, float scale,
                          float *dLogits, int64_t rows, int64_t V, int64_t shift, int64_t seq,
                          cudaStream_t s) {
  int64_t counted = 0;
  for (int64_t t = 0; t < rows; ++t)
    counted += (t % seq) + shift < seq;
  if (!counted)
    return;
  crossEntropyBackwardKernel<<<blocks(rows * V), kThreads, 0, s>>>(logits, labels, aux, scale / float(counted),
                                                                   dLogits, rows, V, shift, seq);
}

} // namespace mhcc::runtime::cuda
