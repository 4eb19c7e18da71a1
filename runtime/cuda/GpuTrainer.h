//===- GpuTrainer.h - training steps on the CUDA backend ------------*- C++ -*-===//
//
// One GPU per pipeline rank, one host thread per rank enqueueing its static
// instruction list: kernels on a compute stream, NCCL send / recv on one
// stream and communicator per directed rank pair (the model the schedule
// verifier checks), stream-ordered memory from a pool that keeps what it
// has (no cudaMalloc once the first step has run), FREE as a stream-ordered
// free behind the send. Gradients are reduced and the optimizer applied with
// the code the CPU backend uses, so the two differ only by the kernels'
// summation order.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CUDA_GPUTRAINER_H
#define MHCC_RUNTIME_CUDA_GPUTRAINER_H

#include "runtime/train/Trainer.h"

#include <memory>

namespace mhcc::runtime {

/// Sets the process environment the CUDA backend needs, unless the user
/// set it: CUDA_DEVICE_MAX_CONNECTIONS=1 and NCCL_LAUNCH_MODE=GROUP. Found on
/// H200s: with one host thread per GPU and the CUDA defaults, PP2 hung in its
/// first step; with these it runs. Call before the first CUDA call.
void prepareCudaEnvironment();

class GpuTrainer {
public:
  /// Fails (nullptr and `error`) when fewer GPUs are visible than the
  /// artifact has pipeline ranks, when a GPU is not sm_90, or on any CUDA,
  /// cuBLAS or NCCL error during setup.
  static std::unique_ptr<GpuTrainer> create(Artifact artifact, const TokenDataset &data,
                                            TrainOptions options, std::string &error);
  ~GpuTrainer();

  /// nullopt and `error` (naming rank, instruction and call) on failure; the
  /// trainer is unusable afterwards.
  std::optional<StepResult> step(std::string &error);

  const std::vector<std::vector<float>> &parameters() const;

  struct Impl;

private:
  explicit GpuTrainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CUDA_GPUTRAINER_H
