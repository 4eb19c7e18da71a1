//===- RankPlan.cpp - who talks to whom in a CUDA run -----------------------===//
#include "runtime/cuda/RankPlan.h"

#include <algorithm>
#include <set>

namespace mhcc::runtime::cuda {

std::vector<ParamPlan> planParameters(const Artifact &a) {
  std::vector<ParamPlan> plans(a.params.size());
  for (size_t s = 0; s < a.stages.size(); ++s)
    for (size_t k = 0; k < a.stages[s].params.size(); ++k) {
      const ParamSlot &slot = a.stages[s].params[k];
      plans[slot.param].uses.push_back({slot.useOrder, a.rankOf(s), int64_t(s), int(k)});
    }
  for (ParamPlan &plan : plans) {
    std::sort(plan.uses.begin(), plan.uses.end(),
              [](const ParamUse &x, const ParamUse &y) { return x.useOrder < y.useOrder; });
    if (!plan.uses.empty())
      plan.owner = plan.uses.front().rank;
    std::set<int64_t> holders;
    for (const ParamUse &use : plan.uses)
      holders.insert(use.rank);
    plan.holders.assign(holders.begin(), holders.end());
  }
  return plans;
}

std::vector<Pair> communicatingPairs(const Artifact &a, const std::vector<ParamPlan> &plans) {
  std::set<Pair> pipelinePairs;
  for (int64_t r = 0; r < a.pp; ++r)
    for (const Instr &i : a.ranks[r])
      if (i.kind == OpKind::Send)
        pipelinePairs.insert({r, i.peer});
  for (const ParamPlan &plan : plans)
    for (int64_t holder : plan.holders)
      if (holder != plan.owner) {
        pipelinePairs.insert({holder, plan.owner});
        pipelinePairs.insert({plan.owner, holder});
      }
  std::set<Pair> pairs; // every replica's, context rank's and tensor rank's, by global rank
  for (int64_t d = 0; d < a.dp; ++d)
    for (int64_t c = 0; c < a.cp; ++c)
      for (int64_t t = 0; t < a.tp; ++t)
        for (auto [from, to] : pipelinePairs)
          pairs.insert({a.globalRank(from, d, c, t), a.globalRank(to, d, c, t)});
  return {pairs.begin(), pairs.end()};
}

} // namespace mhcc::runtime::cuda
