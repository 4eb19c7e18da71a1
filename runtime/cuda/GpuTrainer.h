//===- GpuTrainer.h - training steps on the CUDA backend ------------*- C++ -*-===//
//
// One GPU per pipeline rank, either one process per rank (mhcrun --gpus N,
// mpirun, srun: createRank) or every rank in this process on its own host
// thread (create: the tests, and mhcrun without a launcher). Each rank
// enqueues its static instruction list: kernels on a compute stream, NCCL
// send / recv on one stream and communicator per directed rank pair (the
// model the schedule verifier checks), stream-ordered memory from a pool
// that keeps what it has (steady after the first step at PP1; with several
// ranks, frees on the communication streams can keep it growing: a static
// memory plan is still to come), FREE
// as a stream-ordered free behind the send. The optimizer runs on the
// GPUs: each parameter's gradient is reduced on its owner (the rank of its
// first use) in model order, the global norm comes from one all-reduce of
// per-parameter statistics, and the owner sends the updated weights to the
// other ranks holding the parameter, so results do not depend on the
// layout.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CUDA_GPUTRAINER_H
#define MHCC_RUNTIME_CUDA_GPUTRAINER_H

#include "runtime/dist/ProcessGroup.h"
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
  /// This process is rank `placement.rank` of a multi-process run; rank 0's
  /// NCCL ids reach the others through `bootstrap`. Taps are per rank.
  static std::unique_ptr<GpuTrainer> createRank(Artifact artifact, const TokenDataset &data,
                                                TrainOptions options, const ProcessPlacement &placement,
                                                Bootstrap &bootstrap, std::string &error);
  ~GpuTrainer();

  /// nullopt and `error` (naming rank, instruction and call) on failure; the
  /// trainer is unusable afterwards.
  std::optional<StepResult> step(std::string &error);

  /// Parameter values in table order, downloaded from their owners; in a
  /// multi-process run only this rank's owned parameters are filled.
  const std::vector<std::vector<float>> &parameters() const;

  struct Impl;

private:
  explicit GpuTrainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CUDA_GPUTRAINER_H
