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

/// Floats the forward scans leave for the backward (`kept`: the chunks'
/// pseudo-values U, the W of their WY form, each chunk's starting state
/// and the gate table), and floats of scratch the backward needs besides.
int64_t gdnScanKeptFloats(int64_t rows, int64_t C, int64_t H, int64_t seq);
int64_t gdnScanScratchFloats(int64_t rows, int64_t C, int64_t H, int64_t seq);

/// a: [rows, 3C] normalized q, k and v; gates: [rows, 2H] alpha then beta.
/// Forward: o = S_t q_t / sqrt(d) into o [rows, C], and `kept`
/// (gdnScanKeptFloats) filled. Backward (dO: the gradient of o; `kept` as
/// the forward of the same a and gates left it, read only; `gates` unused):
/// the gradients of q, k, v into dA [rows, 3C], of beta's logit into
/// dAb[t, h] (of [rows, 2H]) and of log alpha into dLogAlpha [rows, H];
/// `scratch`: gdnScanScratchFloats floats. "" or a one-line error (an
/// unsupported head dim, a launch).
std::string gdnScans(bool backward, const float *a, const float *gates, const float *dO, float *o, float *dA,
                     float *dAb, float *dLogAlpha, float *kept, float *scratch, int64_t rows, int64_t C, int64_t H,
                     int64_t seq, const int32_t *firstKeys, cudaStream_t s);

} // namespace mhcc::runtime::cuda

#endif // MHCC_RUNTIME_CUDA_GDNSCAN_H
