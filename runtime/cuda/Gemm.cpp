//===- Gemm.cpp - cuBLAS / cuBLASLt products with fixed algorithms ----------===//
#include "runtime/cuda/Gemm.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace mhcc::runtime::cuda {

namespace {
cublasLtHandle_t ltHandle(void *p) { return static_cast<cublasLtHandle_t>(p); }
cudaDataType_t cudaType(Dtype d) { return d == Dtype::BF16 ? CUDA_R_16BF : CUDA_R_32F; }
const char *dtypeName(Dtype d) { return d == Dtype::BF16 ? "bf16" : "f32"; }
} // namespace

/// A cuBLASLt product of one shape: its descriptors and the chosen algorithm.
struct Gemms::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::string chosen;
  ~Plan() {
    if (first)
      cublasLtMatrixLayoutDestroy(first);
    if (second)
      cublasLtMatrixLayoutDestroy(second);
    if (out)
      cublasLtMatrixLayoutDestroy(out);
    if (op)
      cublasLtMatmulDescDestroy(op);
  }
};

std::string GemmShape::describe() const {
  return std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) + (transA ? " A^T" : "") +
         (transB ? " B^T" : "") + " " + dtypeName(operands) + "->" + dtypeName(output);
}

Gemms::Gemms() = default;

Gemms::~Gemms() {
  plans_.clear();
  if (lt_)
    cublasLtDestroy(ltHandle(lt_));
  if (blas_)
    cublasDestroy(blas_);
  cudaFree(workspace_);
}

std::string Gemms::init(cudaStream_t stream) {
  stream_ = stream;
  cublasLtHandle_t lt = nullptr;
  if (cublasCreate(&blas_) != CUBLAS_STATUS_SUCCESS || cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS)
    return "cannot create the cuBLAS / cuBLASLt handles";
  lt_ = lt;
  cublasSetStream(blas_, stream);
  cublasSetMathMode(blas_, CUBLAS_PEDANTIC_MATH); // fp32, no TF32
  if (cudaMalloc(&workspace_, kGemmWorkspaceBytes) != cudaSuccess)
    return "out of GPU memory for the cuBLASLt workspace";
  return "";
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the
// column-major call takes B first, A second, m = N, n = M.
const Gemms::Plan *Gemms::plan(const GemmShape &s) {
  auto found = plans_.find(s);
  if (found != plans_.end())
    return found->second.get();
  auto p = std::make_unique<Plan>();
  const cublasOperation_t opFirst = s.transB ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opSecond = s.transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cudaDataType_t in = cudaType(s.operands), out = cudaType(s.output);
  bool ok = cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opFirst, sizeof opFirst) ==
                CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opSecond, sizeof opSecond) ==
                CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&p->first, in, s.transB ? s.K : s.N, s.transB ? s.N : s.K, s.ldb) ==
                CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&p->second, in, s.transA ? s.M : s.K, s.transA ? s.K : s.M, s.lda) ==
                CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&p->out, out, s.N, s.M, s.ldc) == CUBLAS_STATUS_SUCCESS;
  cublasLtMatmulPreference_t pref = nullptr;
  ok = ok && cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS;
  if (ok) {
    const size_t workspace = kGemmWorkspaceBytes;
    const uint32_t align = 16; // what every operand here guarantees (row strides are multiples of 8 elements)
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace);
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    ok = cublasLtMatmulAlgoGetHeuristic(ltHandle(lt_), p->op, p->first, p->second, p->out, p->out, pref, 1, &result,
                                        &found) == CUBLAS_STATUS_SUCCESS &&
         found > 0;
    if (ok) {
      p->algo = result.algo;
      int id = 0, tile = 0, stages = 0, splitK = 0, reduction = 0;
      size_t written = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &written);
      cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &written);
      cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &written);
      cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitK, sizeof splitK, &written);
      cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &reduction,
                                           sizeof reduction, &written);
      p->chosen = s.describe() + ": algo " + std::to_string(id) + " tile " + std::to_string(tile) + " stages " +
                  std::to_string(stages) + " split-k " + std::to_string(splitK) + " reduction " +
                  std::to_string(reduction) + " workspace " + std::to_string(result.workspaceSize);
    }
  }
  if (pref)
    cublasLtMatmulPreferenceDestroy(pref);
  if (!ok) {
    if (error_.empty())
      error_ = "cuBLASLt has no algorithm for the product " + s.describe();
    return nullptr;
  }
  return (plans_[s] = std::move(p)).get();
}

void Gemms::run(const GemmShape &s, const void *a, const void *b, void *c, float alpha, float beta) {
  if (s.M == 0 || s.N == 0)
    return;
  if (s.operands == Dtype::F32) {
    cublasStatus_t status =
        cublasSgemm(blas_, s.transB ? CUBLAS_OP_T : CUBLAS_OP_N, s.transA ? CUBLAS_OP_T : CUBLAS_OP_N, int(s.N),
                    int(s.M), int(s.K), &alpha, static_cast<const float *>(b), int(s.ldb),
                    static_cast<const float *>(a), int(s.lda), &beta, static_cast<float *>(c), int(s.ldc));
    if (status != CUBLAS_STATUS_SUCCESS && error_.empty())
      error_ = "cublasSgemm failed on " + s.describe() + " (status " + std::to_string(int(status)) + ")";
    return;
  }
  const Plan *p = plan(s);
  if (!p)
    return;
  cublasStatus_t status = cublasLtMatmul(ltHandle(lt_), p->op, &alpha, b, p->first, a, p->second, &beta, c, p->out,
                                         c, p->out, &p->algo, workspace_, kGemmWorkspaceBytes, stream_);
  if (status != CUBLAS_STATUS_SUCCESS && error_.empty())
    error_ = "cublasLtMatmul failed on " + s.describe() + " (status " + std::to_string(int(status)) + ")";
}

std::string Gemms::takeError() {
  std::string e;
  e.swap(error_);
  return e;
}

std::vector<std::string> Gemms::algorithms() const {
  std::vector<std::string> lines;
  for (const auto &[shape, p] : plans_)
    lines.push_back(p->chosen);
  return lines;
}

} // namespace mhcc::runtime::cuda
