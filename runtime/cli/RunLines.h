//===- RunLines.h - what mhcrun prints ----------------------------*- C++ -*-===//
//
// The run's banner, Megatron's iteration and validation lines, the progress
// bar, the --profile table and the --metrics JSON lines: one place for the
// formats that tools (metrics_to_golden.py, the GPU suite) and users read.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CLI_RUNLINES_H
#define MHCC_RUNTIME_CLI_RUNLINES_H

#include "runtime/artifact/Artifact.h"
#include "runtime/cli/RunFlags.h"
#include "runtime/data/Dataset.h"
#include "runtime/exec/StepTypes.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <utility>

namespace mhcc::runtime {

/// Megatron's iteration line: losses, grad norm, zeros, rates, peak memory
/// (the largest rank's, and each rank's when there are several).
std::string iterationLine(const StepResult &r, int64_t steps, int64_t samplesPerStep, double flopsPerToken,
                          double peakTflops);

/// The progress bar on stderr (a terminal's), redrawn in place.
void printProgress(int64_t done, int64_t total, double lmLoss);

/// Device time by rank and primitive, largest first, then the host phases.
void printProfile(const std::map<std::string, double> &profileMs, int64_t iterations);

/// How a rank keeps the optimizer's state (optimizerBytesPerRank).
struct OptimizerStateLayout {
  bool sharded = false;        // the distributed optimizer's parts: the moments
  bool mastersSharded = false; // and the fp32 masters (the CUDA backend's bf16 models)
  bool remainders = false;     // each master as its bf16 copy and 2 bytes, on its owner alone
  bool moments = true;         // Adam's two (the CUDA backend keeps none for SGD)
};
/// The optimizer's state a rank holds (fp32 masters and Adam's moments, 12
/// bytes a parameter element, 10 with remainders, 4 or 2 without moments,
/// of the parameters its stages use, its tensor-parallel blocks of them),
/// the largest over the ranks.
int64_t optimizerBytesPerRank(const Artifact &a, const OptimizerStateLayout &layout);

/// The validation pass's line, Megatron's format.
std::string validationLine(const StepResult &v);

/// One --metrics line. Keys are snake_case, one style (docs/runtime.md);
/// tools/metrics_to_golden.py maps them to Megatron's golden-value names.
nlohmann::json metricsLine(const StepResult &r, double flopsPerToken);

/// The run's first lines (the speaking rank's): the model, backend, mesh,
/// layout and data; with the distributed optimizer, its state per rank.
void printRunBanner(const Artifact &a, const std::string &backend, const RunFlags &f, const TokenDataset &data);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CLI_RUNLINES_H
