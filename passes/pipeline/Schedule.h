//===- Schedule.h - static per-rank pipeline schedules -------------*- C++ -*-===//
//
// Builds each rank's instruction list (FWD, BWD or its B/W halves, SEND,
// RECV, FREE, ALLREDUCE, OPTIM, and after each compute step the tp / cp
// COLLECTIVEs it issues) for GPipe, 1F1B, interleaved 1F1B and ZB-H1, and
// simulates all ranks together to verify a list set (no deadlock, matching
// message order at both ends of every peer pair, shapes, no use after FREE,
// each step's collectives) and to predict its timeline, bubble and peak
// activation memory.
//
// Collective semantics: every rank of a tensor- or context-parallel group
// runs its pipeline rank's list, so the group issues the same collectives
// in the same order; the verifier checks that each compute step lists
// exactly the collectives its stage issues, in order and shape, so that
// no member can wait in a collective the others never call.
//
// Message semantics are NCCL's: messages from rank a to rank b are matched to
// b's receives from a in issue order; consecutive SEND/RECV instructions form
// one group (ncclGroupStart/End) that completes when all of them have.
//
// Plain C++ (no MLIR).
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_PASSES_PIPELINE_SCHEDULE_H
#define MHCC_PASSES_PIPELINE_SCHEDULE_H

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/program/Instructions.h"
#include "runtime/program/Trace.h"

namespace mhcc::pipeline {

enum class ScheduleKind { GPipe, OneFOneB, Interleaved, ZeroBubbleH1 };

const char *scheduleKindName(ScheduleKind kind);
std::optional<ScheduleKind> parseScheduleKind(const std::string &name);

// The instruction format belongs to the runtime, which executes it.
using runtime::Instr;
using runtime::OpKind;
using runtime::Payload;
using runtime::opKindName;

struct StageSpec {
  double forwardTime = 0;     // one microbatch
  double backwardTime = 0;    // BWD, or B + W
  double weightGradTime = 0;  // W's share of backwardTime (zero-bubble split)
  int64_t savedBytes = 0;     // activations kept from FWD to BWD, per microbatch
  /// Activation recomputation: of a microbatch's activations, what its FWD
  /// drops and the backward computes again (not in savedBytes). A BWD
  /// holds the largest one segment's at a time; ZB-H1's B all of it,
  /// until W has read it.
  int64_t recomputedBytes = 0, recomputeWorkingBytes = 0;
  int64_t params = 0;         // parameters the stage updates (the optimizer's work)
  /// Width per token of the stage's output boundary (0 for the last stage).
  int64_t outputWidth = 0;
  /// Bytes per value of that boundary (an fp32 residual in a bf16 model
  /// carries 4); 0: the spec's elementBytes.
  int64_t outputElementBytes = 0;
  /// The tensor- and context-parallel collectives each compute step of the
  /// stage issues (runtime/program/Collectives.h; their time is in the
  /// step's): the schedule lists them right after the step.
  std::vector<Instr> forwardCollectives, backwardCollectives, inputCollectives, weightCollectives;
  const std::vector<Instr> &collectivesOf(OpKind step) const;
};

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int64_t pp = 1, vpp = 1;
  int64_t dp = 1; // data-parallel replicas: > 1 adds each rank's gradient ALLREDUCE before OPTIM
  int64_t cp = 1; // context-parallel ranks per sequence: tokens is already T / cp; dp x cp > 1 adds the ALLREDUCE
  int64_t tp = 1; // tensor-parallel ranks per layer (with sequence parallelism tokens is T / (cp x tp))
  bool sequenceParallel = false;
  bool distributedOptimizer = false; // ZeRO-1 over the dp x cp gradient group: REDUCESCATTERs, OPTIM updates a part
  bool recomputeSublayers = false;   // activation recomputation: in the stages' costs; recorded with the schedule
  int64_t recomputeNumSublayers = 1; // with it, the sublayers a recomputed segment holds
  int64_t microbatches = 1;
  int64_t groupSize = 0; // interleaved microbatch group g; 0 = p
  int64_t tokens = 1;    // T per microbatch
  int64_t elementBytes = 4; // activations (collectives); boundaries may differ (StageSpec)
  double linkBytesPerTime = 0; // P2P bandwidth; 0 = free communication
  double linkLatency = 0;      // per message
  double optimizerNsPerParam = 0; // OPTIM: the rank's stages' parameters x this
  /// Cores every rank of the world shares (the CPU backend: threads or
  /// processes of one host); 0: a device per rank. Ranks computing at once
  /// beyond it share the cores equally (simulateSchedule's processor sharing).
  int64_t sharedCores = 0;
  std::vector<StageSpec> stages; // pp * vpp of them
};

/// Every replica of a data-parallel group runs its pipeline rank's list, so
/// the group issues the same collectives in the same order by construction;
/// the simulator checks each list's ALLREDUCE (one, after the rank's last
/// backward, before OPTIM, over exactly the rank's gradients).
struct Schedule {
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int64_t pp = 1, vpp = 1, dp = 1, cp = 1, tp = 1, microbatches = 1, groupSize = 1;
  bool sequenceParallel = false, distributedOptimizer = false, recomputeSublayers = false;
  int64_t recomputeNumSublayers = 1;
  std::vector<std::vector<Instr>> ranks;
  /// Ranks one ALLREDUCE sums over: the data-parallel replicas and their context-parallel ranks.
  int64_t reduceGroup() const { return dp * cp; }
};

/// Why `kind` cannot run pp x vpp stages with `microbatches` in groups of
/// `groupSize` (0: pp), or nullopt. These checks need no model, so a driver
/// can reject its flags before compiling; buildSchedule makes them too.
std::optional<std::string> checkScheduleShape(ScheduleKind kind, int64_t pp, int64_t vpp,
                                              int64_t microbatches, int64_t groupSize);

/// Builds the schedule, or returns nullopt with `error` for configurations
/// the schedule cannot run (GPipe or ZB-H1 with v > 1, the m % g rule, ...).
std::optional<Schedule> buildSchedule(const ScheduleSpec &spec, std::string &error);

struct ScheduleError {
  int64_t rank = -1;
  int64_t instr = -1; // index into that rank's list
  std::string message;
};

struct TimedInstr {
  double start = 0, end = 0;
};

struct SimulationResult {
  std::vector<ScheduleError> errors; // empty: the schedule is valid
  double makespan = 0;
  std::vector<double> busy;            // compute time per rank
  std::vector<int64_t> peakBytes;      // live activations + boundary buffers
  std::vector<int64_t> peakInFlight;   // microbatches between FWD and last BWD part
  std::vector<std::vector<TimedInstr>> timeline;
  /// Idle time over ranks x makespan, overall and per rank: in [0, 1).
  double bubbleFraction = 0;
  std::vector<double> rankBubbleFraction;
  /// (makespan - busiest rank's compute) / busiest rank's compute: the
  /// closed forms' "bubble" ((p-1)/m for 1F1B), unbounded above.
  double bubbleOverhead = 0;
};

/// The errors of each rank's COLLECTIVE instructions: every compute step
/// must be followed by exactly its stage's collectives
/// (StageSpec::collectivesOf), in order and shape, and a COLLECTIVE
/// anywhere else follows no step. simulateSchedule reports these first.
std::vector<ScheduleError> checkStepCollectives(const Schedule &schedule, const ScheduleSpec &spec);

/// Simulates every rank's list together; see the file comment for the rules.
/// With spec.sharedCores, more ranks than cores computing at once each run
/// at cores / ranks of their speed: each compute instruction is stretched by
/// the share of the cores it got over its interval, and the schedule is
/// simulated again until the step stops moving (a damped fixed point). The
/// pipeline ranks simulated stand for dp x cp x tp host ranks each.
SimulationResult simulateSchedule(const Schedule &schedule, const ScheduleSpec &spec);

/// A per-rank text timeline plus bubble and peak memory, for --print-schedule.
std::string formatTimeline(const Schedule &schedule, const SimulationResult &result);

/// The predicted timeline as Chrome trace events (runtime/program/Trace.h):
/// the same track and slice names mhcrun --trace measures.
std::string predictedTrace(const Schedule &schedule, const SimulationResult &result);

} // namespace mhcc::pipeline

#endif // MHCC_PASSES_PIPELINE_SCHEDULE_H
