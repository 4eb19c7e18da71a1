//===- StreamTimeline.h - instructions timed on their CUDA streams -*- C++ -*-===//
//
// The GPU side of `mhcrun --trace`: the host only issues work, so each
// instruction is timed by CUDA events on the streams that ran it. A bracket
// (one instruction, or one communication group) records a start event on a
// stream when it first issues work there, after the waits it placed before
// that work (a FWD's start follows the wait for its received input; a SEND's
// the wait for the compute that produced its data), and an end event on each
// such stream when it closes; its interval spans them all. A bracket that
// issued no work (FREE, OPTIM) is a point on the compute stream. One event,
// waited for by the host at the start of the step, ties the GPU's clock to
// the host's steady clock, so the slices of every rank and process share one
// time axis as the CPU backend's do.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CUDA_STREAMTIMELINE_H
#define MHCC_RUNTIME_CUDA_STREAMTIMELINE_H

#include "runtime/exec/StepTypes.h"

#include <cuda_runtime.h>

#include <chrono>
#include <string>
#include <vector>

namespace mhcc::runtime::cuda {

class StreamTimeline {
public:
  StreamTimeline() = default;
  StreamTimeline(const StreamTimeline &) = delete;
  StreamTimeline &operator=(const StreamTimeline &) = delete;
  ~StreamTimeline();

  /// Start of a step: forgets the last step's brackets and ties the clocks
  /// with an event on `stream`, waited for. False on a CUDA error.
  bool startStep(cudaStream_t stream);
  void openBracket();
  /// The open bracket issues work on `stream` next (a no-op outside one,
  /// and after its first call for the same stream).
  void work(cudaStream_t stream);
  /// Ends the open bracket on every stream it worked on, or marks a point on
  /// `idle` when it worked on none.
  void closeBracket(cudaStream_t idle);
  /// After the streams drained: one interval per bracket of the step, in order.
  bool read(std::vector<DeviceInterval> &intervals, std::string &error);

private:
  struct OnStream {
    cudaStream_t stream;
    cudaEvent_t start, end;
  };
  cudaEvent_t event(); // from the pool, reused step after step

  std::vector<cudaEvent_t> pool_;
  size_t used_ = 0;
  cudaEvent_t origin_ = nullptr;
  std::chrono::steady_clock::time_point originHost_;
  std::vector<std::vector<OnStream>> brackets_;
  bool open_ = false;
};

} // namespace mhcc::runtime::cuda

#endif // MHCC_RUNTIME_CUDA_STREAMTIMELINE_H
