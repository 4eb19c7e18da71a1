//===- CudaContextParallel.cpp - the token mixers under context parallelism -===//
//
// mhcc --cp on the GPU, with the collectives of the CPU's form
// (runtime/cpu/ContextParallelAttention.h, StageExecutor.h's
// contextParallelMixer), which the schedule lists and CollectiveCheck holds
// the kernels to:
//
// - Attention: a rank projects q, k, v for its own rows, all-gathers the
//   group's k and v, and runs the attention core on the microbatch's rows
//   with its own queries in place; it keeps its rows of o and the
//   log-sum-exp. The backward gathers q, k, v, dO and each query's
//   statistics (log-sum-exp and flash attention's rowDot), runs the core's
//   backward and keeps its rows of dQ, dK, dV. A ZB-H1 W half issues the
//   same gathers (the schedule lists them for both halves, as the CPU runs
//   them) and takes dQ, dK, dV from B's stash.
// - Gated DeltaNet: the recurrence runs over the group's gathered rows (the
//   input, and the output gradient backward) on every rank, each keeping
//   its rows; context rank 0 alone adds the weight gradients, whole.
//
// Bits: each row's attention output and input gradient come from the same
// kernels over the same operands as without context parallelism (a query's
// row of the core reads only its own q and every key; a key's dK and dV sum
// every query in the core's fixed order), so they differ from cp = 1 only
// where the projections' GEMMs, now over a context rank's rows, pick
// another algorithm. The weight gradients sum each rank's rows, then the
// ranks (the gradient all-reduce). The work: flash attention launches only
// the rank's own query tiles (o, lse, dQ) and key tiles (dK, dV) where its
// chunks are whole 128-row tiles (ownChunks), so each rank does 1 / cp of
// the core; the fp32 reference core (and unaligned chunks) still run every
// row. Gated DeltaNet runs the whole microbatch on every rank and keeps
// its aux and stash for every row (cp times its work and memory).
//
// A rank's rows (Artifact::contextRows): of each sequence, chunk r and chunk
// 2 cp - 1 - r of 2 cp chunks; NCCL's all-gather is rank-major, so rows go
// into (and out of) the microbatch's order with one strided copy per chunk.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/CudaRank.h"
#include "runtime/cuda/DeviceKernels.h"

namespace mhcc::runtime::cuda {
namespace {

/// Copies context rank r's rows between its block of a rank-major buffer
/// (its rows of each of `sequences` sequences: chunk r, then chunk 2 cp - 1
/// - r) and the microbatch's order: one strided copy per chunk (a chunk of
/// every sequence a step).
void copyContextRows(char *block, char *all, int64_t r, int64_t cp, int64_t seq, int64_t sequences,
                     int64_t rowBytes, bool toMicrobatch, cudaStream_t stream) {
  const int64_t chunkBytes = seq / (2 * cp) * rowBytes;
  for (int64_t part = 0; part < 2; ++part) {
    const int64_t index = part == 0 ? r : 2 * cp - 1 - r;
    copySequenceRun(block + part * chunkBytes, 2 * chunkBytes, all, index * chunkBytes, seq * rowBytes, chunkBytes,
                    sequences, toMicrobatch, stream);
  }
}

/// Copies `rows` rows of `cols` elements between two pitches (a column block of a wider row).
void copyColumns(void *to, int64_t toPitch, const void *from, int64_t fromPitch, int64_t cols, int64_t rows,
                 int64_t elementBytes, cudaStream_t stream) {
  stridedCopy(to, toPitch * elementBytes, from, fromPitch * elementBytes, cols * elementBytes, rows, stream);
}

} // namespace

void *CudaRank::contextAllRows(const void *local, int64_t cols, Dtype dtype) {
  if (std::string problem = collectives_.issue(MeshAxis::Context, CollectiveOp::AllGather, gemmRows_, cols);
      !problem.empty()) {
    fail(problem);
    return nullptr;
  }
  const int64_t rowBytes = cols * dtypeBytes(dtype), T = a_.model.tokens();
  char *rankMajor = scratchOf<char>(T * rowBytes), *all = scratchOf<char>(T * rowBytes);
  if (std::string problem = links_->allGatherContext(local, rankMajor, gemmRows_ * cols, dtype, compute_);
      !problem.empty()) {
    fail("a context-parallel all-gather: " + problem);
    return nullptr;
  }
  for (int64_t r = 0; r < a_.cp; ++r)
    copyContextRows(rankMajor + r * gemmRows_ * rowBytes, all, r, a_.cp, a_.model.seqLen, T / a_.model.seqLen,
                    rowBytes, true, compute_);
  return all;
}

FlashRowRanges CudaRank::ownChunks() const {
  const int64_t chunk = a_.model.seqLen / (2 * a_.cp);
  FlashRowRanges rows;
  rows.first[0] = context_ * chunk;
  rows.first[1] = (2 * a_.cp - 1 - context_) * chunk;
  rows.count[0] = rows.count[1] = chunk;
  return rows;
}

void CudaRank::moveOwnRows(void *mine, void *all, int64_t rowBytes, bool toMicrobatch) {
  copyContextRows(static_cast<char *>(mine), static_cast<char *>(all), context_, a_.cp, a_.model.seqLen,
                  a_.model.tokens() / a_.model.seqLen, rowBytes, toMicrobatch, compute_);
}

template <typename A>
std::string CudaRank::contextAttentionForward(const ForwardInstr &f, int64_t mb, const A *x, const A *wqkv,
                                              const A *wo, A *y, float *aux) {
  const int64_t G = gemmRows_, T = a_.model.tokens(), C = a_.model.hidden, D = C / a_.tp, heads = f.heads;
  const int64_t bytes = sizeof(A);
  Gemms &g = *gemms_;
  A *qkv = reinterpret_cast<A *>(aux), *o = qkv + G * 3 * D;
  float *lse = reinterpret_cast<float *>(o + G * D);
  matmul(g, x, wqkv, qkv, G, C, 3 * D, false); // this rank's rows, RoPE not yet applied
  A *kv = scratchOf<A>(G * 2 * D);
  copyColumns(kv, 2 * D, qkv + D, 3 * D, 2 * D, G, bytes, compute_);
  const A *kvAll = static_cast<const A *>(contextAllRows(kv, 2 * D, kActivations<A>));
  if (!kvAll)
    return "";
  // Every row's k and v, this rank's q (the others' queries are zeros: their rows are not kept).
  A *qkvAll = scratchOf<A>(T * 3 * D), *oAll = scratchOf<A>(T * D);
  float *lseAll = scratchOf<float>(T * heads);
  cudaMemsetAsync(qkvAll, 0, T * 3 * D * bytes, compute_);
  moveOwnRows(qkv, qkvAll, 3 * D * bytes, true);
  copyColumns(qkvAll + D, 3 * D, kvAll, 2 * D, 2 * D, T, bytes, compute_);
  const std::string error =
      attentionCoreForward(*kernels_, g, qkvAll, oAll, lseAll,
                           scratch(attentionForwardScratch(T, D, heads, f.seqLen, int(bytes))).data, T, D, heads,
                           f.seqLen, documents(mb), compute_, ownChunks());
  moveOwnRows(qkv, qkvAll, 3 * D * bytes, false); // now rotated
  moveOwnRows(o, oAll, D * bytes, false);
  moveOwnRows(lse, lseAll, heads * int64_t(sizeof(float)), false);
  matmul(g, o, wo, y, G, D, C, false);
  return error;
}

template <typename A>
std::string CudaRank::contextAttentionBackward(const ForwardInstr &f, int64_t mb, const AttentionGrads<A> &a,
                                               GradParts parts, bool freshInput) {
  const int64_t G = gemmRows_, T = a_.model.tokens(), C = a_.model.hidden, D = C / a_.tp, heads = f.heads;
  const int64_t bytes = sizeof(A), statBytes = sizeof(float);
  Gemms &g = *gemms_;
  const A *qkv = reinterpret_cast<const A *>(a.aux), *o = qkv + G * 3 * D;
  const float *lse = reinterpret_cast<const float *>(o + G * D);
  A *dO = scratchOf<A>(G * D);
  attentionOutputGradient(g, a.dy, a.wo, dO, G, C, D, compute_); // dO = dy Wo^T
  // The CPU form's gathers, in its order: q k v, dO, then each query's log-sum-exp and rowDot.
  const A *qkvAll = static_cast<const A *>(contextAllRows(qkv, 3 * D, kActivations<A>));
  const A *dOAll = qkvAll ? static_cast<const A *>(contextAllRows(dO, D, kActivations<A>)) : nullptr;
  if (!dOAll)
    return "";
  float *stats = scratchOf<float>(G * 2 * heads), *rowDot = scratchOf<float>(G * heads);
  std::string error = attentionRowDot(o, dO, rowDot, G, D, heads, f.seqLen, compute_);
  copyColumns(stats, 2 * heads, lse, heads, heads, G, statBytes, compute_);
  copyColumns(stats + heads, 2 * heads, rowDot, heads, heads, G, statBytes, compute_);
  const float *statsAll = static_cast<const float *>(contextAllRows(stats, 2 * heads, Dtype::F32));
  if (!statsAll)
    return error;
  float *lseAll = scratchOf<float>(T * heads), *rowDotAll = scratchOf<float>(T * heads);
  copyColumns(lseAll, heads, statsAll, 2 * heads, heads, T, statBytes, compute_);
  copyColumns(rowDotAll, heads, statsAll + heads, 2 * heads, heads, T, statBytes, compute_);
  if (parts.inputs) { // a W half finds dQ, dK, dV of its rows in B's stash
    A *dQkvAll = scratchOf<A>(T * 3 * D);
    if (error.empty())
      error = attentionCoreBackward(*kernels_, g, qkvAll, static_cast<const A *>(nullptr), lseAll, rowDotAll, dOAll,
                                    dQkvAll,
                                    scratch(attentionCoreBackwardScratch(T, D, heads, f.seqLen, int(bytes))).data, T,
                                    D, heads, f.seqLen, documents(mb), compute_, ownChunks());
    moveOwnRows(a.dQkv, dQkvAll, 3 * D * bytes, false);
  }
  if (parts.inputs)
    attentionInputGradient(g, static_cast<const A *>(a.dQkv), a.wqkv, a.dx, G, C, D, freshInput, compute_);
  if (parts.weights) {
    matmulTransAAcc(g, o, a.dy, a.dWo, G, D, C);
    matmulTransAAcc(g, a.x, static_cast<const A *>(a.dQkv), a.dWqkv, G, C, 3 * D);
  }
  return error;
}

template <typename A>
std::string CudaRank::contextGdnForward(const ForwardInstr &f, int64_t mb, const A *x, const GdnWeights<A> &w, A *y,
                                        float *aux) {
  const int64_t T = a_.model.tokens(), C = a_.model.hidden, inner = C / a_.tp;
  const A *xAll = static_cast<const A *>(contextAllRows(x, C, kActivations<A>));
  if (!xAll)
    return "";
  A *yAll = scratchOf<A>(T * C);
  const std::string error =
      gdnForward<A>(*gemms_, xAll, w, yAll, aux, scratch(gdnForwardScratch(T, inner, f.heads, f.seqLen, sizeof(A))).data,
                    T, C, inner, f.heads, f.seqLen, f.eps, documents(mb), compute_);
  moveOwnRows(y, yAll, C * int64_t(sizeof(A)), false);
  return error;
}

template <typename A>
std::string CudaRank::contextGdnBackward(const ForwardInstr &f, int64_t mb, const A *x, const GdnWeights<A> &w,
                                         const float *aux, const A *dy, A *dx, const GdnWeightGrads &grads,
                                         float *stash, GradParts parts) {
  const int64_t T = a_.model.tokens(), C = a_.model.hidden, inner = C / a_.tp, rowBytes = C * int64_t(sizeof(A));
  const A *xAll = static_cast<const A *>(contextAllRows(x, C, kActivations<A>));
  const A *dyAll = xAll ? static_cast<const A *>(contextAllRows(dy, C, kActivations<A>)) : nullptr;
  if (!dyAll)
    return "";
  // Context rank 0 adds the weight gradients (whole); the others' rows need only the input gradient.
  const GradParts mine{parts.inputs, parts.weights && context_ == 0};
  if (!mine.inputs && !mine.weights)
    return "";
  A *dxAll = nullptr;
  if (mine.inputs) { // it starts from what this rank's rows hold, so they sum as they would unsplit
    dxAll = scratchOf<A>(T * C);
    cudaMemsetAsync(dxAll, 0, T * rowBytes, compute_);
    moveOwnRows(dx, dxAll, rowBytes, true);
  }
  const std::string error = gdnBackward<A>(
      *gemms_, xAll, w, aux, dyAll, dxAll, mine.weights ? grads : GdnWeightGrads{}, stash,
      scratch(gdnBackwardScratch(T, inner, f.heads, f.seqLen, sizeof(A))).data, T, C, inner, f.heads, f.seqLen, mine,
      documents(mb), compute_);
  if (mine.inputs)
    moveOwnRows(dx, dxAll, rowBytes, false);
  return error;
}

#define MHCC_CONTEXT_PARALLEL(A)                                                                               \
  template std::string CudaRank::contextAttentionForward<A>(const ForwardInstr &, int64_t, const A *, const A *, \
                                                           const A *, A *, float *);                          \
  template std::string CudaRank::contextAttentionBackward<A>(const ForwardInstr &, int64_t,                    \
                                                            const AttentionGrads<A> &, GradParts, bool);       \
  template std::string CudaRank::contextGdnForward<A>(const ForwardInstr &, int64_t, const A *,                \
                                                     const GdnWeights<A> &, A *, float *);                     \
  template std::string CudaRank::contextGdnBackward<A>(const ForwardInstr &, int64_t, const A *,               \
                                                      const GdnWeights<A> &, const float *, const A *, A *,   \
                                                      const GdnWeightGrads &, float *, GradParts);
MHCC_CONTEXT_PARALLEL(float)
MHCC_CONTEXT_PARALLEL(bf16)
#undef MHCC_CONTEXT_PARALLEL

} // namespace mhcc::runtime::cuda
