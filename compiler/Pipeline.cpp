//===- Pipeline.cpp - mhcc's named compilation phases -----------------------===//
#include "compiler/Pipeline.h"

#include "passes/Passes.h"

namespace mhcc {

const std::vector<PhaseInfo> &allPhases() {
  static const std::vector<PhaseInfo> phases = {
      {Phase::Import, "import", "JSON model graph to the verified mhc dialect"},
      {Phase::Partition, "partition", "layers to virtual pipeline stages"},
      {Phase::P2P, "p2p", "width-aware boundary transfers between stages"},
      {Phase::Schedule, "schedule", "verified per-rank instruction lists"},
  };
  return phases;
}

std::optional<Phase> parsePhase(const std::string &name) {
  for (const PhaseInfo &info : allPhases())
    if (name == info.name)
      return info.phase;
  return std::nullopt;
}

std::string phaseNames() {
  std::string names;
  for (const PhaseInfo &info : allPhases())
    names += (names.empty() ? "" : ", ") + std::string(info.name);
  return names;
}

void buildPipeline(mlir::PassManager &pm, Phase last, const PipelineOptions &options) {
  // Import is done by the importer itself.
  if (last < Phase::Partition)
    return;
  PipePartitionOptions partition;
  partition.pp = options.pp;
  partition.vpp = options.vpp;
  partition.layout = options.layout;
  partition.memoryCapGib = options.memoryCapGib;
  pm.addPass(createPipePartition(partition));
  if (last < Phase::P2P)
    return;
  pm.addPass(createPipeInsertP2P());
  if (last < Phase::Schedule)
    return;
  PipeScheduleOptions schedule;
  schedule.kind = options.scheduleKind();
  schedule.microbatches = options.microbatches;
  schedule.groupSize = options.groupSize;
  pm.addPass(createPipeSchedule(schedule));
  if (options.testMisorderP2P)
    pm.addPass(createPipeTestMisorderP2P());
  // Every compile verifies the schedule it emits.
  pm.addPass(createPipeVerifySchedule());
}

} // namespace mhcc
