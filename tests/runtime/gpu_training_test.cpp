// The CUDA backend end to end: deterministic run to run, bit-identical
// across pipeline layouts at a fixed dp (PP1 reference against PP2 and PP2/VPP2, on one
// GPU a rank, or with ranks sharing the GPUs when fewer are visible:
// losses, every reduced gradient, every tapped boundary and activation,
// final weights), and close to the CPU backend on the
// losses: 1e-5 relative in fp32; 1e-3 in bf16 (grad norm 2e-2), where the GPU
// rounds where the CPU keeps fp32 (flash attention's probabilities, two
// products summed into one bf16 gradient) and sums in another order
// (docs/precision.md). Skips cleanly without a GPU.
//
// usage: gpu_training_test DATA CPU_REFERENCE|- GPU_REFERENCE OTHER...
// ("-": no CPU comparison, for models too large for the CPU backend)
#include "runtime/cuda/CudaDevice.h"
#include "runtime/cuda/Gpus.h"
#include "tests/runtime/TrainingCompare.h"

#include <algorithm>
#include <cmath>

namespace mhcc::runtime {

namespace {

std::string gData;
std::vector<std::string> gArtifacts;

/// Ranks a GPU for `path`'s mesh on `gpus` GPUs: 1 when each rank can have
/// one, else as many as sharing them takes (their messages device copies
/// instead of NCCL, runtime/cuda/RankLinks.h: the same kernels and bits,
/// the transport not exercised); `how` says which.
int ranksPerGpu(const std::string &path, int64_t gpus, std::string &how) {
  std::string error;
  std::optional<Artifact> artifact = readArtifact(path, error);
  EXPECT_TRUE(artifact) << error;
  const int64_t ranks = artifact ? artifact->worldSize() : 1;
  const int perGpu = int((ranks + gpus - 1) / gpus);
  how = perGpu > 1 ? " on " + std::to_string((ranks + perGpu - 1) / perGpu) + " GPU(s), " + std::to_string(perGpu) +
                         " ranks a GPU"
                   : " on GPUs";
  return perGpu;
}

TEST(GpuTraining, DeterministicAcrossRunsLayoutsAndCloseToTheCpu) {
  GpuInventory gpus = queryGpus();
  if (gpus.gpus.empty())
    GTEST_SKIP() << gpus.unavailableReason;
  std::string error;
  std::optional<TokenDataset> data = TokenDataset::open(gData, error);
  ASSERT_TRUE(data) << error;

  const int64_t visible = static_cast<int64_t>(gpus.gpus.size());
  std::string how;
  const int referenceSharing = ranksPerGpu(gArtifacts[1], visible, how);
  std::printf("%s: training%s\n", gArtifacts[1].c_str(), how.c_str());
  TrainingRun gpu = train(gArtifacts[1], *data, 2, cudaDevices(referenceSharing));
  ASSERT_EQ(gpu.steps.size(), 2u);
  {
    TrainingRun again = train(gArtifacts[1], *data, 2, cudaDevices(referenceSharing));
    expectIdentical(gpu, again, gArtifacts[1] + " on the GPU (rerun)");
  }
  TrainingRun cpu;
  double lossTolerance = 1e-5, normTolerance = 1e-5, gradTolerance = 1e-4;
  if (gArtifacts[0] != "-") {
    cpu = train(gArtifacts[0], *data, 2);
    std::optional<Artifact> reference = readArtifact(gArtifacts[0], error);
    ASSERT_TRUE(reference) << error;
    if (reference->model.dtype == "bf16")
      lossTolerance = 1e-3, normTolerance = 2e-2, gradTolerance = 3e-2;
  }
  // Step 1's reduced gradients, parameter by parameter (a wrong small
  // gradient hides in the global norm, and Adam's first update is nearly
  // lr * sign(g) whatever its size): the L2 distance to the CPU's, relative to
  // the larger of the parameter's gradient norm and 1e-3 of the global one.
  // The floor is needed in bf16: some mHC gradients (layer 0's bias, whose
  // streams are identical copies; alpha) are ~1e-5 of the global norm and
  // mostly rounding, as far from an fp32 run's as from the GPU's
  // (docs/precision.md).
  if (!cpu.steps.empty()) {
    std::vector<std::pair<double, std::string>> distances;
    const double floor = 1e-3 * cpu.steps[0].gradNorm;
    for (const auto &[name, g] : cpu.steps[0].paramGrads) {
      const std::vector<float> &h = gpu.steps[0].paramGrads.at(name);
      double diff = 0, norm = 0;
      for (size_t i = 0; i < g.size(); ++i)
        diff += (double(h[i]) - g[i]) * (double(h[i]) - g[i]), norm += double(g[i]) * g[i];
      distances.push_back({std::sqrt(diff) / std::max(std::sqrt(norm), floor), name});
    }
    std::sort(distances.rbegin(), distances.rend());
    for (size_t i = 0; i < std::min<size_t>(3, distances.size()); ++i)
      std::printf("step 1 gradient of %s: relative distance to the CPU's %.2e\n", distances[i].second.c_str(),
                  distances[i].first);
    EXPECT_LT(distances.front().first, gradTolerance)
        << "step 1: the gradient of " << distances.front().second << " is far from the CPU's";
  }
  for (size_t s = 0; s < cpu.steps.size(); ++s) {
    double lm = std::abs(gpu.steps[s].lmLoss - cpu.steps[s].lmLoss) / cpu.steps[s].lmLoss;
    ASSERT_EQ(gpu.steps[s].mtpLoss.has_value(), cpu.steps[s].mtpLoss.has_value());
    double mtp = cpu.steps[s].mtpLoss
                     ? std::abs(*gpu.steps[s].mtpLoss - *cpu.steps[s].mtpLoss) / *cpu.steps[s].mtpLoss
                     : 0.0;
    EXPECT_LT(lm, lossTolerance) << "step " << s + 1 << ": GPU lm loss " << gpu.steps[s].lmLoss << ", CPU "
                        << cpu.steps[s].lmLoss;
    EXPECT_LT(mtp, lossTolerance) << "step " << s + 1;
    double norm = std::abs(gpu.steps[s].gradNorm - cpu.steps[s].gradNorm) / cpu.steps[s].gradNorm;
    EXPECT_LT(norm, normTolerance) << "step " << s + 1 << ": grad norm";
    RecordProperty("lm_loss_relative_difference_step" + std::to_string(s + 1), std::to_string(lm));
    std::printf("step %zu: lm loss GPU %.9f CPU %.9f (relative %.2e), grad norm GPU %.6f CPU %.6f\n", s + 1,
                gpu.steps[s].lmLoss, cpu.steps[s].lmLoss, lm, gpu.steps[s].gradNorm, cpu.steps[s].gradNorm);
  }
  for (size_t i = 2; i < gArtifacts.size(); ++i) {
    const int sharing = ranksPerGpu(gArtifacts[i], visible, how);
    std::printf("%s: training%s\n", gArtifacts[i].c_str(), how.c_str());
    TrainingRun first = train(gArtifacts[i], *data, 2, cudaDevices(sharing));
    expectIdentical(gpu, first, gArtifacts[i] + how);
    first = {}; // the large cases hold gigabytes of gradients per run
    TrainingRun second = train(gArtifacts[i], *data, 2, cudaDevices(sharing));
    expectIdentical(gpu, second, gArtifacts[i] + how + " (rerun)");
    std::printf("%s: bit-identical to PP1%s, twice\n", gArtifacts[i].c_str(), how.c_str());
  }
}

} // namespace
} // namespace mhcc::runtime

int main(int argc, char **argv) {
  mhcc::runtime::prepareCudaEnvironment();
  std::setvbuf(stdout, nullptr, _IOLBF, 0); // a run killed by a time limit still shows how far it got
  testing::InitGoogleTest(&argc, argv);
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s DATA CPU_REFERENCE|- GPU_REFERENCE [OTHER...]\n", argv[0]);
    return 2;
  }
  mhcc::runtime::gData = argv[1];
  for (int i = 2; i < argc; ++i)
    mhcc::runtime::gArtifacts.push_back(argv[i]);
  if (mhcc::runtime::gArtifacts.size() < 2) {
    std::fprintf(stderr, "need a CPU reference and a GPU reference artifact\n");
    return 2;
  }
  return RUN_ALL_TESTS();
}
