//===- gemm_bench.cu - the ceilings the bf16 work is measured against ------===//
//
// Prints, for one GPU: the device-to-device copy bandwidth (bytes read plus
// written), and for every GEMM shape of the 1b model's step (forward, input
// gradient, weight gradient; T = 2048 tokens per microbatch) the TFLOP/s of
// cuBLASLt in bf16 with fp32 accumulation (the algorithm the heuristic picks
// first, its split-K and reduction scheme named: issue 12 needs one without
// atomics) beside cuBLAS fp32 without TF32 (what the backend runs today),
// and whether two runs gave the same bits. Random inputs, medians of 20
// timed runs after 3 warm-ups, CUDA events. Prints numbers, asserts nothing;
// exit 1 only when a CUDA call fails.
//
// usage: gemm_bench [--tokens T]
//
//===----------------------------------------------------------------------===//
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "tools/BenchTiming.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

#define CHECK_BLAS(call)                                                                            \
  do {                                                                                              \
    int blasStatus_ = static_cast<int>(call);                                                       \
    if (blasStatus_ != 0) {                                                                         \
      std::fprintf(stderr, "gemm_bench: %s: status %d\n", #call, blasStatus_);                      \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

__global__ void toBf16(const float *in, __nv_bfloat16 *out, size_t n) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n)
    out[i] = __float2bfloat16_rn(in[i]);
}


struct Shape {
  const char *name;
  int64_t m, n, k; // row-major C[m, n] = A[m, k] B[k, n] (op applied)
  bool aT, bT;     // A or B stored transposed
  bool fp32Out;    // weight gradients: fp32 main gradient, accumulated (beta = 1)
};

bool sameBytes(const void *a, const void *b, size_t bytes) {
  std::vector<char> x(bytes), y(bytes);
  CHECK_CUDA(cudaMemcpy(x.data(), a, bytes, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(y.data(), b, bytes, cudaMemcpyDeviceToHost));
  return std::memcmp(x.data(), y.data(), bytes) == 0;
}

/// One bf16 GEMM through cuBLASLt (row-major via the transposed problem).
struct LtGemm {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::string algoName;
  bool ok = false;

  LtGemm(cublasLtHandle_t lt, const Shape &s, size_t workspace) {
    // Row-major C = A B is column-major C^T = B^T A^T: swap the operands.
    cublasOperation_t opB = s.bT ? CUBLAS_OP_T : CUBLAS_OP_N, opA = s.aT ? CUBLAS_OP_T : CUBLAS_OP_N;
    CHECK_BLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opB, sizeof opB));
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opA, sizeof opA));
    // Column-major views: B^T is [n, k] (ld n) unless stored transposed.
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, s.bT ? s.k : s.n, s.bT ? s.n : s.k, s.bT ? s.k : s.n));
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, s.aT ? s.m : s.k, s.aT ? s.k : s.m, s.aT ? s.m : s.k));
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&c, s.fp32Out ? CUDA_R_32F : CUDA_R_16BF, s.n, s.m, s.n));
    cublasLtMatmulPreference_t pref;
    CHECK_BLAS(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                    sizeof workspace));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    CHECK_BLAS(cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, 1, &result, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0)
      return;
    algo = result.algo;
    int id = 0, splitK = 0, reduction = 0, tile = 0;
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &written);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitK, sizeof splitK, &written);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &reduction, sizeof reduction,
                                         &written);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &written);
    algoName = "algo " + std::to_string(id) + " tile " + std::to_string(tile) + " splitK " +
               std::to_string(splitK) + " reduction " + std::to_string(reduction);
    ok = true;
  }
  ~LtGemm() {
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(op);
  }
  void run(cublasLtHandle_t lt, const void *A, const void *B, void *C, float beta, void *ws, size_t wsBytes) {
    const float one = 1.0f;
    CHECK_BLAS(cublasLtMatmul(lt, op, &one, B, a, A, b, &beta, C, c, C, c, &algo, ws, wsBytes, 0));
  }
};

} // namespace

int main(int argc, char **argv) {
  int64_t T = 2048;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--tokens")
      T = std::atoll(argv[i + 1]);
  const int64_t C = 2048, F = 5632, V = 32000, nC = 4 * 2048, K = 4 * 4 + 2 * 4;
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("gemm_bench: %s, %d SMs, T = %lld tokens per microbatch (1b: C %lld, F %lld, V %lld, n*C %lld)\n",
              prop.name, prop.multiProcessorCount, (long long)T, (long long)C, (long long)F, (long long)V,
              (long long)nC);

  // Copy bandwidth: 2 GiB each way, bytes read plus written.
  const size_t copyBytes = size_t(2) << 30;
  void *src, *dst;
  CHECK_CUDA(cudaMalloc(&src, copyBytes));
  CHECK_CUDA(cudaMalloc(&dst, copyBytes));
  CHECK_CUDA(cudaMemset(src, 1, copyBytes));
  float copyMs = medianMs([&] { CHECK_CUDA(cudaMemcpyAsync(dst, src, copyBytes, cudaMemcpyDeviceToDevice)); });
  std::printf("copy: %.1f GB/s (read + write)\n", 2.0 * copyBytes / copyMs / 1e6);
  CHECK_CUDA(cudaFree(src));
  CHECK_CUDA(cudaFree(dst));

  const std::vector<Shape> shapes = {
      {"fwd qkv", T, 3 * C, C, false, false, false},   {"fwd attn out", T, C, C, false, false, false},
      {"fwd gate+up", T, 2 * F, C, false, false, false}, {"fwd down", T, C, F, false, false, false},
      {"fwd lm head", T, V, C, false, false, false},    {"fwd mhc map", T, K, nC, false, false, false},
      {"dgrad qkv", T, C, 3 * C, false, true, false},    {"dgrad gate+up", T, C, 2 * F, false, true, false},
      {"dgrad down", T, F, C, false, true, false},       {"dgrad lm head", T, C, V, false, true, false},
      {"wgrad qkv", C, 3 * C, T, true, false, true},     {"wgrad gate+up", C, 2 * F, T, true, false, true},
      {"wgrad down", F, C, T, true, false, true},        {"wgrad lm head", C, V, T, true, false, true},
      {"wgrad mhc map", nC, K, T, true, false, true},
  };
  cublasLtHandle_t lt;
  cublasHandle_t blas;
  CHECK_BLAS(cublasLtCreate(&lt));
  CHECK_BLAS(cublasCreate(&blas));
  CHECK_BLAS(cublasSetMathMode(blas, CUBLAS_PEDANTIC_MATH));
  const size_t wsBytes = size_t(64) << 20;
  void *ws;
  CHECK_CUDA(cudaMalloc(&ws, wsBytes));
  std::printf("%-14s %6s %6s %6s  %9s %9s  %-5s  %s\n", "gemm", "m", "n", "k", "bf16 TF/s", "fp32 TF/s", "same",
              "cuBLASLt algorithm");
  for (const Shape &s : shapes) {
    const size_t aCount = size_t(s.m) * s.k, bCount = size_t(s.k) * s.n, cCount = size_t(s.m) * s.n;
    float *A32, *B32, *C32, *D32;
    __nv_bfloat16 *A, *B;
    void *Cx, *Cy;
    const size_t cBytes = cCount * (s.fp32Out ? 4 : 2);
    CHECK_CUDA(cudaMalloc(&A32, aCount * 4));
    CHECK_CUDA(cudaMalloc(&B32, bCount * 4));
    CHECK_CUDA(cudaMalloc(&C32, cCount * 4));
    CHECK_CUDA(cudaMalloc(&D32, cCount * 4));
    CHECK_CUDA(cudaMalloc(&A, aCount * 2));
    CHECK_CUDA(cudaMalloc(&B, bCount * 2));
    CHECK_CUDA(cudaMalloc(&Cx, cBytes));
    CHECK_CUDA(cudaMalloc(&Cy, cBytes));
    fillRandom<<<unsigned((aCount + 255) / 256), 256>>>(A32, aCount, 1, 1.0f);
    fillRandom<<<unsigned((bCount + 255) / 256), 256>>>(B32, bCount, 2, 0.05f);
    toBf16<<<unsigned((aCount + 255) / 256), 256>>>(A32, A, aCount);
    toBf16<<<unsigned((bCount + 255) / 256), 256>>>(B32, B, bCount);
    CHECK_CUDA(cudaMemset(Cx, 0, cBytes));
    CHECK_CUDA(cudaMemset(Cy, 0, cBytes));
    CHECK_CUDA(cudaDeviceSynchronize());
    const double flops = 2.0 * s.m * s.n * s.k;
    const float beta = s.fp32Out ? 1.0f : 0.0f;
    LtGemm g(lt, s, wsBytes);
    double bf16Tf = 0;
    bool same = false;
    if (g.ok) {
      bf16Tf = flops / medianMs([&] { g.run(lt, A, B, Cx, beta, ws, wsBytes); }) / 1e9;
      // Determinism: the same call twice from the same C gives the same bits.
      CHECK_CUDA(cudaMemset(Cx, 0, cBytes));
      CHECK_CUDA(cudaMemset(Cy, 0, cBytes));
      g.run(lt, A, B, Cx, beta, ws, wsBytes);
      g.run(lt, A, B, Cy, beta, ws, wsBytes);
      CHECK_CUDA(cudaDeviceSynchronize());
      same = sameBytes(Cx, Cy, cBytes);
    }
    // fp32, no TF32, as the backend runs today (column-major swap as above).
    const float one = 1.0f, zero = 0.0f;
    double fp32Tf = flops / medianMs([&] {
                      CHECK_BLAS(cublasSgemm(blas, s.bT ? CUBLAS_OP_T : CUBLAS_OP_N, s.aT ? CUBLAS_OP_T : CUBLAS_OP_N,
                                             int(s.n), int(s.m), int(s.k), &one, B32, int(s.bT ? s.k : s.n), A32,
                                             int(s.aT ? s.m : s.k), &zero, D32, int(s.n)));
                    }) /
                    1e9;
    std::printf("%-14s %6lld %6lld %6lld  %9.1f %9.1f  %-5s  %s\n", s.name, (long long)s.m, (long long)s.n,
                (long long)s.k, bf16Tf, fp32Tf, g.ok ? (same ? "yes" : "NO") : "-",
                g.ok ? g.algoName.c_str() : "no algorithm");
    for (void *p : {(void *)A32, (void *)B32, (void *)C32, (void *)D32, (void *)A, (void *)B, Cx, Cy})
      cudaFree(p);
  }
  cudaFree(ws);
  cublasLtDestroy(lt);
  cublasDestroy(blas);
  return 0;
}
