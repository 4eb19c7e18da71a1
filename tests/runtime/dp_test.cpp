// Data parallelism on the CPU backend (issue 13): dp replicas of a pipeline
// trained on the same global batch as one replica with dp times the
// microbatches.
//
// What must hold, and why:
// - Step 1, every tapped activation and input gradient of every microbatch
//   (named by its place in the global batch) is bit-identical: a
//   microbatch's forward and backward do not depend on which replica runs it.
// - Step 1's lm loss is bit-identical: the same per-microbatch losses,
//   averaged in the global batch's order.
// - The reduced gradients differ only in summation order (each replica sums
//   its own microbatches, then the replicas are added in order), so every
//   gradient element agrees to 1e-5 of its parameter's largest (sums that
//   nearly cancel, like the mHC gates', differ by 1.6e-6 of it), and the lm
//   loss over 5 steps to 1e-6 relative in fp32. In bf16 step 1 holds as in
//   fp32, but later steps read bf16 copies of the fp32 masters: a master one
//   fp32 ulp away can round to a copy one bf16 ulp (2^-8) away, so the losses
//   of steps 2-5 agree to 1e-4 relative (measured: 6.5e-6 at step 4).
//
// usage: dp_test DATA DP1.mhcc DP2.mhcc DP4_PP2.mhcc BF16_DP1.mhcc BF16_DP2_PP2.mhcc
#include "tests/runtime/TrainingCompare.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace mhcc::runtime {
namespace {

std::string gDataPath;
std::vector<std::string> gArtifacts; // dp1, dp2, dp4 x pp2, bf16 dp1, bf16 dp2 x pp2

constexpr int64_t kSteps = 5;

/// `other` trained the same global batch as `reference` with more replicas.
void expectSameTraining(const TrainingRun &reference, const TrainingRun &other, const std::string &what,
                        double lossTolerance = 1e-6, double normTolerance = 1e-5) {
  ASSERT_EQ(reference.steps.size(), size_t(kSteps)) << what;
  ASSERT_EQ(other.steps.size(), size_t(kSteps)) << what;
  const StepResult &a = reference.steps[0], &b = other.steps[0];
  EXPECT_TRUE(sameBits(a.lmLoss, b.lmLoss)) << what << ": step 1 lm loss " << a.lmLoss << " vs " << b.lmLoss;
  ASSERT_EQ(a.taps.size(), b.taps.size()) << what << ": the taps name other microbatches";
  ASSERT_GT(a.taps.size(), 10u);
  for (const auto &[name, values] : a.taps) {
    auto it = b.taps.find(name);
    ASSERT_NE(it, b.taps.end()) << what << ": no tap " << name;
    EXPECT_TRUE(sameBits(values, it->second)) << what << ": step 1 tap " << name << " differs";
  }
  ASSERT_EQ(a.paramGrads.size(), b.paramGrads.size());
  int64_t differing = 0;
  for (const auto &[name, grad] : a.paramGrads) {
    const std::vector<float> &g = b.paramGrads.at(name);
    ASSERT_EQ(g.size(), grad.size()) << name;
    float largest = 0;
    for (float v : grad)
      largest = std::max(largest, std::abs(v));
    for (size_t e = 0; e < grad.size(); ++e) {
      differing += grad[e] != g[e];
      EXPECT_LE(std::abs(grad[e] - g[e]), 1e-5 * largest) << what << ": gradient " << name << "[" << e << "]";
    }
  }
  std::printf("%s: step 1 gradients differ in %lld elements (summation order), every tap the same bits\n",
              what.c_str(), static_cast<long long>(differing));
  expectCloseLosses(reference, other, what, lossTolerance, normTolerance);
}

TEST(DataParallel, ReplicasTrainTheGlobalBatchAsOneReplicaDoes) {
  std::string error;
  std::optional<TokenDataset> data = TokenDataset::open(gDataPath, error);
  ASSERT_TRUE(data) << error;
  ASSERT_EQ(gArtifacts.size(), 5u);
  for (const std::string &path : gArtifacts) {
    std::optional<Artifact> a = readArtifact(path, error);
    ASSERT_TRUE(a) << error;
    std::printf("%s: dp %lld x pp %lld, %lld microbatches a replica\n", path.c_str(), static_cast<long long>(a->dp),
                static_cast<long long>(a->pp), static_cast<long long>(a->microbatches));
  }
  const TrainingRun dp1 = train(gArtifacts[0], *data, kSteps);
  const TrainingRun dp2 = train(gArtifacts[1], *data, kSteps);
  expectSameTraining(dp1, dp2, "dp 2");
  // Replicas of a pipeline: 8 ranks as threads.
  expectSameTraining(dp1, train(gArtifacts[2], *data, kSteps), "dp 4 x pp 2");
  expectSameTraining(train(gArtifacts[3], *data, kSteps), train(gArtifacts[4], *data, kSteps), "bf16 dp 2 x pp 2",
                     1e-4, 1e-3);
  // Run to run: the same bits.
  const TrainingRun again = train(gArtifacts[1], *data, kSteps);
  for (int64_t s = 0; s < kSteps; ++s)
    EXPECT_TRUE(sameBits(dp2.steps[s].lmLoss, again.steps[s].lmLoss)) << "dp 2 rerun, step " << s + 1;
  for (size_t p = 0; p < dp2.weights.size(); ++p)
    EXPECT_TRUE(sameBits(dp2.weights[p], again.weights[p])) << "dp 2 rerun, weights " << p;
}

} // namespace
} // namespace mhcc::runtime

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s DATA DP1 DP2 DP4_PP2 BF16_DP1 BF16_DP2_PP2\n", argv[0]);
    return 2;
  }
  mhcc::runtime::gDataPath = argv[1];
  mhcc::runtime::gArtifacts.assign(argv + 2, argv + 7);
  return RUN_ALL_TESTS();
}
