//===- StepTypes.h - what a training step takes and gives ----------*- C++ -*-===//
//
// Shared by the trainer, the executor and every device: the options of a
// run, one step's inputs (token ids) and its result.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_EXEC_STEPTYPES_H
#define MHCC_RUNTIME_EXEC_STEPTYPES_H

#include "runtime/program/Trace.h"

#include <chrono>
#include <cstdint>
#include <map>
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
  /// Megatron's --reset-position-ids and --reset-attention-mask over the
  /// documents of an indexed dataset: RoPE positions restart at each
  /// document start within a sequence, and a token attends only to the
  /// tokens of its own document.
  bool resetPositionIds = false, resetAttentionMask = false;
  /// How long a rank waited on may go without progress (an instruction, an
  /// exchange; on a GPU, a completed piece of the queued work) before the
  /// waiting rank declares it stuck and fails: a slow rank that progresses is
  /// waited for however long a wait lasts (docs/runtime.md, "A lost rank").
  double recvTimeoutSeconds = 30;
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
  /// Activation recomputation (runtime/program/Recompute.h): every
  /// sublayer's activations but its input are released after its forward
  /// and computed again before its backward. The same bits; one more
  /// forward of every sublayer. Resolved by the caller: mhcrun sets it for
  /// --recompute-sublayers or an artifact compiled with it
  /// (Artifact::recomputeSublayers), unless --no-recompute-sublayers.
  bool recompute = false;
  /// Sublayers a recomputed segment holds (Megatron's --recompute-num-layers):
  /// only each segment's input is kept, so fewer checkpoints and a larger
  /// working set when its forward runs again. Resolved like `recompute`
  /// (Artifact::recomputeNumSublayers, --recompute-num-sublayers).
  int64_t recomputeNumSublayers = 1;
  /// bf16 models: keep each fp32 master as its bf16 copy and its low 16
  /// bits (Megatron's store_param_remainders; 2 bytes a parameter less on
  /// the GPU, 2 / parts under the distributed optimizer), the masters
  /// settled off bf16 ties on both backends
  /// (runtime/train/ParamRemainders.h).
  bool storeParamRemainders = false;
  /// Record each instruction's start and end for mhcrun --trace: the host
  /// clock on the CPU backend, whose instructions run when issued; events on
  /// the streams that ran them on the GPU (Device::instructionTimes).
  bool trace = false;
};

/// When a device ran one instruction (or communication group), on the
/// host's steady clock.
struct DeviceInterval {
  std::chrono::steady_clock::time_point start, end;
};

/// The token ids of one step, by microbatch: every rank gets all of them
/// (the first stage reads tokens, the loss stages read labels, MTP both).
struct StepInputs {
  std::vector<std::vector<int32_t>> tokens, labels;
  /// Packed documents (TrainOptions::resetPositionIds / resetAttentionMask),
  /// by microbatch, one entry per token; empty when off: each token's RoPE
  /// position (its offset in its document) and the first key it attends to
  /// (its document's start, as an offset in its sequence).
  std::vector<std::vector<int32_t>> positions, firstKeys;
  /// A validation step: the same instructions and shared losses, but the
  /// optimizer leaves the weights, moments and step count alone.
  bool evaluateOnly = false;
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
  /// A stop signal (SIGTERM / SIGINT) any rank had seen by the end of this
  /// step, agreed by every rank through the step's collective (the CPU
  /// ranks' gather, the CUDA ranks' statistics all-reduce); 0: none.
  int stopSignal = 0;
  // With recordTaps:
  std::map<std::string, std::vector<float>> taps;       // "<tap>@mb<k>"
  std::map<std::string, std::vector<float>> paramGrads; // by parameter, before clipping
  // With profile: milliseconds by "rank R fwd|bwd PRIM" (device time) and by
  // host phase ("host: ...").
  std::map<std::string, double> profileMs;
  /// With trace: every local rank's instructions this step, microseconds
  /// since the trainer started.
  std::vector<TraceSlice> trace;
};

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_EXEC_STEPTYPES_H
