//===- HostMemory.cpp - whether the CPU backend's parameters fit the host --===//
#include "runtime/cli/HostMemory.h"

#include "runtime/cpu/CpuRankBase.h"
#include "runtime/program/Recompute.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

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

/// "5.5 MiB", or "21.4 GiB" from 1 GiB up.
std::string sizeText(int64_t bytes) {
  char text[32];
  const double mib = double(bytes) / (1024.0 * 1024);
  if (mib < 1024)
    std::snprintf(text, sizeof text, "%.1f MiB", mib);
  else
    std::snprintf(text, sizeof text, "%.1f GiB", mib / 1024);
  return text;
}

/// A key's value in a cgroup's memory.stat ("inactive_file 1234").
std::optional<int64_t> statValue(const std::string &path, const std::string &key) {
  std::ifstream in(path);
  std::string name;
  int64_t value = 0;
  while (in >> name >> value)
    if (name == key)
      return value;
  return std::nullopt;
}

/// The memory the cgroup this process runs in may still take: the least,
/// over it and its ancestors that set a limit, of the limit less the use,
/// the reclaimable page cache not counted as used (cgroup v2, else v1);
/// nullopt where none sets one.
std::optional<int64_t> cgroupAvailable() {
  std::ifstream self("/proc/self/cgroup");
  std::string line, v2Path, v1Path;
  while (std::getline(self, line)) {
    if (line.rfind("0::", 0) == 0)
      v2Path = line.substr(3);
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first != std::string::npos && second != std::string::npos) {
      const std::string controllers = "," + line.substr(first + 1, second - first - 1) + ",";
      if (controllers.find(",memory,") != std::string::npos)
        v1Path = line.substr(second + 1);
    }
  }
  struct Layout {
    std::string root, path, limit, usage, inactive;
  };
  const Layout layouts[] = {
      {"/sys/fs/cgroup", v2Path, "memory.max", "memory.current", "inactive_file"},
      {"/sys/fs/cgroup/memory", v1Path, "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"},
  };
  for (const Layout &l : layouts) {
    // The cgroup, then each ancestor up to the root (a slice's limit holds its children).
    std::vector<std::string> dirs;
    for (std::string path = l.path;;) {
      dirs.push_back(l.root + (path.empty() || path == "/" ? "" : path));
      if (path.empty() || path == "/" || path.find('/') == std::string::npos)
        break;
      const size_t cut = path.rfind('/');
      path = cut == 0 ? "/" : path.substr(0, cut);
    }
    std::optional<int64_t> least;
    bool seen = false;
    for (const std::string &dir : dirs) {
      const std::optional<int64_t> limit = readNumber(dir + "/" + l.limit), used = readNumber(dir + "/" + l.usage);
      if (!limit || !used)
        continue;
      seen = true;
      if (*limit >= (int64_t(1) << 60))
        continue; // v1 writes "no limit" as a number near 2^63
      const int64_t cache = statValue(dir + "/memory.stat", l.inactive).value_or(0);
      const int64_t room = std::max<int64_t>(0, *limit - std::max<int64_t>(0, *used - cache));
      least = least ? std::min(*least, room) : room;
    }
    if (seen)
      return least;
  }
  return std::nullopt;
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
  if (std::optional<int64_t> cgroup = cgroupAvailable(); cgroup && (!best || *cgroup < best->bytes))
    best = HostMemory{*cgroup, "the cgroup's memory limit less its use"};
  return best;
}

int64_t cpuActivationBytes(const Artifact &a, int64_t recomputeSegment) {
  // A microbatch's forward of a stage: its values and the aux its
  // primitives keep, as floats (the CPU backend stores every dtype so);
  // recomputed (recomputeSegment > 0), what its dropped segments do not
  // keep, and the largest of them while its backward runs it again.
  const size_t S = a.stages.size();
  std::vector<int64_t> kept(S, 0), working(S, 0);
  for (size_t s = 0; s < S; ++s) {
    const StageProgram &p = a.stages[s];
    for (const ValueInfo &v : p.values)
      kept[s] += 4 * v.rows * v.cols;
    for (const ForwardInstr &f : p.forward)
      kept[s] += 4 * f.auxSize;
    if (recomputeSegment <= 0 || p.forward.empty())
      continue;
    std::vector<size_t> spans(p.forward.size()); // the CPU device's spans: one instruction each
    for (size_t j = 0; j < spans.size(); ++j)
      spans[j] = j;
    const RecomputePlan plan = recomputePlan(p, spans, {}, recomputeSegment);
    for (size_t g = 0; g < plan.segments.size(); ++g) {
      if (!plan.drops(g))
        continue;
      int64_t dropped = 0;
      for (int id : plan.dropped[g])
        dropped += 4 * p.values[id].rows * p.values[id].cols;
      for (size_t j = plan.segments[g].first; j < plan.segments[g].second; ++j)
        dropped += 4 * p.forward[j].auxSize;
      kept[s] -= dropped;
      working[s] = std::max(working[s], dropped);
    }
  }
  // A rank holds a forward until its backward (W under the zero-bubble split).
  int64_t total = 0;
  for (const std::vector<Instr> &rank : a.ranks) {
    int64_t live = 0, peak = 0, work = 0;
    for (const Instr &instr : rank) {
      if (instr.stage < 0 || size_t(instr.stage) >= S)
        continue;
      if (instr.kind == OpKind::Forward)
        live += kept[instr.stage];
      else if (instr.kind == OpKind::Backward || instr.kind == OpKind::BackwardWeight)
        live -= kept[instr.stage];
      peak = std::max(peak, live);
      work = std::max(work, working[instr.stage]);
    }
    total += peak + work;
  }
  return total * a.dp * a.cp * a.tp; // every replica, context and tensor rank its own
}

std::string hostMemoryProblem(const Artifact &a, const HostMemory &available, int64_t recomputeSegment,
                              bool processes) {
  const int64_t parameters = processes ? hostProcessesParameterBytes(a) : hostParameterBytes(a);
  const int64_t activations = cpuActivationBytes(a, recomputeSegment);
  if (parameters + activations <= available.bytes)
    return "";
  std::ostringstream out;
  out << "the CPU backend would hold about " << sizeText(parameters + activations) << " in host memory"
      << (processes ? " over its " + std::to_string(a.worldSize()) + " processes" : "") << ", "
      << sizeText(parameters) << " of parameters (fp32 masters, Adam's moments"
      << (a.model.dtype == "bf16" ? ", bf16 copies" : "") << " and gradients) and up to "
      << sizeText(activations) << " of activations, more than the " << sizeText(available.bytes) << " available ("
      << available.source << "): run it on GPUs or train a smaller model on the CPU (MHCC_HOST_MEMORY_BYTES sets "
      << "what is taken as available)";
  return out.str();
}

} // namespace mhcc::runtime
