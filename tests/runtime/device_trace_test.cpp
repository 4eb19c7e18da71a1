// The executor's side of `mhcrun --trace` on a device that times its own
// work (the GPU, whose host only issues it): every slice takes the interval
// the device measured for its bracket, a communication group's slices share
// one, the names and order are the host-timed run's (OPTIM spans the
// optimizer step, on the host's clock), and a device that
// times the wrong number of brackets fails the step naming both counts.
// The device here is the CPU backend behind a wrapper that reports each
// bracket k of a step as [t0 + k ms, t0 + k ms + 250 us].
//
// usage: device_trace_test DATA PP2_VPP2
#include "runtime/cpu/CpuDevice.h"
#include "runtime/train/Trainer.h"
#include "tests/runtime/ForwardingDevice.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>

namespace mhcc::runtime {
namespace {

std::string gArtifact;
std::optional<TokenDataset> gData;
using Clock = std::chrono::steady_clock;

/// The CPU device, claiming to time each bracket itself.
class SelfTimedDevice final : public ForwardingDevice {
public:
  SelfTimedDevice(std::unique_ptr<Device> inner, bool dropOne)
      : ForwardingDevice(std::move(inner)), dropOne_(dropOne) {}
  bool beginStep(const StepInputs &inputs) override {
    brackets_ = 0;
    origin_ = Clock::now();
    return inner_->beginStep(inputs);
  }
  void beginInstruction(const std::string &name) override { ++brackets_; }
  void endInstruction() override {}
  bool timesInstructions() const override { return true; }
  bool instructionTimes(std::vector<DeviceInterval> &intervals) override {
    intervals.clear();
    for (int64_t k = 0; k < brackets_ - (dropOne_ ? 1 : 0); ++k) {
      const Clock::time_point start = origin_ + std::chrono::milliseconds(k);
      intervals.push_back({start, start + std::chrono::microseconds(250)});
    }
    return true;
  }

private:
  const bool dropOne_;
  int64_t brackets_ = 0;
  Clock::time_point origin_;
};

DeviceFactory selfTimed(bool dropOne) {
  return [dropOne](const Artifact &a, const TrainOptions &options, std::atomic<bool> &failed, std::string &error) {
    std::vector<std::unique_ptr<Device>> devices = cpuDevices()(a, options, failed, error);
    for (auto &d : devices)
      d = std::make_unique<SelfTimedDevice>(std::move(d), dropOne);
    return devices;
  };
}

/// One traced step's slices, or the step's error.
std::vector<TraceSlice> tracedStep(const DeviceFactory &devices, std::string &error) {
  std::optional<Artifact> artifact = readArtifact(gArtifact, error);
  EXPECT_TRUE(artifact) << error;
  TrainOptions options;
  options.trace = true;
  auto trainer = Trainer::create(std::move(*artifact), *gData, options, devices, error);
  EXPECT_TRUE(trainer) << error;
  std::optional<StepResult> result = trainer->step(error);
  return result ? result->trace : std::vector<TraceSlice>();
}

TEST(DeviceTrace, SlicesTakeTheDevicesIntervals) {
  std::string error;
  const std::vector<TraceSlice> host = tracedStep(cpuDevices(), error);
  ASSERT_FALSE(host.empty()) << error;
  const std::vector<TraceSlice> timed = tracedStep(selfTimed(false), error);
  ASSERT_EQ(timed.size(), host.size()) << error;
  std::map<int64_t, double> first; // by rank: the first slice's start
  std::map<int64_t, double> lastStart;
  int64_t shared = 0;
  for (size_t k = 0; k < timed.size(); ++k) {
    const TraceSlice &s = timed[k];
    EXPECT_EQ(s.name, host[k].name);
    EXPECT_EQ(s.rank, host[k].rank);
    if (s.category == "optimizer") { // the trainer's host clock around the optimizer step
      EXPECT_GT(s.durationUs, 0.0);
      continue;
    }
    EXPECT_NEAR(s.durationUs, 250.0, 1e-3) << s.name;
    if (!first.count(s.rank))
      first[s.rank] = s.startUs;
    // Bracket b starts b ms after the rank's first: a whole number of ms.
    const double offsetMs = (s.startUs - first[s.rank]) / 1000;
    EXPECT_NEAR(offsetMs, std::round(offsetMs), 1e-6) << s.name;
    if (lastStart.count(s.rank) && s.startUs == lastStart[s.rank]) {
      ++shared; // a communication group's next instruction: the same bracket
      EXPECT_TRUE(s.category == "comm") << s.name;
    } else if (lastStart.count(s.rank)) {
      EXPECT_NEAR(s.startUs - lastStart[s.rank], 1000.0, 1e-3) << s.name;
    }
    lastStart[s.rank] = s.startUs;
  }
  EXPECT_GT(shared, 0) << "PP2/VPP2 should post some SEND and RECV together";
}

TEST(DeviceTrace, AMissingIntervalFailsTheStep) {
  std::string error;
  const std::vector<TraceSlice> timed = tracedStep(selfTimed(true), error);
  EXPECT_TRUE(timed.empty());
  EXPECT_NE(error.find("--trace: the device timed"), std::string::npos) << error;
}

} // namespace
} // namespace mhcc::runtime

int main(int argc, char **argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc != 3) {
    std::fprintf(stderr, "usage: device_trace_test DATA PP2_VPP2\n");
    return 2;
  }
  std::string error;
  mhcc::runtime::gData = mhcc::runtime::TokenDataset::open(argv[1], error);
  if (!mhcc::runtime::gData) {
    std::fprintf(stderr, "device_trace_test: %s\n", error.c_str());
    return 2;
  }
  mhcc::runtime::gArtifact = argv[2];
  return RUN_ALL_TESTS();
}
