//===- Collectives.h - the tp / cp collectives of one compute step --*- C++ -*-===//
//
// Which collectives a stage's FWD, BWD, B or W issues, in order and with
// their shapes, under tensor parallelism (with or without sequence
// parallelism) and context parallelism. The compiler lists them in every
// rank's schedule after their compute instruction (-pipe-verify-schedule
// checks the lists), the runtime checks an artifact's lists against its
// stage programs before a step, and the CPU device checks each collective
// its kernels issue against the list while they run. The rules follow the
// CPU kernels (runtime/cpu/StageExecutor.h, TensorParallel.h,
// ContextParallelAttention.h): a change there that issues another
// collective fails the tensor- and context-parallel tests at once.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_PROGRAM_COLLECTIVES_H
#define MHCC_RUNTIME_PROGRAM_COLLECTIVES_H

#include "runtime/program/Instructions.h"
#include "runtime/program/Program.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace mhcc::runtime {

/// The mesh and the model sizes the collectives' shapes depend on.
struct CollectiveMesh {
  int64_t tp = 1, cp = 1;
  bool sequenceParallel = false;
  int64_t tokens = 0; // a microbatch's rows, T
  int64_t hidden = 0, heads = 0;
  bool active() const { return tp > 1 || cp > 1; }
};

/// One primitive of a stage program, as far as its collectives go: its
/// kind, whether its backward produces an input gradient (the embedding's
/// has none), and whether it has weights (W runs only those that do).
struct CollectiveStep {
  Prim op = Prim::Identity;
  bool inputGradient = true;
  bool weights = true;
};

/// The collectives compute instruction `kind` (FWD, BWD, B or W) issues
/// over `prims`, which are in the order that instruction runs them (the
/// forward list for FWD, the backward list for the others).
/// OpKind::Collective instructions with stage and mb unset.
std::vector<Instr> collectivesOf(const std::vector<CollectiveStep> &prims, OpKind kind, const CollectiveMesh &mesh);

/// The collectives a compute step of stage program `p` issues: FWD over
/// forward instructions [begin, end) (all of them by default; a segment
/// run again by activation recomputation, runtime/program/Recompute.h),
/// BWD, B and W over the backward list. Stage and mb unset.
std::vector<Instr> stageCollectives(const StageProgram &p, OpKind kind, const CollectiveMesh &mesh, size_t begin = 0,
                                    size_t end = SIZE_MAX);

/// One difference between a rank's list and the collectives its compute
/// steps issue: the instruction it is found at, and what is wrong there.
struct ListedCollectiveError {
  size_t index = 0;
  std::string message;
};
/// The verifier's and the artifact check's one rule: every compute step of
/// `list` is followed by exactly the collectives `issuedBy(step)` returns
/// (stage and mb unset), in order and shape, and no COLLECTIVE follows
/// anything else. At most one error a step (its first difference: the rest
/// of its list is shifted by it). `issuedBy` returns nullopt for a step it
/// cannot judge (a stage out of range, which the caller reports): that
/// step's collectives go with it.
std::vector<ListedCollectiveError>
checkListedCollectives(const std::vector<Instr> &list,
                       const std::function<std::optional<std::vector<Instr>>(const Instr &step)> &issuedBy);

/// What collective `c` costs one rank as a ring over `groupSize` ranks, for
/// the simulator: the bytes it sends (an all-gather or a reduce-scatter
/// (g - 1) / g of the whole tensor, an all-reduce twice that) at
/// `elementBytes` a value, and the link latencies it waits (g - 1 a pass).
struct CollectiveTraffic {
  double bytes = 0;
  int64_t latencies = 0;
};
CollectiveTraffic ringTraffic(const Instr &c, int64_t groupSize, int64_t elementBytes);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_PROGRAM_COLLECTIVES_H
