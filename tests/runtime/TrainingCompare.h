// Shared by the parity tests: train an artifact with every tap recorded, and
// compare two runs bit for bit (losses, reduced gradients, every tapped
// activation and gradient, final weights).
#ifndef MHCC_TESTS_RUNTIME_TRAININGCOMPARE_H
#define MHCC_TESTS_RUNTIME_TRAININGCOMPARE_H

#include "runtime/cpu/CpuDevice.h"
#include "runtime/train/Trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace mhcc::runtime {

struct TrainingRun {
  std::vector<StepResult> steps;
  std::vector<std::vector<float>> weights;
};

/// Trains `steps` steps with every tap recorded on the devices `devices`
/// makes, with `base`'s options otherwise.
inline TrainingRun train(const std::string &path, const TokenDataset &data, int64_t steps,
                         const DeviceFactory &devices = cpuDevices(), const TrainOptions &base = TrainOptions()) {
  std::string error;
  std::optional<Artifact> artifact = readArtifact(path, error);
  EXPECT_TRUE(artifact) << error;
  if (!artifact)
    return {};
  TrainOptions options = base;
  options.recordTaps = true;
  // The GPU suite reruns the GPU parity test with the pool (the static plan
  // is the default).
  if (const char *plan = std::getenv("MHCC_TEST_MEMORY_PLAN"))
    options.staticMemoryPlan = std::string(plan) != "pool";
  // The GPU suite's packed-document parity cases (an indexed dataset).
  if (const char *packed = std::getenv("MHCC_TEST_PACKED_DOCUMENTS"); packed && std::string(packed) == "1")
    options.resetPositionIds = options.resetAttentionMask = true;
  // Adam's epsilon for a GPU-against-CPU comparison where gradients at the
  // level of bf16 rounding noise would otherwise each take a full lr step
  // whose sign depends on the noise (docs/precision.md, small_bf16).
  if (const char *eps = std::getenv("MHCC_TEST_ADAM_EPS"); eps && *eps)
    options.adamEps = std::atof(eps);
  // The GPU suite's --store-param-remainders parity groups (both backends).
  if (const char *remainders = std::getenv("MHCC_TEST_PARAM_REMAINDERS"); remainders && std::string(remainders) == "1")
    options.storeParamRemainders = true;
  // A hung layout then fails in seconds instead of using up a GPU call.
  if (const char *timeout = std::getenv("MHCC_TEST_RECV_TIMEOUT"))
    options.recvTimeoutSeconds = std::atof(timeout);
  std::unique_ptr<Trainer> trainer = Trainer::create(std::move(*artifact), data, options, devices, error);
  EXPECT_TRUE(trainer) << error;
  if (!trainer)
    return {};
  TrainingRun run;
  for (int64_t s = 0; s < steps; ++s) {
    std::optional<StepResult> result = trainer->step(error);
    EXPECT_TRUE(result) << path << ": " << error;
    if (!result)
      return run;
    run.steps.push_back(std::move(*result));
  }
  run.weights = trainer->parameters();
  return run;
}

/// The text at `textPath` cut into documents of 3 to 150 bytes (a hash of the cut's
/// position picks each length), written as an indexed dataset.
inline std::optional<TokenDataset> packedCorpus(const std::string &textPath, std::string &error) {
  std::optional<TokenDataset> text = TokenDataset::open(textPath, error);
  if (!text)
    return std::nullopt;
  std::vector<std::vector<int32_t>> docs;
  for (size_t i = 0; i < text->size();) {
    const size_t length = std::min<size_t>(3 + mix64(i) % 148, text->size() - i);
    docs.emplace_back();
    for (size_t k = 0; k < length; ++k)
      docs.back().push_back(text->token(i + k));
    i += length;
  }
  const char *tmp = std::getenv("TEST_TMPDIR");
  const std::string prefix = std::string(tmp ? tmp : "/tmp") + "/packed_corpus";
  if (!writeIndexedDataset(prefix, docs, 1, error))
    return std::nullopt;
  return TokenDataset::open(prefix, error);
}

/// Two runs of the same global batch that sum in another order: each step's
/// lm loss (and MTP loss) within `lossTolerance` relative, the gradient norm
/// within `normTolerance`; prints each step's pair.
inline void expectCloseLosses(const TrainingRun &reference, const TrainingRun &other, const std::string &what,
                              double lossTolerance, double normTolerance) {
  ASSERT_EQ(reference.steps.size(), other.steps.size()) << what;
  for (size_t s = 0; s < reference.steps.size(); ++s) {
    const StepResult &a = reference.steps[s], &b = other.steps[s];
    EXPECT_LE(std::abs(a.lmLoss - b.lmLoss), lossTolerance * std::abs(a.lmLoss))
        << what << ": step " << s + 1 << " lm loss " << a.lmLoss << " vs " << b.lmLoss;
    ASSERT_EQ(a.mtpLoss.has_value(), b.mtpLoss.has_value()) << what;
    if (a.mtpLoss) {
      EXPECT_LE(std::abs(*a.mtpLoss - *b.mtpLoss), lossTolerance * std::abs(*a.mtpLoss))
          << what << ": step " << s + 1 << " mtp loss";
    }
    EXPECT_LE(std::abs(a.gradNorm - b.gradNorm), normTolerance * a.gradNorm)
        << what << ": step " << s + 1 << " grad norm " << a.gradNorm << " vs " << b.gradNorm;
    std::printf("%s: step %zu lm loss %.9f vs %.9f (relative %.2e)\n", what.c_str(), s + 1, a.lmLoss, b.lmLoss,
                std::abs(a.lmLoss - b.lmLoss) / std::abs(a.lmLoss));
  }
}

inline bool sameBits(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// What expectCloseGradients compared.
struct GradientComparison {
  int64_t sameBitsParams = 0;     // compared bit for bit (sameBits)
  int64_t differing = 0, compared = 0; // elements compared with the tolerance, and those whose bits differ
  double worst = 0;               // the largest difference over its bound's scale
};

/// Step 1's gradients of two runs of the same batch summed in another order:
/// those `sameBits(name)` selects bit for bit, every other element within
/// `tolerance` of its parameter's largest (or of 1e-4 of the gradient norm
/// where that is larger: the mHC gates' gradients are sums that nearly cancel).
template <typename SameBits>
GradientComparison expectCloseGradients(const StepResult &a, const StepResult &b, const std::string &what,
                                        double tolerance, SameBits sameBitsFor) {
  GradientComparison out;
  EXPECT_EQ(a.paramGrads.size(), b.paramGrads.size()) << what;
  for (const auto &[name, grad] : a.paramGrads) {
    auto it = b.paramGrads.find(name);
    if (it == b.paramGrads.end() || it->second.size() != grad.size()) {
      ADD_FAILURE() << what << ": no gradient of " << name << " of the same size";
      continue;
    }
    const std::vector<float> &g = it->second;
    if (sameBitsFor(name)) {
      ++out.sameBitsParams;
      EXPECT_TRUE(sameBits(grad, g)) << what << ": step 1 gradient of " << name << " differs";
      continue;
    }
    float largest = float(1e-4 * a.gradNorm);
    for (float v : grad)
      largest = std::max(largest, std::abs(v));
    for (size_t e = 0; e < grad.size(); ++e) {
      out.differing += grad[e] != g[e];
      ++out.compared;
      out.worst = std::max(out.worst, double(std::abs(grad[e] - g[e])) / largest);
      EXPECT_LE(std::abs(grad[e] - g[e]), tolerance * largest) << what << ": gradient " << name << "[" << e << "]";
    }
  }
  return out;
}

inline bool sameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

inline void expectIdentical(const TrainingRun &reference, const TrainingRun &run, const std::string &what) {
  ASSERT_EQ(reference.steps.size(), run.steps.size()) << what;
  for (size_t s = 0; s < run.steps.size(); ++s) {
    const StepResult &a = reference.steps[s], &b = run.steps[s];
    std::string at = what + ", step " + std::to_string(s + 1);
    EXPECT_TRUE(sameBits(a.lmLoss, b.lmLoss)) << at << ": lm loss " << a.lmLoss << " vs " << b.lmLoss;
    ASSERT_EQ(a.mtpLoss.has_value(), b.mtpLoss.has_value()) << at;
    if (a.mtpLoss) {
      EXPECT_TRUE(sameBits(*a.mtpLoss, *b.mtpLoss)) << at << ": mtp loss";
    }
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

} // namespace mhcc::runtime

#endif // MHCC_TESTS_RUNTIME_TRAININGCOMPARE_H
