//===- RankPlan.h - who talks to whom in a CUDA run (plain C++) -----*- C++ -*-===//
//
// The CUDA backend's static communication plan, computed from the artifact
// alone (no CUDA, unit-tested on the CPU): which rank owns each parameter's
// update, which directed rank pairs exchange messages, and which data-,
// tensor- and context-parallel groups get a communicator of their own.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CUDA_RANKPLAN_H
#define MHCC_RUNTIME_CUDA_RANKPLAN_H

#include "runtime/artifact/Artifact.h"

#include <cstdint>
#include <utility>
#include <vector>

namespace mhcc::runtime::cuda {

using Pair = std::pair<int64_t, int64_t>; // (sending rank, receiving rank)

/// One use of a parameter: its gradient slot (stage, slot) on `rank`.
struct ParamUse {
  int64_t useOrder = 0, rank = 0, stage = 0;
  int slot = 0;
};

/// Where a parameter's gradient is reduced and its update computed: the
/// owner, the rank of its first use. Other ranks holding it send their uses'
/// gradients there and receive the updated weights back. The reduction runs
/// in use order whatever the layout, so the bits do not depend on it.
struct ParamPlan {
  int64_t owner = 0;
  std::vector<ParamUse> uses;   // by useOrder
  std::vector<int64_t> holders; // ranks with a copy, ascending
};

std::vector<ParamPlan> planParameters(const Artifact &a);

/// Every directed pair of global ranks that exchanges messages: pipeline
/// sends, and gradients / weights of parameters held on several pipeline
/// ranks, within each data-parallel replica, context rank and tensor rank.
/// (`plans` are in pipeline ranks, the same for every one of those.)
std::vector<Pair> communicatingPairs(const Artifact &a, const std::vector<ParamPlan> &plans);

/// The groups with a communicator of their own: the gradient-reduction ones
/// (a pipeline rank's replicas and their context-parallel ranks, dp x cp
/// members, one per pipeline and tensor rank when dp x cp > 1), then the
/// tensor-parallel ones (one per pipeline rank, replica and context rank
/// when tp > 1), then the context-parallel ones (one per pipeline rank,
/// replica and tensor rank when cp > 1).
inline size_t replicaGroupCount(const Artifact &a) { return a.reduceGroupSize() > 1 ? size_t(a.pp * a.tp) : 0; }
inline size_t tensorGroupCount(const Artifact &a) { return a.tp > 1 ? size_t(a.worldSize() / a.tp) : 0; }
inline size_t contextGroupCount(const Artifact &a) { return a.cp > 1 ? size_t(a.worldSize() / a.cp) : 0; }
inline size_t groupCount(const Artifact &a) {
  return replicaGroupCount(a) + tensorGroupCount(a) + contextGroupCount(a);
}
/// Global rank r's groups among them (its member index in the gradient
/// group is Artifact::reduceMemberOf, in the others its tensor or context rank).
inline size_t replicaGroupOf(const Artifact &a, int64_t r) {
  return size_t(a.pipelineRankOf(r) * a.tp + a.tensorRankOf(r));
}
inline size_t tensorGroupOf(const Artifact &a, int64_t r) { return replicaGroupCount(a) + size_t(r / a.tp); }
inline size_t contextGroupOf(const Artifact &a, int64_t r) {
  return replicaGroupCount(a) + tensorGroupCount(a) + size_t(r / (a.cp * a.tp) * a.tp + a.tensorRankOf(r));
}

} // namespace mhcc::runtime::cuda

#endif // MHCC_RUNTIME_CUDA_RANKPLAN_H
