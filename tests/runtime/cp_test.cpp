// Context parallelism on the CPU backend (issue 16): cp ranks share every
// sequence (the load-balanced causal split) and train the same global batch
// as one rank per sequence.
//
// What must hold, and why:
// - Gated DeltaNet runs on the context-parallel group's gathered rows as the
//   whole microbatch would (StageExecutor.h, contextParallelMixer), and its
//   weight gradients are added by context rank 0 alone: step 1's Gated
//   DeltaNet weight gradients are bit-identical to cp 1's. Attention
//   exchanges q, k, v and splits the work; its rows' outputs and input
//   gradients keep one rank's bits (cp_attention_test), its weight gradients
//   are sums of the ranks' rows like every other.
// - Every other gradient sums its rows on each context rank, then over the
//   ranks (the reduce group's order), and each rank's loss is its rows' sum
//   over the microbatch's count: so step 1's other gradients agree to 1e-5
//   of their parameter's largest (or of 1e-4 of the global gradient norm
//   where that is larger: the mHC gates' gradients are sums that nearly
//   cancel, 1e-6 of the norm), and the lm loss over 5 steps to 1e-6
//   relative in fp32 (1e-4 in bf16: a master one fp32 ulp away can round to
//   another bf16 copy, as with data parallelism). The same holds on packed
//   documents (--reset-position-ids --reset-attention-mask), whose masks the
//   gathered rows keep across the chunks, and at cp 2 x dp 2 x pp 2 (8
//   ranks) against one rank with dp x --microbatches microbatches (there the
//   replicas split the microbatches, as in dp_test).
// - A context-parallel run gives the same bits run to run.
//
// usage: cp_test DATA CP1.mhcc CP2.mhcc CP2_DP2_PP2.mhcc BF16_CP1.mhcc BF16_CP2_PP2.mhcc
//                HYBRID_CP1.mhcc HYBRID_CP2.mhcc
#include "tests/runtime/TrainingCompare.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace mhcc::runtime {
namespace {

std::string gDataPath;
std::vector<std::string> gArtifacts; // cp1, cp2, cp2 x dp2 x pp2, bf16 cp1, bf16 cp2 x pp2

constexpr int64_t kSteps = 5;

/// A Gated DeltaNet weight: computed whole from the gathered rows (the sublayer's mHC
/// coefficients and its pre-norm are per row, summed in row order like everything else).
bool isGdnWeight(const std::string &name) {
  static const char *const kGdn[] = {".gdn.w_qkv",   ".gdn.conv",     ".gdn.w_ab",   ".gdn.a_log",
                                     ".gdn.dt_bias", ".gdn.out_norm", ".gdn.w_gate", ".gdn.w_o"};
  auto endsWith = [&](const char *suffix) {
    const size_t n = std::strlen(suffix);
    return name.size() >= n && name.compare(name.size() - n, n, suffix) == 0;
  };
  return std::any_of(std::begin(kGdn), std::end(kGdn), endsWith);
}

/// `other` trained the same global batch as `reference` with cp ranks per sequence.
void expectSameTraining(const TrainingRun &reference, const TrainingRun &other, const std::string &what,
                        bool gdnBits, double lossTolerance = 1e-6, double normTolerance = 1e-5) {
  ASSERT_EQ(reference.steps.size(), size_t(kSteps)) << what;
  ASSERT_EQ(other.steps.size(), size_t(kSteps)) << what;
  const GradientComparison c =
      expectCloseGradients(reference.steps[0], other.steps[0], what, 1e-5,
                           [&](const std::string &name) { return gdnBits && isGdnWeight(name); });
  const int64_t gdn = c.sameBitsParams, differing = c.differing;
  EXPECT_EQ(gdn > 0, gdnBits) << what << ": no Gated DeltaNet weights compared bit for bit";
  EXPECT_GT(differing, 0) << what << ": no gradient summed in another order: is context parallelism on?";
  std::printf("%s: step 1 Gated DeltaNet weight gradients (%lld) the same bits, %lld other elements differ "
              "(row order)\n",
              what.c_str(), static_cast<long long>(gdn), static_cast<long long>(differing));
  expectCloseLosses(reference, other, what, lossTolerance, normTolerance);
}

TEST(ContextParallel, RanksSharingSequencesTrainAsOneRankDoes) {
  std::string error;
  std::optional<TokenDataset> text = TokenDataset::open(gDataPath, error);
  ASSERT_TRUE(text) << error;
  std::optional<TokenDataset> packed = packedCorpus(gDataPath, error);
  ASSERT_TRUE(packed) << error;
  ASSERT_EQ(gArtifacts.size(), 7u);
  for (const std::string &path : gArtifacts) {
    std::optional<Artifact> a = readArtifact(path, error);
    ASSERT_TRUE(a) << error;
    std::printf("%s: cp %lld x dp %lld x pp %lld, %lld tokens of each "
                "microbatch a rank\n",
                path.c_str(), static_cast<long long>(a->cp), static_cast<long long>(a->dp),
                static_cast<long long>(a->pp), static_cast<long long>(a->rowsPerRank()));
  }
  const TrainingRun cp1 = train(gArtifacts[0], *text, kSteps);
  const TrainingRun cp2 = train(gArtifacts[1], *text, kSteps);
  expectSameTraining(cp1, cp2, "cp 2", false);
  expectSameTraining(cp1, train(gArtifacts[2], *text, kSteps), "cp 2 x dp 2 x pp 2", false);
  TrainOptions documents;
  documents.resetPositionIds = documents.resetAttentionMask = true;
  expectSameTraining(train(gArtifacts[0], *packed, kSteps, cpuDevices(), documents),
                     train(gArtifacts[1], *packed, kSteps, cpuDevices(), documents), "cp 2, packed documents", false);
  expectSameTraining(train(gArtifacts[3], *text, kSteps), train(gArtifacts[4], *text, kSteps), "bf16 cp 2 x pp 2",
                     false, 1e-4, 1e-3);
  // The hybrid stack: Gated DeltaNet's recurrence runs across the chunks too.
  expectSameTraining(train(gArtifacts[5], *packed, kSteps, cpuDevices(), documents),
                     train(gArtifacts[6], *packed, kSteps, cpuDevices(), documents), "hybrid cp 2, packed documents",
                     true);
  // Run to run: the same bits.
  const TrainingRun again = train(gArtifacts[1], *text, kSteps);
  for (int64_t s = 0; s < kSteps; ++s)
    EXPECT_TRUE(sameBits(cp2.steps[s].lmLoss, again.steps[s].lmLoss)) << "cp 2 rerun, step " << s + 1;
  for (size_t p = 0; p < cp2.weights.size(); ++p)
    EXPECT_TRUE(sameBits(cp2.weights[p], again.weights[p])) << "cp 2 rerun, weights " << p;
}

} // namespace
} // namespace mhcc::runtime

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 9) {
    std::fprintf(stderr,
                 "usage: %s DATA CP1 CP2 CP2_DP2_PP2 BF16_CP1 BF16_CP2_PP2 "
                 "HYBRID_CP1 HYBRID_CP2\n",
                 argv[0]);
    return 2;
  }
  mhcc::runtime::gDataPath = argv[1];
  mhcc::runtime::gArtifacts.assign(argv + 2, argv + 9);
  return RUN_ALL_TESTS();
}
