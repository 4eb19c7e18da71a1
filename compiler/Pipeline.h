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
  Import, // JSON model graph -> verified mhc dialect
};

struct PhaseInfo {
  Phase phase;
  const char *name;
  const char *description;
};

const std::vector<PhaseInfo> &allPhases();
std::optional<Phase> parsePhase(const std::string &name);
/// "import, ..." for error messages and --help.
std::string phaseNames();

/// Adds the passes of every phase after Import up to and including `last`.
void buildPipeline(mlir::PassManager &pm, Phase last);

} // namespace mhcc

#endif // MHCC_COMPILER_PIPELINE_H
