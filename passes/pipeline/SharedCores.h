//===- SharedCores.h - ranks that share one host's cores ----------*- C++ -*-===//
//
// The CPU backend runs every rank as a thread (or process) of one host, so
// when more ranks compute at once than the host has cores, each computes
// slower. simulateSchedule models that as processor sharing: k ranks
// computing at once on c < k cores each get c / k of a core. Given one
// simulated timeline, coreShares says what share each compute instruction
// got over its interval; the simulator stretches the instructions by it
// and simulates again (Simulator.cpp).
//
// Plain C++ (no MLIR).
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_PASSES_PIPELINE_SHAREDCORES_H
#define MHCC_PASSES_PIPELINE_SHAREDCORES_H

#include "passes/pipeline/Schedule.h"

#include <vector>

namespace mhcc::pipeline {

/// Iterations of the sharing fixed point at most, and the relative change
/// of the step below which it has settled.
constexpr int kSharingIterations = 16;
constexpr double kSharingTolerance = 1e-3;

/// [rank][instruction]: the mean over each compute instruction's interval
/// in `timed` of min(1, cores / ranks computing), in (0, 1]; 1 for the
/// instructions that are not compute or take no time. Each pipeline rank
/// counts as `hostRanks` ranks of the host: its dp x cp x tp copies run the
/// same list at the same time.
std::vector<std::vector<double>> coreShares(const Schedule &schedule, const SimulationResult &timed, int64_t cores,
                                            int64_t hostRanks);

} // namespace mhcc::pipeline

#endif // MHCC_PASSES_PIPELINE_SHAREDCORES_H
