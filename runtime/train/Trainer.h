//===- Trainer.h - training steps over any backend ------------------*- C++ -*-===//
//
// One trainer for every backend: it samples each step's microbatches, runs
// every local rank's instruction list through the one Executor over that
// rank's Device (a thread per rank when this process drives several), then
// the devices' optimizer step, and merges what the ranks report. The backend
// is chosen by the device factory alone (runtime/cpu/CpuDevice.h,
// runtime/cuda/CudaDevice.h). Same artifact, seed and data: bit-identical
// losses and gradients, across runs and pipeline layouts.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_TRAIN_TRAINER_H
#define MHCC_RUNTIME_TRAIN_TRAINER_H

#include "runtime/data/Dataset.h"
#include "runtime/exec/Device.h"
#include "runtime/exec/Executor.h"
#include "runtime/exec/StepTypes.h"
#include "runtime/train/Parameters.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mhcc::runtime {

class Trainer {
public:
  static std::unique_ptr<Trainer> create(Artifact artifact, const TokenDataset &data, TrainOptions options,
                                         const DeviceFactory &devices, std::string &error);
  ~Trainer();

  /// Runs one step; nullopt and `error` (naming rank, instruction and call)
  /// on failure, after which the trainer refuses to continue.
  std::optional<StepResult> step(std::string &error);
  /// A validation pass after stepsDone() iterations: `iterations` global
  /// batches from the data's validation part (TokenDataset::setSplit), run
  /// through the same lists without an update. The mean lm (and MTP) loss
  /// over them; the weights, moments and step count stay as they were.
  std::optional<StepResult> evaluate(int64_t iterations, std::string &error);

  const Artifact &artifact() const { return artifact_; }
  /// Iterations done; the next step is stepsDone() + 1. With the data seed
  /// it fixes everything a resumed run needs besides the parameters: the
  /// sampler is a counter hash of (seed, step, microbatch) and the learning
  /// rate a function of the step; there is no other RNG state.
  int64_t stepsDone() const { return stepsDone_; }
  /// Between steps: the weights and moments every local device owns, in
  /// table order (a multi-process run fills only what this process holds:
  /// whole tensors, or blocks and parts named as pieces in `state`).
  bool saveState(ParameterState &state, std::string &error);
  /// Between steps: every local device takes `state` (all parameters), and
  /// the trainer continues after iteration `stepsDone`.
  bool loadState(const ParameterState &state, int64_t stepsDone, std::string &error);
  /// Parameter values in table order; in a multi-process run only this
  /// process's owned parameters are filled.
  const std::vector<std::vector<float>> &parameters();
  /// The instant the measured trace's times count from (StepResult::trace).
  std::chrono::steady_clock::time_point traceEpoch() const { return traceEpoch_; }

private:
  Trainer(Artifact artifact, const TokenDataset &data, TrainOptions options);
  bool runRanks(const std::vector<StepInputs> &inputs, int64_t stepNumber, std::vector<StepResult> &results,
                std::vector<double> &pipelineMs);
  /// runRanks for a training or validation step; on failure every device
  /// aborts, the trainer refuses further steps and `error` names the cause.
  bool runStep(const std::vector<StepInputs> &inputs, int64_t stepNumber, std::vector<StepResult> &results,
               std::vector<double> &pipelineMs, std::string &error);
  /// Each replica's share of global batch `batch` (the training part, or
  /// the validation part for a validation pass).
  std::vector<StepInputs> sampleInputs(int64_t batch, bool validation) const;
  std::string firstError() const;

  Artifact artifact_;
  const TokenDataset &data_;
  TrainOptions options_;
  std::atomic<bool> failed_{false};
  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<std::unique_ptr<Executor>> executors_; // one per device
  std::vector<std::string> errors_;                  // per device, this step
  std::vector<std::vector<float>> weights_;
  int64_t stepsDone_ = 0;
  bool broken_ = false;
  std::chrono::steady_clock::time_point traceEpoch_;
};

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_TRAIN_TRAINER_H
