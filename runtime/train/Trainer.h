//===- Trainer.h - training steps on the CPU reference backend -----*- C++ -*-===//
//
// Executes an artifact's per-rank schedules with one thread per pipeline rank
// and in-memory channels with NCCL's semantics (per directed pair FIFO;
// sends never block; receives wait, with a timeout instead of a hang), then
// reduces gradients in a fixed order and applies the optimizer. Same
// artifact, seed and data: bit-identical losses and gradients, across runs
// and across pipeline layouts.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_TRAIN_TRAINER_H
#define MHCC_RUNTIME_TRAIN_TRAINER_H

#include "runtime/artifact/Artifact.h"
#include "runtime/data/Dataset.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mhcc::runtime {

struct TrainOptions {
  std::string optimizer = "adamw"; // or "sgd"
  double lr = 3e-3;
  double beta1 = 0.9, beta2 = 0.95, adamEps = 1e-8;
  double weightDecay = 0.1;
  double clipGrad = 1.0; // global-norm clipping across all stages; 0: off
  int64_t warmupSteps = 0;
  uint64_t dataSeed = 1234;
  double recvTimeoutSeconds = 120;
  /// Keep every tapped activation and gradient (model-graph node outputs,
  /// hence every pipeline boundary) and the reduced parameter gradients of
  /// each step: what the parity tests compare.
  bool recordTaps = false;
  /// Time every primitive (CUDA: events around each kernel group; CPU: the
  /// rank thread's clock), per rank, and the host phases of a step; costs a
  /// little, so only on request.
  bool profile = false;
  /// CUDA: record the first step's buffers, then give them fixed offsets in
  /// one arena (runtime/memory/MemoryPlan.h), so later steps allocate
  /// nothing; false: the stream-ordered pool in every step.
  bool staticMemoryPlan = true;
};

struct StepResult {
  int64_t step = 0;
  double lmLoss = 0;
  std::optional<double> mtpLoss;
  double gradNorm = 0;
  int64_t numZeros = 0;   // zero elements among the reduced gradients
  double seconds = 0;
  int64_t tokens = 0;     // trained this step
  double learningRate = 0;
  std::vector<int64_t> peakBytes; // per rank: activations, gradients, buffers (CUDA: also weights and optimizer state)
  /// CUDA, per rank: device memory held for step buffers after the pipeline
  /// (the static plan's arena plus what the stream-ordered pool holds);
  /// steady from the second step when steps allocate nothing new.
  std::vector<int64_t> deviceReservedBytes;
  // With recordTaps:
  std::map<std::string, std::vector<float>> taps;       // "<tap>@mb<k>"
  std::map<std::string, std::vector<float>> paramGrads; // by parameter, before clipping
  // With profile: milliseconds by "rank R fwd|bwd PRIM" (device time) and by
  // host phase ("host: ...").
  std::map<std::string, double> profileMs;
};

class CpuTrainer {
public:
  CpuTrainer(Artifact artifact, const TokenDataset &data, TrainOptions options);
  ~CpuTrainer();

  /// Runs one step; nullopt and `error` (naming rank and instruction) on
  /// failure, after which the trainer must not be used again.
  std::optional<StepResult> step(std::string &error);

  const Artifact &artifact() const { return artifact_; }
  /// Parameter values, in the artifact's table order.
  const std::vector<std::vector<float>> &parameters() const { return weights_; }

private:
  struct Impl;
  Artifact artifact_;
  const TokenDataset &data_;
  TrainOptions options_;
  std::vector<std::vector<float>> weights_, adamM_, adamV_;
  int64_t stepsDone_ = 0;
};

/// Deterministic initial value of every element of parameter `info`, from
/// the model seed and the parameter's name (not its placement).
std::vector<float> initialParameter(const ParamInfo &info, int64_t seed);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_TRAIN_TRAINER_H
