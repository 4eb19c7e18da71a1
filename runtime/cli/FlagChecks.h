//===- FlagChecks.h - numbers and output paths a command line may not take -*- C++ -*-===//
//
// Checked once, where the flags enter (issue 14): a float flag that is NaN,
// infinite or out of its range, and an output path that would destroy an
// input (the artifact, the data, a checkpoint) or is not a regular file.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CLI_FLAGCHECKS_H
#define MHCC_RUNTIME_CLI_FLAGCHECKS_H

#include <string>
#include <vector>

namespace mhcc::runtime {

/// "" or "--flag: must be ..., got X" unless `value` is finite and in
/// [min, max] (`min` excluded when `positive`).
std::string checkNumber(const std::string &flag, double value, double min, double max, bool positive);

/// "" or "--flag PATH: ..." when PATH names one of `inputs` (however
/// spelled: the same file on disk), a directory, or an existing file that is
/// not a regular file (a device, a pipe; /dev/null is allowed).
std::string checkOutputPath(const std::string &flag, const std::string &path, const std::vector<std::string> &inputs);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CLI_FLAGCHECKS_H
