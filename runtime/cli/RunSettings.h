//===- RunSettings.h - what every process of a run must share -----*- C++ -*-===//
//
// mpirun, srun and mhcrun's own launcher give every rank one command line,
// but a hand-made launch (a per-node script, a job array) can give ranks
// different flags. Ranks that disagree on a setting that changes the step or
// the ranks' meeting points would train different models silently (--lr under
// data parallelism), or wait in collectives the others never issue
// (--recompute-sublayers under tensor parallelism, a save, a validation
// pass). So a multi-process run compares, at start-up, each rank's settings
// with rank 0's, and a rank that differs stops with the setting named.
// Output-only flags (--metrics, --no-progress, --peak-tflops) may differ.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CLI_RUNSETTINGS_H
#define MHCC_RUNTIME_CLI_RUNSETTINGS_H

#include "runtime/artifact/Artifact.h"
#include "runtime/cli/RunFlags.h"

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace mhcc::runtime {

/// The settings, as (flag, value) pairs in a fixed order: the artifact's
/// checksum, the backend chosen, the data's size in tokens (its path may
/// differ between hosts), every flag that changes the step, the data order,
/// or when the ranks meet (saves, validation, profiles, traces).
std::vector<std::pair<std::string, std::string>> sharedRunSettings(const RunFlags &f, const Artifact &a,
                                                                   const std::string &backend, size_t dataTokens);

/// One "flag=value" line each, what rank 0 broadcasts.
std::string encodeRunSettings(const std::vector<std::pair<std::string, std::string>> &settings);

/// "" when this rank's settings are rank 0's (as encoded); else one line
/// naming the first that differs, both values, and the fix.
std::string runSettingsDifference(const std::string &rank0, const std::vector<std::pair<std::string, std::string>> &mine);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CLI_RUNSETTINGS_H
