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
#include "runtime/data/Dataset.h"

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace mhcc::runtime {

/// The settings, as (flag, value) pairs in a fixed order: mhcrun's version,
/// the artifact's checksum, the backend chosen, the data's fingerprint (its
/// path may differ between hosts), the MHCC_ environment (kernel choices
/// change bits), and every flag that changes the step, the data order, or
/// when the ranks meet (saves, validation, traces); of --load and
/// --init-from whether they are given (a checkpoint's path may differ too).
std::vector<std::pair<std::string, std::string>> sharedRunSettings(const RunFlags &f, const Artifact &a,
                                                                   const std::string &backend,
                                                                   const std::string &dataFingerprint,
                                                                   const std::string &environment);

/// The data's size in tokens and an XXH3 of up to 65,536 tokens spread
/// evenly over it: another file, a blend in another order or with other
/// weights' parts almost surely differs, without reading a large dataset.
std::string dataFingerprint(const TokenDataset &data);

/// This process's MHCC_ environment variables but the ones that place it
/// (MHCC_RANK, MHCC_LOCAL_RANK, MHCC_WORLD_SIZE, MHCC_BOOTSTRAP_DIR),
/// sorted, "NAME=VALUE" joined by spaces.
std::string mhccEnvironment();

/// One "flag=value" line each, what rank 0 broadcasts.
std::string encodeRunSettings(const std::vector<std::pair<std::string, std::string>> &settings);

/// "" when this rank's settings are rank 0's (as encoded); else one line
/// naming the first that differs, both values, and the fix.
std::string runSettingsDifference(const std::string &rank0, const std::vector<std::pair<std::string, std::string>> &mine);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CLI_RUNSETTINGS_H
