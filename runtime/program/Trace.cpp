//===- Trace.cpp - timelines in the Chrome trace-event format ---------------===//
#include "runtime/program/Trace.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>

namespace mhcc::runtime {
namespace {

std::string quoted(const std::string &text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\')
      out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20)
      out += c;
  }
  return out + "\"";
}

std::string number(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.3f", value);
  return buffer;
}

} // namespace

const char *traceCategory(OpKind kind) {
  switch (kind) {
  case OpKind::Forward:
  case OpKind::Backward:
  case OpKind::BackwardInput:
  case OpKind::BackwardWeight:
    return "compute";
  case OpKind::Send:
  case OpKind::Recv:
  case OpKind::AllReduce:
  case OpKind::Collective:
    return "comm";
  case OpKind::Free:
    return "free";
  case OpKind::Optimizer:
    return "optimizer";
  }
  return "other";
}

std::vector<StepTiming> stepTimings(const std::vector<TraceSlice> &slices, int64_t ranks) {
  struct Extent {
    double start = std::numeric_limits<double>::infinity(), end = -std::numeric_limits<double>::infinity();
    double busy = 0;
  };
  std::map<int64_t, Extent> byStep;
  for (const TraceSlice &s : slices) {
    Extent &e = byStep[s.step];
    e.start = std::min(e.start, s.startUs);
    e.end = std::max(e.end, s.startUs + s.durationUs);
    // Busy as the simulator counts it: compute, and the optimizer every rank runs.
    if (s.category == traceCategory(OpKind::Forward) || s.category == traceCategory(OpKind::Optimizer))
      e.busy += s.durationUs;
  }
  std::vector<StepTiming> timings;
  for (const auto &[step, e] : byStep) {
    const double span = e.end - e.start;
    timings.push_back({step, span / 1e3, span > 0 && ranks > 0 ? std::max(0.0, 1 - e.busy / (ranks * span)) : 0.0});
  }
  return timings;
}

std::string chromeTrace(const std::vector<TraceSlice> &slices, int64_t ranks, const std::string &title) {
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  out += "{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": 0, \"args\": {\"name\": " + quoted(title) + "}}";
  for (int64_t r = 0; r < ranks; ++r)
    out += ",\n{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": 0, \"tid\": " + std::to_string(r) +
           ", \"args\": {\"name\": \"rank " + std::to_string(r) + "\"}}";
  for (const TraceSlice &s : slices)
    out += ",\n{\"ph\": \"X\", \"pid\": 0, \"tid\": " + std::to_string(s.rank) + ", \"name\": " + quoted(s.name) +
           ", \"cat\": " + quoted(s.category) + ", \"ts\": " + number(s.startUs) + ", \"dur\": " +
           number(s.durationUs) + ", \"args\": {\"step\": " + std::to_string(s.step) + "}}";
  return out + "\n]}\n";
}

} // namespace mhcc::runtime
