//===- HostMemory.cpp - whether the CPU backend's parameters fit the host --===//
#include "runtime/cli/HostMemory.h"

#include "runtime/cpu/CpuRankBase.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace mhcc::runtime {
namespace {

std::optional<int64_t> readNumber(const std::string &path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt; // missing, or "max"
  return std::stoll(word);
}

std::optional<int64_t> memAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:")
      return kib * 1024;
  return std::nullopt;
}

std::string gib(int64_t bytes) {
  char text[32];
  const double mib = double(bytes) / (1024.0 * 1024);
  if (mib < 1024)
    std::snprintf(text, sizeof text, "%.1f MiB", mib);
  else
    std::snprintf(text, sizeof text, "%.1f GiB", mib / 1024);
  return text;
}

} // namespace

std::optional<HostMemory> availableHostMemory() {
  if (const char *forced = std::getenv("MHCC_HOST_MEMORY_BYTES"); forced && *forced) {
    char *end = nullptr;
    const long long bytes = std::strtoll(forced, &end, 10);
    if (end && *end == '\0' && bytes >= 0)
      return HostMemory{bytes, "MHCC_HOST_MEMORY_BYTES"};
  }
  std::optional<HostMemory> best;
  if (std::optional<int64_t> bytes = memAvailable())
    best = HostMemory{*bytes, "MemAvailable in /proc/meminfo"};
  const std::optional<int64_t> limit = readNumber("/sys/fs/cgroup/memory.max"),
                               used = readNumber("/sys/fs/cgroup/memory.current");
  if (limit && used && (!best || *limit - *used < best->bytes))
    best = HostMemory{std::max<int64_t>(0, *limit - *used), "the cgroup's memory.max less memory.current"};
  return best;
}

int64_t cpuActivationBytes(const Artifact &a) {
  // A microbatch's forward of a stage: its values and the aux its
  // primitives keep, as floats (the CPU backend stores every dtype so).
  std::vector<int64_t> stageBytes(a.stages.size(), 0);
  for (size_t s = 0; s < a.stages.size(); ++s) {
    for (const ValueInfo &v : a.stages[s].values)
      stageBytes[s] += 4 * v.rows * v.cols;
    for (const ForwardInstr &f : a.stages[s].forward)
      stageBytes[s] += 4 * f.auxSize;
  }
  // A rank holds a forward until its backward (W under the zero-bubble split).
  int64_t total = 0;
  for (const std::vector<Instr> &rank : a.ranks) {
    int64_t live = 0, peak = 0;
    for (const Instr &instr : rank) {
      if (instr.stage < 0 || size_t(instr.stage) >= stageBytes.size())
        continue;
      if (instr.kind == OpKind::Forward)
        live += stageBytes[instr.stage];
      else if (instr.kind == OpKind::Backward || instr.kind == OpKind::BackwardWeight)
        live -= stageBytes[instr.stage];
      peak = std::max(peak, live);
    }
    total += peak;
  }
  return total * a.dp * a.cp * a.tp; // every replica, context and tensor rank its own
}

std::string hostMemoryProblem(const Artifact &a, const HostMemory &available) {
  const int64_t parameters = hostParameterBytes(a), activations = cpuActivationBytes(a);
  if (parameters + activations <= available.bytes)
    return "";
  std::ostringstream out;
  out << "the CPU backend would hold about " << gib(parameters + activations) << " in host memory, "
      << gib(parameters) << " of parameters (fp32 masters" << (a.distributedOptimizer ? "" : ", Adam's moments")
      << (a.model.dtype == "bf16" ? ", bf16 copies" : "") << " and a gradient a use) and up to "
      << gib(activations) << " of activations, more than the " << gib(available.bytes) << " available ("
      << available.source << "): run it on GPUs or train a smaller model on the CPU (MHCC_HOST_MEMORY_BYTES sets "
      << "what is taken as available)";
  return out.str();
}

} // namespace mhcc::runtime
