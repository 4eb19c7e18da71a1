//===- Recompute.cpp - which activations a stage drops and recomputes -------===//
#include "runtime/program/Recompute.h"

#include "runtime/program/BackwardFrees.h"

#include <algorithm>

namespace mhcc::runtime {

RecomputePlan recomputePlan(const StageProgram &p, const std::vector<size_t> &spanStarts,
                            const std::vector<std::vector<int>> &extraReads, int64_t sublayersPerSegment) {
  RecomputePlan plan;
  const size_t F = p.forward.size();
  plan.segmentOf.assign(F, 0);
  // Cut after every sublayersPerSegment-th span holding a residual update.
  size_t begin = 0;
  int64_t updatesInSegment = 0;
  for (size_t s = 0; s < spanStarts.size(); ++s) {
    const size_t spanEnd = s + 1 < spanStarts.size() ? spanStarts[s + 1] : F;
    bool updates = false;
    for (size_t j = spanStarts[s]; j < spanEnd; ++j)
      updates = updates || p.forward[j].op == Prim::MhcPostRes || p.forward[j].op == Prim::Residual;
    updatesInSegment += updates;
    if (updatesInSegment >= std::max<int64_t>(sublayersPerSegment, 1) || spanEnd == F) {
      plan.segments.push_back({begin, spanEnd});
      begin = spanEnd;
      updatesInSegment = 0;
    }
  }
  for (size_t g = 0; g < plan.segments.size(); ++g)
    for (size_t j = plan.segments[g].first; j < plan.segments[g].second; ++j)
      plan.segmentOf[j] = g;
  // A value is a checkpoint when a later segment's forward reads it.
  std::vector<size_t> lastForwardReader(p.values.size(), 0);
  for (size_t j = 0; j < F; ++j) {
    for (int id : p.forward[j].inputs)
      if (id >= 0)
        lastForwardReader[id] = std::max(lastForwardReader[id], plan.segmentOf[j]);
  }
  plan.dropped.resize(plan.segments.size());
  std::vector<long> droppedIn(p.values.size(), -1); // the segment that drops it
  for (size_t j = 0; j < F; ++j) {
    const int id = p.forward[j].output;
    const size_t g = plan.segmentOf[j];
    if (plan.drops(g) && id != p.output && id != p.input && lastForwardReader[id] <= g) {
      plan.dropped[g].push_back(id);
      droppedIn[id] = long(g);
    }
  }
  plan.needs.resize(p.backward.size());
  for (size_t k = 0; k < p.backward.size(); ++k) {
    std::vector<size_t> &needs = plan.needs[k];
    const size_t own = plan.segmentOf[p.backward[k].forward];
    if (plan.drops(own))
      needs.push_back(own); // its aux at least
    std::vector<int> reads = ownBackwardReads(p, p.backward[k]);
    if (k < extraReads.size())
      reads.insert(reads.end(), extraReads[k].begin(), extraReads[k].end());
    for (int id : reads)
      if (id >= 0 && size_t(id) < droppedIn.size() && droppedIn[id] >= 0)
        needs.push_back(size_t(droppedIn[id]));
    std::sort(needs.begin(), needs.end());
    needs.erase(std::unique(needs.begin(), needs.end()), needs.end());
  }
  return plan;
}

} // namespace mhcc::runtime
