//===- DeviceKernels.h - CUDA kernels for stage programs ------------*- C++ -*-===//
//
// The GPU versions of runtime/cpu/Kernels.h, same math and conventions
// (row-major, backward adds into its outputs), in fp32: cuBLAS for the
// products, the artifact's generated kernels (`k`, ModelKernels.h) for the
// rest; fills, additions and the optimizer are here. Deterministic: no
// atomics; every reduction runs in a fixed order (weight gradients over
// tokens ascending, as on the CPU), and matrix products go through cuBLAS
// without TF32, whose results are bit-reproducible for fixed shapes on one
// GPU architecture. All pointers are device pointers; every launch is on
// `stream`.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CUDA_DEVICEKERNELS_H
#define MHCC_RUNTIME_CUDA_DEVICEKERNELS_H

#include <cstdint>
#include <string>

typedef struct CUstream_st *cudaStream_t;
typedef struct cublasContext *cublasHandle_t;

namespace mhcc::runtime::cuda {

class ModelKernels;

/// Returns "" or the CUDA / cuBLAS error of the last launches.
std::string lastError(const char *what);

// c[M,N] (+)= a[M,K] b[K,N]
void matmul(cublasHandle_t h, const float *a, const float *b, float *c, int64_t M, int64_t K,
            int64_t N, bool accumulate);
// c[K,N] += a[M,K]^T b[M,N]
void matmulTransAAcc(cublasHandle_t h, const float *a, const float *b, float *c, int64_t M,
                     int64_t K, int64_t N);
// c[M,K] += a[M,N] b[K,N]^T
void matmulTransBAcc(cublasHandle_t h, const float *a, const float *b, float *c, int64_t M,
                     int64_t N, int64_t K);

void fill(float *p, int64_t count, float value, cudaStream_t s);
void addInto(float *dst, const float *src, int64_t count, cudaStream_t s);

/// tokens are device ids; `positions` / `offsets` (device) list, per vocab
/// row, the rows t reading it in ascending t (CSR), for the deterministic
/// backward.
void embedForward(const ModelKernels &k, const int32_t *tokens, const float *table, float *out, int64_t rows, int64_t C,
                  int64_t shift, int64_t seq, cudaStream_t s);
void embedBackward(const ModelKernels &k, const int32_t *offsets, const int32_t *positions, int64_t vocab,
                   const float *dOut, float *dTable, int64_t C, cudaStream_t s);

void expandForward(const ModelKernels &k, const float *h, float *x, int64_t rows, int64_t C, int64_t n, cudaStream_t s);
void expandBackward(const ModelKernels &k, const float *dx, float *dh, int64_t rows, int64_t C, int64_t n, cudaStream_t s);
void contractForward(const ModelKernels &k, const float *x, float *h, int64_t rows, int64_t C, int64_t n, cudaStream_t s);
void contractBackward(const ModelKernels &k, const float *dh, float *dx, int64_t rows, int64_t C, int64_t n, cudaStream_t s);

/// Which gradients a backward call computes. The zero-bubble split runs
/// `inputs` (B: the input gradients, leaving in `stash` what the weight
/// gradients need) and later `weights` (W: from the stash); one call with
/// both computes every output with the same operations in the same order,
/// so the bits equal B then W.
struct GradParts {
  bool inputs = true, weights = true;
};

/// Scratch each call needs for itself, and the stash B leaves for W, in floats.
int64_t mhcCoeffsForwardScratch(int64_t rows, int64_t n);
int64_t mhcCoeffsBackwardStash(int64_t rows, int64_t n);
int64_t mhcCoeffsBackwardScratch(int64_t rows, int64_t n);
int64_t rmsNormBackwardScratch(int64_t rows, int64_t C);
int64_t attentionForwardScratch(int64_t heads, int64_t seq);
int64_t attentionBackwardStash(int64_t rows, int64_t C);
int64_t attentionBackwardScratch(int64_t rows, int64_t C, int64_t heads, int64_t seq);
int64_t swigluBackwardStash(int64_t rows, int64_t F);
int64_t swigluBackwardScratch(int64_t rows, int64_t F);

/// scratch: mhcCoeffsForwardScratch (the projection p = x W_map, row norms).
void mhcCoeffsForward(const ModelKernels &k, cublasHandle_t h, const float *x, const float *wmap, const float *bias,
                      const float *alpha, float *coef, float *aux, float *scratch, int64_t rows,
                      int64_t C, int64_t n, cudaStream_t s);
/// stash: mhcCoeffsBackwardStash (the projection, dh, dp); scratch:
/// mhcCoeffsBackwardScratch.
void mhcCoeffsBackward(const ModelKernels &k, cublasHandle_t h, const float *x, const float *wmap, const float *alpha,
                       const float *aux, const float *dCoef, float *dx, float *dWmap, float *dBias,
                       float *dAlpha, float *stash, float *scratch, int64_t rows, int64_t C, int64_t n,
                       GradParts parts, cudaStream_t s);
void mhcPreForward(const ModelKernels &k, const float *x, const float *coef, float *u, int64_t rows, int64_t C, int64_t n,
                   cudaStream_t s);
void mhcPreBackward(const ModelKernels &k, const float *x, const float *coef, const float *du, float *dx, float *dCoef,
                    int64_t rows, int64_t C, int64_t n, cudaStream_t s);
void mhcPostResForward(const ModelKernels &k, const float *x, const float *coef, const float *y, float *out, int64_t rows,
                       int64_t C, int64_t n, cudaStream_t s);
void mhcPostResBackward(const ModelKernels &k, const float *x, const float *coef, const float *y, const float *dOut,
                        float *dx, float *dCoef, float *dy, int64_t rows, int64_t C, int64_t n,
                        cudaStream_t s);
void residualForward(const ModelKernels &k, const float *x, const float *y, float *out, int64_t count, cudaStream_t s);
void residualBackward(const ModelKernels &k, const float *dOut, float *dx, float *dy, int64_t count, cudaStream_t s);

void rmsNormForward(const ModelKernels &k, const float *u, const float *gain, float *y, float *aux, int64_t rows, int64_t C,
                    double eps, cudaStream_t s);
/// scratch: rmsNormBackwardScratch (partial column sums of dGain).
void rmsNormBackward(const ModelKernels &k, const float *u, const float *gain, const float *aux, const float *dy, float *du,
                     float *dGain, float *scratch, int64_t rows, int64_t C, GradParts parts, cudaStream_t s);

/// aux layout as on the CPU: [rows, 3C] rotated q, k, v; [rows, C] o;
/// [rows, heads] log-sum-exp. Scores and probabilities of one sequence live
/// in scratch (all heads: heads * seq^2 floats, twice in the backward);
/// products through cuBLAS strided-batched GEMMs, causal softmax and its
/// backward one block per row. scratch: attention{Forward,Backward}Scratch;
/// stash (backward): attentionBackwardStash, the gradient of q, k, v.
void attentionForward(const ModelKernels &k, cublasHandle_t h, const float *x, const float *wqkv, const float *wo, float *y,
                      float *aux, float *scratch, int64_t rows, int64_t C, int64_t heads, int64_t seq,
                      cudaStream_t s);
void attentionBackward(const ModelKernels &k, cublasHandle_t h, const float *x, const float *wqkv, const float *wo,
                       const float *aux, const float *dy, float *dx, float *dWqkv, float *dWo,
                       float *stash, float *scratch, int64_t rows, int64_t C, int64_t heads, int64_t seq,
                       GradParts parts, cudaStream_t s);

/// Backward: stash swigluBackwardStash (the gate and up gradients), scratch
/// swigluBackwardScratch.
void swigluForward(const ModelKernels &k, cublasHandle_t h, const float *x, const float *wg, const float *wu, const float *wd,
                   float *y, float *aux, int64_t rows, int64_t C, int64_t F, cudaStream_t s);
void swigluBackward(const ModelKernels &k, cublasHandle_t h, const float *x, const float *wg, const float *wu,
                    const float *wd, const float *aux, const float *dy, float *dx, float *dWg,
                    float *dWu, float *dWd, float *stash, float *scratch, int64_t rows, int64_t C, int64_t F,
                    GradParts parts, cudaStream_t s);

void concatProjForward(cublasHandle_t h, const float *a, const float *b, const float *w, float *z,
                       int64_t rows, int64_t C, int64_t N);
void concatProjBackward(cublasHandle_t h, const float *a, const float *b, const float *w,
                        const float *dz, float *da, float *db, float *dW, int64_t rows, int64_t C,
                        int64_t N, GradParts parts);

/// loss: one device float (mean over unmasked rows).
void crossEntropyForward(const ModelKernels &k, const float *logits, const int32_t *labels, float *aux, float *loss,
                         int64_t rows, int64_t V, int64_t shift, int64_t seq, cudaStream_t s);
void crossEntropyBackward(const ModelKernels &k, const float *logits, const int32_t *labels, const float *aux, float scale,
                          float *dLogits, int64_t rows, int64_t V, int64_t shift, int64_t seq,
                          cudaStream_t s);

// ---- optimizer (the math of runtime/train/Optimizer.cpp, on the device) ----

/// out[0] = sum of squares (double), out[1] = number of zeros; the summation
/// order depends on `count` alone. partials: squaresAndZerosScratch() doubles.
void squaresAndZeros(const float *g, int64_t count, double *out, double *partials, cudaStream_t s);
int64_t squaresAndZerosScratch();
void adamW(float *w, const float *g, float *m, float *v, int64_t count, float lr, float clip, float beta1,
           float beta2, float eps, float correction1, float correction2, float decay, cudaStream_t s);
void sgd(float *w, const float *g, int64_t count, float lr, float clip, cudaStream_t s);

} // namespace mhcc::runtime::cuda

#endif // MHCC_RUNTIME_CUDA_DEVICEKERNELS_H
