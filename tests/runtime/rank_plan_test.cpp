// The CUDA backend's communication plan (runtime/cuda/RankPlan.h) for meshes
// of every axis it runs (the artifacts named on the command line: tiny at
// tp 2 + SP x dp 2 x pp 2, at cp 2 x dp 2 x pp 2, at tp 2 + SP x cp 2 x pp 2):
// no GPU needed. A wrong pair or group would hang or mix ranks on the GPU only.
#include "runtime/artifact/Artifact.h"
#include "runtime/cuda/RankPlan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace mhcc::runtime::cuda {
namespace {

std::vector<std::string> gArtifacts;

class RankPlan : public testing::TestWithParam<std::string> {
protected:
  void SetUp() override {
    std::string error;
    artifact_ = readArtifact(GetParam(), error);
    ASSERT_TRUE(artifact_) << error;
    ASSERT_GT(artifact_->worldSize(), artifact_->pp) << "a mesh with more than the pipeline axis";
  }
  std::optional<Artifact> artifact_;
};

TEST_P(RankPlan, EachParameterIsOwnedWhereItIsFirstUsed) {
  const Artifact &a = *artifact_;
  const std::vector<ParamPlan> plans = planParameters(a);
  ASSERT_EQ(plans.size(), a.params.size());
  for (size_t p = 0; p < plans.size(); ++p) {
    const ParamPlan &plan = plans[p];
    ASSERT_FALSE(plan.uses.empty()) << a.params[p].name;
    EXPECT_TRUE(std::is_sorted(plan.uses.begin(), plan.uses.end(),
                               [](const ParamUse &x, const ParamUse &y) { return x.useOrder < y.useOrder; }));
    EXPECT_EQ(plan.owner, plan.uses.front().rank) << a.params[p].name;
    std::set<int64_t> ranks;
    for (const ParamUse &use : plan.uses) {
      EXPECT_EQ(use.rank, a.rankOf(use.stage));
      ranks.insert(use.rank);
    }
    EXPECT_EQ(plan.holders, std::vector<int64_t>(ranks.begin(), ranks.end())) << a.params[p].name;
  }
}

TEST_P(RankPlan, PairsStayInsideTheirReplicaContextAndTensorRank) {
  const Artifact &a = *artifact_;
  const std::vector<Pair> pairs = communicatingPairs(a, planParameters(a));
  const std::set<Pair> all(pairs.begin(), pairs.end());
  EXPECT_EQ(all.size(), pairs.size()) << "a pair listed twice";
  for (auto [from, to] : pairs) {
    EXPECT_NE(a.pipelineRankOf(from), a.pipelineRankOf(to));
    EXPECT_EQ(a.replicaOf(from), a.replicaOf(to));
    EXPECT_EQ(a.contextRankOf(from), a.contextRankOf(to));
    EXPECT_EQ(a.tensorRankOf(from), a.tensorRankOf(to));
  }
  // Every pipeline send, for every replica, context rank and tensor rank.
  for (int64_t r = 0; r < a.pp; ++r)
    for (const Instr &i : a.ranks[r])
      for (int64_t d = 0; d < a.dp && i.kind == OpKind::Send; ++d)
        for (int64_t c = 0; c < a.cp; ++c)
          for (int64_t t = 0; t < a.tp; ++t) {
            EXPECT_TRUE(all.count({a.globalRank(r, d, c, t), a.globalRank(i.peer, d, c, t)}))
                << "rank " << r << " -> " << i.peer << ", replica " << d << ", context rank " << c
                << ", tensor rank " << t;
          }
}

TEST_P(RankPlan, EveryGroupHasOneCommunicatorAndItsMembers) {
  const Artifact &a = *artifact_;
  EXPECT_EQ(replicaGroupCount(a), a.dp * a.cp > 1 ? size_t(a.pp * a.tp) : 0);
  EXPECT_EQ(tensorGroupCount(a), a.tp > 1 ? size_t(a.worldSize() / a.tp) : 0);
  EXPECT_EQ(contextGroupCount(a), a.cp > 1 ? size_t(a.worldSize() / a.cp) : 0);
  EXPECT_EQ(groupCount(a), replicaGroupCount(a) + tensorGroupCount(a) + contextGroupCount(a));
  // One axis: its groups' range among groupCount, a rank's group and its
  // member index there, and what every member of one group shares.
  struct Axis {
    const char *name;
    size_t first, count;
    std::function<size_t(int64_t)> groupOf;
    std::function<int64_t(int64_t)> memberOf, sharedOf;
    int64_t size;
  };
  const size_t R = replicaGroupCount(a), T = tensorGroupCount(a), C = contextGroupCount(a);
  const std::vector<Axis> axes = {
      {"gradient", 0, R, [&](int64_t r) { return replicaGroupOf(a, r); }, [&](int64_t r) { return a.reduceMemberOf(r); },
       [&](int64_t r) { return a.pipelineRankOf(r) * a.tp + a.tensorRankOf(r); }, a.dp * a.cp},
      {"tensor", R, T, [&](int64_t r) { return tensorGroupOf(a, r); }, [&](int64_t r) { return a.tensorRankOf(r); },
       [&](int64_t r) { return r / a.tp; }, a.tp},
      {"context", R + T, C, [&](int64_t r) { return contextGroupOf(a, r); },
       [&](int64_t r) { return a.contextRankOf(r); },
       [&](int64_t r) { return (r / (a.cp * a.tp)) * a.tp + a.tensorRankOf(r); }, a.cp},
  };
  for (const Axis &axis : axes) {
    if (axis.count == 0)
      continue;
    std::map<size_t, std::set<int64_t>> members; // group -> members' place in it
    for (int64_t r = 0; r < a.worldSize(); ++r) {
      const size_t group = axis.groupOf(r);
      ASSERT_GE(group, axis.first) << axis.name;
      ASSERT_LT(group, axis.first + axis.count) << axis.name;
      EXPECT_TRUE(members[group].insert(axis.memberOf(r)).second) << "two ranks of one place in a " << axis.name
                                                                  << " group";
      // The members of a group differ only along its axis.
      for (int64_t q = 0; q < a.worldSize(); ++q)
        EXPECT_EQ(axis.groupOf(q) == group, axis.sharedOf(q) == axis.sharedOf(r)) << axis.name << " " << r << " " << q;
    }
    EXPECT_EQ(members.size(), axis.count) << axis.name;
    for (const auto &[group, places] : members) {
      EXPECT_EQ(int64_t(places.size()), axis.size) << axis.name;
      EXPECT_EQ(*places.rbegin(), axis.size - 1) << axis.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Meshes, RankPlan, testing::ValuesIn(gArtifacts));

} // namespace
} // namespace mhcc::runtime::cuda

int main(int argc, char **argv) {
  // The artifacts first: the parameterized suite's values are read when
  // InitGoogleTest registers it.
  for (int k = 1; k < argc; ++k)
    if (std::string(argv[k]).rfind("--gtest", 0) != 0)
      mhcc::runtime::cuda::gArtifacts.push_back(argv[k]);
  testing::InitGoogleTest(&argc, argv);
  if (mhcc::runtime::cuda::gArtifacts.empty()) {
    std::fprintf(stderr, "usage: %s ARTIFACT... (meshes beyond the pipeline axis)\n", argv[0]);
    return 2;
  }
  return RUN_ALL_TESTS();
}
