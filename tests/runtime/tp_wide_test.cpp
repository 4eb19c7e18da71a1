// DeepSeek widths under tensor and sequence parallelism (issue 13): C = 4096
// and C = 7168 with n = 4 residual streams (n*C = 16384 and 28672 values a
// token on the wire), shrunk in depth, FFN and sequence for the CPU, at
// PP2/VPP2 + TP2 + sequence parallelism. Every boundary then carries S/tp x
// n*C per rank (mhcc --print-schedule prints it; tests/compiler/summary.test),
// wraparound edge included, and the run must be the PP1 + TP2 + SP run bit
// for bit (losses, gradients, every tapped activation and gradient, the
// updated weights) after one step: the CPU takes about a minute a step at
// C = 7168 (0.2 G parameters; issue 13 runs the same at TP2 + SP on GPUs).
//
// usage: tp_wide_test DATA PP1.mhcc PP2_VPP2.mhcc [-- PP1.mhcc PP2_VPP2.mhcc ...]
#include "tests/runtime/TrainingCompare.h"

#include <gtest/gtest.h>

namespace mhcc::runtime {
namespace {

std::string gDataPath;
std::vector<std::vector<std::string>> gPairs; // [pp1, pp2/vpp2]

TEST(TensorParallelWide, LayoutsAreBitIdenticalAtDeepSeekWidths) {
  std::string error;
  std::optional<TokenDataset> data = TokenDataset::open(gDataPath, error);
  ASSERT_TRUE(data) << error;
  ASSERT_FALSE(gPairs.empty());
  for (const std::vector<std::string> &pair : gPairs) {
    ASSERT_EQ(pair.size(), 2u);
    std::optional<Artifact> a = readArtifact(pair[1], error);
    ASSERT_TRUE(a) << error;
    ASSERT_EQ(a->tp, 2);
    ASSERT_TRUE(a->sequenceParallel);
    std::printf("%s: C = %lld, n = %lld, boundaries of %lld x %lld per rank\n", pair[1].c_str(),
                static_cast<long long>(a->model.hidden), static_cast<long long>(a->model.streams),
                static_cast<long long>(a->rowsPerRank()),
                static_cast<long long>(a->model.hidden * a->model.streams));
    const TrainingRun reference = train(pair[0], *data, 1);
    ASSERT_EQ(reference.steps.size(), 1u);
    EXPECT_GT(reference.steps[0].taps.size(), 10u);
    expectIdentical(reference, train(pair[1], *data, 1), pair[1]);
  }
}

} // namespace
} // namespace mhcc::runtime

int main(int argc, char **argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s DATA PP1 PP2_VPP2 [-- PP1 PP2_VPP2 ...]\n", argv[0]);
    return 2;
  }
  mhcc::runtime::gDataPath = argv[1];
  mhcc::runtime::gPairs.emplace_back();
  for (int i = 2; i < argc; ++i) {
    if (std::string(argv[i]) == "--") {
      mhcc::runtime::gPairs.emplace_back();
      continue;
    }
    mhcc::runtime::gPairs.back().push_back(argv[i]);
  }
  return RUN_ALL_TESTS();
}
