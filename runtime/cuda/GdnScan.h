//===- GdnScan.h - the Gated DeltaNet recurrence on the GPU -----*- C++ -*-===//
//
// The scans GdnKernels.cu runs between its projections: the state
// recurrence of runtime/cpu/GdnKernels.h's gdnScan, forward and backward, in
// the chunked WY form (GdnWy.cu). Included only by the CUDA sources behind
// DeviceKernels.h (nvcc).
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CUDA_GDNSCAN_H
#define MHCC_RUNTIME_CUDA_GDNSCAN_H

#include <cstdint>
#include <string>

typedef struct CUstream_st *cudaStream_t;

namespace mhcc::runtime::cuda {

/// First key of row t's document in its sequence (0: one document).
__device__ inline int64_t firstKeyOf(const int32_t *firstKeys, int64_t t) { return firstKeys ? firstKeys[t] : 0; }

/// Floats of scratch the forward or backward scans need for `rows` tokens.
int64_t gdnScanScratchFloats(bool backward, int64_t rows, int64_t C, int64_t H, int64_t seq);

/// a: [rows, 3C] normalized q, k and v; gates: [rows, 2H] alpha then beta.
/// Forward: o = S_t q_t / sqrt(d) into o [rows, C]. Backward (dO: the
/// gradient of o): the gradients of q, k, v into dA [rows, 3C], of beta's
/// logit into dAb[t, h] (of [rows, 2H]) and of log alpha into dLogAlpha
/// [rows, H]. `scratch`: gdnScanScratchFloats(backward, ...) floats.
/// "" or a one-line error (an unsupported head dim, a launch).
std::string gdnScans(bool backward, const float *a, const float *gates, const float *dO, float *o, float *dA,
                     float *dAb, float *dLogAlpha, float *scratch, int64_t rows, int64_t C, int64_t H, int64_t seq,
                     const int32_t *firstKeys, cudaStream_t s);

} // namespace mhcc::runtime::cuda

#endif // MHCC_RUNTIME_CUDA_GDNSCAN_H
