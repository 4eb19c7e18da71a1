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
  // (Divided, not multiplied: tp may come from a file, and 3 tp could overflow.)
  if (info.tpSplit == "qkv")
    return info.cols % 3 || info.cols / 3 % tp ? std::to_string(info.cols / 3) + " columns of each of q, k and v" : "";
  if (info.tpSplit == "ab")
    return info.cols % 2 || info.cols / 2 % tp ? std::to_string(info.cols / 2) + " columns of each of beta and alpha"
                                               : "";
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

/// Elements [begin, end) of tensor rank `tensorRank`'s block of a tensor
/// split over `tp` ranks (tp = 1: of the whole tensor): what one rank holds
/// of a parameter, its block or, under the distributed optimizer, a
/// member's part of it. Checkpoints of multi-process runs store pieces.
struct TensorPiece {
  int64_t tp = 1, tensorRank = 0, begin = 0, end = 0;
  int64_t count() const { return end - begin; }
};

/// Calls run(wholeOffset, pieceOffset, length) for each contiguous run of
/// the piece's elements in the whole tensor, in the piece's order.
template <typename Run> void forEachPieceRun(const ParamInfo &info, const TensorPiece &piece, Run run) {
  int64_t at = 0; // the shard run's first element in the block
  for (const ShardRun &shard : shardRuns(info, piece.tp, piece.tensorRank)) {
    if (at >= piece.end)
      break;
    const int64_t from = std::max(piece.begin, at), to = std::min(piece.end, at + shard.length);
    if (from < to)
      run(shard.offset + (from - at), from - piece.begin, to - from);
    at += shard.length;
  }
}

/// whole's elements of `piece` = data (the piece's count() elements); the
/// others are left as they are. `whole` is sized (zeros) to the tensor when
/// it is not yet.
inline void scatterPiece(const ParamInfo &info, const TensorPiece &piece, const float *data,
                         std::vector<float> &whole) {
  if (whole.size() != size_t(info.count()))
    whole.assign(info.count(), 0.0f);
  forEachPieceRun(info, piece, [&](int64_t offset, int64_t in, int64_t length) {
    std::copy_n(data + in, length, whole.begin() + offset);
  });
}

/// The piece's elements of whole, in the piece's order.
inline std::vector<float> gatherPiece(const ParamInfo &info, const TensorPiece &piece, const float *whole) {
  std::vector<float> data(size_t(std::max<int64_t>(piece.count(), 0)));
  forEachPieceRun(info, piece, [&](int64_t offset, int64_t in, int64_t length) {
    std::copy_n(whole + offset, length, data.begin() + in);
  });
  return data;
}

/// whole's part of tensor rank t = block, but only the block's elements
/// [begin, end) (a member's part under the distributed optimizer); the
/// other elements of whole are left as they are. `whole` is sized (zeros)
/// to the tensor when it is not yet.
inline void scatterShardPart(const ParamInfo &info, int64_t tp, int64_t t, const float *block, int64_t begin,
                             int64_t end, std::vector<float> &whole) {
  if (begin < end)
    scatterPiece(info, {tp, t, begin, end}, block + begin, whole);
  else if (whole.size() != size_t(info.count()))
    whole.assign(info.count(), 0.0f);
}

/// Why `pieces` do not hold every element of `info` exactly once (empty:
/// they do). Pieces of an unsplit tensor are of the whole tensor, whatever
/// their tensor rank.
inline std::string piecesProblem(const ParamInfo &info, const std::vector<TensorPiece> &pieces) {
  if (pieces.empty())
    return "no piece of it";
  const int64_t tp = pieces.front().tp;
  if (tp < 1 || tp > info.count() || !splitProblem(info, tp).empty())
    return "pieces split over " + std::to_string(tp) + " tensor ranks, which its shape does not allow";
  const int64_t block = shardCount(info, tp), blocks = block == info.count() ? 1 : tp;
  std::vector<std::vector<TensorPiece>> byRank(static_cast<size_t>(blocks));
  for (const TensorPiece &piece : pieces) {
    if (piece.tp != tp)
      return "pieces split over both " + std::to_string(tp) + " and " + std::to_string(piece.tp) + " tensor ranks";
    if (piece.tensorRank < 0 || piece.tensorRank >= tp || piece.begin < 0 || piece.begin >= piece.end ||
        piece.end > block)
      return "a piece [" + std::to_string(piece.begin) + ", " + std::to_string(piece.end) + ") of tensor rank " +
             std::to_string(piece.tensorRank) + " outside its " + std::to_string(block) + "-element blocks";
    byRank[size_t(blocks == 1 ? 0 : piece.tensorRank)].push_back(piece);
  }
  for (size_t t = 0; t < byRank.size(); ++t) {
    std::vector<TensorPiece> &list = byRank[t];
    std::sort(list.begin(), list.end(), [](const TensorPiece &x, const TensorPiece &y) { return x.begin < y.begin; });
    int64_t covered = 0;
    for (const TensorPiece &piece : list) {
      if (piece.begin != covered)
        return "elements [" + std::to_string(std::min(piece.begin, covered)) + ", " +
               std::to_string(std::max(piece.begin, covered)) + ") of tensor rank " + std::to_string(t) +
               "'s block " + (piece.begin > covered ? "in no piece" : "in two pieces");
      covered = piece.end;
    }
    if (covered != block)
      return "elements [" + std::to_string(covered) + ", " + std::to_string(block) + ") of tensor rank " +
             std::to_string(t) + "'s block in no piece";
  }
  return "";
}

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_ARTIFACT_TENSORSPLIT_H
