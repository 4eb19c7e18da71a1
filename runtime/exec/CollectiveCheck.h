//===- CollectiveCheck.h - a step's collectives against its schedule -*- C++ -*-===//
//
// The tensor- and context-parallel collectives a compute instruction's
// kernels issue are listed in the schedule as COLLECTIVE instructions after
// it (Device::expectCollectives). Every backend checks each collective its
// kernels issue against the next listed one, so a runtime that disagrees
// with the compiler fails with both named instead of letting the group wait
// in different collectives.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_EXEC_COLLECTIVECHECK_H
#define MHCC_RUNTIME_EXEC_COLLECTIVECHECK_H

#include "runtime/artifact/Artifact.h"

#include <string>
#include <tuple>
#include <vector>

namespace mhcc::runtime {

class CollectiveCheck {
public:
  /// The next compute instruction's COLLECTIVEs: `count` from `first`.
  void expect(const Instr *first, size_t count) {
    planned_ = first;
    plannedCount_ = count;
    issued_ = 0;
  }

  /// A collective about to be issued: "" when it is the next one listed,
  /// else the error. An all-reduce compares elements (rows x cols), the
  /// others rows and cols.
  std::string issue(MeshAxis axis, CollectiveOp op, int64_t rows, int64_t cols) {
    const Instr *next = issued_ < plannedCount_ ? planned_ + issued_ : nullptr;
    const bool allReduce = op == CollectiveOp::AllReduce || op == CollectiveOp::AllReduceMax;
    if (next && next->axis == axis && next->collective == op && rows * cols == next->tokens * next->width &&
        (allReduce || (rows == next->tokens && cols == next->width))) {
      ++issued_;
      return "";
    }
    const std::string issued = std::string(meshAxisName(axis)) + " " + collectiveOpName(op) + " [" +
                               std::to_string(rows) + "x" + std::to_string(cols) + "]";
    return "its kernels issued collective #" + std::to_string(issued_ + 1) + " as " + issued + ", where " +
           listName() + " lists " + (next ? next->describe() : std::string("no more")) + disagreement();
  }

  /// After the instruction: "" when every listed collective was issued.
  std::string finished() const {
    if (issued_ == plannedCount_)
      return "";
    return "its kernels issued " + std::to_string(issued_) + " of the " + std::to_string(plannedCount_) +
           " collectives " + listName() + " lists; the next was " + planned_[issued_].describe() + disagreement();
  }

  /// A forward run again inside a backward (activation recomputation)
  /// issues its own collectives between the backward's: checked against
  /// `count` from `first` until resume(), which then goes on with the
  /// backward's list where it stopped.
  void interpose(const Instr *first, size_t count) {
    outer_.push_back({planned_, plannedCount_, issued_});
    expect(first, count);
  }
  /// "" when the interposed list was issued whole; the outer list resumes
  /// either way.
  std::string resume() {
    std::string problem = finished(); // named as the interposed list's
    if (!outer_.empty()) {
      std::tie(planned_, plannedCount_, issued_) = outer_.back();
      outer_.pop_back();
    }
    return problem.empty() ? "" : "a recomputed forward: " + problem;
  }

private:
  /// Whose list is checked: the compiled schedule's, or (interposed) the
  /// one the runtime derived for a recomputed forward.
  std::string listName() const {
    return outer_.empty() ? "the schedule" : "the recomputed segment's list (derived from its stage program)";
  }
  std::string disagreement() const {
    return outer_.empty()
               ? " (the runtime and the compiler disagree on this step's collectives: a bug, please report it)"
               : " (the kernels and the stage program disagree on a recomputed forward's collectives: a bug, "
                 "please report it)";
  }
  const Instr *planned_ = nullptr;
  size_t plannedCount_ = 0, issued_ = 0;
  std::vector<std::tuple<const Instr *, size_t, size_t>> outer_; // interrupted lists
};

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_EXEC_COLLECTIVECHECK_H
