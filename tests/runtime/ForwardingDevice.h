//===- ForwardingDevice.h - a Device that passes every call to another -*- C++ -*-===//
//
// Tests wrap the CPU backend's devices to give them a property a real
// device has (timing its own work, computing several instructions at once)
// and override only that; everything else goes to the wrapped device.
// wrappedCpuDevices builds such a factory, trainSteps trains on it,
// expectSameStepBits compares two runs, and missingBackwardReads says what
// a backward call finds released.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_TESTS_RUNTIME_FORWARDINGDEVICE_H
#define MHCC_TESTS_RUNTIME_FORWARDINGDEVICE_H

#include "runtime/cpu/CpuDevice.h"
#include "runtime/exec/Device.h"
#include "runtime/program/BackwardFrees.h"
#include "runtime/train/Trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>

namespace mhcc::runtime {

class ForwardingDevice : public Device {
public:
  explicit ForwardingDevice(std::unique_ptr<Device> inner) : inner_(std::move(inner)) {}
  int64_t rank() const override { return inner_->rank(); }
  int64_t pipelineRank() const override { return inner_->pipelineRank(); }
  int64_t replica() const override { return inner_->replica(); }
  const std::string &error() const override { return inner_->error(); }
  bool beginStep(const StepInputs &inputs) override { return inner_->beginStep(inputs); }
  bool finishPipeline() override { return inner_->finishPipeline(); }
  bool allReduceGradients(const Instr &i) override { return inner_->allReduceGradients(i); }
  bool optimizerStep(int64_t step, const std::vector<std::vector<double>> &losses, StepResult &result) override {
    return inner_->optimizerStep(step, losses, result);
  }
  Buffer allocate(int64_t count, Dtype dtype, Queue queue, bool zeroed) override {
    return inner_->allocate(count, dtype, queue, zeroed);
  }
  int64_t auxCount(int64_t stage, size_t index) const override { return inner_->auxCount(stage, index); }
  void release(Buffer &buffer, Queue queue) override { inner_->release(buffer, queue); }
  void copy(Buffer dst, const Buffer &src) override { inner_->copy(dst, src); }
  bool download(const Buffer &buffer, float *host) override { return inner_->download(buffer, host); }
  size_t forwardSpan(int64_t stage, size_t index) const override { return inner_->forwardSpan(stage, index); }
  bool forward(int64_t stage, int64_t mb, size_t index, StageState &state) override {
    return inner_->forward(stage, mb, index, state);
  }
  bool backward(int64_t stage, int64_t mb, size_t index, BackwardPart part, StageState &state,
                const std::vector<int> &fresh) override {
    return inner_->backward(stage, mb, index, part, state, fresh);
  }
  size_t backwardSpan(int64_t stage, size_t index) const override { return inner_->backwardSpan(stage, index); }
  std::vector<int> backwardReads(int64_t stage, size_t index) const override {
    return inner_->backwardReads(stage, index);
  }
  bool expectCollectives(const Instr *first, size_t count) override {
    return inner_->expectCollectives(first, count);
  }
  bool collectivesIssued() override { return inner_->collectivesIssued(); }
  bool interposeCollectives(const Instr *first, size_t count) override {
    return inner_->interposeCollectives(first, count);
  }
  bool resumeCollectives() override { return inner_->resumeCollectives(); }
  bool exchange(std::vector<Transfer> &group) override { return inner_->exchange(group); }
  void waitFor(Transfer &arrival) override { inner_->waitFor(arrival); }
  void beginInstruction(const std::string &name) override { inner_->beginInstruction(name); }
  void endInstruction() override { inner_->endInstruction(); }
  bool timesInstructions() const override { return inner_->timesInstructions(); }
  bool instructionTimes(std::vector<DeviceInterval> &intervals) override {
    return inner_->instructionTimes(intervals);
  }
  void takeProfile(std::map<std::string, double> &profileMs) override { inner_->takeProfile(profileMs); }
  void downloadParameters(std::vector<std::vector<float>> &weights) override { inner_->downloadParameters(weights); }
  bool saveState(ParameterState &state) override { return inner_->saveState(state); }
  bool loadState(const ParameterState &state) override { return inner_->loadState(state); }
  void abort() override { inner_->abort(); }

protected:
  std::unique_ptr<Device> inner_;
};

/// The CPU backend's devices, each behind wrap(device, artifact).
template <typename Wrap> DeviceFactory wrappedCpuDevices(Wrap wrap) {
  return [wrap](const Artifact &a, const TrainOptions &options, std::atomic<bool> &failed, std::string &error) {
    std::vector<std::unique_ptr<Device>> devices = cpuDevices()(a, options, failed, error);
    for (auto &d : devices)
      d = wrap(std::move(d), a);
    return devices;
  };
}

/// `steps` steps of the artifact at `path` on `devices`; a step that fails
/// is a test failure, and the results stop there.
inline std::vector<StepResult> trainSteps(const std::string &path, const TokenDataset &data,
                                          const DeviceFactory &devices, int steps,
                                          const TrainOptions &options = TrainOptions{}) {
  std::string error;
  std::optional<Artifact> artifact = readArtifact(path, error);
  EXPECT_TRUE(artifact) << error;
  if (!artifact)
    return {};
  auto trainer = Trainer::create(std::move(*artifact), data, options, devices, error);
  EXPECT_TRUE(trainer) << error;
  std::vector<StepResult> results;
  for (int k = 0; trainer && k < steps; ++k) {
    std::optional<StepResult> r = trainer->step(error);
    EXPECT_TRUE(r) << error;
    if (!r)
      break;
    results.push_back(*r);
  }
  return results;
}

/// Step by step, the same lm loss and grad norm bits and zero counts.
inline void expectSameStepBits(const std::vector<StepResult> &a, const std::vector<StepResult> &b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_EQ(std::memcmp(&a[k].lmLoss, &b[k].lmLoss, sizeof(double)), 0) << "step " << k + 1;
    EXPECT_EQ(std::memcmp(&a[k].gradNorm, &b[k].gradNorm, sizeof(double)), 0) << "step " << k + 1;
    EXPECT_EQ(a[k].numZeros, b[k].numZeros) << "step " << k + 1;
  }
}

/// What backward instruction `index` of `p` reads that `state` no longer
/// holds: its own values (its W half's under BackwardPart::Weight) and,
/// computing input gradients, the `declared` extra reads (a declared
/// gradient once an earlier instruction made it). The stage's output and
/// the gradients it sends or receives are the executor's to hand over.
inline std::vector<int> missingBackwardReads(const StageProgram &p, size_t index, BackwardPart part,
                                             const std::vector<int> &declared, const StageState &state) {
  auto isGradient = [&](int id) {
    return id != p.input && std::none_of(p.forward.begin(), p.forward.end(),
                                         [&](const ForwardInstr &f) { return f.output == id; });
  };
  auto madeBefore = [&](int id) {
    for (size_t k = 0; k < index; ++k) {
      const std::vector<int> own = ownBackwardReads(p, p.backward[k]);
      if (std::count(own.begin(), own.end(), id))
        return true;
    }
    return false;
  };
  std::vector<int> reads = weightHalfReads(p, p.backward[index]);
  if (part != BackwardPart::Weight) {
    reads = ownBackwardReads(p, p.backward[index]);
    for (int id : declared)
      if (!isGradient(id) || madeBefore(id))
        reads.push_back(id);
  }
  std::vector<int> missing;
  for (int id : reads)
    if (id >= 0 && id != p.output && id != p.gradOutput && id != p.gradInput && !state.values[id])
      missing.push_back(id);
  return missing;
}

} // namespace mhcc::runtime

#endif // MHCC_TESTS_RUNTIME_FORWARDINGDEVICE_H
