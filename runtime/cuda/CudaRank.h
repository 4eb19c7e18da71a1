//===- CudaRank.h - one pipeline rank on one GPU (internal) --------*- C++ -*-===//
//
// The CUDA Device, split by concern over several files: CudaRank.cpp
// (setup, memory and the static plan, step boundaries), CudaLaunch.cpp (the
// launch table: one stage instruction's forward or backward half),
// CudaTensorParallel.cpp (the tensor-parallel collectives),
// CudaContextParallel.cpp (the token mixers under context parallelism),
// CudaComms.cpp (NCCL communicators and messages, the factories),
// SharedGpuLinks.cpp (messages between ranks sharing a GPU) and
// CudaOptimizer.cpp (the optimizer step on the GPUs).
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CUDA_CUDARANK_H
#define MHCC_RUNTIME_CUDA_CUDARANK_H

#include "runtime/artifact/TensorSplit.h"
#include "runtime/exec/CollectiveCheck.h"
#include "runtime/exec/TestFaults.h"
#include "runtime/cuda/CudaDevice.h"
#include "runtime/cuda/DeviceKernels.h"
#include "runtime/cuda/Gemm.h"
#include "runtime/cuda/ModelKernels.h"
#include "runtime/cuda/RankLinks.h"
#include "runtime/cuda/RankPlan.h"
#include "runtime/cuda/StreamTimeline.h"
#include "runtime/memory/MemoryPlan.h"
#include "runtime/program/MixGroups.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace mhcc::runtime::cuda {

/// cudaMemcpy2DAsync, or one copy a row where a pitch is above what it
/// takes (cudaDevAttrMaxPitch, 2^31 - 1 bytes or less: a long sequence's
/// rows of a wide tensor), on `stream`; its error is the stream's last.
inline void stridedCopy(void *to, int64_t toPitch, const void *from, int64_t fromPitch, int64_t width, int64_t rows,
                        cudaStream_t stream) {
  constexpr int64_t kMaxPitch = (int64_t(1) << 31) - 1;
  if (toPitch <= kMaxPitch && fromPitch <= kMaxPitch) {
    cudaMemcpy2DAsync(to, toPitch, from, fromPitch, width, rows, cudaMemcpyDeviceToDevice, stream);
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    cudaMemcpyAsync(static_cast<char *>(to) + r * toPitch, static_cast<const char *>(from) + r * fromPitch, width,
                    cudaMemcpyDeviceToDevice, stream);
}

/// Moves one run of rows of each of a microbatch's `sequences` sequences
/// between a packed buffer (the runs `packedPitch` bytes apart) and the
/// microbatch's order (the run `at` bytes into each `sequenceBytes`-long
/// sequence): how sequence parallelism's and context parallelism's
/// rank-major buffers meet the microbatch.
inline void copySequenceRun(char *packed, int64_t packedPitch, char *ordered, int64_t at, int64_t sequenceBytes,
                            int64_t runBytes, int64_t sequences, bool toMicrobatch, cudaStream_t stream) {
  if (toMicrobatch)
    stridedCopy(ordered + at, sequenceBytes, packed, packedPitch, runBytes, sequences, stream);
  else
    stridedCopy(packed, packedPitch, ordered + at, sequenceBytes, runBytes, sequences, stream);
}

/// What CudaRank::forwardSpan may join of the mHC forward (bf16 models);
/// InClusters: PostResAndEntry, its kernel over clusters of blocks.
enum class MhcForwardFusion { Unfused, Entry, PostResAndEntry, PostResAndEntryInClusters };

/// The NCCL unique ids of a run: the world, each pair in order, then each
/// group's (groupCount).
struct CommIds {
  ncclUniqueId world;
  std::vector<ncclUniqueId> pairs, groups;
  std::string serialize() const;
  static bool parse(const std::string &bytes, size_t pairCount, size_t groupCount, CommIds &ids);
  static std::string make(size_t pairCount, size_t groupCount, CommIds &ids); // "" or the NCCL error
};

std::string cudaWhat(cudaError_t status);

class CudaRank final : public Device {
public:
  CudaRank(const Artifact &artifact, const TrainOptions &options, int64_t rank, int gpu,
           const std::atomic<bool> *peerFailed);
  ~CudaRank() override;

  /// Device, kernels, weights and optimizer state; no communication yet.
  bool setupDevice();
  /// Joins the world communicator and one per directed pair this rank is
  /// in (NCCL links: one GPU per rank).
  bool setupComms(const CommIds &ids);
  /// Or links through `post` to the other ranks of this process, which
  /// may share its GPU (RankLinks.h).
  bool setupSharedLinks(std::shared_ptr<SharedGpuPost> post);
  const std::vector<Pair> &communicating() const { return pairs_; }

  int64_t rank() const override { return rank_; }
  int64_t pipelineRank() const override { return pipe_; }
  int64_t replica() const override { return replica_; }
  const std::string &error() const override { return error_; }
  bool beginStep(const StepInputs &inputs) override;
  bool finishPipeline() override;
  /// The data-parallel ALLREDUCE of a stage's gradients (dp > 1), on a
  /// stream of its own behind the compute so far: the backward goes on.
  bool allReduceGradients(const Instr &instr) override;
  bool optimizerStep(int64_t step, const std::vector<std::vector<double>> &losses, StepResult &result) override;
  Buffer allocate(int64_t count, Dtype dtype, Queue queue, bool zeroed) override;
  int64_t auxCount(int64_t stage, size_t index) const override;
  void release(Buffer &buffer, Queue queue) override;
  void copy(Buffer dst, const Buffer &src) override;
  bool download(const Buffer &buffer, float *host) override;
  /// 2 where an mHC coefficient instruction and the pre-mix reading its
  /// input and output run as one kernel (bf16, mhcFusedForwardApplies), 3
  /// where the post-res mix writing that input runs in it too, else 1
  /// (MHCC_MHC_FORWARD=entry keeps to 2, =unfused to 1).
  size_t forwardSpan(int64_t stage, size_t index) const override;
  bool forward(int64_t stage, int64_t mb, size_t index, StageState &state) override;
  bool backward(int64_t stage, int64_t mb, size_t index, BackwardPart part, StageState &state,
                const std::vector<int> &fresh) override;
  /// 2 where a coefficient backward (a three-pass group's pass C) is
  /// followed by the post/res backward of the sublayer before (groupBefore),
  /// whose pass A then runs inside that pass C, else 1.
  size_t backwardSpan(int64_t stage, size_t index) const override;
  /// A mixing group's values (MixGroups.h) at each of its three backwards
  /// and at the pass C that runs the pass A of the group before: the
  /// deferred passes read them after the instructions that own them ran.
  std::vector<int> backwardReads(int64_t stage, size_t index) const override;
  /// Tensor parallelism: the COLLECTIVEs the kernels issue, checked as
  /// they go (CollectiveCheck.h).
  bool expectCollectives(const Instr *first, size_t count) override;
  bool collectivesIssued() override;
  bool interposeCollectives(const Instr *first, size_t count) override;
  bool resumeCollectives() override;
  bool exchange(std::vector<Transfer> &group) override;
  void waitFor(Transfer &arrival) override;
  void takeProfile(std::map<std::string, double> &profileMs) override;
  /// NVTX ranges (nvtx3, header-only: free when no profiler is attached)
  /// and, with --trace, the brackets StreamTimeline times.
  void beginInstruction(const std::string &name) override;
  void endInstruction() override;
  bool timesInstructions() const override { return options_.trace; }
  bool instructionTimes(std::vector<DeviceInterval> &intervals) override;
  void downloadParameters(std::vector<std::vector<float>> &weights) override;
  bool saveState(ParameterState &state) override;
  bool loadState(const ParameterState &state) override;
  void abort() override;

private:
  // CudaRank.cpp
  bool fail(const std::string &message);
  bool check(const char *what);
  cudaStream_t stream(Queue queue);
  std::vector<cudaStream_t> allStreams();
  /// Waits until every stream is idle; fails when no progress mark completes
  /// and no stream drains for `limitSeconds` (0: --recv-timeout), so a slow
  /// step that progresses is waited for and a stuck peer is not.
  bool waitStreams(const std::vector<cudaStream_t> &streams, const std::string &what, double limitSeconds = 0);
  /// Records a progress mark on `stream` (after each exchange's work).
  void markProgress(cudaStream_t stream);
  /// True when a mark completed since the last look.
  bool progressed();
  static void follow(cudaStream_t waiter, cudaStream_t producer);
  int streamId(cudaStream_t stream);
  PlannedAllocator::Hooks planHooks();
  bool adoptMemoryPlan();
  /// Host to device, ordered before every later kernel of the compute stream.
  void upload(void *device, const void *host, size_t bytes);
  float *deviceBuffer(size_t bytes, const std::string &what);
  void prepareCsrs(const StepInputs &inputs);
  void markStart(cudaEvent_t &start);
  void markEnd(const std::string &name, cudaEvent_t start);
  // CudaComms.cpp
  void createPairStreams();
  bool connectPairs();
  /// The global rank of pipeline rank `peer` in this rank's replica, context and tensor rank.
  int64_t globalPeer(int64_t peer) const { return a_.globalRank(peer, replica_, context_, tensor_); }
  // CudaTensorParallel.cpp: the tensor-parallel group's collectives on the
  // compute stream, each checked first against the schedule's next
  // COLLECTIVE (false, error_ set, on a difference or a failure).
  /// The group's sum (max) of `count` elements at `data`, in place.
  bool tensorAllReduce(void *data, int64_t count, Dtype dtype, bool max = false);
  template <typename A> static constexpr Dtype kActivations = std::is_same_v<A, bf16> ? Dtype::BF16 : Dtype::F32;
  /// `local` (this rank's rows x cols) as every row of the microbatch, in
  /// its order (sequence parallelism: the group's all-gather, in scratch;
  /// else `local` itself); null on failure.
  template <typename A> const A *allRows(const A *local, int64_t cols);
  /// The group's sum of `partial` (every row x cols, this rank's part): this
  /// rank's rows of it into `out` (sequence parallelism: a reduce-scatter;
  /// else an all-reduce, `out` == `partial` or added into `out` with `add`).
  /// With `add`, added into out instead of written.
  template <typename A> bool reducePartial(A *partial, A *out, int64_t cols, bool add);
  /// `count` elements of A in scratch.
  template <typename A> A *scratchOf(int64_t count) {
    return reinterpret_cast<A *>(scratch((count * int64_t(sizeof(A)) + 3) / 4).data);
  }
  // CudaContextParallel.cpp: the token mixers under context parallelism
  // (each gather checked first against the schedule's next COLLECTIVE;
  // "" with error_ set on a difference or a failure, else a kernel's error).
  /// `local` (this rank's gemmRows_ x cols) as every row of the microbatch,
  /// in its order: the context group's all-gather, in scratch; null on failure.
  void *contextAllRows(const void *local, int64_t cols, Dtype dtype);
  /// This rank's rows between `mine` (gemmRows_ rows) and their places in
  /// `all` (every row of the microbatch), `rowBytes` a row.
  void moveOwnRows(void *mine, void *all, int64_t rowBytes, bool toMicrobatch);
  /// The rows of each sequence this rank keeps (chunks r and 2 cp - 1 - r):
  /// flash attention runs only their tiles.
  FlashRowRanges ownChunks() const;
  /// attentionBackward's operands (DeviceKernels.h); dQkv: the stash.
  template <typename A> struct AttentionGrads {
    const A *x, *wqkv, *wo;
    const float *aux;
    const A *dy;
    A *dx, *dQkv;
    float *dWqkv, *dWo;
  };
  template <typename A>
  std::string contextAttentionForward(const ForwardInstr &f, int64_t mb, const A *x, const A *wqkv, const A *wo, A *y,
                                      float *aux);
  template <typename A>
  std::string contextAttentionBackward(const ForwardInstr &f, int64_t mb, const AttentionGrads<A> &a, GradParts parts,
                                       bool freshInput);
  /// aux holds every row's (auxCount).
  template <typename A>
  std::string contextGdnForward(const ForwardInstr &f, int64_t mb, const A *x, const GdnWeights<A> &w, A *y,
                                float *aux);
  template <typename A>
  std::string contextGdnBackward(const ForwardInstr &f, int64_t mb, const A *x, const GdnWeights<A> &w,
                                 const float *aux, const A *dy, A *dx, const GdnWeightGrads &grads, float *stash,
                                 GradParts parts);
  // CudaLaunch.cpp
  Buffer scratch(int64_t count);
  void releaseScratch();
  /// The weights the kernels read: the fp32 masters, or their bf16 copies.
  template <typename A> const A *param(int64_t stage, const ForwardInstr &f, size_t k);
  float *paramGrad(int64_t stage, const ForwardInstr &f, size_t k);
  /// A: the activations' storage, R: the residual stream's (A, or float
  /// beside bf16 activations: wideResidual_).
  template <typename A, typename R> bool forwardAs(int64_t stage, int64_t mb, size_t index, StageState &state);
  /// bf16 models: stage s's forward[index] and the instructions forwardSpan
  /// joins to it as one kernel (an entry: coefficients and pre-mix; or the
  /// post-res mix before an entry).
  void fusedMixForward(int64_t s, size_t index, StageState &st);
  /// The loss of `logits` (this rank's rows; under tensor parallelism its
  /// vocabulary share, Megatron's vocabulary-parallel softmax); a failed
  /// collective sets error_.
  template <typename A> void crossEntropyAs(const ForwardInstr &f, int64_t mb, const A *logits, float *aux, float *loss);
  /// `joinedBefore`: the group of the sublayer before, whose post/res
  /// backward is backward[index + 1], its gradients fresh, joined to this
  /// one by backwardSpan (pass A in pass C where this is a deferred pass
  /// C), else null.
  template <typename A, typename R>
  bool backwardAs(int64_t stage, int64_t mb, size_t index, BackwardPart part, StageState &state,
                  const std::vector<int> &fresh, const MixGroup *joinedBefore);
  /// backwardAs's operands of one instruction (CudaLaunch.cpp), and its
  /// launch table in two halves: the mHC and residual primitives, and the
  /// layers' (each "" or a kernel's error).
  template <typename A, typename R> struct BackwardCall;
  template <typename A, typename R> std::string backwardMixing(BackwardCall<A, R> &c);
  template <typename A, typename R> std::string backwardLayer(BackwardCall<A, R> &c);
  /// The stash of c's instruction: what B leaves for W (`count` floats).
  template <typename A, typename R> float *stashFor(BackwardCall<A, R> &c, int64_t count);
  /// Zero-fills the input gradients that start here (`fresh`) but those the
  /// instruction's kernel writes itself; returns those as its fresh bits.
  int freshGradients(const ForwardInstr &f, const BackwardInstr &b, GradParts parts, StageState &st,
                     const std::vector<int> &fresh, bool firstProductWrites);
  /// The mixing group (MixGroups.h) whose post/res, pre or coefficient
  /// backward is stage s's backward[index], or null.
  const MixGroup *mixGroup(int64_t stage, size_t index) const;
  /// One backward instruction's part in its group's three passes.
  struct MixStep {
    const MixGroup *group = nullptr; // the group it belongs to, if any
    bool deferred = false;           // the group runs as passes A, B, C this microbatch
    bool passADone = false;          // a post/res backward whose pass A ran in the pass C before it
    MixBackwardTerms terms;          // pass C's: the deferred terms (and pass A before it, where joined)
  };
  /// Decides and records that part for backward[index] of stage s,
  /// microbatch mb (the group's pass A decides it, or the pass C before
  /// that joins it; joinedBefore as backwardAs's); false on failure.
  bool planMixing(int64_t stage, int64_t mb, size_t index, StageState &state, int freshMask,
                  const MixGroup *joinedBefore, MixStep &step);
  /// The group whose coefficient backward is backward[index], when the
  /// next instruction is the post/res backward of another group whose
  /// output gradient is this one's dx (the sublayer before): that group.
  const MixGroup *groupBefore(int64_t stage, size_t index) const;
  // CudaOptimizer.cpp
  bool reduceGradients(std::vector<float *> &gradient, std::map<std::pair<size_t, size_t>, Buffer> &remote);
  bool shareStatistics(const std::vector<std::vector<double>> &losses, StepResult &result);
  bool updateWeights(int64_t step, const std::vector<float *> &gradient, StepResult &result);
  bool recordGradientTaps(const std::vector<float *> &gradient, StepResult &result);
  /// bf16 models: the kernels' copies of the held weights, from the masters
  /// (with `receivedOnly`, those the owner's update did not already round);
  /// nothing under copiesLead(), whose copies are written where they change.
  void refreshLowWeights(bool receivedOnly = false);

  const Artifact &a_;
  const TrainOptions &options_;
  const int64_t rank_;                    // global (Artifact::globalRank)
  const int64_t pipe_, replica_, context_, tensor_; // the plans, streams and schedules are in pipeline ranks
  /// A microbatch's rows on this rank outside the tensor-parallel GEMMs
  /// (Artifact::rowsPerRank: a context-parallel rank's share, split again
  /// under sequence parallelism) and the rows those GEMMs see (the context
  /// rank's share, every row of the microbatch without context parallelism).
  const int64_t rows_, gemmRows_;
  /// Context parallelism: the microbatch row of each of the gemmRows_ rows
  /// (Artifact::contextRows; empty without it), and the same on the GPU
  /// (null without it) for the kernels that read token ids and labels.
  const std::vector<int64_t> contextRows_;
  int32_t *rowMap_ = nullptr;
  ContextRows contextRowMap() const { return {rowMap_, a_.model.tokens()}; }
  /// Elements of parameter p this rank holds: its tensor-parallel block
  /// (TensorSplit.h; all of it at tp = 1 and for the replicated ones).
  int64_t held(size_t p) const { return shardCount(a_.params[p], a_.tp); }
  /// Whether this rank's copy of parameter p is the one to report: each
  /// tensor rank's block of a split parameter; of one every tensor rank
  /// holds whole (norm gains, mHC; Gated DeltaNet's out_norm, whose
  /// gradient the group sums), which has the same bits on each, tensor rank 0's.
  bool speaksFor(size_t p) const { return tensor_ == 0 || !heldWhole(p); }
  bool heldWhole(size_t p) const { return a_.params[p].tpSplit.empty() || isPartial(a_.params[p]); }
  /// The distributed optimizer (ZeRO-1, dp x cp > 1): member m of an owner's
  /// gradient group (Artifact::reduceMemberOf, dp x cp members) receives
  /// the summed gradients of part m of each owned parameter alone (the
  /// stage REDUCESCATTERs), holds Adam's moments of it, updates it and
  /// gathers the other parts after the update.
  const bool sharded_;
  const int64_t member_; // this rank's index in its gradient group
  /// bf16 models under the distributed optimizer (Megatron's 12 / parts
  /// bytes a parameter element): an owner keeps the fp32 master of its part
  /// alone and other holders none, as the kernels read the bf16 copies; the
  /// parts' gather and the holders' messages carry the bf16 copies.
  const bool partMasters_;
  /// TrainOptions::storeParamRemainders on a bf16 model: over its master
  /// range a rank keeps each master's low 16 bits (remainders_) beside the
  /// bf16 copy instead of the fp32 master (runtime/train/ParamRemainders.h).
  const bool keepRemainders_;
  /// The bf16 copies are the weights' record (partMasters_ or
  /// keepRemainders_): the update writes them, the distributed optimizer's
  /// gather and the other holders' messages carry them, refreshLowWeights
  /// leaves them alone.
  bool copiesLead() const { return partMasters_ || keepRemainders_; }
  /// The elements of parameter p whose fp32 master this rank keeps
  /// (weights_[p], or remainders_[p] beside the copy, points at the first):
  /// all of its block, its part (copiesLead: owners only), or none.
  std::pair<int64_t, int64_t> masterRange(size_t p) const;
  /// The fp32 masters of parameter p's master range, on the host.
  std::vector<float> downloadMasters(size_t p);
  /// Sets this rank's master range and bf16 copy of parameter p from its
  /// whole block (setup and loads).
  bool uploadWeights(size_t p, const std::vector<float> &block);
  /// Part `member_` of parameter p (all of it without sharding).
  std::pair<int64_t, int64_t> ownShard(size_t p) const;
  /// `data`, a buffer of parameter p's held block, with every member's part.
  RankLinks::ReplicaShards partsOf(size_t p, void *data, Dtype dtype) const;
  /// Each parameter's first statistics chunk (Artifact::gradientChunk of
  /// its held block) in stats_, then their number: parameter p's chunks are
  /// [firstChunk_[p], firstChunk_[p + 1]).
  std::vector<int64_t> firstChunk_{0};
  int64_t statChunks() const { return firstChunk_.back(); }
  const int gpu_;
  const std::atomic<bool> *peerFailed_;
  const TestFaults faults_{rank_}; // the fault tests' hooks (runtime/exec/TestFaults.h)
  int64_t stepsRun_ = 0;
  bool exchanged_ = false; // in this step
  bool evaluating_ = false; // this step is a validation step: no update
  std::vector<ParamPlan> plans_;
  std::vector<Pair> pairs_;
  std::string error_;

  cudaStream_t compute_ = nullptr;
  const bool bf16_;                // activations, GEMM operands and the kernels' weights in bf16
  /// An fp32 residual stream beside bf16 activations (residual_dtype f32):
  /// the stream's kernels read and write it as fp32 (the image's res_t), the
  /// fused entry and the three-pass backward mixing (bf16 stream) stay off.
  const bool wideResidual_;
  /// How much of the mHC forward forwardSpan fuses: nothing
  /// (MHCC_MHC_FORWARD=unfused), the entry (=entry), or the post-res mix
  /// before it too (the default; =cluster: over clusters of blocks where
  /// they apply).
  const MhcForwardFusion mhcForwardFusion_;
  /// bf16: one sublayer's backward mixing in three passes where it applies
  /// (MhcBackwardKernels.cu): the same bits as the three kernels, dx written
  /// once. MHCC_MHC_BACKWARD=kernels runs the three kernels instead.
  const bool mixBackward_;
  /// And pass A of the sublayer before inside pass C (backwardSpan);
  /// MHCC_MHC_BACKWARD=passes keeps pass A apart.
  const bool passAInPassC_;
  std::vector<std::vector<MixGroup>> mixGroups_;                // by stage
  std::set<std::tuple<int64_t, int64_t, size_t>> deferredMix_; // (stage, mb, postRes) whose pass A ran
  /// Post dots' partials a pass C left for the pass B of the group
  /// (stage, mb, postRes) whose pass A it did.
  std::map<std::tuple<int64_t, int64_t, size_t>, Buffer> postPartials_;
  std::unique_ptr<Gemms> gemms_;
  std::unique_ptr<ModelKernels> kernels_; // the artifact's generated kernels, loaded on this GPU
  // By parameter: the fp32 masters (masterRange), Adam's moments and the sum of several
  // uses (reduced_) of the part this rank updates (ownShard).
  std::map<int, float *> weights_, adamM_, adamV_, reduced_;
  std::map<int, bf16 *> lowWeights_;                        // bf16 models: what the kernels read
  std::map<int, uint16_t *> remainders_;                    // keepRemainders_: instead of weights_
  std::map<std::pair<int64_t, int>, float *> slotGrads_;    // (stage, slot)
  std::unique_ptr<RankLinks> links_;                       // NCCL or shared-GPU (RankLinks.h)
  CollectiveCheck collectives_;                             // the running instruction's COLLECTIVEs
  std::map<int64_t, cudaStream_t> sendStream_, recvStream_; // by the peer's pipeline rank
  cudaStream_t replicaStream_ = nullptr;                     // the data-parallel ALLREDUCEs (dp > 1)
  std::vector<int32_t *> tokens_, labels_; // by microbatch
  /// Packed documents' RoPE positions and first keys by microbatch (empty
  /// unless TrainOptions::resetPositionIds / resetAttentionMask).
  std::vector<int32_t *> positions_, firstKeys_;
  DeviceDocuments documents(int64_t mb) const {
    return {positions_.empty() ? nullptr : positions_[mb], firstKeys_.empty() ? nullptr : firstKeys_[mb]};
  }
  double *stats_ = nullptr, *sharedStats_ = nullptr; // chunk statistics (2 statChunks()); shareStatistics' all-reduce
  StatsTensor *statTensors_ = nullptr; // the owned gradients of a step, for squaresAndZeros
  int64_t staticBytes_ = 0;   // weights, gradients, optimizer state, token ids
  int64_t live_ = 0, peak_ = 0; // staticBytes plus what the step allocates

  // --memory-plan static: the first step is recorded through the pool, then
  // every step's buffers live at fixed offsets of one arena.
  PlannedAllocator planner_;
  bool recording_ = false;
  const bool poison_; // MHCC_POISON_ALLOCATIONS (CudaRank.cpp)
  char *arena_ = nullptr;
  std::vector<cudaEvent_t> freeEvents_; // by recorded buffer, where a later one waits for its free
  std::map<cudaStream_t, int> streamIds_;
  std::vector<cudaStream_t> streamById_;

  /// Embedding-backward CSRs, uploaded before each step into buffers kept
  /// from the first: (mb, shift) -> device offsets, positions.
  std::map<std::pair<int64_t, int64_t>, std::pair<int32_t *, int32_t *>> csrs_;
  std::vector<Buffer> scratch_; // of the running primitive
  /// With profiling: events around each primitive, read after the step.
  std::vector<std::tuple<std::string, cudaEvent_t, cudaEvent_t>> timings_;
  StreamTimeline timeline_; // with --trace: each instruction's interval on its streams
  std::map<std::string, double> profileMs_;
  /// Progress marks (--recv-timeout), by stream in record order, and done
  /// ones kept for reuse.
  std::map<cudaStream_t, std::deque<cudaEvent_t>> progressMarks_;
  std::vector<cudaEvent_t> spareMarks_;
};

} // namespace mhcc::runtime::cuda

#endif // MHCC_RUNTIME_CUDA_CUDARANK_H
