//===- FlashAttention.h - bf16 causal flash attention on tensor cores -*- C++ -*-===//
//
// Causal multi-head self-attention over bf16 q, k, v with fp32 softmax and
// accumulation (FlashAttention-2: online softmax, scores never stored), the
// bf16 path of runtime/cpu/AttentionKernels.h without the rotary step and
// the projections: scores = scale * q.k with scale = 1/sqrt(d), the
// probabilities are bf16 only as tensor-core operands, o is rounded once
// (docs/precision.md). Deterministic: no atomics; every output element is
// written once by one thread block, summed in an order fixed by the shapes.
// Head dims 64 and 128; seq a multiple of 64. All pointers are device
// pointers; everything runs on `stream`, with no host sync and no allocation.
// Includable from plain C++.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CUDA_FLASHATTENTION_H
#define MHCC_RUNTIME_CUDA_FLASHATTENTION_H

#include <cstdint>
#include <string>

typedef struct CUstream_st *cudaStream_t;
struct __nv_bfloat16;

namespace mhcc::runtime::cuda {

/// qkv: [T, 3C] bf16 row-major; T = batches * seq tokens, each sequence `seq`
/// contiguous rows; q of head h is columns [h*d, (h+1)*d), k at C + h*d, v at
/// 2C + h*d (d = C / heads). Attention is causal within each sequence.
/// o: [T, C] bf16, head h at columns h*d. lse: [T, heads] fp32, the natural
/// log-sum-exp of the scaled score row. firstKeys (null: none): packed
/// documents, per token its document's start in its sequence; a query then
/// sees keys [firstKeys[t], t] only, and key tiles wholly before a block's
/// documents are skipped. Returns "" or a one-line error.
std::string flashAttentionForward(const __nv_bfloat16 *qkv, __nv_bfloat16 *o, float *lse, int64_t T, int64_t C,
                                  int64_t heads, int64_t seq, const int32_t *firstKeys, cudaStream_t stream);

/// Floats of scratch flashAttentionBackward needs: D = rowsum(dO * O) per
/// (token, head).
int64_t flashAttentionBackwardScratch(int64_t T, int64_t C, int64_t heads);

/// dO: [T, C] bf16. dqkv: [T, 3C] bf16, overwritten (dq, dk, dv in the q, k,
/// v column positions). o and lse as flashAttentionForward wrote them, with
/// the same firstKeys.
std::string flashAttentionBackward(const __nv_bfloat16 *qkv, const __nv_bfloat16 *o, const __nv_bfloat16 *dO,
                                   const float *lse, __nv_bfloat16 *dqkv, float *scratch, int64_t T, int64_t C,
                                   int64_t heads, int64_t seq, const int32_t *firstKeys, cudaStream_t stream);

/// The kernels flashAttentionForward and flashAttentionBackward run: on wgmma (Hopper's warpgroup MMA, the
/// default) or on mma.sync (FlashAttention-2's structure, the kernels before). For benchmarks and checks that
/// compare them in one run; not thread-safe.
enum class FlashKernels { kWgmma, kMmaSync };
void setFlashAttentionKernels(FlashKernels kernels);

/// Runs the two wgmma product forms the Hopper kernels use (K-major A B^T, register A times MN-major B) on exact
/// small integers on the current GPU: "" when every element matches, else which form failed.
std::string wgmmaLayoutCheck();

} // namespace mhcc::runtime::cuda

#endif // MHCC_RUNTIME_CUDA_FLASHATTENTION_H
