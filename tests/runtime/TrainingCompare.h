// Shared by the parity tests: train an artifact with every tap recorded, and
// compare two runs bit for bit (losses, reduced gradients, every tapped
// activation and gradient, final weights).
#ifndef MHCC_TESTS_RUNTIME_TRAININGCOMPARE_H
#define MHCC_TESTS_RUNTIME_TRAININGCOMPARE_H

#include "runtime/cpu/CpuDevice.h"
#include "runtime/train/Trainer.h"

#include <gtest/gtest.h>

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

inline bool sameBits(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
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
