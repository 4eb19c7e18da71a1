//===- TensorParallel.h - the CPU kernels' tensor-parallel forms ----*- C++ -*-===//
//
// Megatron-LM's tensor parallelism (mhcc --tp) for the CPU reference
// backend's stage programs: a rank holds heads / tp of every attention, ffn /
// tp FFN columns and vocab / tp rows of the embedding and columns of the LM
// head (runtime/artifact/TensorSplit.h). The column-parallel GEMMs read the
// whole input; the row-parallel ones leave partial sums that the group adds
// (all-reduce), or, under sequence parallelism, adds and splits by rows
// (reduce-scatter) after gathering the input rows first (all-gather). The
// cross-entropy runs on vocabulary shards with the softmax statistics
// reduced across the group. Every reduction adds the ranks' parts in
// tensor-rank order, so each rank holds the same bits, and a layout change
// (PP, VPP, ZB-H1) moves none of them.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CPU_TENSORPARALLEL_H
#define MHCC_RUNTIME_CPU_TENSORPARALLEL_H

#include "runtime/cpu/Kernels.h"

#include <functional>
#include <vector>

namespace mhcc::runtime {

/// This rank's tensor-parallel group, as the kernels see it. Each collective
/// is called by every rank of the group in the same order (the group runs
/// the same instruction lists); false when another rank failed.
template <typename T> struct TensorGroup {
  int64_t size = 1, rank = 0;
  bool sequenceParallel = false;
  /// In place: the element-wise sum (max: the maximum) over the group.
  std::function<bool(T *data, int64_t count, bool max)> allReduce;
  /// Sequence parallelism: every rank's rows (tensorRows) into microbatch order.
  std::function<bool(const T *local, int64_t cols, T *all)> gatherRows;
  /// Sequence parallelism: this rank's rows of the group's sum of `all`.
  std::function<bool(const T *all, int64_t cols, T *local)> reduceScatterRows;

  bool active() const { return size > 1; }
};

namespace kernels {

/// The rows of a row-parallel output, summed over the group into `y` (this
/// rank's rows under sequence parallelism, else every row): `partial` holds
/// this rank's part for every row.
template <typename T>
bool reducePartial(const TensorGroup<T> &g, T *partial, T *y, int64_t rows, int64_t cols) {
  if (g.sequenceParallel)
    return g.reduceScatterRows(partial, cols, y);
  if (!g.allReduce(partial, rows * cols, false))
    return false;
  if (partial != y)
    std::copy_n(partial, rows * cols, y);
  return true;
}

/// dx += the group's sum of `partial` (every row's; this rank's rows of it
/// under sequence parallelism).
template <typename T> bool addReduced(const TensorGroup<T> &g, T *partial, T *dx, int64_t rows, int64_t cols) {
  const int64_t mine = g.sequenceParallel ? rows / g.size : rows;
  std::vector<T> sum(mine * cols);
  if (!reducePartial(g, partial, sum.data(), rows, cols))
    return false;
  for (int64_t e = 0; e < mine * cols; ++e)
    dx[e] += sum[e];
  return true;
}

/// `local` as every row of the microbatch: itself, or the gathered rows
/// under sequence parallelism (kept in `storage`).
template <typename T>
const T *allRows(const TensorGroup<T> &g, const T *local, int64_t rows, int64_t cols, std::vector<T> &storage,
                 bool &ok) {
  if (!g.sequenceParallel)
    return local;
  storage.assign(rows * cols, T(0));
  ok = ok && g.gatherRows(local, cols, storage.data());
  return storage.data();
}

/// A column-parallel GEMM followed by a row-parallel one (attention, SwiGLU):
/// `compute(in, partial)` runs this rank's heads or columns on all `rows`
/// rows of x (C wide) and leaves its partial sum of y.
template <typename T, typename Compute>
bool tensorParallelForward(const TensorGroup<T> &g, const T *x, T *y, int64_t rows, int64_t C, Compute compute) {
  bool ok = true;
  std::vector<T> xAll, partial(rows * C, T(0));
  const T *in = allRows(g, x, rows, C, xAll, ok);
  if (!ok)
    return false;
  compute(in, partial.data());
  return reducePartial(g, partial.data(), y, rows, C);
}

/// Its backward: `compute(in, dyAll, dxPartial)` adds this rank's weight
/// gradients (when asked) and, with dx, its partial input gradient for every
/// row; the group's sum is added into dx. The input is gathered only for
/// the weight gradients (`needsInput`).
template <typename T, typename Compute>
bool tensorParallelBackward(const TensorGroup<T> &g, const T *x, const T *dy, T *dx, int64_t rows, int64_t C,
                            bool needsInput, Compute compute) {
  bool ok = true;
  std::vector<T> xAll, dyAll;
  const T *in = needsInput ? allRows(g, x, rows, C, xAll, ok) : x;
  const T *dyIn = allRows(g, dy, rows, C, dyAll, ok);
  if (!ok)
    return false;
  std::vector<T> partial(dx ? rows * C : 0, T(0));
  compute(in, dyIn, dx ? partial.data() : nullptr);
  return !dx || addReduced(g, partial.data(), dx, rows, C);
}

/// The vocabulary-parallel embedding: this rank's table holds rows
/// [first, first + vocabShare) of the vocabulary; a row whose token lies
/// elsewhere is zero here, so the group's sum has exactly the table's bits.
template <typename T>
bool tensorParallelEmbedForward(const TensorGroup<T> &g, const int32_t *tokens, const T *table, T *out,
                                int64_t rows, int64_t C, int64_t vocabShare, int64_t shift, int64_t seq,
                                const int64_t *rowMap = nullptr) {
  const int64_t first = g.rank * vocabShare;
  std::vector<T> partial(rows * C, T(0));
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t id = tokens[shiftedRow(microbatchRow(rowMap, t), shift, seq)] - first;
    if (id >= 0 && id < vocabShare)
      std::copy_n(table + id * C, C, partial.data() + t * C);
  }
  return reducePartial(g, partial.data(), out, rows, C);
}

template <typename T>
bool tensorParallelEmbedBackward(const TensorGroup<T> &g, const int32_t *tokens, const T *dOut, T *dTable,
                                 int64_t rows, int64_t C, int64_t vocabShare, int64_t shift, int64_t seq,
                                 const int64_t *rowMap = nullptr) {
  bool ok = true;
  std::vector<T> dyAll;
  const T *dy = allRows(g, dOut, rows, C, dyAll, ok);
  if (!ok)
    return false;
  const int64_t first = g.rank * vocabShare;
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t id = tokens[shiftedRow(microbatchRow(rowMap, t), shift, seq)] - first;
    if (id >= 0 && id < vocabShare)
      addScaled(dTable + id * C, dy + t * C, T(1), C);
  }
  return true;
}

/// The vocabulary-parallel cross-entropy (Megatron's): each rank holds the
/// logits of its vocabulary share for every row; the row maxima, the sums
/// of exponentials and the label's logit are reduced over the group, so
/// every rank gets the same loss and lse (aux) per row. Its backward needs
/// no collective: Kernels.h's crossEntropyBackward on the share (vocabFirst). With a
/// context-parallel rowMap (Kernels.h, microbatchRow), the rows' share of
/// the microbatch's mean over its `microbatchRows` rows.
template <typename T>
bool tensorParallelCrossEntropyForward(const TensorGroup<T> &g, const T *logits, const int32_t *labels, T *aux,
                                       int64_t rows, int64_t vocabShare, int64_t shift, int64_t seq, T &loss,
                                       const int64_t *rowMap = nullptr, int64_t microbatchRows = 0) {
  const int64_t first = g.rank * vocabShare;
  std::vector<T> maxima(rows), sums(rows, T(0)), targets(rows, T(0));
  for (int64_t t = 0; t < rows; ++t)
    maxima[t] = *std::max_element(logits + t * vocabShare, logits + (t + 1) * vocabShare);
  if (!g.allReduce(maxima.data(), rows, true))
    return false;
  for (int64_t t = 0; t < rows; ++t) {
    const T *row = logits + t * vocabShare;
    for (int64_t v = 0; v < vocabShare; ++v)
      sums[t] += std::exp(row[v] - maxima[t]);
    const int64_t m = microbatchRow(rowMap, t);
    if ((m % seq) + shift < seq) {
      const int64_t label = labels[m + shift] - first;
      if (label >= 0 && label < vocabShare)
        targets[t] = row[label];
    }
  }
  if (!g.allReduce(sums.data(), rows, false) || !g.allReduce(targets.data(), rows, false))
    return false;
  T total = 0;
  for (int64_t t = 0; t < rows; ++t) {
    aux[t] = maxima[t] + std::log(sums[t]);
    if ((microbatchRow(rowMap, t) % seq) + shift < seq)
      total += aux[t] - targets[t];
  }
  const int64_t counted = countedRows(rowMap ? microbatchRows : rows, shift, seq);
  loss = counted ? total / T(counted) : T(0);
  return true;
}

} // namespace kernels
} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CPU_TENSORPARALLEL_H
