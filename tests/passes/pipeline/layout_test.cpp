// Layout strings (Megatron's E/t/m/L/| notation) and the cost-balanced DP
// partition.
#include "passes/pipeline/AutoPartition.h"
#include "passes/pipeline/Layout.h"

#include <gtest/gtest.h>

namespace mhcc::pipeline {
namespace {

TEST(Layout, ExpandsRepetitionAndGroups) {
  std::string error;
  auto stages = expandLayout("E|t*3|(tt|)*2L", error);
  ASSERT_TRUE(stages) << error;
  EXPECT_EQ(*stages, (std::vector<std::string>{"E", "ttt", "tt", "tt", "L"}));
  stages = expandLayout("Et||tL", error);
  ASSERT_TRUE(stages);
  EXPECT_EQ(*stages, (std::vector<std::string>{"Et", "", "tL"}));
}

TEST(Layout, ParsesValidLayouts) {
  std::string error;
  ModelShape model{4, 0};
  auto layout = parseLayout("Et|tt|t|L", 2, 2, model, error);
  ASSERT_TRUE(layout) << error;
  EXPECT_EQ(layout->numStages(), 4);
  EXPECT_EQ(Layout::rankOf(2, 2), 0);
  EXPECT_EQ(Layout::chunkOf(2, 2), 1);
  EXPECT_EQ(layout->toString(), "Et|tt|t|L");
  ModelShape withMtp{6, 1};
  layout = parseLayout("E|t*6||mL", 2, 2, withMtp, error);
  ASSERT_TRUE(layout) << error;
  EXPECT_EQ(layout->toString(), "E|t*6||mL");
}

TEST(Layout, RejectsBadLayoutsWithReasons) {
  ModelShape model{4, 1};
  struct Case {
    std::string text;
    int64_t pp, vpp;
    std::string reason;
  } cases[] = {
      {"Et|tt|tmL", 2, 2, "has 3 virtual stages, but --pp 2 x --vpp 2 needs 4"},
      {"Et|tt||mL", 2, 2, "places 3 transformer layers 't'"},
      {"Etttt|||mL", 2, 2, ""}, // valid: control case
      {"Ett|tt|m|L", 2, 2, "must be in the stage of the loss"},
      {"tE|tt|t|mL", 2, 2, "must come first"},
      {"|Etttt||mL", 2, 2, "must be in virtual stage 0"},
      {"Ettt|L|t|m", 2, 2, "must come after every transformer layer"},
      {"Et|tt|tt|mL", 2, 2, "places 5 transformer layers"},
      {"Ex|tt|t|mL", 2, 2, "unknown symbol 'x'"},
      {"E(tt|t|tmL", 2, 2, "unbalanced '('"},
      {"Et*|tt|t|mL", 2, 2, "needs a count"},
      {"EEtt|tt||mL", 2, 2, "exactly once"},
  };
  for (const Case &c : cases) {
    std::string error;
    auto layout = parseLayout(c.text, c.pp, c.vpp, model, error);
    if (c.reason.empty()) {
      EXPECT_TRUE(layout) << c.text << ": " << error;
      continue;
    }
    EXPECT_FALSE(layout) << c.text;
    EXPECT_NE(error.find(c.reason), std::string::npos) << c.text << ": " << error;
  }
}

// Parentheses nest by recursion; a few thousand levels (a --layout of
// 6000 '(') overflowed the stack (found by tests/fuzz/layout_fuzz.cpp).
TEST(Layout, DeepNestingIsAnErrorNotAStackOverflow) {
  std::string error;
  EXPECT_FALSE(expandLayout(std::string(200000, '('), error));
  EXPECT_NE(error.find("parentheses nested deeper than 64 at position 64"), std::string::npos) << error;
  // 64 levels are fine.
  auto stages = expandLayout(std::string(64, '(') + "Et|tL" + std::string(64, ')'), error);
  ASSERT_TRUE(stages) << error;
  EXPECT_EQ(*stages, (std::vector<std::string>{"Et", "tL"}));
}

TEST(Layout, UniformLayoutIsValid) {
  for (int64_t p = 1; p <= 8; ++p)
    for (int64_t v = 1; v <= 4; ++v)
      for (int64_t layers : {1, 4, 12, 16}) {
        ModelShape model{layers, 1};
        Layout layout = uniformLayout(p, v, model);
        EXPECT_FALSE(validateLayout(layout, model)) << layout.toString();
      }
}

std::vector<PartitionUnit> chain(int layers, double layerTime, double headTime) {
  std::vector<PartitionUnit> units;
  units.push_back({'E', 0, 0.1, 100, 10});
  for (int i = 0; i < layers; ++i)
    units.push_back({'t', 0, layerTime, 1000, 100});
  units.push_back({'L', 1, headTime, 500, 50});
  return units;
}

TEST(AutoPartition, BalancesUniformLayers) {
  std::string error;
  auto result = partitionChain(chain(8, 1.0, 0.5), {2, 2, 0}, error);
  ASSERT_TRUE(result) << error;
  EXPECT_EQ(result->layout.toString(), "Ett|tt|tt|ttmL");
  EXPECT_DOUBLE_EQ(result->slowestStage, 2.5);
  std::string problem;
  EXPECT_FALSE(validateLayout(result->layout, {8, 1}));
}

TEST(AutoPartition, HeavyHeadGetsItsOwnStage) {
  std::string error;
  // The loss stage costs as much as three layers: it should stand alone.
  auto result = partitionChain(chain(6, 1.0, 3.0), {2, 2, 0}, error);
  ASSERT_TRUE(result) << error;
  EXPECT_DOUBLE_EQ(result->slowestStage, 3.0);
  EXPECT_EQ(result->layout.stages.back(), "mL");
}

TEST(AutoPartition, MoreStagesThanUnitsLeavesEmptyStages) {
  std::string error;
  auto result = partitionChain(chain(2, 1.0, 1.0), {4, 2, 0}, error);
  ASSERT_TRUE(result) << error;
  EXPECT_EQ(result->layout.numStages(), 8);
  EXPECT_FALSE(validateLayout(result->layout, {2, 1}));
  EXPECT_DOUBLE_EQ(result->slowestStage, 1.0);
}

TEST(AutoPartition, MemoryCapForcesMoreBalancedMemory) {
  std::string error;
  std::vector<PartitionUnit> units = chain(4, 1.0, 0.1);
  units[1].parameterBytes = 1e6; // one huge layer
  auto capped = partitionChain(units, {2, 1, 1.1e6}, error);
  ASSERT_TRUE(capped) << error;
  for (double bytes : capped->stageBytes)
    EXPECT_LE(bytes, 1.1e6);
  auto impossible = partitionChain(units, {2, 1, 1e5}, error);
  EXPECT_FALSE(impossible);
  EXPECT_NE(error.find("memory cap"), std::string::npos) << error;
}

TEST(AutoPartition, RecomputationChargesTheLastSublayerAndOneWorkingSet) {
  // Each layer's last sublayer drops 300 bytes a microbatch, its largest
  // 400: a stage ending in a layer keeps that one whole in each of the p
  // microbatches in flight, and every stage holds one working set.
  std::string error;
  std::vector<PartitionUnit> units = chain(4, 1.0, 0.1);
  auto plain = partitionChain(units, {2, 1, 0}, error);
  ASSERT_TRUE(plain) << error;
  ASSERT_EQ(plain->layout.toString(), "Ett|ttmL");
  for (PartitionUnit &u : units)
    if (u.symbol == 't') {
      u.lastSublayerDrop = 300;
      u.largestSublayerDrop = 400;
    }
  auto recomputed = partitionChain(units, {2, 1, 0}, error);
  ASSERT_TRUE(recomputed) << error;
  ASSERT_EQ(recomputed->layout.toString(), "Ett|ttmL");
  EXPECT_DOUBLE_EQ(recomputed->stageBytes[0], plain->stageBytes[0] + 2 * 300 + 400);
  EXPECT_DOUBLE_EQ(recomputed->stageBytes[1], plain->stageBytes[1] + 400); // ends in L: nothing kept whole
  // A cap the plain charge meets and the recomputing one does not.
  EXPECT_TRUE(partitionChain(chain(4, 1.0, 0.1), {2, 1, 3450}, error)) << error;
  EXPECT_FALSE(partitionChain(units, {2, 1, 3450}, error));
}

TEST(AutoPartition, IsOptimalAgainstBruteForce) {
  // Every way to cut 6 layers (+E, L) into 3 stages with E first and L last.
  std::vector<PartitionUnit> units = {{'E', 0, 0.3, 0, 0}, {'t', 0, 1.0, 0, 0}, {'t', 0, 2.0, 0, 0},
                                      {'t', 0, 0.5, 0, 0}, {'t', 0, 1.5, 0, 0}, {'t', 0, 1.0, 0, 0},
                                      {'t', 0, 0.7, 0, 0}, {'L', 0, 1.2, 0, 0}};
  std::string error;
  auto result = partitionChain(units, {3, 1, 0}, error);
  ASSERT_TRUE(result) << error;
  double best = 1e9;
  int n = static_cast<int>(units.size());
  for (int a = 1; a < n; ++a)
    for (int b = a; b < n; ++b) {
      double t[3] = {0, 0, 0};
      for (int i = 0; i < n; ++i)
        t[i < a ? 0 : i < b ? 1 : 2] += units[i].time;
      best = std::min(best, std::max({t[0], t[1], t[2]}));
    }
  EXPECT_DOUBLE_EQ(result->slowestStage, best);
}

} // namespace
} // namespace mhcc::pipeline
