// recomputeEffect against segments cut by hand as the runtime cuts them
// (runtime/program/Recompute.h): after every k-th residual update, the
// stage's last segment kept whole, each dropped one keeping the residual
// that enters it.
#include "passes/pipeline/RecomputeCost.h"

#include <gtest/gtest.h>

namespace mhcc::pipeline {
namespace {

constexpr int64_t kSaved = 1000, kCheckpoint = 100;

RecomputePiece sublayer() { return {kSaved, kCheckpoint, false, 2.0}; }
RecomputePiece other(int64_t saved) { return {saved, 0, false, 0.5}; }

std::vector<bool> flags(std::initializer_list<int> bits) {
  std::vector<bool> out;
  for (int b : bits)
    out.push_back(b != 0);
  return out;
}

TEST(RecomputeCost, MiddleStageDropsAllButItsLastSublayer) {
  const RecomputeEffect e = recomputeEffect({sublayer(), sublayer(), sublayer(), sublayer()}, 1);
  EXPECT_EQ(e.recomputed, flags({1, 1, 1, 0}));
  EXPECT_EQ(e.droppedBytes, 3 * (kSaved - kCheckpoint));
  EXPECT_EQ(e.largestSegmentBytes, kSaved - kCheckpoint);
  EXPECT_DOUBLE_EQ(e.forwardMs, 3 * 2.0);
  // Segments of two: the second, ending the stage, kept whole.
  const RecomputeEffect two = recomputeEffect({sublayer(), sublayer(), sublayer(), sublayer()}, 2);
  EXPECT_EQ(two.recomputed, flags({1, 1, 0, 0}));
  EXPECT_EQ(two.droppedBytes, 2 * kSaved - kCheckpoint);
  // Segments of three: the stage's last segment is its remainder.
  const RecomputeEffect three = recomputeEffect({sublayer(), sublayer(), sublayer(), sublayer()}, 3);
  EXPECT_EQ(three.recomputed, flags({1, 1, 1, 0}));
  EXPECT_EQ(three.droppedBytes, 3 * kSaved - kCheckpoint);
  EXPECT_EQ(three.largestSegmentBytes, 3 * kSaved - kCheckpoint);
}

TEST(RecomputeCost, TheFirstStageRecomputesFromTheTokens) {
  RecomputePiece embedding = other(0);
  embedding.startsFromTokens = true;
  const RecomputeEffect e = recomputeEffect({embedding, other(0), sublayer(), sublayer()}, 1);
  EXPECT_EQ(e.recomputed, flags({1, 1, 1, 0}));
  EXPECT_EQ(e.droppedBytes, kSaved); // no residual enters the first segment
  EXPECT_DOUBLE_EQ(e.forwardMs, 0.5 + 0.5 + 2.0);
}

// The last stage with one MTP module: the main contract, final norm, head
// and loss, the module's prelude, its attention and MLP sublayers, its tail.
std::vector<RecomputePiece> lastStageWithMtp() {
  return {sublayer(), sublayer(), other(0), other(10), other(20), other(300),
          other(40),  sublayer(), sublayer(), other(500)};
}

TEST(RecomputeCost, MtpCutsAfterTheMainHeadAndLoss) {
  const int64_t between = 10 + 20 + 300 + 40; // the main tail and the prelude
  const RecomputeEffect one = recomputeEffect(lastStageWithMtp(), 1);
  EXPECT_EQ(one.recomputed, flags({1, 1, 1, 1, 1, 1, 1, 1, 1, 0}));
  EXPECT_EQ(one.droppedBytes, 4 * (kSaved - kCheckpoint) + between);
  EXPECT_EQ(one.largestSegmentBytes, kSaved - kCheckpoint + between);
  EXPECT_DOUBLE_EQ(one.forwardMs, 4 * 2.0 + 5 * 0.5);
  const RecomputeEffect two = recomputeEffect(lastStageWithMtp(), 2);
  EXPECT_EQ(two.recomputed, flags({1, 1, 1, 1, 1, 1, 1, 1, 1, 0}));
  EXPECT_EQ(two.droppedBytes, 2 * (2 * kSaved - kCheckpoint) + between);
  const RecomputeEffect three = recomputeEffect(lastStageWithMtp(), 3);
  EXPECT_EQ(three.recomputed, flags({1, 1, 1, 1, 1, 1, 1, 1, 0, 0}));
  EXPECT_EQ(three.droppedBytes, 3 * kSaved - kCheckpoint + between);
}

TEST(RecomputeCost, WithoutMtpTheHeadAndLossAreTheKeptSegment) {
  const RecomputeEffect e = recomputeEffect({sublayer(), sublayer(), other(0), other(10), other(20), other(300)}, 1);
  EXPECT_EQ(e.recomputed, flags({1, 1, 0, 0, 0, 0}));
  EXPECT_EQ(e.droppedBytes, 2 * (kSaved - kCheckpoint));
  EXPECT_TRUE(recomputeEffect({}, 1).recomputed.empty());
  EXPECT_EQ(recomputeEffect({other(7)}, 1).droppedBytes, 0);
}

} // namespace
} // namespace mhcc::pipeline
