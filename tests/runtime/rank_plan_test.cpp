// The CUDA backend's communication plan (runtime/cuda/RankPlan.h) for a mesh
// of every axis it runs, tiny at tp 2 + SP x dp 2 x pp 2 (8 ranks): no GPU
// needed. A wrong pair or group would hang or mix ranks on the GPU only.
#include "runtime/artifact/Artifact.h"
#include "runtime/cuda/RankPlan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>

namespace mhcc::runtime::cuda {
namespace {

std::string gArtifact;

class RankPlan : public testing::Test {
protected:
  void SetUp() override {
    std::string error;
    artifact_ = readArtifact(gArtifact, error);
    ASSERT_TRUE(artifact_) << error;
    ASSERT_EQ(artifact_->worldSize(), 8);
    ASSERT_EQ(artifact_->tp, 2);
    ASSERT_EQ(artifact_->dp, 2);
  }
  std::optional<Artifact> artifact_;
};

TEST_F(RankPlan, EachParameterIsOwnedWhereItIsFirstUsed) {
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

TEST_F(RankPlan, PairsStayInsideTheirReplicaAndTensorRank) {
  const Artifact &a = *artifact_;
  const std::vector<Pair> pairs = communicatingPairs(a, planParameters(a));
  const std::set<Pair> all(pairs.begin(), pairs.end());
  EXPECT_EQ(all.size(), pairs.size()) << "a pair listed twice";
  for (auto [from, to] : pairs) {
    EXPECT_NE(a.pipelineRankOf(from), a.pipelineRankOf(to));
    EXPECT_EQ(a.replicaOf(from), a.replicaOf(to));
    EXPECT_EQ(a.tensorRankOf(from), a.tensorRankOf(to));
  }
  // Every pipeline send, for every replica and tensor rank.
  for (int64_t r = 0; r < a.pp; ++r)
    for (const Instr &i : a.ranks[r])
      if (i.kind == OpKind::Send)
        for (int64_t d = 0; d < a.dp; ++d)
          for (int64_t t = 0; t < a.tp; ++t)
            EXPECT_TRUE(all.count({a.globalRank(r, d, 0, t), a.globalRank(i.peer, d, 0, t)}))
                << "rank " << r << " -> " << i.peer << ", replica " << d << ", tensor rank " << t;
}

TEST_F(RankPlan, EveryGroupHasOneCommunicatorAndItsMembers) {
  const Artifact &a = *artifact_;
  EXPECT_EQ(replicaGroupCount(a), size_t(a.pp * a.tp));
  EXPECT_EQ(tensorGroupCount(a), size_t(a.worldSize() / a.tp));
  EXPECT_EQ(groupCount(a), replicaGroupCount(a) + tensorGroupCount(a));
  std::map<size_t, std::set<int64_t>> replicas, tensorRanks; // group -> members' place in it
  for (int64_t r = 0; r < a.worldSize(); ++r) {
    const size_t replicaGroup = replicaGroupOf(a, r), tensorGroup = tensorGroupOf(a, r);
    ASSERT_LT(replicaGroup, replicaGroupCount(a));
    ASSERT_GE(tensorGroup, replicaGroupCount(a));
    ASSERT_LT(tensorGroup, groupCount(a));
    EXPECT_TRUE(replicas[replicaGroup].insert(a.replicaOf(r)).second) << "two ranks of one replica in a group";
    EXPECT_TRUE(tensorRanks[tensorGroup].insert(a.tensorRankOf(r)).second) << "two ranks of one tensor rank";
    // The members of a group differ only along its axis.
    for (int64_t q = 0; q < a.worldSize(); ++q) {
      if (replicaGroupOf(a, q) == replicaGroup)
        EXPECT_TRUE(a.pipelineRankOf(q) == a.pipelineRankOf(r) && a.tensorRankOf(q) == a.tensorRankOf(r));
      if (tensorGroupOf(a, q) == tensorGroup)
        EXPECT_TRUE(a.pipelineRankOf(q) == a.pipelineRankOf(r) && a.replicaOf(q) == a.replicaOf(r));
    }
  }
  EXPECT_EQ(replicas.size(), replicaGroupCount(a));
  EXPECT_EQ(tensorRanks.size(), tensorGroupCount(a));
  for (const auto &[group, members] : replicas)
    EXPECT_EQ(int64_t(members.size()), a.dp);
  for (const auto &[group, members] : tensorRanks)
    EXPECT_EQ(int64_t(members.size()), a.tp);
}

} // namespace
} // namespace mhcc::runtime::cuda

int main(int argc, char **argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s ARTIFACT (tp 2 x dp 2 x pp 2)\n", argv[0]);
    return 2;
  }
  mhcc::runtime::cuda::gArtifact = argv[1];
  return RUN_ALL_TESTS();
}
