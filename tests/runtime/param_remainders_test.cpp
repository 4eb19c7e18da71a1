// --store-param-remainders on the CPU backend (runtime/train/ParamRemainders.h):
// the CPU keeps fp32 masters but settles them off bf16 ties as the GPU's
// remainders must, so (a) no master of a run with it ever lies on a tie,
// where the plain run's initial masters do; (b) the run is bit-identical
// across pipeline layouts and with the distributed optimizer; (c) it is the
// plain run but for those few ulps (losses within 1e-5 over three steps).
// checkpoint_test resumes such a run bit for bit.
//
// usage: param_remainders_test DATA PP1 PP2_VPP2 DP2_PP2 DP2_PP2_ZERO1 (tiny_bf16)
#include "runtime/train/Parameters.h"
#include "runtime/train/Trainer.h"
#include "tests/runtime/TrainingCompare.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace mhcc::runtime {
namespace {

std::string gData, gPp1, gPp2Vpp2, gDp2, gDp2Zero1;

const TokenDataset &data() {
  static std::optional<TokenDataset> d = [] {
    std::string error;
    auto opened = TokenDataset::open(gData, error);
    EXPECT_TRUE(opened) << error;
    return opened;
  }();
  return *d;
}

TrainOptions withRemainders() {
  TrainOptions o;
  o.storeParamRemainders = true;
  return o;
}

/// Elements exactly halfway between two bf16 values (the low 16 bits 0x8000).
int64_t ties(const std::vector<std::vector<float>> &weights) {
  int64_t n = 0;
  for (const std::vector<float> &w : weights)
    for (float v : w) {
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      n += (bits & 0xFFFFu) == 0x8000u;
    }
  return n;
}

TEST(ParamRemainders, NoMasterLiesOnATieAndThePlainRunIsCloseButForThem) {
  std::string error;
  std::optional<Artifact> a = readArtifact(gPp1, error);
  ASSERT_TRUE(a) << error;
  std::vector<std::vector<float>> initial;
  for (const ParamInfo &info : a->params)
    initial.push_back(initialParameter(info, a->model.seed));
  const int64_t initialTies = ties(initial);
  ASSERT_GT(initialTies, 0) << "tiny_bf16's initial masters hold no tie: the comparison below shows nothing";

  const TrainingRun plain = train(gPp1, data(), 3), settled = train(gPp1, data(), 3, cpuDevices(), withRemainders());
  ASSERT_EQ(plain.steps.size(), 3u);
  ASSERT_EQ(settled.steps.size(), 3u);
  EXPECT_EQ(ties(settled.weights), 0);
  // Only ties moved, by an fp32 ulp: the plain losses to within 1e-5.
  for (size_t s = 0; s < 3; ++s)
    EXPECT_NEAR(settled.steps[s].lmLoss, plain.steps[s].lmLoss, 1e-5 * plain.steps[s].lmLoss) << "step " << s + 1;
  bool moved = false;
  for (size_t p = 0; p < plain.weights.size() && !moved; ++p)
    moved = !sameBits(plain.weights[p], settled.weights[p]);
  EXPECT_TRUE(moved) << "the settled masters equal the plain ones: the flag did nothing";
}

TEST(ParamRemainders, BitIdenticalAcrossLayoutsAndTheDistributedOptimizer) {
  const TrainingRun reference = train(gPp1, data(), 2, cpuDevices(), withRemainders());
  expectIdentical(reference, train(gPp2Vpp2, data(), 2, cpuDevices(), withRemainders()), "PP2/VPP2");
  const TrainingRun dp2 = train(gDp2, data(), 2, cpuDevices(), withRemainders());
  ASSERT_EQ(dp2.steps.size(), 2u);
  EXPECT_EQ(ties(dp2.weights), 0);
  expectIdentical(dp2, train(gDp2Zero1, data(), 2, cpuDevices(), withRemainders()), "dp 2 with the distributed "
                                                                                         "optimizer");
}

} // namespace
} // namespace mhcc::runtime

int main(int argc, char **argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s DATA PP1 PP2_VPP2 DP2_PP2 DP2_PP2_ZERO1\n", argv[0]);
    return 2;
  }
  mhcc::runtime::gData = argv[1];
  mhcc::runtime::gPp1 = argv[2];
  mhcc::runtime::gPp2Vpp2 = argv[3];
  mhcc::runtime::gDp2 = argv[4];
  mhcc::runtime::gDp2Zero1 = argv[5];
  return RUN_ALL_TESTS();
}
