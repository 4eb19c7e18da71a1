//===- RecomputeCost.h - what activation recomputation drops and reruns -*- C++ -*-===//
//
// The compiler's side of activation recomputation (mhcc
// --recompute-sublayers): which parts of a stage's forward the runtime
// drops after the forward and runs again before the backward, and so how
// many saved bytes leave the stage's peak and how much forward time joins
// its backward. The runtime cuts a stage's forward into segments of
// `sublayersPerSegment` residual updates (runtime/program/Recompute.h);
// everything between two cuts belongs to one segment, whatever it is (with
// MTP: the main model's head and loss, an MTP module's prelude and tail),
// and only the stage's last segment is kept whole. Plain C++, no MLIR.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_PASSES_PIPELINE_RECOMPUTECOST_H
#define MHCC_PASSES_PIPELINE_RECOMPUTECOST_H

#include <cstdint>
#include <vector>

namespace mhcc::pipeline {

/// One piece of a stage's forward, in program order: a unit of the model
/// (passes/CostModel.h) or one part of an MTP module.
struct RecomputePiece {
  int64_t savedBytes = 0; // kept from its forward to its backward without recomputation
  /// > 0: a sublayer, whose residual update ends a span the runtime may cut
  /// after; what a dropped segment keeps for it (a residual and what a
  /// fused span carries across: CostModel's checkpointBytesPerToken).
  int64_t checkpointBytes = 0;
  /// The embedding: a segment it opens starts from the token ids and keeps
  /// no residual (the runtime drops the expanded residual with the rest).
  bool startsFromTokens = false;
  double forwardMs = 0;
};

struct RecomputeEffect {
  /// By piece: dropped after its forward and run again before its backward.
  std::vector<bool> recomputed;
  int64_t droppedBytes = 0;        // the saved bytes the recomputed segments do not keep
  int64_t largestSegmentBytes = 0; // the most one segment drops: its working set in the backward
  double forwardMs = 0;            // the recomputed pieces' forwards, run again
};

/// Each dropped segment keeps one residual: what enters it (sized as its
/// first sublayer's checkpoint; nothing where it starts from the tokens).
RecomputeEffect recomputeEffect(const std::vector<RecomputePiece> &pieces, int64_t sublayersPerSegment);

} // namespace mhcc::pipeline

#endif // MHCC_PASSES_PIPELINE_RECOMPUTECOST_H
