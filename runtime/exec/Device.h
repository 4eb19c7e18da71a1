//===- Device.h - what the executor asks of a backend ---------------*- C++ -*-===//
//
// The line between the step logic and the backends, in the spirit of IREE's
// HAL. One Device is one rank of the mesh (a pipeline rank of one
// data-parallel replica) on one processor (a GPU, or a thread or process of
// the CPU reference backend). The executor (Executor.h) walks its pipeline
// rank's instruction list and owns every (stage, microbatch)'s buffers; the device
// supplies memory on ordered queues, runs one stage-program instruction's
// forward or backward (or its B / W half), moves messages between ranks,
// and applies the optimizer. Backends differ only below this line.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_EXEC_DEVICE_H
#define MHCC_RUNTIME_EXEC_DEVICE_H

#include "runtime/artifact/Artifact.h"
#include "runtime/artifact/TensorSplit.h"
#include "runtime/program/Dtype.h"
#include "runtime/exec/StepTypes.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace mhcc::runtime {

/// A tensor in the device's memory: `count` elements of `dtype` at `data`
/// (a float pointer on the CPU backend; a GPU's bf16 buffer reads through as<>).
struct Buffer {
  float *data = nullptr;
  int64_t count = 0;
  Dtype dtype = Dtype::F32;
  explicit operator bool() const { return data != nullptr; }
  template <typename T> T *as() const { return reinterpret_cast<T *>(data); }
  int64_t bytes() const { return count * dtypeBytes(dtype); }
};

/// Where work is ordered on a device: its compute queue, or the queue of
/// sends to / receives from one peer rank. A buffer released on a queue is
/// reused only after the work queued there so far.
struct Queue {
  enum Kind { Compute, Send, Recv } kind = Compute;
  int64_t peer = -1;
  static Queue compute() { return {}; }
  static Queue sendTo(int64_t peer) { return {Send, peer}; }
  static Queue recvFrom(int64_t peer) { return {Recv, peer}; }
};

/// What a SEND / RECV carries: the stored dtype of the boundary value (an
/// activation, or the gradient of one), so a bf16 model's messages are bf16.
inline Dtype messageDtype(const Artifact &a, const Instr &i) {
  const StageProgram &src = a.stages[i.srcStage];
  const int value = i.payload == Payload::Activation ? src.output : src.gradInput;
  return value >= 0 ? dtypeOf(src.values[value].dtype) : Dtype::F32;
}

/// One (stage, microbatch)'s buffers, owned by the executor.
struct StageState {
  std::vector<Buffer> values; // by value id: activations and their gradients
  std::vector<Buffer> aux;    // by forward instruction: what its backward reads
  /// By forward instruction: what its B half leaves for its W half (the
  /// device decides what; e.g. attention's gradient of q, k, v). Released
  /// by the executor after W.
  std::vector<Buffer> stash;
};

/// The training state of every parameter on the host, by parameter table
/// index: fp32 master weights and Adam's moments (exp_avg, exp_avg_sq).
/// What checkpoints store; stored by parameter, never by rank, so a state
/// saved under one layout loads under any other.
struct ParameterState {
  std::vector<std::vector<float>> weights, adamM, adamV;
  /// Where a device filled only pieces of an entry (a tensor rank's block,
  /// a distributed-optimizer part): those pieces, by parameter (the
  /// moments' for m and v alike). An empty list with a filled entry: all
  /// of it. A save writes whole tensors where the pieces make them up (all
  /// ranks in one process), else the pieces (one process a rank).
  std::vector<std::vector<TensorPiece>> weightPieces, momentPieces;

  /// Sizes every list to `params` entries, all empty.
  void clear(size_t params) {
    for (auto *entries : {&weights, &adamM, &adamV})
      entries->assign(params, {});
    weightPieces.assign(params, {});
    momentPieces.assign(params, {});
  }
};

/// A message posted by Device::exchange: SEND carries `buffer`; for a RECV
/// the device allocates `buffer` on the receive queue and gives a `ready`
/// event that Device::waitFor turns into a wait of the compute queue.
struct Transfer {
  const Instr *instr = nullptr;
  Buffer buffer;
  void *ready = nullptr;
};

class Device {
public:
  virtual ~Device() = default;

  /// This device's rank in the world (Artifact.h's mesh: pipeline rank,
  /// replica, context rank, tensor rank), as messages name it.
  virtual int64_t rank() const = 0;
  /// Its pipeline rank, whose instruction list it runs (SEND / RECV peers
  /// are pipeline ranks of the same replica, context and tensor rank), and
  /// its data-parallel replica.
  virtual int64_t pipelineRank() const { return rank(); }
  virtual int64_t replica() const { return 0; }
  /// The first error, one line; empty while all is well.
  virtual const std::string &error() const = 0;

  // ---- a step -----------------------------------------------------------------
  /// Token ids of every microbatch of this device's replica (all its ranks
  /// get all), gradients zeroed.
  virtual bool beginStep(const StepInputs &inputs) = 0;
  /// Waits for every queue (with the receive deadline; a failed peer ends
  /// the wait at once) after the executor issued the whole list.
  virtual bool finishPipeline() = 0;
  /// ALLREDUCE: stage `instr.stage`'s gradients (its slots) summed over the
  /// rank's data-parallel group, after the stage's last backward; returns
  /// once the group's sum is in place. False (error() may say why) where a
  /// backend has no data parallelism.
  virtual bool allReduceGradients(const Instr &) { return false; }
  /// Reduces the gradients, shares losses and statistics between ranks and
  /// updates the weights (Optimizer.h's math). `losses[mb][k]` holds this
  /// rank's last-stage losses (zero elsewhere); fills `result`'s losses,
  /// grad norm, zeros, learning rate, memory figures and, with recordTaps,
  /// parameter gradients.
  virtual bool optimizerStep(int64_t step, const std::vector<std::vector<double>> &losses,
                             StepResult &result) = 0;

  // ---- memory -----------------------------------------------------------------
  /// `count` elements of `dtype` ordered on `queue`; zero-filled when
  /// `zeroed`. An empty buffer (and error() set) when memory runs out.
  virtual Buffer allocate(int64_t count, Dtype dtype, Queue queue, bool zeroed) = 0;
  /// Floats forward instruction `index` of `stage` keeps for its backward:
  /// the artifact's auxSize, or less where the device stores pieces in bf16.
  virtual int64_t auxCount(int64_t stage, size_t index) const = 0;
  /// Gives `buffer` back once the work queued on `queue` so far is done;
  /// clears it. A no-op for an empty buffer.
  virtual void release(Buffer &buffer, Queue queue) = 0;
  /// dst = src, on the compute queue.
  virtual void copy(Buffer dst, const Buffer &src) = 0;
  /// Copies to the host as floats (bf16 widened exactly); only after
  /// finishPipeline.
  virtual bool download(const Buffer &buffer, float *host) = 0;

  // ---- compute ----------------------------------------------------------------
  /// How many forward instructions from `index` on the device computes in
  /// one forward() call (a fused kernel), at least 1. The executor allocates
  /// all their outputs and aux first and reads none of them in between.
  virtual size_t forwardSpan(int64_t stage, size_t index) const { return 1; }
  /// Forward instructions `index` .. index + forwardSpan - 1 of stage
  /// `stage` for microbatch `mb`; their inputs, outputs and aux are
  /// allocated in `state`.
  virtual bool forward(int64_t stage, int64_t mb, size_t index, StageState &state) = 0;
  /// Backward instruction `index` (of the stage's backward list), `part` of
  /// it; the gradients it writes are allocated, and backward adds into them.
  /// `fresh` lists those just allocated for this call without zero-filling:
  /// the device treats them as zero, writing instead of adding where a
  /// kernel can (the same bits: +0 + v is v) and zero-filling the rest, so
  /// that a gradient's first writer saves a fill and a read of it.
  virtual bool backward(int64_t stage, int64_t mb, size_t index, BackwardPart part, StageState &state,
                        const std::vector<int> &fresh) = 0;
  /// How many backward instructions from `index` on the device computes in
  /// one backward() call (input gradients: B or both parts; W runs one at a
  /// time), at least 1. The executor checks and allocates the gradients of
  /// all of them first (`fresh` then lists those of every one) and calls
  /// backward() once, for `index`.
  virtual size_t backwardSpan(int64_t stage, size_t index) const { return 1; }
  /// Values backward instruction `index` reads besides its own (its
  /// forward's inputs and output, its output gradient, the gradients it adds
  /// into; BackwardFrees.h): a device that moves work between instructions
  /// names them, and the executor, which releases each value of a whole
  /// backward after its last reader, keeps them until this one has run.
  virtual std::vector<int> backwardReads(int64_t stage, size_t index) const { return {}; }

  /// The tensor- and context-parallel collectives the next compute
  /// instruction issues from inside its kernels: the COLLECTIVE
  /// instructions listed after it (`count` of them from `first`, valid
  /// until collectivesIssued). The device checks each collective its
  /// kernels issue against the next of these, and fails (naming both) on a
  /// difference rather than let the group wait in different collectives.
  /// A backend without tensor or context parallelism accepts none.
  virtual bool expectCollectives(const Instr *first, size_t count) { return count == 0; }
  /// After that compute instruction: false (error() says why) unless its
  /// kernels issued every collective expected.
  virtual bool collectivesIssued() { return true; }
  /// Activation recomputation runs a segment's forward again inside a
  /// backward: its collectives (not in the schedule, derived by every
  /// rank of the group from the same stage program, runtime/program/
  /// Collectives.h's stageCollectives) come between the backward's. The
  /// device checks its kernels' against `count` from `first` until
  /// resumeCollectives, then goes on with the backward's list; false
  /// (error() says why) when the interposed ones were not issued whole.
  virtual bool interposeCollectives(const Instr *first, size_t count) { return count == 0; }
  virtual bool resumeCollectives() { return true; }

  // ---- communication ----------------------------------------------------------
  /// Posts one group of SEND / RECV instructions together (NCCL's group
  /// semantics: none blocks the others). Sends follow the compute queued so
  /// far; receives fill their Transfer's buffer and event.
  virtual bool exchange(std::vector<Transfer> &group) = 0;
  /// Makes the compute queue wait until a received buffer is complete.
  virtual void waitFor(Transfer &arrival) = 0;

  // ---- reporting --------------------------------------------------------------
  /// Brackets the work one instruction (or one communication group) issues,
  /// named as the trace names its slices, for profilers: NVTX ranges on the
  /// GPU, so an Nsight Systems capture shows the schedule's structure. No-ops
  /// by default.
  virtual void beginInstruction(const std::string &name) {}
  virtual void endInstruction() {}
  /// With TrainOptions::trace: true where the device runs its work
  /// asynchronously and times each bracket itself (the GPU: events on its
  /// streams); false where the host's clock around each bracket is the
  /// measurement (the CPU backends run an instruction when it is issued).
  virtual bool timesInstructions() const { return false; }
  /// After finishPipeline, where timesInstructions(): one interval per
  /// bracket of the step, in order; false with error() when unreadable.
  virtual bool instructionTimes(std::vector<DeviceInterval> &intervals) { return false; }
  /// Adds this step's time per "rank R fwd|bwd|bwd-weight PRIM" (ms) and clears it.
  virtual void takeProfile(std::map<std::string, double> &profileMs) = 0;
  /// Parameter values in table order; a device fills the ones it owns.
  virtual void downloadParameters(std::vector<std::vector<float>> &weights) = 0;
  /// Between steps: fills `state`'s entries (weights, m, v) of the
  /// parameters this device owns, leaving the others as they are (the
  /// vectors are sized to the parameter table by the caller).
  virtual bool saveState(ParameterState &state) = 0;
  /// Between steps: sets every copy of a parameter this device holds from
  /// `state.weights`; an owner also takes m and v (an empty adamM / adamV
  /// entry leaves the moments as they are, e.g. zero for --init-from).
  virtual bool loadState(const ParameterState &state) = 0;
  /// After a failure anywhere: stop waiting for peers, never block again.
  virtual void abort() = 0;
};

/// Makes the devices this process drives (every rank, or its one rank of a
/// multi-process run) for an artifact and options that outlive them;
/// `failed` is raised by the first rank that fails and ends every wait.
/// Empty and `error` on failure.
using DeviceFactory = std::function<std::vector<std::unique_ptr<Device>>(
    const Artifact &artifact, const TrainOptions &options, std::atomic<bool> &failed, std::string &error)>;

/// A backward span's `fresh` gradients by instruction: entry j lists those
/// backward[index + j] writes (its input gradients or its output
/// gradient), each id under the first instruction that lists it, as the
/// executor allocated them; what a device that runs the span one
/// instruction at a time hands each one.
inline std::vector<std::vector<int>> freshByInstruction(const StageProgram &p, size_t index, size_t span,
                                                        const std::vector<int> &fresh) {
  std::vector<std::vector<int>> own(span);
  std::vector<int> claimed;
  for (size_t j = 0; j < span; ++j) {
    const BackwardInstr &b = p.backward[index + j];
    for (int id : fresh) {
      const bool listed = id == b.gradOutput || std::count(b.gradInputs.begin(), b.gradInputs.end(), id) > 0;
      if (listed && !std::count(claimed.begin(), claimed.end(), id)) {
        own[j].push_back(id);
        claimed.push_back(id);
      }
    }
  }
  return own;
}

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_EXEC_DEVICE_H
