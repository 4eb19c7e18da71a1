//===- AttentionKernels.cu - causal attention with RoPE on the GPU ----------===//
//
// The projections, RoPE and the output product around one of two cores:
// flash attention (FlashAttention.h) for bf16 models with a head dimension
// it supports, else the reference core below: per sequence, the scores and
// probabilities of all heads in fp32 scratch, products through cuBLAS
// strided-batched SGEMMs, causal softmax one block per row (the fp32 path
// whose bits the fp32 goldens hold). A bf16 model on the reference core
// widens q, k, v and dO to fp32 scratch and rounds o and dQKV back.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/DeviceKernelsImpl.h"
#include "runtime/cuda/FlashAttention.h"

#include <cublas_v2.h>

#include <cmath>
#include <cstdlib>
#include <string>

namespace mhcc::runtime::cuda {
namespace {

/// Column-major strided-batched product (one batch entry per attention head).
void gemmBatched(Gemms &g, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                 float alpha, const float *a, int64_t lda, int64_t strideA, const float *b, int64_t ldb,
                 int64_t strideB, float *c, int64_t ldc, int64_t strideC, int64_t batch) {
  const float zero = 0.0f;
  cublasSgemmStridedBatched(g.blas(), ta, tb, int(m), int(n), int(k), &alpha, a, int(lda), strideA, b, int(ldb),
                            strideB, &zero, c, int(ldc), strideC, int(batch));
}

/// Flash attention's shapes (FlashAttention.h): head dim 64 or 128, whole key
/// tiles. MHCC_ATTENTION=reference forces the reference core, to tell a
/// flash-attention problem from any other (docs/precision.md).
bool useFlash(int64_t C, int64_t heads, int64_t seq, int actBytes) {
  static const bool reference = [] {
    const char *choice = std::getenv("MHCC_ATTENTION");
    return choice && std::string(choice) == "reference";
  }();
  const int64_t d = C / heads;
  return actBytes == 2 && !reference && (d == 64 || d == 128) && seq % 64 == 0;
}

/// o and lse from the rotated q, k, v (all fp32); scores: heads * seq^2.
void referenceForward(const ModelKernels &k, Gemms &g, const float *qkv, float *o, float *lse, float *scores,
                      int64_t rows, int64_t C, int64_t heads, int64_t seq, const int32_t *firstKeys,
                      cudaStream_t s) {
  const int64_t d = C / heads;
  const float scale = 1.0f / std::sqrt(float(d));
  // Per sequence, all heads at once (row-major S = scale Q K^T, O = P V
  // through column-major GEMMs on the strided q / k / v columns).
  for (int64_t b = 0; b < rows / seq; ++b) {
    const float *q = qkv + b * seq * 3 * C, *kk = q + C, *v = q + 2 * C;
    gemmBatched(g, CUBLAS_OP_T, CUBLAS_OP_N, seq, seq, d, scale, kk, 3 * C, d, q, 3 * C, d, scores, seq, seq * seq,
                heads);
    k.launch(ModelKernel::CausalSoftmax, unsigned(heads * seq), 1, kThreads, s, scores, lse, firstKeys, seq, heads,
             int64_t(b * seq));
    gemmBatched(g, CUBLAS_OP_N, CUBLAS_OP_N, d, seq, seq, 1.0f, v, 3 * C, d, scores, seq, seq * seq, o + b * seq * C,
                C, d, heads);
  }
}

/// dQkv (rows x 3C, before RoPE is undone) from dO (all fp32); scratch:
/// 2 heads seq^2.
void referenceBackward(const ModelKernels &k, Gemms &g, const float *qkv, const float *lse, const float *dO,
                       float *dQkv, float *scratch, int64_t rows, int64_t C, int64_t heads, int64_t seq,
                       const int32_t *firstKeys, cudaStream_t s) {
  float *probs = scratch, *dScores = probs + heads * seq * seq;
  const int64_t d = C / heads;
  const float scale = 1.0f / std::sqrt(float(d));
  for (int64_t b = 0; b < rows / seq; ++b) {
    const float *q = qkv + b * seq * 3 * C, *kk = q + C, *v = q + 2 * C, *gO = dO + b * seq * C;
    float *dq = dQkv + b * seq * 3 * C, *dk = dq + C, *dv = dq + 2 * C;
    // Scores again (the same GEMM as the forward, so the same bits), dP = dO V^T.
    gemmBatched(g, CUBLAS_OP_T, CUBLAS_OP_N, seq, seq, d, scale, kk, 3 * C, d, q, 3 * C, d, probs, seq, seq * seq,
                heads);
    gemmBatched(g, CUBLAS_OP_T, CUBLAS_OP_N, seq, seq, d, 1.0f, v, 3 * C, d, gO, C, d, dScores, seq, seq * seq,
                heads);
    k.launch(ModelKernel::CausalSoftmaxBackward, unsigned(heads * seq), 1, kThreads, s, probs, dScores, lse,
             firstKeys, seq, heads, int64_t(b * seq), scale);
    // dQ = dS K, dK = dS^T Q, dV = P^T dO.
    gemmBatched(g, CUBLAS_OP_N, CUBLAS_OP_N, d, seq, seq, 1.0f, kk, 3 * C, d, dScores, seq, seq * seq, dq, 3 * C, d,
                heads);
    gemmBatched(g, CUBLAS_OP_N, CUBLAS_OP_T, d, seq, seq, 1.0f, q, 3 * C, d, dScores, seq, seq * seq, dk, 3 * C, d,
                heads);
    gemmBatched(g, CUBLAS_OP_N, CUBLAS_OP_T, d, seq, seq, 1.0f, gO, C, d, probs, seq, seq * seq, dv, 3 * C, d,
                heads);
  }
}

template <typename A>
void rope(const ModelKernels &k, A *qkv, const int32_t *positions, int64_t rows, int64_t C, int64_t heads,
          int64_t seq, bool inverse, cudaStream_t s) {
  // One thread per (row, q or k, 4 pairs) where the head dim allows (any grid
  // is correct: the kernel loops grid-stride).
  const int64_t pairs = C / heads / 2;
  const float *table = k.ropeTable(seq, C / heads, s);
  if (!table)
    return; // the launch error names it (ModelKernels::takeError)
  k.launch(ModelKernel::Rope, blocks(rows * 2 * ((pairs + 3) / 4)), 1, kThreads, s, qkv, positions, table, rows, C,
           heads, seq, int(inverse), int64_t(3 * C));
}

} // namespace

int64_t attentionForwardScratch(int64_t rows, int64_t C, int64_t heads, int64_t seq, int actBytes) {
  if (useFlash(C, heads, seq, actBytes))
    return 0;
  return heads * seq * seq + (actBytes == 2 ? rows * 4 * C : 0); // scores; fp32 q, k, v and o
}

int64_t attentionAuxFloats(int64_t rows, int64_t C, int64_t heads, int actBytes) {
  return (4 * rows * C * actBytes + 3) / 4 + rows * heads; // q, k, v, o in A; log-sum-exp
}

int64_t attentionBackwardStash(int64_t rows, int64_t C) { return 3 * rows * C; }

// The backward's scratch: dO (rows * C floats, whatever its type), then the
// core's: flash attention's, or the reference core's probabilities and their
// gradients (and for bf16 fp32 copies of q, k, v, dO and dQKV).
int64_t attentionBackwardScratch(int64_t rows, int64_t C, int64_t heads, int64_t seq, int actBytes) {
  return rows * C + attentionCoreBackwardScratch(rows, C, heads, seq, actBytes);
}

template <typename A>
std::string attentionCoreForward(const ModelKernels &k, Gemms &g, A *qkv, A *o, float *lse, float *scratch,
                                 int64_t rows, int64_t D, int64_t heads, int64_t seq, DeviceDocuments docs,
                                 cudaStream_t s, FlashRowRanges needed) {
  rope(k, qkv, docs.positions, rows, D, heads, seq, false, s);
  if constexpr (std::is_same_v<A, float>) {
    referenceForward(k, g, qkv, o, lse, scratch, rows, D, heads, seq, docs.firstKeys, s);
    return "";
  } else if (useFlash(D, heads, seq, 2)) {
    return flashAttentionForward(qkv, o, lse, rows, D, heads, seq, docs.firstKeys, s, needed);
  } else {
    float *qkv32 = scratch + heads * seq * seq, *o32 = qkv32 + rows * 3 * D;
    toFloat(qkv, qkv32, rows * 3 * D, s);
    referenceForward(k, g, qkv32, o32, lse, scratch, rows, D, heads, seq, docs.firstKeys, s);
    toBf16(o32, o, rows * D, s);
    return "";
  }
}

int64_t attentionCoreBackwardScratch(int64_t rows, int64_t D, int64_t heads, int64_t seq, int actBytes) {
  if (useFlash(D, heads, seq, actBytes))
    return flashAttentionBackwardScratch(rows, D, heads);
  return 2 * heads * seq * seq + (actBytes == 2 ? 7 * rows * D : 0);
}

template <typename A>
std::string attentionCoreBackward(const ModelKernels &k, Gemms &g, const A *qkv, const A *o, const float *lse,
                                  const float *rowDot, const A *dO, A *dQkv, float *scratch, int64_t rows, int64_t D,
                                  int64_t heads, int64_t seq, DeviceDocuments docs, cudaStream_t s,
                                  FlashRowRanges needed) {
  std::string error;
  if constexpr (std::is_same_v<A, float>) {
    referenceBackward(k, g, qkv, lse, dO, dQkv, scratch, rows, D, heads, seq, docs.firstKeys, s);
  } else if (useFlash(D, heads, seq, 2)) {
    error = flashAttentionBackward(qkv, o, dO, lse, dQkv, scratch, rows, D, heads, seq, docs.firstKeys, s, rowDot,
                                   needed);
  } else {
    float *qkv32 = scratch + 2 * heads * seq * seq, *dO32 = qkv32 + rows * 3 * D, *dQkv32 = dO32 + rows * D;
    toFloat(qkv, qkv32, rows * 3 * D, s);
    toFloat(dO, dO32, rows * D, s);
    referenceBackward(k, g, qkv32, lse, dO32, dQkv32, scratch, rows, D, heads, seq, docs.firstKeys, s);
    toBf16(dQkv32, dQkv, rows * 3 * D, s);
  }
  rope(k, dQkv, docs.positions, rows, D, heads, seq, true, s);
  return error;
}

template <typename A>
std::string attentionRowDot(const A *o, const A *dO, float *rowDot, int64_t rows, int64_t D, int64_t heads,
                            int64_t seq, cudaStream_t s) {
  if constexpr (std::is_same_v<A, bf16>)
    if (useFlash(D, heads, seq, 2))
      return flashAttentionRowDot(o, dO, rowDot, rows, D, heads, s);
  // The reference core's softmax backward forms the row's sum from P and dP itself.
  cudaMemsetAsync(rowDot, 0, rows * heads * sizeof(float), s);
  return "";
}

template <typename A>
void attentionOutputGradient(Gemms &g, const A *dy, const A *wo, A *dO, int64_t rows, int64_t C, int64_t D,
                             cudaStream_t s) {
  overwriteTransB(g, dy, wo, dO, rows, C, D, s);
}

template <typename A>
void attentionInputGradient(Gemms &g, const A *dQkv, const A *wqkv, A *dx, int64_t rows, int64_t C, int64_t D,
                            bool fresh, cudaStream_t s) {
  intoTransB(g, dQkv, wqkv, dx, rows, 3 * D, C, fresh, s);
}

template <typename A>
std::string attentionForward(const ModelKernels &k, Gemms &g, const A *x, const A *wqkv, const A *wo, A *y,
                             float *aux, float *scratch, int64_t rows, int64_t C, int64_t inner, int64_t heads,
                             int64_t seq, DeviceDocuments docs, cudaStream_t s) {
  // Everything between the two projections is `inner` wide (this rank's heads).
  const int64_t D = inner;
  A *qkv = reinterpret_cast<A *>(aux), *o = qkv + rows * 3 * D;
  float *lse = reinterpret_cast<float *>(o + rows * D);
  matmul(g, x, wqkv, qkv, rows, C, 3 * D, false);
  const std::string error = attentionCoreForward(k, g, qkv, o, lse, scratch, rows, D, heads, seq, docs, s);
  matmul(g, o, wo, y, rows, D, C, false);
  return error;
}

template <typename A>
std::string attentionBackward(const ModelKernels &k, Gemms &g, const A *x, const A *wqkv, const A *wo,
                              const float *aux, const A *dy, A *dx, float *dWqkv, float *dWo, float *stash,
                              float *scratch, int64_t rows, int64_t C, int64_t inner, int64_t heads, int64_t seq,
                              GradParts parts, DeviceDocuments docs, cudaStream_t s, bool freshInput) {
  std::string error;
  const int64_t D = inner;
  const A *qkv = reinterpret_cast<const A *>(aux), *o = qkv + rows * 3 * D;
  const float *lse = reinterpret_cast<const float *>(o + rows * D);
  A *dQkv = reinterpret_cast<A *>(stash);
  if (parts.inputs) {
    A *dO = reinterpret_cast<A *>(scratch);
    attentionOutputGradient(g, dy, wo, dO, rows, C, D, s);
    error = attentionCoreBackward(k, g, qkv, o, lse, static_cast<const float *>(nullptr), dO, dQkv, scratch + rows * D,
                                  rows, D, heads, seq, docs, s);
    attentionInputGradient(g, static_cast<const A *>(dQkv), wqkv, dx, rows, C, D, freshInput, s);
  }
  if (parts.weights) {
    matmulTransAAcc(g, o, dy, dWo, rows, D, C);
    matmulTransAAcc(g, x, dQkv, dWqkv, rows, C, 3 * D);
  }
  return error;
}

template decltype(attentionForward<float>) attentionForward<float>;
template decltype(attentionForward<bf16>) attentionForward<bf16>;
template decltype(attentionBackward<float>) attentionBackward<float>;
template decltype(attentionBackward<bf16>) attentionBackward<bf16>;
template decltype(attentionCoreForward<float>) attentionCoreForward<float>;
template decltype(attentionCoreForward<bf16>) attentionCoreForward<bf16>;
template decltype(attentionCoreBackward<float>) attentionCoreBackward<float>;
template decltype(attentionCoreBackward<bf16>) attentionCoreBackward<bf16>;
template decltype(attentionRowDot<float>) attentionRowDot<float>;
template decltype(attentionRowDot<bf16>) attentionRowDot<bf16>;
template decltype(attentionOutputGradient<float>) attentionOutputGradient<float>;
template decltype(attentionOutputGradient<bf16>) attentionOutputGradient<bf16>;
template decltype(attentionInputGradient<float>) attentionInputGradient<float>;
template decltype(attentionInputGradient<bf16>) attentionInputGradient<bf16>;

} // namespace mhcc::runtime::cuda
