//===- RecomputeCost.cpp - what activation recomputation drops and reruns -===//
#include "passes/pipeline/RecomputeCost.h"

#include <algorithm>

namespace mhcc::pipeline {

RecomputeEffect recomputeEffect(const std::vector<RecomputePiece> &pieces, int64_t sublayersPerSegment) {
  RecomputeEffect effect;
  effect.recomputed.assign(pieces.size(), false);
  const int64_t perSegment = std::max<int64_t>(sublayersPerSegment, 1);
  // The open segment: [begin, i), its residual updates, and what it keeps.
  size_t begin = 0;
  int64_t updates = 0, saved = 0, kept = 0;
  bool fromTokens = false;
  auto dropOpen = [&](size_t end) {
    for (size_t j = begin; j < end; ++j) {
      effect.recomputed[j] = true;
      effect.forwardMs += pieces[j].forwardMs;
    }
    effect.droppedBytes += saved - kept;
    effect.largestSegmentBytes = std::max(effect.largestSegmentBytes, saved - kept);
  };
  for (size_t i = 0; i < pieces.size(); ++i) {
    // The runtime cuts right after a segment's last residual update; the
    // segment still open at the stage's end is its last, kept whole.
    if (updates >= perSegment) {
      dropOpen(i);
      begin = i;
      updates = saved = kept = 0;
      fromTokens = false;
    }
    const RecomputePiece &piece = pieces[i];
    fromTokens = fromTokens || (i == begin && piece.startsFromTokens);
    if (piece.checkpointBytes > 0 && updates++ == 0 && !fromTokens)
      kept = std::min(piece.checkpointBytes, saved + piece.savedBytes);
    saved += piece.savedBytes;
  }
  return effect;
}

} // namespace mhcc::pipeline
