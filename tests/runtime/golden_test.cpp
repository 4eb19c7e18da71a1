// Trains each recipe's artifact for its golden's iterations and compares
// "lm loss", "mtp loss" and "num-zeros" exactly with goldens/<recipe>/
// golden_values_cpu.json. Regenerate only with tools/regen_goldens.sh.
//
// usage: golden_test DATA ARTIFACT GOLDEN [ARTIFACT GOLDEN...]
#include "runtime/cpu/CpuDevice.h"
#include "runtime/train/Trainer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

namespace mhcc::runtime {
namespace {

std::string gDataPath;
std::vector<std::pair<std::string, std::string>> gRecipes;

TEST(Goldens, CpuTrainingReproducesEveryValueExactly) {
  std::string error;
  std::optional<TokenDataset> data = TokenDataset::open(gDataPath, error);
  ASSERT_TRUE(data) << error;
  ASSERT_FALSE(gRecipes.empty());
  for (const auto &[artifactPath, goldenPath] : gRecipes) {
    std::ifstream in(goldenPath);
    ASSERT_TRUE(in) << goldenPath;
    nlohmann::json golden = nlohmann::json::parse(in);
    for (const char *metric : {"lm loss", "num-zeros"})
      ASSERT_TRUE(golden.contains(metric)) << goldenPath << " lacks " << metric;
    int64_t steps = golden["lm loss"]["end_step"];
    ASSERT_GE(steps, 1);
    std::optional<Artifact> artifact = readArtifact(artifactPath, error);
    ASSERT_TRUE(artifact) << error;
    std::unique_ptr<Trainer> trainer = Trainer::create(std::move(*artifact), *data, TrainOptions{}, cpuDevices(), error);
    ASSERT_TRUE(trainer) << error;
    for (int64_t s = 1; s <= steps; ++s) {
      std::optional<StepResult> result = trainer->step(error);
      ASSERT_TRUE(result) << error;
      std::string key = std::to_string(s);
      EXPECT_EQ(result->lmLoss, golden["lm loss"]["values"][key].get<double>())
          << goldenPath << " iteration " << s;
      EXPECT_EQ(result->numZeros, golden["num-zeros"]["values"][key].get<int64_t>())
          << goldenPath << " iteration " << s;
      if (golden.contains("mtp loss")) {
        ASSERT_TRUE(result->mtpLoss);
        EXPECT_EQ(*result->mtpLoss, golden["mtp loss"]["values"][key].get<double>())
            << goldenPath << " iteration " << s;
      }
    }
  }
}

} // namespace
} // namespace mhcc::runtime

int main(int argc, char **argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc < 4 || argc % 2) {
    std::fprintf(stderr, "usage: %s DATA ARTIFACT GOLDEN [ARTIFACT GOLDEN...]\n", argv[0]);
    return 2;
  }
  mhcc::runtime::gDataPath = argv[1];
  for (int i = 2; i + 1 < argc; i += 2)
    mhcc::runtime::gRecipes.push_back({argv[i], argv[i + 1]});
  return RUN_ALL_TESTS();
}
