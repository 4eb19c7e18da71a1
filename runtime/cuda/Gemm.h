//===- Gemm.h - the GPU backend's matrix products -------------------*- C++ -*-===//
//
// Row-major products C = alpha op(A) op(B) + beta C for one rank, on its
// compute stream. fp32 models go through cuBLAS SGEMM without TF32 (the bits
// their goldens hold). bf16 models go through cuBLASLt: bf16 operands, fp32
// accumulation, C stored in bf16 (activations, their gradients) or fp32 (the
// weights' main gradients, added into with beta = 1). cuBLASLt's heuristic
// picks the algorithm once per shape (for 16-byte aligned operands, so the
// choice never depends on where a buffer happens to lie); it is then reused
// and listed by algorithms(): the bits depend on the shapes alone, as layout
// parity needs. Every split-K reduction cuBLASLt offers is deterministic.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CUDA_GEMM_H
#define MHCC_RUNTIME_CUDA_GEMM_H

#include "runtime/program/Dtype.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

typedef struct CUstream_st *cudaStream_t;
typedef struct cublasContext *cublasHandle_t;

namespace mhcc::runtime::cuda {

/// One product: C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C. Row-major;
/// op(A) = A^T when transA (A stored [K,M]); lda / ldb / ldc are the stored
/// rows' lengths.
struct GemmShape {
  bool transA = false, transB = false;
  int64_t M = 0, N = 0, K = 0, lda = 0, ldb = 0, ldc = 0;
  Dtype operands = Dtype::F32, output = Dtype::F32;
  auto key() const { return std::tie(transA, transB, M, N, K, lda, ldb, ldc, operands, output); }
  bool operator<(const GemmShape &o) const { return key() < o.key(); }
  std::string describe() const;
};

class Gemms {
public:
  Gemms();
  ~Gemms();
  Gemms(const Gemms &) = delete;
  Gemms &operator=(const Gemms &) = delete;

  /// Handles and the cuBLASLt workspace on the current device; "" or the error.
  std::string init(cudaStream_t stream);
  /// The cuBLAS handle of fp32 products (also the batched ones of attention).
  cublasHandle_t blas() const { return blas_; }

  /// Queues one product on the stream. bf16 operands need output F32 or BF16;
  /// fp32 operands need F32. Errors are kept for takeError().
  void run(const GemmShape &shape, const void *a, const void *b, void *c, float alpha, float beta);

  /// "" or the first failure since the last call (then cleared).
  std::string takeError();
  /// Every cuBLASLt shape used so far with its algorithm (id, tile, stages,
  /// split-K, reduction scheme), one line each.
  std::vector<std::string> algorithms() const;

private:
  struct Plan;
  const Plan *plan(const GemmShape &shape);

  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void *lt_ = nullptr; // cublasLtHandle_t
  void *workspace_ = nullptr;
  std::map<GemmShape, std::unique_ptr<Plan>> plans_;
  std::string error_;
};

/// Bytes of cuBLASLt workspace per rank (fixed: the heuristic's choice may
/// depend on it).
inline constexpr size_t kGemmWorkspaceBytes = size_t(32) << 20;

} // namespace mhcc::runtime::cuda

#endif // MHCC_RUNTIME_CUDA_GEMM_H
