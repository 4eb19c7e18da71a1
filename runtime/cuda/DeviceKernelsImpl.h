//===- DeviceKernelsImpl.h - helpers shared by the .cu files of DeviceKernels -===//
//
// Included only by the CUDA sources behind DeviceKernels.h (nvcc).
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CUDA_DEVICEKERNELSIMPL_H
#define MHCC_RUNTIME_CUDA_DEVICEKERNELSIMPL_H

#include "runtime/cuda/DependentLaunch.cuh"
#include "runtime/cuda/DeviceKernels.h"
#include "runtime/cuda/Gemm.h"
#include "runtime/cuda/ModelKernels.h"

#include <cuda_bf16.h>
#include <type_traits>

namespace mhcc::runtime::cuda {
namespace {

constexpr int kThreads = kBlockThreads;

inline int blocks(int64_t count) { return static_cast<int>((count + kThreads - 1) / kThreads); }
inline int warpBlocks(int64_t rows) { return blocks(rows * 32); }

template <typename T> constexpr Dtype dtypeFor() { return std::is_same_v<T, float> ? Dtype::F32 : Dtype::BF16; }

/// Column sums over rows in two fixed stages, without atomics: the model's
/// kernel writes partial sums over chunks of kColumnChunkRows rows (rows
/// ascending), then the chunks are added in order here. The order depends on
/// the shapes alone.
inline int64_t columnChunks(int64_t rows) { return (rows + kColumnChunkRows - 1) / kColumnChunkRows; }

/// dst[c] += the chunks' partials of column c, in chunk order; with `dst2`,
/// columns from `split` on go to dst2[c - split] (two gradients in one launch).
/// The loads go out kBatch at a time (and dst's first), the adds stay in
/// chunk order: a thread waits for memory once a batch, not once a chunk.
__global__ void addColumnPartialsKernel(const float *partial, int64_t chunks, int64_t cols, float *dst,
                                        int64_t split, float *dst2) {
  dependentPrologue();
  constexpr int kBatch = 8;
  int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= cols)
    return;
  float *target = c < split ? dst + c : dst2 + (c - split);
  const float before = *target;
  float acc = 0;
  int64_t chunk = 0;
  for (; chunk + kBatch <= chunks; chunk += kBatch) {
    float v[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
      v[i] = partial[(chunk + i) * cols + c];
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
      acc += v[i];
  }
  for (; chunk < chunks; ++chunk)
    acc += partial[chunk * cols + c];
  *target = before + acc;
}

/// addColumnPartialsKernel over `cols` columns, launched as a dependent launch.
inline void addColumnPartials(const float *partial, int64_t chunks, int64_t cols, float *dst, cudaStream_t s,
                              int64_t split = INT64_MAX, float *dst2 = nullptr) {
  launchDependent(addColumnPartialsKernel, dim3(unsigned(blocks(cols))), dim3(kThreads), 0, s, partial, chunks, cols,
                  dst, split, dst2);
}

/// dst[c] += sum over t of the summands `partials` produces (a model kernel
/// taking `args...` and then `partial`); partial: columnChunks(rows) * cols floats.
template <typename... Args>
void addColumnSums(const ModelKernels &k, ModelKernel partials, int64_t rows, int64_t cols, float *partial,
                   float *dst, cudaStream_t s, Args... args) {
  if (rows == 0)
    return;
  k.launch(partials, unsigned(blocks(cols)), unsigned(columnChunks(rows)), kThreads, s, args..., partial);
  addColumnPartials(partial, columnChunks(rows), cols, dst, s);
}

/// c[M,K] = a[M,N] b[K,N]^T. fp32 keeps the zero fill and accumulating
/// product its goldens were made with; bf16 writes once (beta = 0).
template <typename A>
void overwriteTransB(Gemms &g, const A *a, const A *b, A *c, int64_t M, int64_t N, int64_t K, cudaStream_t s) {
  if constexpr (std::is_same_v<A, float>) {
    fill(c, M * K, 0.0f, s);
    matmulTransBAcc(g, a, b, c, M, N, K);
  } else {
    g.run({false, true, M, K, N, N, N, K, Dtype::BF16, Dtype::BF16}, a, b, c, 1.0f, 0.0f);
  }
}

/// c[M,K] (+)= a[M,N] b[K,N]^T: written when c is `fresh` (overwriteTransB:
/// in bf16 beta = 0 with the plan's algorithm, so the bits of adding into
/// zeros), else added into.
template <typename A>
void intoTransB(Gemms &g, const A *a, const A *b, A *c, int64_t M, int64_t N, int64_t K, bool fresh, cudaStream_t s) {
  if (fresh)
    overwriteTransB(g, a, b, c, M, N, K, s);
  else
    matmulTransBAcc(g, a, b, c, M, N, K);
}

} // namespace
} // namespace mhcc::runtime::cuda

#endif // MHCC_RUNTIME_CUDA_DEVICEKERNELSIMPL_H
