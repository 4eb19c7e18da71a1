//===- SharedCores.cpp - ranks that share one host's cores ----------------===//
#include "passes/pipeline/SharedCores.h"

#include <algorithm>

namespace mhcc::pipeline {

std::vector<std::vector<double>> coreShares(const Schedule &schedule, const SimulationResult &timed, int64_t cores,
                                            int64_t hostRanks) {
  std::vector<std::vector<double>> shares(schedule.ranks.size());
  // Where the number of ranks computing changes, and by how much.
  std::vector<std::pair<double, int64_t>> changes;
  for (size_t r = 0; r < schedule.ranks.size(); ++r) {
    shares[r].assign(schedule.ranks[r].size(), 1.0);
    for (size_t i = 0; i < schedule.ranks[r].size(); ++i) {
      const TimedInstr &t = timed.timeline[r][i];
      if (schedule.ranks[r][i].isCompute() && t.end > t.start) {
        changes.push_back({t.start, hostRanks});
        changes.push_back({t.end, -hostRanks});
      }
    }
  }
  std::sort(changes.begin(), changes.end());
  // The cores' share a computing rank gets, integrated from time 0: at
  // times[k], cumulative[k] (piecewise linear between, constant share).
  std::vector<double> times, cumulative;
  int64_t computing = 0;
  double integral = 0, last = 0;
  for (size_t k = 0; k < changes.size();) {
    const double at = changes[k].first;
    const double share = computing > cores ? double(cores) / double(computing) : 1.0;
    integral += (at - last) * share;
    last = at;
    for (; k < changes.size() && changes[k].first == at; ++k)
      computing += changes[k].second;
    times.push_back(at);
    cumulative.push_back(integral);
  }
  auto integralAt = [&](double at) { // `at` is one of times: every interval's ends are
    return cumulative[size_t(std::lower_bound(times.begin(), times.end(), at) - times.begin())];
  };
  for (size_t r = 0; r < schedule.ranks.size(); ++r)
    for (size_t i = 0; i < schedule.ranks[r].size(); ++i) {
      const TimedInstr &t = timed.timeline[r][i];
      if (schedule.ranks[r][i].isCompute() && t.end > t.start)
        shares[r][i] = std::max(1e-9, (integralAt(t.end) - integralAt(t.start)) / (t.end - t.start));
    }
  return shares;
}

} // namespace mhcc::pipeline
