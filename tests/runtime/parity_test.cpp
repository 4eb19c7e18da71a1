// Bit-exact parity of pipelined training with the serial reference: for each
// model family, the PP1 artifact is the reference, and every other layout
// (PP2, PP2/VPP2, PP4/VPP2, embedding-only, loss-only and empty chunks, MTP
// on the last stage, GPipe, ZB-H1) must reproduce, bit for bit (memcmp):
// both losses, every reduced parameter gradient, every tapped activation and
// input gradient of every microbatch (every model-graph node's output, hence
// every pipeline boundary) and the updated weights, over two steps; each run
// twice.
//
// usage: parity_test DATA REFERENCE.mhcc OTHER.mhcc... [-- REFERENCE OTHER...]
#include "runtime/train/Trainer.h"

#include <gtest/gtest.h>

#include <cstring>

namespace mhcc::runtime {
namespace {

std::string gDataPath;
std::vector<std::vector<std::string>> gFamilies; // [reference, others...]

struct TrainingRun {
  std::vector<StepResult> steps;
  std::vector<std::vector<float>> weights;
};

TrainingRun train(const std::string &path, const TokenDataset &data, int64_t steps) {
  std::string error;
  std::optional<Artifact> artifact = readArtifact(path, error);
  EXPECT_TRUE(artifact) << error;
  if (!artifact)
    return {};
  TrainOptions options;
  options.recordTaps = true;
  CpuTrainer trainer(std::move(*artifact), data, options);
  TrainingRun run;
  for (int64_t s = 0; s < steps; ++s) {
    std::optional<StepResult> result = trainer.step(error);
    EXPECT_TRUE(result) << path << ": " << error;
    if (!result)
      return run;
    run.steps.push_back(std::move(*result));
  }
  run.weights = trainer.parameters();
  return run;
}

bool sameBits(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool sameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void expectIdentical(const TrainingRun &reference, const TrainingRun &run, const std::string &what) {
  ASSERT_EQ(reference.steps.size(), run.steps.size()) << what;
  for (size_t s = 0; s < run.steps.size(); ++s) {
    const StepResult &a = reference.steps[s], &b = run.steps[s];
    std::string at = what + ", step " + std::to_string(s + 1);
    EXPECT_TRUE(sameBits(a.lmLoss, b.lmLoss)) << at << ": lm loss " << a.lmLoss << " vs " << b.lmLoss;
    ASSERT_EQ(a.mtpLoss.has_value(), b.mtpLoss.has_value()) << at;
    if (a.mtpLoss)
      EXPECT_TRUE(sameBits(*a.mtpLoss, *b.mtpLoss)) << at << ": mtp loss";
    EXPECT_TRUE(sameBits(a.gradNorm, b.gradNorm)) << at << ": grad norm";
    EXPECT_EQ(a.numZeros, b.numZeros) << at;
    ASSERT_EQ(a.paramGrads.size(), b.paramGrads.size()) << at;
    for (const auto &[name, grad] : a.paramGrads) {
      auto it = b.paramGrads.find(name);
      ASSERT_NE(it, b.paramGrads.end()) << at << ": no gradient of " << name;
      EXPECT_TRUE(sameBits(grad, it->second)) << at << ": gradient of " << name << " differs";
    }
    ASSERT_EQ(a.taps.size(), b.taps.size()) << at << ": different tensors recorded";
    for (const auto &[key, value] : a.taps) {
      auto it = b.taps.find(key);
      ASSERT_NE(it, b.taps.end()) << at << ": " << key << " not recorded";
      EXPECT_TRUE(sameBits(value, it->second)) << at << ": " << key << " differs";
    }
  }
  ASSERT_EQ(reference.weights.size(), run.weights.size()) << what;
  for (size_t p = 0; p < run.weights.size(); ++p)
    EXPECT_TRUE(sameBits(reference.weights[p], run.weights[p])) << what << ": weights of parameter " << p;
}

TEST(Parity, EveryLayoutMatchesTheSerialReferenceBitForBit) {
  std::string error;
  std::optional<TokenDataset> data = TokenDataset::open(gDataPath, error);
  ASSERT_TRUE(data) << error;
  ASSERT_FALSE(gFamilies.empty());
  for (const auto &family : gFamilies) {
    ASSERT_GE(family.size(), 2u);
    TrainingRun reference = train(family[0], *data, 2);
    ASSERT_EQ(reference.steps.size(), 2u);
    // Taps cover every node output and its gradient for every microbatch.
    EXPECT_GT(reference.steps[0].taps.size(), 10u);
    TrainingRun again = train(family[0], *data, 2);
    expectIdentical(reference, again, family[0] + " (rerun)");
    for (size_t i = 1; i < family.size(); ++i) {
      TrainingRun first = train(family[i], *data, 2);
      expectIdentical(reference, first, family[i]);
      TrainingRun second = train(family[i], *data, 2);
      expectIdentical(first, second, family[i] + " (rerun)");
    }
    // Training moved the weights: the comparison is not of untouched values.
    std::optional<Artifact> artifact = readArtifact(family[0], error);
    ASSERT_TRUE(artifact);
    bool changed = false;
    for (size_t p = 0; p < artifact->params.size() && !changed; ++p)
      changed = !sameBits(initialParameter(artifact->params[p], artifact->model.seed), reference.weights[p]);
    EXPECT_TRUE(changed);
  }
}

} // namespace
} // namespace mhcc::runtime

int main(int argc, char **argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s DATA REFERENCE OTHER... [-- REFERENCE OTHER...]\n", argv[0]);
    return 2;
  }
  mhcc::runtime::gDataPath = argv[1];
  mhcc::runtime::gFamilies.emplace_back();
  for (int i = 2; i < argc; ++i) {
    if (std::string(argv[i]) == "--") {
      mhcc::runtime::gFamilies.emplace_back();
      continue;
    }
    mhcc::runtime::gFamilies.back().push_back(argv[i]);
  }
  return RUN_ALL_TESTS();
}
