//===- Trace.h - timelines in the Chrome trace-event format --------*- C++ -*-===//
//
// What `mhcc --print-schedule --trace F` predicts and `mhcrun --trace F`
// measures, written the same way so that Perfetto or chrome://tracing shows
// the two side by side: one process per timeline, one track per pipeline
// rank, one slice per instruction named by Instr::describe() ("FWD(s1,mb0)",
// "SEND act s0->s1 mb0 to r1 [128x256]"), in microseconds.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_PROGRAM_TRACE_H
#define MHCC_RUNTIME_PROGRAM_TRACE_H

#include "runtime/program/Instructions.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mhcc::runtime {

struct TraceSlice {
  int64_t rank = 0;
  std::string name;     // Instr::describe()
  std::string category; // compute, comm, free, optimizer
  double startUs = 0, durationUs = 0;
  int64_t step = 0;     // measured: the iteration (1-based); predicted: 0
};

/// "compute" for FWD / BWD / B / W, "comm" for SEND / RECV, "free", "optimizer".
const char *traceCategory(OpKind kind);

/// One measured step as its slices show it: the span from the first slice's
/// start to the last one's end (the optimizer included) and the bubble, the
/// time a rank ran neither compute nor the optimizer, over ranks x span: the
/// simulator's idle / (ranks x step), and tests/runtime/check_trace.py's.
struct StepTiming {
  int64_t step = 0;
  double spanMs = 0, bubble = 0;
};
/// Each step's timing, by step, from measured slices of `ranks` ranks.
std::vector<StepTiming> stepTimings(const std::vector<TraceSlice> &slices, int64_t ranks);

/// The trace-event JSON of `slices`, their ranks named "rank R" under one
/// process called `title` (e.g. "predicted" or "measured").
std::string chromeTrace(const std::vector<TraceSlice> &slices, int64_t ranks, const std::string &title);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_PROGRAM_TRACE_H
