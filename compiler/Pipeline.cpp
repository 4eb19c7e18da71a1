//===- Pipeline.cpp - mhcc's named compilation phases -----------------------===//
#include "compiler/Pipeline.h"

namespace mhcc {

const std::vector<PhaseInfo> &allPhases() {
  static const std::vector<PhaseInfo> phases = {
      {Phase::Import, "import", "JSON model graph to the verified mhc dialect"},
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

void buildPipeline(mlir::PassManager &pm, Phase last) {
  (void)pm;
  (void)last; // Import is done by the importer itself; later phases add passes.
}

} // namespace mhcc
