//===- TraceParts.h - one trace from the processes of a run -------*- C++ -*-===//
//
// `mhcrun --trace FILE` in a multi-process CPU run (--processes, mpirun,
// srun on one host): each rank writes its slices to FILE.rank<R>, timed in
// microseconds of the host's steady clock (one clock for every process of
// the host), and rank 0 waits for every part, merges them into FILE (times
// from the earliest slice, a track per rank, as a one-process run writes
// it) and removes the parts.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CLI_TRACEPARTS_H
#define MHCC_RUNTIME_CLI_TRACEPARTS_H

#include "runtime/program/Trace.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mhcc::runtime {

/// This rank's part: `slices` (times from `epochUs`, the trace epoch in
/// steady-clock microseconds), written atomically. False and `error`.
bool writeTracePart(const std::string &path, int64_t rank, const std::vector<TraceSlice> &slices, double epochUs,
                    std::string &error);

/// Rank 0: waits up to `waitSeconds` for the parts of ranks 0 .. world - 1,
/// writes the merged trace to `path` (its slices also to `merged`) and
/// removes the parts. False and `error` naming a part that did not come or
/// does not read.
bool mergeTraceParts(const std::string &path, int64_t world, double waitSeconds, std::vector<TraceSlice> &merged,
                     std::string &error);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CLI_TRACEPARTS_H
