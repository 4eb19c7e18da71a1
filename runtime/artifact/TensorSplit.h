//===- TensorSplit.h - a parameter's block on a tensor-parallel rank -*- C++ -*-===//
//
// Tensor parallelism (mhcc --tp) splits the weights of the GEMMs as
// Megatron-LM does: column-parallel q/k/v (whole heads) and gate/up
// projections, row-parallel output and down projections, the embedding and
// the LM head by vocabulary. The parameter table and checkpoints keep whole
// tensors by name; a rank's block of one is a list of contiguous runs of the
// row-major whole, so a rank's weights are gathered from it and its
// gradients scattered back without either side knowing the layer.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_ARTIFACT_TENSORSPLIT_H
#define MHCC_RUNTIME_ARTIFACT_TENSORSPLIT_H

#include "runtime/artifact/Artifact.h"

#include <algorithm>
#include <string>
#include <vector>

namespace mhcc::runtime {

/// One contiguous run of a whole tensor's elements.
struct ShardRun {
  int64_t offset = 0, length = 0;
};

/// Why `info` cannot be split over `tp` ranks (empty: it can). A "qkv"
/// tensor has 3 blocks of columns, each split over tp; an "ab" tensor 2
/// (Gated DeltaNet's beta and alpha logits, a column a head). A "partial"
/// tensor is not split: every rank holds all of it, but its gradient is a
/// partial sum over the rank's heads (Gated DeltaNet's per-head norm gain),
/// added over the ranks in tensor-rank order.
inline bool isPartial(const ParamInfo &info) { return info.tpSplit == "partial"; }
inline std::string splitProblem(const ParamInfo &info, int64_t tp) {
  if (tp == 1 || info.tpSplit.empty() || isPartial(info))
    return "";
  if (info.tpSplit == "rows")
    return info.rows % tp ? std::to_string(info.rows) + " rows" : "";
  if (info.tpSplit == "cols")
    return info.cols % tp ? std::to_string(info.cols) + " columns" : "";
  if (info.tpSplit == "qkv")
    return info.cols % (3 * tp) ? std::to_string(info.cols / 3) + " columns of each of q, k and v" : "";
  if (info.tpSplit == "ab")
    return info.cols % (2 * tp) ? std::to_string(info.cols / 2) + " columns of each of beta and alpha" : "";
  return "unknown tensor-parallel split '" + info.tpSplit + "'";
}

/// Elements of tensor rank t's block (every rank's has the same size).
inline int64_t shardCount(const ParamInfo &info, int64_t tp) {
  return info.tpSplit.empty() || isPartial(info) ? info.count() : info.count() / tp;
}

/// Tensor rank t's block, in the block's row-major order.
inline std::vector<ShardRun> shardRuns(const ParamInfo &info, int64_t tp, int64_t t) {
  if (info.tpSplit.empty() || isPartial(info) || tp == 1)
    return {{0, info.count()}};
  if (info.tpSplit == "rows") {
    const int64_t block = info.rows / tp * info.cols;
    return {{t * block, block}};
  }
  std::vector<ShardRun> runs;
  const int64_t parts = info.tpSplit == "qkv" ? 3 : info.tpSplit == "ab" ? 2 : 1, width = info.cols / parts,
                share = width / tp;
  for (int64_t r = 0; r < info.rows; ++r)
    for (int64_t p = 0; p < parts; ++p)
      runs.push_back({r * info.cols + p * width + t * share, share});
  return runs;
}

/// block = tensor rank t's part of whole.
inline void gatherShard(const ParamInfo &info, int64_t tp, int64_t t, const float *whole, float *block) {
  for (const ShardRun &run : shardRuns(info, tp, t))
    block = std::copy_n(whole + run.offset, run.length, block);
}

/// whole's part of tensor rank t = block.
inline void scatterShard(const ParamInfo &info, int64_t tp, int64_t t, const float *block, float *whole) {
  for (const ShardRun &run : shardRuns(info, tp, t)) {
    std::copy_n(block, run.length, whole + run.offset);
    block += run.length;
  }
}

/// whole's part of tensor rank t = block, but only the block's elements
/// [begin, end) (a member's part under the distributed optimizer); the
/// other elements of whole are left as they are. `whole` is sized (zeros)
/// to the tensor when it is not yet.
inline void scatterShardPart(const ParamInfo &info, int64_t tp, int64_t t, const float *block, int64_t begin,
                             int64_t end, std::vector<float> &whole) {
  if (whole.size() != size_t(info.count()))
    whole.assign(info.count(), 0.0f);
  int64_t at = 0; // the run's first element in the block
  for (const ShardRun &run : shardRuns(info, tp, t)) {
    const int64_t from = std::max(begin, at), to = std::min(end, at + run.length);
    if (from < to)
      std::copy(block + from, block + to, whole.begin() + run.offset + (from - at));
    at += run.length;
  }
}

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_ARTIFACT_TENSORSPLIT_H
