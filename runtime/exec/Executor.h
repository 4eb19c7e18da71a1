//===- Executor.h - one rank's step: the instruction list, once ----*- C++ -*-===//
//
// Walks a rank's static instruction list (FWD, BWD, B, W, SEND, RECV, FREE,
// OPTIM) for one step over a Device, for every backend. It owns the per-
// (stage, microbatch) state, hands a chunk's output (or input gradient) to
// the next chunk on the same rank without a message, records taps and
// collects the last stage's losses. Every check of the list's order (a FWD
// twice, a W before its B, a use before arrival) is made here, once.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_EXEC_EXECUTOR_H
#define MHCC_RUNTIME_EXEC_EXECUTOR_H

#include "runtime/exec/Device.h"
#include "runtime/program/BackwardFrees.h"
#include "runtime/program/Recompute.h"

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace mhcc::runtime {

class Executor {
public:
  Executor(const Artifact &artifact, const TrainOptions &options, Device &device);

  /// Issues the rank's whole list for one step, then waits for the device
  /// and reads the losses and taps. False with error() on failure.
  bool runPipeline();

  /// This rank's last-stage losses of the step, [mb][loss] (zeros elsewhere).
  const std::vector<std::vector<double>> &losses() const { return losses_; }
  /// With recordTaps: "<tap>@mb<k>" -> values.
  std::map<std::string, std::vector<float>> takeTaps() { return std::move(taps_); }
  /// With TrainOptions::trace: this step's instructions, timed from `epoch`.
  void setTraceEpoch(std::chrono::steady_clock::time_point epoch) { epoch_ = epoch; }
  std::vector<TraceSlice> takeTrace() { return std::move(trace_); }
  /// With trace: the OPTIM slice spans the optimizer step the trainer ran
  /// after the list, from `start` to `end` (host clock: the step returns once
  /// its work is done, on the GPU too).
  void traceOptimizer(std::chrono::steady_clock::time_point start, std::chrono::steady_clock::time_point end);
  const std::string &error() const { return error_; }

private:
  using Key = std::pair<int64_t, int64_t>; // (stage, microbatch)

  /// The compute instruction at `index` and the COLLECTIVEs listed after
  /// it (which the device checks its kernels against); `index` ends on
  /// the last of them.
  bool computeStep(const std::vector<Instr> &list, size_t &index);
  bool forward(int64_t stage, int64_t mb);
  /// Forward instructions [begin, end) of (stage, mb), whole spans; `again`:
  /// recomputing them (no loss read, no tap; held checkpoints kept).
  bool runForward(int64_t stage, int64_t mb, StageState &state, size_t begin, size_t end, bool again);
  /// With TrainOptions::recompute: runs again every dropped segment the
  /// backward instructions [index, index + span) need (Recompute.h).
  bool recomputeFor(int64_t stage, int64_t mb, StageState &state, size_t index, size_t span);
  const RecomputePlan &recomputePlanOf(int64_t stage);
  /// Device::backwardReads of each of stage's backward instructions.
  std::vector<std::vector<int>> deviceReadsOf(int64_t stage) const;
  bool backward(int64_t stage, int64_t mb, BackwardPart part);
  bool takeOutputGradient(int64_t stage, int64_t mb, StageState &state);
  bool communicate(const std::vector<const Instr *> &group);
  bool freeOutput(const Instr &instr);
  bool collectResults();
  /// With trace, on a device that times its own work: each slice's interval
  /// replaced by the one the device measured for its bracket.
  bool deviceTimes(size_t brackets);
  double sinceEpochUs(std::chrono::steady_clock::time_point t) const {
    return std::chrono::duration<double, std::micro>(t - epoch_).count();
  }

  void tap(const ValueInfo &info, const Buffer &buffer, int64_t mb);
  void tapGradients(const StageProgram &program, const StageState &state, int64_t mb);
  /// Releases everything of (stage, mb) on the compute queue and forgets it.
  void releaseState(Key key);
  /// Stage s's BackwardFrees for `part` with the device's extra reads, computed once.
  const BackwardFrees &backwardFreesOf(int64_t stage, BackwardPart part);
  /// Releases `values` and `aux` of a state whose backward has read them for
  /// the last time (with tapGradients, a gradient's tap recorded first).
  void releaseRead(const StageProgram &program, StageState &state, int64_t mb, const std::vector<int> &values,
                   const std::vector<size_t> &aux, bool tapGradients);
  bool fail(const std::string &message);
  const StageProgram &program(int64_t stage) const { return artifact_.stages[stage]; }

  const Artifact &artifact_;
  const TrainOptions &options_;
  Device &device_;
  const int64_t rank_;       // the pipeline rank: whose list, which stages
  const int64_t globalRank_; // as messages and traces name it
  const int64_t replica_;    // data-parallel replica: microbatch mb is mb x dp + replica of the global batch
  const bool releaseAsRead_; // the backward releases as it goes (BackwardFrees.h)
  std::string where_, error_;

  std::map<std::pair<int64_t, BackwardPart>, BackwardFrees> backwardFrees_; // by stage and part
  std::map<int64_t, RecomputePlan> recomputePlans_;                         // by stage

  // Per step.
  std::map<Key, StageState> states_;
  std::map<Key, Transfer> activationsIn_, gradientsIn_; // arrived, not yet consumed
  std::map<Key, int64_t> outputPeer_; // where each sent output went: its FREE follows that queue
  std::set<Key> weightPending_;       // B ran, W has not: the state stays
  std::map<Key, std::vector<bool>> dropped_; // with recompute: by segment, released and not yet run again
  struct PendingRead {
    std::string name; // tap key, or empty for a loss
    int64_t mb = 0;
    size_t loss = 0;
    Buffer buffer;
  };
  std::vector<PendingRead> reads_; // losses and tap copies, read after the pipeline
  std::vector<std::vector<double>> losses_;
  std::map<std::string, std::vector<float>> taps_;
  std::chrono::steady_clock::time_point epoch_ = std::chrono::steady_clock::now();
  std::vector<TraceSlice> trace_;
  std::vector<size_t> traceBracket_; // by slice: its beginInstruction bracket in the step
};

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_EXEC_EXECUTOR_H
