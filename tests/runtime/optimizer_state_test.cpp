// optimizerBytesPerRank (runtime/cli/RunLines.h): the optimizer state a rank
// holds, as mhcrun's start lines print it. At PP1 without sharding one rank
// holds every parameter: 12 bytes an element with Adam's moments (fp32
// master, exp_avg, exp_avg_sq), 4 without (SGD on the GPU keeps no
// moments), 10 and 2 with the masters as remainders. Under the distributed
// optimizer the moments and (where sharded) the masters shrink to a part;
// without moments and with whole masters nothing shrinks.
//
// usage: optimizer_state_test PP1_ARTIFACT ZERO1_ARTIFACT
#include "runtime/artifact/Artifact.h"
#include "runtime/cli/RunLines.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <optional>
#include <string>

namespace mhcc::runtime {
namespace {

std::string gPp1, gZero1;

Artifact load(const std::string &path) {
  std::string error;
  std::optional<Artifact> a = readArtifact(path, error);
  if (!a)
    ADD_FAILURE() << path << ": " << error;
  return a ? *a : Artifact{};
}

TEST(OptimizerState, OneRankHoldsEveryElementWithOrWithoutMoments) {
  const Artifact a = load(gPp1);
  ASSERT_EQ(a.pp * a.dp * a.tp * a.cp, 1);
  int64_t elements = 0;
  for (const ParamInfo &p : a.params)
    elements += p.count();
  ASSERT_GT(elements, 0);
  EXPECT_EQ(optimizerBytesPerRank(a, {false, false, false, true}), 12 * elements);
  EXPECT_EQ(optimizerBytesPerRank(a, {false, false, false, false}), 4 * elements);
  EXPECT_EQ(optimizerBytesPerRank(a, {false, false, true, true}), 10 * elements);
  EXPECT_EQ(optimizerBytesPerRank(a, {false, false, true, false}), 2 * elements);
}

TEST(OptimizerState, ShardingShrinksOnlyWhatIsSharded) {
  const Artifact a = load(gZero1);
  ASSERT_TRUE(a.distributedOptimizer);
  ASSERT_EQ(a.optimizerParts(), 2);
  const int64_t whole = optimizerBytesPerRank(a, {false, false, false, true});
  const int64_t momentsSharded = optimizerBytesPerRank(a, {true, false, false, true});
  const int64_t allSharded = optimizerBytesPerRank(a, {true, true, false, true});
  EXPECT_LT(momentsSharded, whole);
  EXPECT_LT(allSharded, momentsSharded);
  // Without moments: whole masters leave nothing to shard; sharded masters shrink.
  const int64_t sgdWhole = optimizerBytesPerRank(a, {false, false, false, false});
  EXPECT_EQ(optimizerBytesPerRank(a, {true, false, false, false}), sgdWhole);
  EXPECT_LT(optimizerBytesPerRank(a, {true, true, false, false}), sgdWhole);
  EXPECT_LT(sgdWhole, momentsSharded);
}

} // namespace
} // namespace mhcc::runtime

int main(int argc, char **argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc < 3) {
    std::fprintf(stderr, "usage: optimizer_state_test PP1_ARTIFACT ZERO1_ARTIFACT\n");
    return 2;
  }
  mhcc::runtime::gPp1 = argv[1];
  mhcc::runtime::gZero1 = argv[2];
  return RUN_ALL_TESTS();
}
