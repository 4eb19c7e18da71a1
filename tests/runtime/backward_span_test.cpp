// The executor's side of Device::backwardSpan (a device computing several
// backward instructions in one call, as the CUDA backend does pass A of a
// sublayer inside the next sublayer's pass C): it checks and allocates the
// gradients of every instruction of the span first, lists every fresh one,
// calls backward() once for the first and moves past the span; the weight
// half (W under ZB-H1) still runs one instruction at a time. The device
// here is the CPU backend behind a wrapper that joins every other pair of
// backward instructions and runs them one by one, each with the fresh
// gradients it writes (freshByInstruction, as CudaRank::backward splits
// them): training must give the plain CPU run's bits, with fewer backward
// calls.
//
// usage: backward_span_test DATA PP2_VPP2 PP2_ZB
#include "runtime/cpu/CpuDevice.h"
#include "runtime/train/Trainer.h"
#include "tests/runtime/ForwardingDevice.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>

namespace mhcc::runtime {
namespace {

std::optional<TokenDataset> gData;
std::string gArtifacts[2];
std::atomic<int64_t> gCalls{0}, gJoined{0};

/// Joins backward instructions 2k and 2k + 1 of every stage.
class SpanningDevice final : public ForwardingDevice {
public:
  SpanningDevice(std::unique_ptr<Device> inner, const Artifact &a) : ForwardingDevice(std::move(inner)), a_(a) {}
  size_t backwardSpan(int64_t stage, size_t index) const override {
    return index % 2 == 0 && index + 1 < a_.stages[stage].backward.size() ? 2 : 1;
  }
  bool backward(int64_t stage, int64_t mb, size_t index, BackwardPart part, StageState &state,
                const std::vector<int> &fresh) override {
    ++gCalls;
    const size_t span = part == BackwardPart::Weight ? 1 : backwardSpan(stage, index);
    gJoined += span == 2;
    const std::vector<std::vector<int>> own = freshByInstruction(a_.stages[stage], index, span, fresh);
    size_t claimed = 0;
    for (size_t i = index; i < index + span; ++i) {
      const BackwardInstr &b = a_.stages[stage].backward[i];
      claimed += own[i - index].size();
      // Every gradient the second one writes exists before the first runs.
      for (int id : b.gradInputs)
        if (part != BackwardPart::Weight && id >= 0 && !state.values[id]) {
          ADD_FAILURE() << "backward " << i << " of stage " << stage << ": gradient " << id << " not allocated";
          return false;
        }
      if (!inner_->backward(stage, mb, i, part, state, own[i - index]))
        return false;
    }
    EXPECT_EQ(claimed, fresh.size()) << "a fresh gradient no instruction of the span writes";
    return true;
  }

private:
  const Artifact &a_;
};

DeviceFactory spanning() {
  return wrappedCpuDevices([](std::unique_ptr<Device> inner, const Artifact &a) -> std::unique_ptr<Device> {
    return std::make_unique<SpanningDevice>(std::move(inner), a);
  });
}

std::vector<StepResult> train(const std::string &path, const DeviceFactory &devices, int steps) {
  return trainSteps(path, *gData, devices, steps);
}

void expectSameBits(const std::string &path) {
  SCOPED_TRACE(path);
  const std::vector<StepResult> plain = train(path, cpuDevices(), 2);
  gCalls = gJoined = 0;
  const std::vector<StepResult> joined = train(path, spanning(), 2);
  ASSERT_EQ(plain.size(), 2u);
  ASSERT_EQ(joined.size(), 2u);
  EXPECT_GT(gJoined.load(), 0) << "no span was taken";
  expectSameStepBits(plain, joined);
}

TEST(BackwardSpan, JoinedInstructionsGiveThePlainBits) { expectSameBits(gArtifacts[0]); }

TEST(BackwardSpan, TheWeightHalfRunsAlone) { expectSameBits(gArtifacts[1]); } // ZB-H1: B spans, W one by one

} // namespace
} // namespace mhcc::runtime

int main(int argc, char **argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc != 4) {
    std::fprintf(stderr, "usage: backward_span_test DATA PP2_VPP2 PP2_ZB\n");
    return 2;
  }
  std::string error;
  mhcc::runtime::gData = mhcc::runtime::TokenDataset::open(argv[1], error);
  if (!mhcc::runtime::gData) {
    std::fprintf(stderr, "backward_span_test: %s\n", error.c_str());
    return 2;
  }
  mhcc::runtime::gArtifacts[0] = argv[2];
  mhcc::runtime::gArtifacts[1] = argv[3];
  return RUN_ALL_TESTS();
}
