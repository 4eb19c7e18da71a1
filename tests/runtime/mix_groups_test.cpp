// findMixGroups (runtime/program/MixGroups.h): every mHC sublayer of the
// compiled tiny_bf16 and hybrid programs (each layout given) forms one
// group, and a group is refused as soon as another instruction touches its
// values in between (the CUDA backend would otherwise write dx once from
// stale or partial inputs).
#include "runtime/artifact/Artifact.h"
#include "runtime/program/MixGroups.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <string>
#include <vector>

namespace mhcc::runtime {
namespace {

std::vector<std::string> gArtifacts;

int64_t countOps(const StageProgram &p, Prim op) {
  int64_t count = 0;
  for (const ForwardInstr &f : p.forward)
    count += f.op == op;
  return count;
}

TEST(MixGroups, EverySublayerOfTheCompiledProgramsIsOneGroup) {
  ASSERT_FALSE(gArtifacts.empty()) << "pass artifacts on the command line";
  for (const std::string &path : gArtifacts) {
    std::string error;
    std::optional<Artifact> a = readArtifact(path, error);
    ASSERT_TRUE(a) << path << ": " << error;
    int64_t sublayers = 0;
    for (const StageProgram &p : a->stages) {
      const std::vector<MixGroup> groups = findMixGroups(p);
      EXPECT_EQ(int64_t(groups.size()), countOps(p, Prim::MhcPostRes)) << path << " stage " << p.stage;
      sublayers += int64_t(groups.size());
      for (const MixGroup &g : groups) {
        EXPECT_LT(g.postRes, g.pre);
        EXPECT_LT(g.pre, g.coeffs);
        EXPECT_EQ(p.forward[p.backward[g.postRes].forward].op, Prim::MhcPostRes);
        EXPECT_EQ(p.forward[p.backward[g.pre].forward].op, Prim::MhcPre);
        EXPECT_EQ(p.forward[p.backward[g.coeffs].forward].op, Prim::MhcCoeffs);
        EXPECT_EQ(p.backward[g.pre].gradOutput, g.du);
        EXPECT_EQ(p.backward[g.coeffs].gradInputs[0], g.dx);
      }
    }
    EXPECT_GT(sublayers, 0) << path << " has no mHC sublayer";
  }
}

/// A stage program with at least one group, from the first artifact.
StageProgram programWithGroups(MixGroup &first) {
  std::string error;
  std::optional<Artifact> a = readArtifact(gArtifacts.at(0), error);
  EXPECT_TRUE(a) << error;
  for (const StageProgram &p : a->stages)
    if (std::vector<MixGroup> groups = findMixGroups(p); !groups.empty()) {
      first = groups.front();
      return p;
    }
  ADD_FAILURE() << "no stage with an mHC sublayer";
  return {};
}

/// p with an instruction adding into `value` (and `output` its output
/// gradient) inserted at backward position `at`.
StageProgram withIntruder(StageProgram p, size_t at, int value, int output = -1) {
  BackwardInstr intruder;
  intruder.forward = 0;
  intruder.gradOutput = output;
  intruder.gradInputs = {value};
  p.backward.insert(p.backward.begin() + at, intruder);
  return p;
}

bool hasGroupOf(const StageProgram &p, const MixGroup &g) {
  for (const MixGroup &h : findMixGroups(p))
    if (h.dx == g.dx)
      return true;
  return false;
}

/// What a backend running the passes reads beyond each instruction
/// (mixGroupReads, CudaRank::backwardReads): at each of a group's three
/// backwards its values, at a pass C followed by the sublayer before's
/// post/res backward that group's too, elsewhere nothing.
TEST(MixGroups, ThePassesReadTheirGroupsValues) {
  std::string error;
  std::optional<Artifact> a = readArtifact(gArtifacts.at(0), error);
  ASSERT_TRUE(a) << error;
  int64_t joined = 0;
  for (const StageProgram &p : a->stages) {
    const std::vector<MixGroup> groups = findMixGroups(p);
    for (size_t k = 0; k < p.backward.size(); ++k) {
      const MixGroup *g = mixGroupAt(groups, k);
      const MixGroup *before = mixGroupBefore(groups, k);
      const std::vector<int> reads = mixGroupReads(groups, k);
      EXPECT_EQ(reads.size(), size_t(8 * ((g != nullptr) + (before != nullptr)))) << "backward " << k;
      if (g)
        for (int id : {g->x, g->coef, g->y, g->dx, g->dCoef, g->dy, g->dOut, g->du})
          EXPECT_TRUE(std::count(reads.begin(), reads.end(), id)) << "backward " << k << " value " << id;
      if (before) {
        ++joined;
        ASSERT_TRUE(g);
        EXPECT_EQ(k, g->coeffs);
        EXPECT_EQ(before->postRes, k + 1);
        EXPECT_EQ(before->dOut, g->dx);
        EXPECT_TRUE(std::count(reads.begin(), reads.end(), before->y));
      }
    }
  }
  EXPECT_GT(joined, 0) << "no pass C followed by the post/res backward before it";
}

TEST(MixGroups, ATermAddedInBetweenRefusesTheGroup) {
  MixGroup g;
  const StageProgram p = programWithGroups(g);
  ASSERT_TRUE(hasGroupOf(p, g));
  // Something unrelated in between changes nothing.
  EXPECT_TRUE(hasGroupOf(withIntruder(p, g.pre, -1), g));
  // dx or dCoef with another term before the group or inside it.
  EXPECT_FALSE(hasGroupOf(withIntruder(p, g.postRes, g.dx), g));
  EXPECT_FALSE(hasGroupOf(withIntruder(p, g.pre, g.dx), g));
  EXPECT_FALSE(hasGroupOf(withIntruder(p, g.coeffs, g.dCoef), g));
  // dOut changed after the post/res backward read it.
  EXPECT_FALSE(hasGroupOf(withIntruder(p, g.pre, g.dOut), g));
  EXPECT_TRUE(hasGroupOf(withIntruder(p, g.postRes, g.dOut), g)); // before: part of dOut
  // du changed after the pre backward read it; before, it is du's making.
  EXPECT_FALSE(hasGroupOf(withIntruder(p, g.coeffs, g.du), g));
  EXPECT_TRUE(hasGroupOf(withIntruder(p, g.pre, g.du), g));
  // Something differentiating through dx before the group ends.
  EXPECT_FALSE(hasGroupOf(withIntruder(p, g.coeffs, -1, g.dx), g));
}

} // namespace
} // namespace mhcc::runtime

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i)
    mhcc::runtime::gArtifacts.push_back(argv[i]);
  return RUN_ALL_TESTS();
}
