//===- DeviceKernels.cu - CUDA kernels for stage programs ---------------------===//
#include "runtime/cuda/DeviceKernels.h"
#include "runtime/cuda/ModelKernels.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

namespace mhcc::runtime::cuda {
namespace {

constexpr int kThreads = kBlockThreads;

inline int blocks(int64_t count) { return static_cast<int>((count + kThreads - 1) / kThreads); }
inline int warpBlocks(int64_t rows) { return blocks(rows * 32); }

/// Column sums over rows in two fixed stages, without atomics: the model's
/// kernel writes partial sums over chunks of kColumnChunkRows rows (rows
/// ascending), then the chunks are added in order here. The order depends on
/// the shapes alone.
inline int64_t columnChunks(int64_t rows) { return (rows + kColumnChunkRows - 1) / kColumnChunkRows; }

__global__ void addColumnPartialsKernel(const float *partial, int64_t chunks, int64_t cols, float *dst) {
  int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= cols)
    return;
  float acc = 0;
  for (int64_t chunk = 0; chunk < chunks; ++chunk)
    acc += partial[chunk * cols + c];
  dst[c] += acc;
}

/// dst[c] += sum over t of the summands `partials` produces (a model kernel
/// taking `args...` and then `partial`); partial: columnChunks(rows) * cols floats.
template <typename... Args>
void addColumnSums(const ModelKernels &k, ModelKernel partials, int64_t rows, int64_t cols, float *partial,
                   float *dst, cudaStream_t s, Args... args) {
  if (rows == 0)
    return;
  k.launch(partials, unsigned(blocks(cols)), unsigned(columnChunks(rows)), kThreads, s, args..., partial);
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

void embedForward(const ModelKernels &k, const int32_t *tokens, const float *table, float *out, int64_t rows,
                  int64_t C, int64_t shift, int64_t seq, cudaStream_t s) {
  k.launch(ModelKernel::EmbedForward, blocks(rows * C), 1, kThreads, s, tokens, table, out, rows, C, shift, seq);
}

void embedBackward(const ModelKernels &k, const int32_t *offsets, const int32_t *positions, int64_t vocab,
                   const float *dOut, float *dTable, int64_t C, cudaStream_t s) {
  k.launch(ModelKernel::EmbedBackward, blocks(vocab * C), 1, kThreads, s, offsets, positions, vocab, dOut, dTable, C);
}

void expandForward(const ModelKernels &k, const float *h, float *x, int64_t rows, int64_t C, int64_t n,
                   cudaStream_t s) {
  k.launch(ModelKernel::ExpandForward, blocks(rows * n * C), 1, kThreads, s, h, x, rows, C);
}

void expandBackward(const ModelKernels &k, const float *dx, float *dh, int64_t rows, int64_t C, int64_t n,
                    cudaStream_t s) {
  k.launch(ModelKernel::ExpandBackward, blocks(rows * C), 1, kThreads, s, dx, dh, rows, C);
}

void contractForward(const ModelKernels &k, const float *x, float *h, int64_t rows, int64_t C, int64_t n,
                     cudaStream_t s) {
  k.launch(ModelKernel::ContractForward, blocks(rows * C), 1, kThreads, s, x, h, rows, C);
}

void contractBackward(const ModelKernels &k, const float *dh, float *dx, int64_t rows, int64_t C, int64_t n,
                      cudaStream_t s) {
  k.launch(ModelKernel::ContractBackward, blocks(rows * n * C), 1, kThreads, s, dh, dx, rows, C);
}

void mhcCoeffsForward(const ModelKernels &k, cublasHandle_t h, const float *x, const float *wmap, const float *bias,
                      const float *alpha, float *coef, float *aux, float *scratch, int64_t rows, int64_t C,
                      int64_t n, cudaStream_t s) {
  const int64_t K = n * n + 2 * n, width = n * C;
  float *p = scratch, *squares = scratch + rows * K;
  matmul(h, x, wmap, p, rows, width, K, false);
  k.launch(ModelKernel::RowSquares, warpBlocks(rows), 1, kThreads, s, x, squares, rows, width);
  // Few rows per block: each row's Sinkhorn is a long serial loop, spread it over the SMs.
  k.launch(ModelKernel::MhcCoeffsForward, unsigned((rows + 31) / 32), 1, 32, s, squares, p, bias, alpha, coef, aux,
           rows, C);
}

void mhcCoeffsBackward(const ModelKernels &k, cublasHandle_t h, const float *x, const float *wmap,
                       const float *alpha, const float *aux, const float *dCoef, float *dx, float *dWmap,
                       float *dBias, float *dAlpha, float *stash, float *scratch, int64_t rows, int64_t C, int64_t n,
                       GradParts parts, cudaStream_t s) {
  const int64_t K = n * n + 2 * n, width = n * C;
  float *p = stash, *dh = stash + rows * K, *dp = stash + 2 * rows * K;
  float *rScale = scratch, *squares = rScale + rows, *partial = squares + rows;
  if (parts.inputs) {
    matmul(h, x, wmap, p, rows, width, K, false);
    k.launch(ModelKernel::RowSquares, warpBlocks(rows), 1, kThreads, s, x, squares, rows, width);
    // Few rows per block: the per-row Sinkhorn backward is long, spread it over SMs.
    k.launch(ModelKernel::MhcCoeffsBackward, unsigned((rows + 31) / 32), 1, 32, s, squares, p, alpha, aux, dCoef,
             dh, dp, rScale, rows, C);
    matmulTransBAcc(h, dp, wmap, dx, rows, K, width);
    k.launch(ModelKernel::RowScaleAdd, blocks(rows * width), 1, kThreads, s, x, rScale, dx, rows, width);
  }
  if (parts.weights) {
    addColumnSums(k, ModelKernel::MhcBiasGradPartials, rows, K, partial, dBias, s, dh, rows);
    addColumnSums(k, ModelKernel::MhcAlphaGradPartials, rows, 3, partial, dAlpha, s, dh, p, aux, rows);
    matmulTransAAcc(h, x, dp, dWmap, rows, width, K);
  }
}

void mhcPreForward(const ModelKernels &k, const float *x, const float *coef, float *u, int64_t rows, int64_t C,
                   int64_t n, cudaStream_t s) {
  k.launch(ModelKernel::MhcPreForward, blocks(rows * C), 1, kThreads, s, x, coef, u, rows, C);
}

void mhcPreBackward(const ModelKernels &k, const float *x, const float *coef, const float *du, float *dx,
                    float *dCoef, int64_t rows, int64_t C, int64_t n, cudaStream_t s) {
  k.launch(ModelKernel::MhcPreBackwardX, blocks(rows * n * C), 1, kThreads, s, coef, du, dx, rows, C);
  k.launch(ModelKernel::MhcPreBackwardCoef, warpBlocks(rows * n), 1, kThreads, s, x, du, dCoef, rows, C);
}

void mhcPostResForward(const ModelKernels &k, const float *x, const float *coef, const float *y, float *out,
                       int64_t rows, int64_t C, int64_t n, cudaStream_t s) {
  k.launch(ModelKernel::MhcPostResForward, blocks(rows * n * C), 1, kThreads, s, x, coef, y, out, rows, C);
}

void mhcPostResBackward(const ModelKernels &k, const float *x, const float *coef, const float *y, const float *dOut,
                        float *dx, float *dCoef, float *dy, int64_t rows, int64_t C, int64_t n, cudaStream_t s) {
  k.launch(ModelKernel::MhcPostResBackwardValues, blocks(rows * n * C), 1, kThreads, s, coef, dOut, dx, dy, rows, C);
  k.launch(ModelKernel::MhcPostResBackwardCoef, warpBlocks(rows * n), 1, kThreads, s, x, y, dOut, dCoef, rows, C);
}

void residualForward(const ModelKernels &k, const float *x, const float *y, float *out, int64_t count,
                     cudaStream_t s) {
  k.launch(ModelKernel::ResidualForward, blocks(count), 1, kThreads, s, x, y, out, count);
}

void residualBackward(const ModelKernels &k, const float *dOut, float *dx, float *dy, int64_t count,
                      cudaStream_t s) {
  k.launch(ModelKernel::ResidualBackward, blocks(count), 1, kThreads, s, dOut, dx, dy, count);
}

void rmsNormForward(const ModelKernels &k, const float *u, const float *gain, float *y, float *aux, int64_t rows,
                    int64_t C, double eps, cudaStream_t s) {
  k.launch(ModelKernel::RowSquares, warpBlocks(rows), 1, kThreads, s, u, aux, rows, C);
  k.launch(ModelKernel::RmsNormStats, blocks(rows), 1, kThreads, s, aux, aux, rows, C, float(eps));
  k.launch(ModelKernel::RmsNormApply, blocks(rows * C), 1, kThreads, s, u, gain, aux, y, rows, C);
}

void rmsNormBackward(const ModelKernels &k, const float *u, const float *gain, const float *aux, const float *dy,
                     float *du, float *dGain, float *scratch, int64_t rows, int64_t C, GradParts parts,
                     cudaStream_t s) {
  if (parts.weights)
    addColumnSums(k, ModelKernel::RmsNormGainGradPartials, rows, C, scratch, dGain, s, u, aux, dy, rows, C);
  if (parts.inputs)
    k.launch(ModelKernel::RmsNormBackwardRow, warpBlocks(rows), 1, kThreads, s, u, gain, aux, dy, du, rows, C);
}

void attentionForward(const ModelKernels &k, cublasHandle_t h, const float *x, const float *wqkv, const float *wo,
                      float *y, float *aux, float *scratch, int64_t rows, int64_t C, int64_t heads, int64_t seq,
                      cudaStream_t s) {
  float *qkv = aux, *o = aux + rows * 3 * C, *lse = o + rows * C, *scores = scratch;
  const int64_t d = C / heads, pairs = d / 2, rowStride = 3 * C;
  const float scale = 1.0f / std::sqrt(float(d));
  matmul(h, x, wqkv, qkv, rows, C, 3 * C, false);
  k.launch(ModelKernel::Rope, blocks(rows * 2 * heads * pairs), 1, kThreads, s, qkv, rows, C, heads, seq, 0,
           rowStride);
  // Per sequence, all heads at once (row-major S = scale Q K^T, O = P V
  // through column-major GEMMs on the strided q / k / v columns).
  for (int64_t b = 0; b < rows / seq; ++b) {
    const float *q = qkv + b * seq * 3 * C, *kk = q + C, *v = q + 2 * C;
    gemmBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, seq, seq, d, scale, kk, 3 * C, d, q, 3 * C, d, scores, seq, seq * seq,
                heads);
    k.launch(ModelKernel::CausalSoftmax, unsigned(heads * seq), 1, kThreads, s, scores, lse, seq, heads,
             int64_t(b * seq));
    gemmBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, d, seq, seq, 1.0f, v, 3 * C, d, scores, seq, seq * seq,
                o + b * seq * C, C, d, heads);
  }
  matmul(h, o, wo, y, rows, C, C, false);
}

void attentionBackwardCore(const ModelKernels &k, cublasHandle_t h, const float *qkv, const float *lse,
                           const float *wo, const float *dy, float *dQkv, float *scratch, int64_t rows, int64_t C,
                           int64_t heads, int64_t seq, cudaStream_t s);

void attentionBackward(const ModelKernels &k, cublasHandle_t h, const float *x, const float *wqkv, const float *wo,
                       const float *aux, const float *dy, float *dx, float *dWqkv, float *dWo, float *dQkv,
                       float *scratch, int64_t rows, int64_t C, int64_t heads, int64_t seq, GradParts parts,
                       cudaStream_t s) {
  const float *qkv = aux, *o = aux + rows * 3 * C, *lse = o + rows * C;
  if (parts.inputs) {
    attentionBackwardCore(k, h, qkv, lse, wo, dy, dQkv, scratch, rows, C, heads, seq, s);
    matmulTransBAcc(h, dQkv, wqkv, dx, rows, 3 * C, C);
  }
  if (parts.weights) {
    matmulTransAAcc(h, o, dy, dWo, rows, C, C);
    matmulTransAAcc(h, x, dQkv, dWqkv, rows, C, 3 * C);
  }
}

/// dQkv (rows x 3C, RoPE undone) from dy; scratch: rows * C + 2 heads seq^2.
void attentionBackwardCore(const ModelKernels &k, cublasHandle_t h, const float *qkv, const float *lse,
                           const float *wo, const float *dy, float *dQkv, float *scratch, int64_t rows, int64_t C,
                           int64_t heads, int64_t seq, cudaStream_t s) {
  float *dO = scratch, *probs = scratch + rows * C, *dScores = probs + heads * seq * seq;
  const int64_t d = C / heads, pairs = d / 2, rowStride = 3 * C;
  const float scale = 1.0f / std::sqrt(float(d));
  fill(dO, rows * C, 0.0f, s);
  matmulTransBAcc(h, dy, wo, dO, rows, C, C); // dO = dy Wo^T
  for (int64_t b = 0; b < rows / seq; ++b) {
    const float *q = qkv + b * seq * 3 * C, *kk = q + C, *v = q + 2 * C, *g = dO + b * seq * C;
    float *dq = dQkv + b * seq * 3 * C, *dk = dq + C, *dv = dq + 2 * C;
    // Scores again (the same GEMM as the forward, so the same bits), dP = dO V^T.
    gemmBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, seq, seq, d, scale, kk, 3 * C, d, q, 3 * C, d, probs, seq, seq * seq,
                heads);
    gemmBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, seq, seq, d, 1.0f, v, 3 * C, d, g, C, d, dScores, seq, seq * seq,
                heads);
    k.launch(ModelKernel::CausalSoftmaxBackward, unsigned(heads * seq), 1, kThreads, s, probs, dScores, lse, seq,
             heads, int64_t(b * seq), scale);
    // dQ = dS K, dK = dS^T Q, dV = P^T dO.
    gemmBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, d, seq, seq, 1.0f, kk, 3 * C, d, dScores, seq, seq * seq, dq, 3 * C, d,
                heads);
    gemmBatched(h, CUBLAS_OP_N, CUBLAS_OP_T, d, seq, seq, 1.0f, q, 3 * C, d, dScores, seq, seq * seq, dk, 3 * C, d,
                heads);
    gemmBatched(h, CUBLAS_OP_N, CUBLAS_OP_T, d, seq, seq, 1.0f, g, C, d, probs, seq, seq * seq, dv, 3 * C, d,
                heads);
  }
  k.launch(ModelKernel::Rope, blocks(rows * 2 * heads * pairs), 1, kThreads, s, dQkv, rows, C, heads, seq, 1,
           rowStride);
}

void swigluForward(const ModelKernels &k, cublasHandle_t h, const float *x, const float *wg, const float *wu,
                   const float *wd, float *y, float *aux, int64_t rows, int64_t C, int64_t F, cudaStream_t s) {
  float *a = aux, *b = aux + rows * F, *hsw = aux + 2 * rows * F;
  const int64_t count = rows * F;
  matmul(h, x, wg, a, rows, C, F, false);
  matmul(h, x, wu, b, rows, C, F, false);
  k.launch(ModelKernel::SwigluGate, blocks(count), 1, kThreads, s, a, b, hsw, count);
  matmul(h, hsw, wd, y, rows, F, C, false);
}

void swigluBackward(const ModelKernels &k, cublasHandle_t h, const float *x, const float *wg, const float *wu,
                    const float *wd, const float *aux, const float *dy, float *dx, float *dWg, float *dWu,
                    float *dWd, float *stash, float *scratch, int64_t rows, int64_t C, int64_t F, GradParts parts,
                    cudaStream_t s) {
  const float *a = aux, *b = aux + rows * F, *hsw = aux + 2 * rows * F;
  float *dh = scratch, *da = stash, *db = stash + rows * F;
  const int64_t count = rows * F;
  if (parts.inputs) {
    fill(dh, count, 0.0f, s);
    matmulTransBAcc(h, dy, wd, dh, rows, C, F);
    k.launch(ModelKernel::SwigluBackwardGate, blocks(count), 1, kThreads, s, a, b, dh, da, db, count);
    matmulTransBAcc(h, da, wg, dx, rows, F, C);
    matmulTransBAcc(h, db, wu, dx, rows, F, C);
  }
  if (parts.weights) {
    matmulTransAAcc(h, hsw, dy, dWd, rows, F, C);
    matmulTransAAcc(h, x, da, dWg, rows, C, F);
    matmulTransAAcc(h, x, db, dWu, rows, C, F);
  }
}

void concatProjForward(cublasHandle_t h, const float *a, const float *b, const float *w, float *z,
                       int64_t rows, int64_t C, int64_t N) {
  matmul(h, a, w, z, rows, C, N, false);
  matmul(h, b, w + C * N, z, rows, C, N, true);
}

void concatProjBackward(cublasHandle_t h, const float *a, const float *b, const float *w, const float *dz,
                        float *da, float *db, float *dW, int64_t rows, int64_t C, int64_t N, GradParts parts) {
  if (parts.weights) {
    matmulTransAAcc(h, a, dz, dW, rows, C, N);
    matmulTransAAcc(h, b, dz, dW + C * N, rows, C, N);
  }
  if (parts.inputs) {
    matmulTransBAcc(h, dz, w, da, rows, N, C);
    matmulTransBAcc(h, dz, w + C * N, db, rows, N, C);
  }
}

void crossEntropyForward(const ModelKernels &k, const float *logits, const int32_t *labels, float *aux, float *loss,
                         int64_t rows, int64_t V, int64_t shift, int64_t seq, cudaStream_t s) {
  k.launch(ModelKernel::LogSumExp, unsigned(rows), 1, kThreads, s, logits, aux, rows, V);
  k.launch(ModelKernel::Loss, 1, 1, 1, s, logits, labels, aux, loss, rows, V, shift, seq);
}

void crossEntropyBackward(const ModelKernels &k, const float *logits, const int32_t *labels, const float *aux,
                          float scale, float *dLogits, int64_t rows, int64_t V, int64_t shift, int64_t seq,
                          cudaStream_t s) {
  int64_t counted = 0;
  for (int64_t t = 0; t < rows; ++t)
    counted += (t % seq) + shift < seq;
  if (!counted)
    return;
  k.launch(ModelKernel::CrossEntropyBackward, blocks(rows * V), 1, kThreads, s, logits, labels, aux,
           scale / float(counted), dLogits, rows, V, shift, seq);
}

int64_t mhcCoeffsForwardScratch(int64_t rows, int64_t n) { return rows * (n * n + 2 * n) + rows; }
int64_t mhcCoeffsBackwardStash(int64_t rows, int64_t n) { return 3 * rows * (n * n + 2 * n); }
int64_t mhcCoeffsBackwardScratch(int64_t rows, int64_t n) {
  return 2 * rows + columnChunks(rows) * (n * n + 2 * n);
}
int64_t rmsNormBackwardScratch(int64_t rows, int64_t C) { return columnChunks(rows) * C; }
int64_t attentionForwardScratch(int64_t heads, int64_t seq) { return heads * seq * seq; }
int64_t attentionBackwardStash(int64_t rows, int64_t C) { return 3 * rows * C; }
int64_t attentionBackwardScratch(int64_t rows, int64_t C, int64_t heads, int64_t seq) {
  return rows * C + 2 * heads * seq * seq;
}
int64_t swigluBackwardStash(int64_t rows, int64_t F) { return 2 * rows * F; }
int64_t swigluBackwardScratch(int64_t rows, int64_t F) { return rows * F; }

} // namespace mhcc::runtime::cuda
