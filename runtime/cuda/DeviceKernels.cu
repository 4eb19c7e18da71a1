//===- DeviceKernels.cu - CUDA kernels for stage programs ---------------------===//
#include "runtime/cuda/DeviceKernels.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

namespace mhcc::runtime::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxStreams = 8;  // n <= 8: coefficients fit per-thread arrays
constexpr double kRopeBase = 10000.0;
constexpr float kMhcRmsEps = 1e-6f;
constexpr float kSinkhornClamp = 1e-6f;
// Sinkhorn steps (2 per iteration) of a 4x4 matrix the backward keeps per
// token instead of recomputing them: 40 iterations at n = 4, 10 at n = 8.
constexpr int kCachedSinkhornSteps = 80;

inline int blocks(int64_t count) { return static_cast<int>((count + kThreads - 1) / kThreads); }

__device__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// ---- deterministic reductions -------------------------------------------------------
// Butterfly sums: every lane ends with the same bits (fp addition commutes),
// and the association order is fixed by the block shape alone.

__device__ float warpSum(float v) {
  for (int offset = 16; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ float warpMax(float v) {
  for (int offset = 16; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

/// Sum over a block of kThreads threads; every thread gets the result.
__device__ float blockSum(float v) {
  __shared__ float partial[kThreads / 32];
  __syncthreads(); // the previous call's readers are done with `partial`
  v = warpSum(v);
  if (threadIdx.x % 32 == 0)
    partial[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < kThreads / 32; ++w)
    total += partial[w];
  return total;
}

__device__ float blockMax(float v) {
  __shared__ float partial[kThreads / 32];
  __syncthreads();
  v = warpMax(v);
  if (threadIdx.x % 32 == 0)
    partial[threadIdx.x / 32] = v;
  __syncthreads();
  float m = partial[0];
  for (int w = 1; w < kThreads / 32; ++w)
    m = fmaxf(m, partial[w]);
  return m;
}

/// One warp per row: out[t] = sum of squares of row t.
__global__ void rowSquaresKernel(const float *x, float *out, int64_t rows, int64_t width) {
  int64_t t = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (t >= rows)
    return;
  const float *row = x + t * width;
  float sq = 0;
  for (int64_t k = lane; k < width; k += 32)
    sq += row[k] * row[k];
  sq = warpSum(sq);
  if (lane == 0)
    out[t] = sq;
}

inline int warpBlocks(int64_t rows) { return blocks(rows * 32); }

/// Column sums over rows in two fixed stages, without atomics: partial sums
/// over chunks of kChunkRows rows (rows ascending), then the chunks in order.
/// `value(t, c)` gives the summand. The order depends on the shapes alone.
constexpr int64_t kChunkRows = 64;
inline int64_t columnChunks(int64_t rows) { return (rows + kChunkRows - 1) / kChunkRows; }

template <typename Value>
__global__ void columnPartialsKernel(Value value, int64_t rows, int64_t cols, float *partial) {
  int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  int64_t chunk = blockIdx.y;
  if (c >= cols)
    return;
  float acc = 0;
  for (int64_t t = chunk * kChunkRows; t < min(rows, (chunk + 1) * kChunkRows); ++t)
    acc += value(t, c);
  partial[chunk * cols + c] = acc;
}

__global__ void addColumnPartialsKernel(const float *partial, int64_t chunks, int64_t cols, float *dst) {
  int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= cols)
    return;
  float acc = 0;
  for (int64_t chunk = 0; chunk < chunks; ++chunk)
    acc += partial[chunk * cols + c];
  dst[c] += acc;
}

/// dst[c] += sum over t of value(t, c); partial: columnChunks(rows) * cols floats.
template <typename Value>
void addColumnSums(Value value, int64_t rows, int64_t cols, float *partial, float *dst, cudaStream_t s) {
  if (rows == 0)
    return;
  dim3 grid(unsigned(blocks(cols)), unsigned(columnChunks(rows)));
  columnPartialsKernel<<<grid, kThreads, 0, s>>>(value, rows, cols, partial);
  addColumnPartialsKernel<<<blocks(cols), kThreads, 0, s>>>(partial, columnChunks(rows), cols, dst);
}

// ---- cuBLAS: row-major products through column-major GEMMs ---------------------

void gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
          int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc,
          float beta) {
  const float one = 1.0f;
  cublasSgemm(h, ta, tb, int(m), int(n), int(k), &one, a, int(lda), b, int(ldb), &beta, c, int(ldc));
}

/// Column-major strided-batched product (one batch entry per attention head).
void gemmBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                 float alpha, const float *a, int64_t lda, int64_t strideA, const float *b, int64_t ldb,
                 int64_t strideB, float *c, int64_t ldc, int64_t strideC, int64_t batch) {
  const float zero = 0.0f;
  cublasSgemmStridedBatched(h, ta, tb, int(m), int(n), int(k), &alpha, a, int(lda), strideA, b, int(ldb), strideB,
                            &zero, c, int(ldc), strideC, int(batch));
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

__global__ void mhcCoeffsForwardKernel(const float *squares, const float *p, const float *bias,
                                       const float *alpha, float *coef, float *aux, int64_t rows,
                                       int64_t C, int n, int iters) {
  int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= rows)
    return;
  const int64_t width = n * C;
  const int K = n * n + 2 * n;
  float rms = sqrtf(squares[t] / float(width));
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
__global__ void mhcCoeffsBackwardKernel(const float *squares, const float *p, const float *alpha,
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
    // Walk the steps backwards. Each step's input matrix comes from one
    // forward sweep saved in (thread-local) memory; past kCachedSinkhornSteps
    // steps it is recomputed from m0 instead. Both produce the same bits.
    float xs[kMaxStreams * kMaxStreams];
    const bool cached = 2 * iters * nn <= kCachedSinkhornSteps * 16;
    float saved[kCachedSinkhornSteps * 16];
    auto normalize = [&](float *mat, int step) {
      bool rowStep = step % 2 == 0;
      for (int a = 0; a < n; ++a) {
        float sum = 0;
        for (int b = 0; b < n; ++b)
          sum += rowStep ? mat[a * n + b] : mat[b * n + a];
        sum = fmaxf(sum, kSinkhornClamp);
        for (int b = 0; b < n; ++b) {
          if (rowStep)
            mat[a * n + b] /= sum;
          else
            mat[b * n + a] /= sum;
        }
      }
    };
    if (cached) {
      for (int e = 0; e < nn; ++e)
        xs[e] = m0[e];
      for (int step = 0; step < 2 * iters; ++step) {
        for (int e = 0; e < nn; ++e)
          saved[step * nn + e] = xs[e];
        normalize(xs, step);
      }
    }
    for (int it = iters - 1; it >= 0; --it) {
      for (int half = 1; half >= 0; --half) {
        // xs = the matrix entering step (2 it + half)
        const int step = 2 * it + half;
        if (cached) {
          for (int e = 0; e < nn; ++e)
            xs[e] = saved[step * nn + e];
        } else {
          for (int e = 0; e < nn; ++e)
            xs[e] = m0[e];
          for (int s2 = 0; s2 < step; ++s2)
            normalize(xs, s2);
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
  float rms = sqrtf(squares[t] / float(width));
  rScale[t] = rms > 0 ? -dr * r * r / (float(width) * rms) : 0.0f;
}

/// Summands of dBias (column k) and of dAlpha (column g: pre, post, res).
struct MhcBiasGrad {
  const float *dh;
  int K;
  __device__ float operator()(int64_t t, int64_t k) const { return dh[t * K + k]; }
};
struct MhcAlphaGrad {
  const float *dh, *p, *aux;
  int n;
  __device__ float operator()(int64_t t, int64_t group) const {
    const int K = n * n + 2 * n;
    int from = group == 0 ? 0 : group == 1 ? n : 2 * n;
    int to = group == 0 ? n : group == 1 ? 2 * n : K;
    float r = aux[t * (K + 1) + K], acc = 0;
    for (int j = from; j < to; ++j)
      acc += dh[t * K + j] * r * p[t * K + j];
    return acc;
  }
};

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

/// One warp per (t, s): dCoef[t, s] += <du[t], x[t, s]>.
__global__ void mhcPreBackwardCoefKernel(const float *x, const float *du, float *dCoef, int64_t rows, int64_t C, int n) {
  int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (i >= rows * n)
    return;
  const int K = n * n + 2 * n;
  int64_t t = i / n, s = i % n;
  float dot = 0;
  for (int64_t c = lane; c < C; c += 32)
    dot += du[t * C + c] * x[(t * n + s) * C + c];
  dot = warpSum(dot);
  if (lane == 0)
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

/// One warp per (t, i): dCoef's post entry <dOut[t,i], y[t]> and res row
/// <dOut[t,i], x[t,j]> for every j.
__global__ void mhcPostResBackwardCoefKernel(const float *x, const float *y, const float *dOut, float *dCoef,
                                             int64_t rows, int64_t C, int n) {
  int64_t e = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (e >= rows * n)
    return;
  const int K = n * n + 2 * n;
  int64_t t = e / n, i = e % n;
  const float *g = dOut + (t * n + i) * C;
  float dotY = 0;
  for (int64_t c = lane; c < C; c += 32)
    dotY += g[c] * y[t * C + c];
  dotY = warpSum(dotY);
  if (lane == 0)
    dCoef[t * K + n + i] += dotY;
  for (int j = 0; j < n; ++j) {
    const float *xj = x + (t * n + j) * C;
    float dot = 0;
    for (int64_t c = lane; c < C; c += 32)
      dot += g[c] * xj[c];
    dot = warpSum(dot);
    if (lane == 0)
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

__global__ void rmsNormStatsKernel(const float *squares, float *aux, int64_t rows, int64_t C, float eps) {
  int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t < rows)
    aux[t] = 1.0f / sqrtf(squares[t] / float(C) + eps);
}

__global__ void rmsNormApplyKernel(const float *u, const float *gain, const float *aux, float *y,
                                   int64_t rows, int64_t C) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < rows * C)
    y[i] = u[i] * aux[i / C] * gain[i % C];
}

/// One warp per row.
__global__ void rmsNormBackwardRowKernel(const float *u, const float *gain, const float *aux,
                                         const float *dy, float *du, int64_t rows, int64_t C) {
  int64_t t = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (t >= rows)
    return;
  float s = aux[t], dot = 0;
  for (int64_t c = lane; c < C; c += 32)
    dot += gain[c] * dy[t * C + c] * u[t * C + c];
  dot = warpSum(dot);
  float k = s * s * s / float(C) * dot;
  for (int64_t c = lane; c < C; c += 32)
    du[t * C + c] += s * gain[c] * dy[t * C + c] - k * u[t * C + c];
}

struct RmsNormGainGrad {
  const float *u, *aux, *dy;
  int64_t C;
  __device__ float operator()(int64_t t, int64_t c) const { return dy[t * C + c] * u[t * C + c] * aux[t]; }
};

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

/// One block per score row (head, query i) of one sequence: causal softmax
/// in place (P, zero above the diagonal) and the row's log-sum-exp.
__global__ void causalSoftmaxKernel(float *scores, float *lse, int64_t seq, int64_t heads, int64_t lseOffset) {
  const int64_t h = blockIdx.x / seq, i = blockIdx.x % seq;
  float *row = scores + (h * seq + i) * seq;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x)
    m = fmaxf(m, row[j]);
  m = blockMax(m);
  float sum = 0;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x)
    sum += expf(row[j] - m);
  sum = blockSum(sum);
  const float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < seq; j += blockDim.x)
    row[j] = j <= i ? expf(row[j] - m) * inv : 0.0f;
  if (threadIdx.x == 0)
    lse[(lseOffset + i) * heads + h] = m + logf(sum);
}

/// Backward of one score row: P from the saved log-sum-exp, then
/// dS = P (dP - <P, dP>) * scale; P replaces the scores, dS replaces dP.
__global__ void causalSoftmaxBackwardKernel(float *scores, float *dP, const float *lse, int64_t seq,
                                            int64_t heads, int64_t lseOffset, float scale) {
  const int64_t h = blockIdx.x / seq, i = blockIdx.x % seq;
  float *row = scores + (h * seq + i) * seq, *grad = dP + (h * seq + i) * seq;
  const float l = lse[(lseOffset + i) * heads + h];
  float dot = 0;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x)
    dot += expf(row[j] - l) * grad[j];
  dot = blockSum(dot);
  for (int64_t j = threadIdx.x; j < seq; j += blockDim.x) {
    float p = j <= i ? expf(row[j] - l) : 0.0f;
    row[j] = p;
    grad[j] = p * (grad[j] - dot) * scale;
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

/// One block per row.
__global__ void logSumExpKernel(const float *logits, float *aux, int64_t rows, int64_t V) {
  const float *row = logits + blockIdx.x * V;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
    m = fmaxf(m, row[v]);
  m = blockMax(m);
  float sum = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
    sum += expf(row[v] - m);
  sum = blockSum(sum);
  if (threadIdx.x == 0)
    aux[blockIdx.x] = m + logf(sum);
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

// ---- optimizer ------------------------------------------------------------------------------

constexpr int kStatBlocks = 256; // fixed: the sum's association depends on the size alone

/// Per block: the sum of squares (double) and the zero count of a strided slice.
__global__ void squaresAndZerosKernel(const float *g, int64_t count, double *partials) {
  __shared__ double squares[kThreads], zeros[kThreads];
  double sq = 0, z = 0;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < count; i += int64_t(kThreads) * gridDim.x) {
    double v = g[i];
    sq += v * v;
    z += g[i] == 0.0f;
  }
  squares[threadIdx.x] = sq;
  zeros[threadIdx.x] = z;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      squares[threadIdx.x] += squares[threadIdx.x + stride];
      zeros[threadIdx.x] += zeros[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    partials[2 * blockIdx.x] = squares[0];
    partials[2 * blockIdx.x + 1] = zeros[0];
  }
}

__global__ void finishSquaresAndZerosKernel(const double *partials, int blocksUsed, double *out) {
  double sq = 0, z = 0;
  for (int b = 0; b < blocksUsed; ++b) {
    sq += partials[2 * b];
    z += partials[2 * b + 1];
  }
  out[0] = sq;
  out[1] = z;
}

__global__ void adamWKernel(float *w, const float *g, float *m, float *v, int64_t count, float lr, float clip,
                            float b1, float b2, float eps, float c1, float c2, float decay) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= count)
    return;
  float grad = g[i] * clip;
  float mm = b1 * m[i] + (1.0f - b1) * grad;
  float vv = b2 * v[i] + (1.0f - b2) * grad * grad;
  m[i] = mm;
  v[i] = vv;
  float update = (mm / c1) / (sqrtf(vv / c2) + eps);
  w[i] -= lr * (update + decay * w[i]);
}

__global__ void sgdKernel(float *w, const float *g, int64_t count, float lr, float clip) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < count)
    w[i] -= lr * (g[i] * clip);
}

} // namespace

void squaresAndZeros(const float *g, int64_t count, double *out, double *partials, cudaStream_t s) {
  int used = int(std::min<int64_t>(kStatBlocks, std::max<int64_t>(1, (count + kThreads - 1) / kThreads)));
  squaresAndZerosKernel<<<used, kThreads, 0, s>>>(g, count, partials);
  finishSquaresAndZerosKernel<<<1, 1, 0, s>>>(partials, used, out);
}
int64_t squaresAndZerosScratch() { return 2 * kStatBlocks; }

void adamW(float *w, const float *g, float *m, float *v, int64_t count, float lr, float clip, float beta1,
           float beta2, float eps, float correction1, float correction2, float decay, cudaStream_t s) {
  if (count)
    adamWKernel<<<blocks(count), kThreads, 0, s>>>(w, g, m, v, count, lr, clip, beta1, beta2, eps, correction1,
                                                  correction2, decay);
}

void sgd(float *w, const float *g, int64_t count, float lr, float clip, cudaStream_t s) {
  if (count)
    sgdKernel<<<blocks(count), kThreads, 0, s>>>(w, g, count, lr, clip);
}

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
  float *p = scratch, *squares = scratch + rows * K;
  matmul(h, x, wmap, p, rows, n * C, K, false);
  rowSquaresKernel<<<warpBlocks(rows), kThreads, 0, s>>>(x, squares, rows, n * C);
  // Few rows per block: each row's Sinkhorn is a long serial loop, spread it over the SMs.
  mhcCoeffsForwardKernel<<<int((rows + 31) / 32), 32, 0, s>>>(squares, p, bias, alpha, coef, aux, rows, C, int(n),
                                                              int(iters));
}

void mhcCoeffsBackward(cublasHandle_t h, const float *x, const float *wmap, const float *alpha,
                       const float *aux, const float *dCoef, float *dx, float *dWmap, float *dBias,
                       float *dAlpha, float *scratch, int64_t rows, int64_t C, int64_t n, int64_t iters,
                       cudaStream_t s) {
  const int64_t K = n * n + 2 * n, width = n * C;
  float *p = scratch, *dh = scratch + rows * K, *dp = scratch + 2 * rows * K, *rScale = scratch + 3 * rows * K;
  float *squares = rScale + rows, *partial = squares + rows;
  matmul(h, x, wmap, p, rows, width, K, false);
  rowSquaresKernel<<<warpBlocks(rows), kThreads, 0, s>>>(x, squares, rows, width);
  // Few rows per block: the per-row Sinkhorn backward is long, spread it over SMs.
  mhcCoeffsBackwardKernel<<<int((rows + 31) / 32), 32, 0, s>>>(squares, p, alpha, aux, dCoef, dh, dp, rScale, rows,
                                                               C, int(n), int(iters));
  addColumnSums(MhcBiasGrad{dh, int(K)}, rows, K, partial, dBias, s);
  addColumnSums(MhcAlphaGrad{dh, p, aux, int(n)}, rows, 3, partial, dAlpha, s);
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
  mhcPreBackwardCoefKernel<<<warpBlocks(rows * n), kThreads, 0, s>>>(x, du, dCoef, rows, C, int(n));
}

void mhcPostResForward(const float *x, const float *coef, const float *y, float *out, int64_t rows,
                       int64_t C, int64_t n, cudaStream_t s) {
  mhcPostResForwardKernel<<<blocks(rows * n * C), kThreads, 0, s>>>(x, coef, y, out, rows, C, int(n));
}

void mhcPostResBackward(const float *x, const float *coef, const float *y, const float *dOut, float *dx,
                        float *dCoef, float *dy, int64_t rows, int64_t C, int64_t n, cudaStream_t s) {
  mhcPostResBackwardValuesKernel<<<blocks(rows * n * C), kThreads, 0, s>>>(coef, dOut, dx, dy, rows, C, int(n));
  mhcPostResBackwardCoefKernel<<<warpBlocks(rows * n), kThreads, 0, s>>>(x, y, dOut, dCoef, rows, C, int(n));
}

void residualForward(const float *x, const float *y, float *out, int64_t count, cudaStream_t s) {
  residualForwardKernel<<<blocks(count), kThreads, 0, s>>>(x, y, out, count);
}

void residualBackward(const float *dOut, float *dx, float *dy, int64_t count, cudaStream_t s) {
  residualBackwardKernel<<<blocks(count), kThreads, 0, s>>>(dOut, dx, dy, count);
}

void rmsNormForward(const float *u, const float *gain, float *y, float *aux, int64_t rows, int64_t C,
                    double eps, cudaStream_t s) {
  rowSquaresKernel<<<warpBlocks(rows), kThreads, 0, s>>>(u, aux, rows, C);
  rmsNormStatsKernel<<<blocks(rows), kThreads, 0, s>>>(aux, aux, rows, C, float(eps));
  rmsNormApplyKernel<<<blocks(rows * C), kThreads, 0, s>>>(u, gain, aux, y, rows, C);
}

void rmsNormBackward(const float *u, const float *gain, const float *aux, const float *dy, float *du,
                     float *dGain, float *scratch, int64_t rows, int64_t C, cudaStream_t s) {
  addColumnSums(RmsNormGainGrad{u, aux, dy, C}, rows, C, scratch, dGain, s);
  rmsNormBackwardRowKernel<<<warpBlocks(rows), kThreads, 0, s>>>(u, gain, aux, dy, du, rows, C);
}

void attentionForward(cublasHandle_t h, const float *x, const float *wqkv, const float *wo, float *y,
                      float *aux, float *scratch, int64_t rows, int64_t C, int64_t heads, int64_t seq,
                      cudaStream_t s) {
  float *qkv = aux, *o = aux + rows * 3 * C, *lse = o + rows * C, *scores = scratch;
  const int64_t d = C / heads, pairs = d / 2;
  const float scale = 1.0f / std::sqrt(float(d));
  matmul(h, x, wqkv, qkv, rows, C, 3 * C, false);
  ropeKernel<<<blocks(rows * 2 * heads * pairs), kThreads, 0, s>>>(qkv, rows, C, heads, seq, false, 3 * C);
  // Per sequence, all heads at once (row-major S = scale Q K^T, O = P V
  // through column-major GEMMs on the strided q / k / v columns).
  for (int64_t b = 0; b < rows / seq; ++b) {
    const float *q = qkv + b * seq * 3 * C, *k = q + C, *v = q + 2 * C;
    gemmBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, seq, seq, d, scale, k, 3 * C, d, q, 3 * C, d, scores, seq, seq * seq,
                heads);
    causalSoftmaxKernel<<<int(heads * seq), kThreads, 0, s>>>(scores, lse, seq, heads, b * seq);
    gemmBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, d, seq, seq, 1.0f, v, 3 * C, d, scores, seq, seq * seq,
                o + b * seq * C, C, d, heads);
  }
  matmul(h, o, wo, y, rows, C, C, false);
}

void attentionBackward(cublasHandle_t h, const float *x, const float *wqkv, const float *wo,
                       const float *aux, const float *dy, float *dx, float *dWqkv, float *dWo,
                       float *scratch, int64_t rows, int64_t C, int64_t heads, int64_t seq, cudaStream_t s) {
  const float *qkv = aux, *o = aux + rows * 3 * C, *lse = o + rows * C;
  float *dO = scratch, *dQkv = scratch + rows * C, *probs = dQkv + rows * 3 * C, *dScores = probs + heads * seq * seq;
  const int64_t d = C / heads, pairs = d / 2;
  const float scale = 1.0f / std::sqrt(float(d));
  matmulTransAAcc(h, o, dy, dWo, rows, C, C);
  fill(dO, rows * C, 0.0f, s);
  matmulTransBAcc(h, dy, wo, dO, rows, C, C); // dO = dy Wo^T
  for (int64_t b = 0; b < rows / seq; ++b) {
    const float *q = qkv + b * seq * 3 * C, *k = q + C, *v = q + 2 * C, *g = dO + b * seq * C;
    float *dq = dQkv + b * seq * 3 * C, *dk = dq + C, *dv = dq + 2 * C;
    // Scores again (the same GEMM as the forward, so the same bits), dP = dO V^T.
    gemmBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, seq, seq, d, scale, k, 3 * C, d, q, 3 * C, d, probs, seq, seq * seq,
                heads);
    gemmBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, seq, seq, d, 1.0f, v, 3 * C, d, g, C, d, dScores, seq, seq * seq,
                heads);
    causalSoftmaxBackwardKernel<<<int(heads * seq), kThreads, 0, s>>>(probs, dScores, lse, seq, heads, b * seq,
                                                                     scale);
    // dQ = dS K, dK = dS^T Q, dV = P^T dO.
    gemmBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, d, seq, seq, 1.0f, k, 3 * C, d, dScores, seq, seq * seq, dq, 3 * C, d,
                heads);
    gemmBatched(h, CUBLAS_OP_N, CUBLAS_OP_T, d, seq, seq, 1.0f, q, 3 * C, d, dScores, seq, seq * seq, dk, 3 * C, d,
                heads);
    gemmBatched(h, CUBLAS_OP_N, CUBLAS_OP_T, d, seq, seq, 1.0f, g, C, d, probs, seq, seq * seq, dv, 3 * C, d,
                heads);
  }
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
  logSumExpKernel<<<int(rows), kThreads, 0, s>>>(logits, aux, rows, V);
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

int64_t mhcCoeffsForwardScratch(int64_t rows, int64_t n) { return rows * (n * n + 2 * n) + rows; }
int64_t mhcCoeffsBackwardScratch(int64_t rows, int64_t n) {
  const int64_t K = n * n + 2 * n;
  return 3 * rows * K + 2 * rows + columnChunks(rows) * K;
}
int64_t rmsNormBackwardScratch(int64_t rows, int64_t C) { return columnChunks(rows) * C; }
int64_t attentionForwardScratch(int64_t heads, int64_t seq) { return heads * seq * seq; }
int64_t attentionBackwardScratch(int64_t rows, int64_t C, int64_t heads, int64_t seq) {
  return 4 * rows * C + 2 * heads * seq * seq;
}

} // namespace mhcc::runtime::cuda
