//===- RunFlags.h - the mhcrun command line, parsed and checked -*- C++ -*-===//
//
// Apart from the rest of mhcrun so that it can be fuzzed alone
// (tests/fuzz/mhcrun_flags_fuzz.cpp): CLI11 and the flag checks only.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CLI_RUNFLAGS_H
#define MHCC_RUNTIME_CLI_RUNFLAGS_H

#include "runtime/exec/StepTypes.h"

#include <cstdint>
#include <string>

namespace mhcc::runtime {

/// Everything the command line sets.
struct RunFlags {
  std::string artifactPath, backend = "auto", dataPath, metricsPath, memoryPlan = "static", dumpDir;
  std::string saveDir, loadDir, exportPath, initFrom, tracePath;
  std::string deviceProfileOut; // --device-profile-out: implies --profile
  int64_t steps = 20, gpus = -1, saveInterval = 0, processes = 0;
  int64_t ranksPerGpu = 1; // --ranks-per-gpu: in-process ranks sharing a GPU
  std::string split;                    // --split TRAIN,VALID (Megatron's weights); empty: no validation part
  int64_t evalInterval = 0, evalIters = 2; // validation every evalInterval iterations (0: never)
  int64_t splitTrain = 100, splitValid = 0; // --split, parsed
  TrainOptions options;
  bool noProgress = false, inProcess = false;
  bool noRecompute = false; // --no-recompute-sublayers: not even where the artifact was compiled with it
  int64_t recomputeNumSublayers = 0; // --recompute-num-sublayers (0: the artifact's)
  double peakTflops = 0;
  bool memoryPlanGiven = false;
};

/// Parses and checks mhcrun's command line into `f`. Returns -1 to go on,
/// else the exit status: 0 after --help or --version, 1 or 2 after one line
/// on stderr naming the flag and the fix.
int parseRunFlags(int argc, char **argv, RunFlags &f);

/// Writes "mhcrun: MESSAGE" to stderr in one write (the ranks of a
/// multi-process run share stderr); returns 1.
int failLine(const std::string &message);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CLI_RUNFLAGS_H
