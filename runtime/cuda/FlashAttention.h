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

/// Context parallelism: the rows of each sequence a launch needs (two
/// ranges: a context rank's chunks), the queries whose o, lse and dQ it
/// writes and the keys whose dK, dV it writes; other rows' outputs are left
/// unwritten. Ranges of whole 128-row tiles narrow the work to them; others
/// (and none: count 0) run every row. A row's results do not depend on it.
struct FlashRowRanges {
  int64_t first[2] = {0, 0}, count[2] = {0, 0};
};

/// qkv: [T, 3C] bf16 row-major; T = batches * seq tokens, each sequence `seq`
/// contiguous rows; q of head h is columns [h*d, (h+1)*d), k at C + h*d, v at
/// 2C + h*d (d = C / heads). Attention is causal within each sequence.
/// o: [T, C] bf16, head h at columns h*d. lse: [T, heads] fp32, the natural
/// log-sum-exp of the scaled score row. firstKeys (null: none): packed
/// documents, per token its document's start in its sequence; a query then
/// sees keys [firstKeys[t], t] only, and key tiles wholly before a block's
/// documents are skipped. Returns "" or a one-line error.
std::string flashAttentionForward(const __nv_bfloat16 *qkv, __nv_bfloat16 *o, float *lse, int64_t T, int64_t C,
                                  int64_t heads, int64_t seq, const int32_t *firstKeys, cudaStream_t stream,
                                  FlashRowRanges rows = {});

/// Floats of scratch flashAttentionBackward needs: D = rowsum(dO * O) per
/// (token, head).
int64_t flashAttentionBackwardScratch(int64_t T, int64_t C, int64_t heads);

/// dO: [T, C] bf16. dqkv: [T, 3C] bf16, overwritten (dq, dk, dv in the q, k,
/// v column positions). o and lse as flashAttentionForward wrote them, with
/// the same firstKeys. rowDot (null: computed into scratch from o and dO):
/// D as flashAttentionRowDot wrote it, o then unread (context parallelism
/// gathers the rows' D instead of their o).
std::string flashAttentionBackward(const __nv_bfloat16 *qkv, const __nv_bfloat16 *o, const __nv_bfloat16 *dO,
                                   const float *lse, __nv_bfloat16 *dqkv, float *scratch, int64_t T, int64_t C,
                                   int64_t heads, int64_t seq, const int32_t *firstKeys, cudaStream_t stream,
                                   const float *rowDot = nullptr, FlashRowRanges rows = {});

/// D = rowsum(dO * O) per (token, head), [T, heads] fp32, as the backward
/// computes it.
std::string flashAttentionRowDot(const __nv_bfloat16 *o, const __nv_bfloat16 *dO, float *rowDot, int64_t T,
                                 int64_t C, int64_t heads, cudaStream_t stream);

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
