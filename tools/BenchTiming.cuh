//===- BenchTiming.cuh - what the GPU benchmarks share ----------*- CUDA -*-===//
//
// Included by tools/gemm_bench.cu and tools/attention_bench.cu: the CUDA
// error check (one line naming the program and the call, exit 1), the median
// time of a queued body, and reproducible random operands.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_TOOLS_BENCHTIMING_CUH
#define MHCC_TOOLS_BENCHTIMING_CUH

#include <cuda_runtime.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK_CUDA(call)                                                                            \
  do {                                                                                              \
    cudaError_t e = (call);                                                                         \
    if (e != cudaSuccess) {                                                                         \
      std::fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, #call, cudaGetErrorString(e)); \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

/// p[i] = a hash of (i, seed) scaled into [-scale, scale), converted to T
/// (float, or bf16 rounded to nearest even): the same operands every run.
template <typename T> __global__ void fillRandom(T *p, size_t n, unsigned seed, float scale) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= n)
    return;
  unsigned x = unsigned(i) * 2654435761u ^ seed;
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  x ^= x >> 15;
  p[i] = T(scale * (float(x & 0xffffff) / float(0x800000) - 1.0f));
}

/// Median milliseconds of `body` over 20 runs after 3 warm-ups.
template <typename Body> float medianMs(Body body) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i)
    body();
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    CHECK_CUDA(cudaEventRecord(start));
    body();
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

#endif // MHCC_TOOLS_BENCHTIMING_CUH
