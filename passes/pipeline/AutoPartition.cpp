//===- AutoPartition.cpp - cost-balanced pipeline partition ------------------===//
#include "passes/pipeline/AutoPartition.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace mhcc::pipeline {

std::optional<PartitionResult> partitionChain(const std::vector<PartitionUnit> &units,
                                              const PartitionRequest &request,
                                              std::string &error) {
  const int64_t stages = request.pp * request.vpp;
  const int64_t n = static_cast<int64_t>(units.size());
  if (request.pp < 1 || request.vpp < 1) {
    error = "--pp and --vpp must be at least 1";
    return std::nullopt;
  }
  if (n < 2 || units.front().symbol != 'E' || units.back().symbol != 'L') {
    error = "internal: the chain must start with E and end with L";
    return std::nullopt;
  }
  // Prefix sums make any segment's cost O(1).
  std::vector<double> time(n + 1, 0), bytes(n + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    time[i + 1] = time[i] + units[i].time;
    // A stage on rank r holds p - r microbatches in flight under 1F1B; budget
    // for the worst case, p.
    bytes[i + 1] = bytes[i] + units[i].parameterBytes +
                   request.pp * units[i].activationBytes;
  }
  // largest[i][j]: the largest sublayer drop of units [i, j), for the one
  // working set a recomputing backward holds (all zero without it).
  std::vector<std::vector<double>> largest(n + 1, std::vector<double>(n + 1, 0));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j <= n; ++j)
      largest[i][j] = std::max(largest[i][j - 1], units[j - 1].largestSublayerDrop);
  auto segmentTime = [&](int64_t from, int64_t to) { return time[to] - time[from]; };
  auto segmentBytes = [&](int64_t from, int64_t to) {
    if (to <= from)
      return 0.0;
    return bytes[to] - bytes[from] + request.pp * units[to - 1].lastSublayerDrop + largest[from][to];
  };
  auto fits = [&](int64_t from, int64_t to) {
    return request.memoryCapBytes <= 0 || segmentBytes(from, to) <= request.memoryCapBytes;
  };

  const double inf = std::numeric_limits<double>::infinity();
  // best[s][i]: the smallest slowest-stage time placing units [0, i) into
  // stages [0, s); cut[s][i] the start of stage s-1's segment.
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int64_t>> cut(stages + 1, std::vector<int64_t>(n + 1, -1));
  best[0][0] = 0;
  for (int64_t s = 1; s <= stages; ++s) {
    for (int64_t i = 0; i <= n; ++i) {
      // Stage 0 must hold E (non-empty); the last stage must hold L.
      int64_t lastStart = s == 1 ? 0 : i;
      for (int64_t j = 0; j <= lastStart; ++j) {
        if (best[s - 1][j] == inf)
          continue;
        if (s == 1 && i == 0)
          continue;
        if (s == stages && (i != n || j == n))
          continue;
        if (!fits(j, i))
          continue;
        double candidate = std::max(best[s - 1][j], segmentTime(j, i));
        // Strictly better only: with j ascending, ties keep the earliest cut,
        // i.e. the later stages as full as the optimum allows.
        if (candidate < best[s][i] * (1 - 1e-12)) {
          best[s][i] = candidate;
          cut[s][i] = j;
        }
      }
    }
  }
  if (best[stages][n] == inf) {
    double largest = 0;
    for (int64_t i = 0; i < n; ++i)
      largest = std::max(largest, segmentBytes(i, i + 1));
    error = "no partition into " + std::to_string(stages) +
            " virtual stages fits the memory cap of " +
            std::to_string(request.memoryCapBytes / (1 << 30)) +
            " GiB per stage (the largest single unit needs " +
            std::to_string(largest / (1 << 30)) +
            " GiB); raise --memory-cap-gib or use more stages";
    return std::nullopt;
  }

  PartitionResult result;
  result.layout.pp = request.pp;
  result.layout.vpp = request.vpp;
  result.layout.stages.assign(stages, "");
  result.stageTimes.assign(stages, 0);
  result.stageBytes.assign(stages, 0);
  int64_t end = n;
  for (int64_t s = stages; s >= 1; --s) {
    int64_t start = cut[s][end];
    std::string symbols;
    for (int64_t i = start; i < end; ++i) {
      if (units[i].symbol == 'L')
        symbols += std::string(units[i].mtpModules, 'm');
      symbols += units[i].symbol;
    }
    result.layout.stages[s - 1] = symbols;
    result.stageTimes[s - 1] = segmentTime(start, end);
    result.stageBytes[s - 1] = segmentBytes(start, end);
    end = start;
  }
  result.slowestStage = best[stages][n];
  return result;
}

} // namespace mhcc::pipeline
