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
/// path may differ between hosts), the kernel choices of the MHCC_
/// environment (they may change bits), and every flag that changes the step, the data order, or
/// when the ranks meet (saves, validation, traces); of --load and
/// --init-from whether they are given (a checkpoint's path may differ too).
std::vector<std::pair<std::string, std::string>> sharedRunSettings(const RunFlags &f, const Artifact &a,
                                                                   const std::string &backend,
                                                                   const std::string &dataFingerprint,
                                                                   const std::string &environment);

/// The data's size in tokens and an XXH3 of the first windows the sampler
/// draws with `seed` (seqLen tokens each): another file, a blend in another
/// order or with other weights, another split almost surely differs,
/// without reading a large dataset.
std::string dataFingerprint(const TokenDataset &data, uint64_t seed, int64_t seqLen);

/// The MHCC_ environment variables that choose kernels (MHCC_ATTENTION,
/// MHCC_MHC_BACKWARD, MHCC_MHC_FORWARD), "NAME=VALUE" joined by spaces.
std::string mhccEnvironment();

/// One "flag=value" line each, what rank 0 broadcasts.
std::string encodeRunSettings(const std::vector<std::pair<std::string, std::string>> &settings);

/// "" when this rank's settings are rank 0's (as encoded); else one line
/// naming the first that differs, both values, and the fix.
std::string runSettingsDifference(const std::string &rank0, const std::vector<std::pair<std::string, std::string>> &mine);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CLI_RUNSETTINGS_H
