//===- Recompute.h - which activations a stage drops and recomputes --*- C++ -*-===//
//
// Activation recomputation (Megatron's full, uniform; --recompute-num-sublayers
// as its --recompute-num-layers): a stage's forward is cut into segments of
// `sublayersPerSegment` sublayers (the stage's last may hold fewer), each
// ending with the device's forward span that holds a sublayer's residual
// update (MhcPostRes, or Residual at n = 1). After a segment's forward its values
// and aux buffers are released but for the checkpoints: what a later
// segment's forward reads (the residual stream between sublayers, and
// whatever a fused span carries across). Before the backward first needs a
// dropped value or aux buffer, the executor runs the segment's forward
// again from its checkpoints: the same kernels on the same inputs, so the
// same bits. The stage's last segment (its output; the LM head and loss,
// or with MTP the last MTP module's tail, as MTP's own residual updates
// cut segments after the main LM head) is never dropped. Under tp or cp a segment run again issues its forward's
// collectives inside the backward (Device::interposeCollectives). Plain
// C++, no device.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_PROGRAM_RECOMPUTE_H
#define MHCC_RUNTIME_PROGRAM_RECOMPUTE_H

#include "runtime/program/Program.h"

#include <cstddef>
#include <vector>

namespace mhcc::runtime {

struct RecomputePlan {
  /// Forward instruction ranges [begin, end), in order, covering the list.
  std::vector<std::pair<size_t, size_t>> segments;
  std::vector<size_t> segmentOf; // by forward instruction
  /// By segment: values released after its forward (none for the last).
  std::vector<std::vector<int>> dropped;
  /// By backward instruction: the dropped segments it needs recomputed
  /// first (its own, and those of any dropped value it reads).
  std::vector<std::vector<size_t>> needs;
  /// Every segment but the last drops its aux buffers and its values but
  /// the checkpoints.
  bool drops(size_t segment) const { return segment + 1 < segments.size(); }
};

/// `spanStarts`: the forward indices where the device's spans start
/// (Device::forwardSpan from 0), so that no span is cut; `extraReads` as
/// for backwardFrees (Device::backwardReads); `sublayersPerSegment` >= 1.
RecomputePlan recomputePlan(const StageProgram &p, const std::vector<size_t> &spanStarts,
                            const std::vector<std::vector<int>> &extraReads, int64_t sublayersPerSegment = 1);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_PROGRAM_RECOMPUTE_H
