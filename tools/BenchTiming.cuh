//===- BenchTiming.cuh - what the GPU benchmarks share ----------*- CUDA -*-===//
//
// Included by tools/gemm_bench.cu and tools/attention_bench.cu: the CUDA
// error check (one line naming the program and the call, exit 1) and the
// median time of a queued body.
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
