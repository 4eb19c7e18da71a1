//===- Pipeline.h - mhcc's named compilation phases ---------------*- C++ -*-===//
#ifndef MHCC_COMPILER_PIPELINE_H
#define MHCC_COMPILER_PIPELINE_H

#include "mlir/Pass/PassManager.h"

#include <optional>
#include <string>
#include <vector>

namespace mhcc {

/// The phases of a compile, in order; `--compile-to=PHASE` stops after one.
enum class Phase {
  Import,    // JSON model graph -> verified mhc dialect
  Partition, // layers -> virtual stages (pipe.stage)
  P2P,       // pipe.boundary on every stage edge
  Schedule,  // per-rank instruction lists, verified by simulation
};

struct PhaseInfo {
  Phase phase;
  const char *name;
  const char *description;
};

const std::vector<PhaseInfo> &allPhases();
std::optional<Phase> parsePhase(const std::string &name);
/// "import, partition, ..." for error messages and --help.
std::string phaseNames();

struct PipelineOptions {
  int64_t pp = 1;
  int64_t vpp = 1;
  std::string layout;       // empty: automatic
  double memoryCapGib = 0;  // automatic partition only; 0: no cap
  int64_t microbatches = 8;
  std::string schedule;     // empty: 1f1b for vpp = 1, else interleaved
  int64_t groupSize = 0;    // interleaved g; 0: p
  bool testMisorderP2P = false;

  std::string scheduleKind() const {
    return !schedule.empty() ? schedule : vpp > 1 ? "interleaved" : "1f1b";
  }
};

/// Adds the passes of every phase after Import up to and including `last`.
void buildPipeline(mlir::PassManager &pm, Phase last, const PipelineOptions &options);

} // namespace mhcc

#endif // MHCC_COMPILER_PIPELINE_H
