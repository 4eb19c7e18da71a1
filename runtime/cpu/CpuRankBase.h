//===- CpuRankBase.h - what both CPU devices share -------------------*- C++ -*-===//
//
// Host memory and the launch table of one CPU rank (a pipeline rank of one
// data-parallel replica), for the
// in-process device (CpuDevice.cpp, ranks as threads) and the one-process-
// per-rank device (CpuProcessDevice.cpp): zero-filled buffers with peak
// accounting, one stage instruction through StageExecutor.h, and bf16
// storage where the artifact names it (docs/precision.md): outputs rounded
// when an instruction completes, composite kernels' intermediates through
// the Store hook, kernels reading bf16 copies of the fp32 masters.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CPU_CPURANKBASE_H
#define MHCC_RUNTIME_CPU_CPURANKBASE_H

#include "runtime/cpu/StageExecutor.h"
#include "runtime/exec/CollectiveCheck.h"
#include "runtime/exec/Device.h"
#include "runtime/train/Optimizer.h"

#include <functional>

namespace mhcc::runtime {

/// The weights kernels read: the fp32 masters themselves, or (bf16 models)
/// their bf16 copies, refreshed after every change of the masters.
class WorkingWeights {
public:
  /// `settleTies`: TrainOptions::storeParamRemainders (bf16 models only).
  WorkingWeights(const Artifact &a, bool settleTies)
      : bf16_(a.model.dtype == "bf16"), settleTies_(bf16_ && settleTies) {}
  /// Under settleTies the masters first move off bf16 ties, as the GPU's
  /// remainders keep them (runtime/train/ParamRemainders.h); idempotent.
  void refresh(std::vector<std::vector<float>> &masters);
  float *at(std::vector<std::vector<float>> &masters, size_t param) {
    return (bf16_ ? copies_[param] : masters[param]).data();
  }
  bool bf16() const { return bf16_; }

private:
  bool bf16_, settleTies_;
  std::vector<std::vector<float>> copies_;
};

/// Bytes the in-process CPU device keeps of the parameters (CpuWorld: one
/// HostParameters holding every stage, and the other ranks' gradients):
/// fp32 masters, Adam's two moments, the reduced gradient, a bf16 model's
/// working copies, a gradient for every parameter use, and the gradient
/// group's other members' (or under tp every rank's blocks of them, and of
/// the split weights). What mhcrun
/// compares with the host's memory before it starts
/// (runtime/cli/HostMemory.h).
int64_t hostParameterBytes(const Artifact &a);
/// The same for a `--processes` run (CpuProcessDevice, one process a rank,
/// all on this host): every process its masters, a bf16 model's copies,
/// its tensor block of the split weights and its stages' gradient blocks;
/// rank 0 also every use's gradient, the ranks' gathered blocks, the
/// reduced gradient and the moments (under the distributed optimizer spread
/// over the gradient group's first ranks: as many bytes).
int64_t hostProcessesParameterBytes(const Artifact &a);

/// What a CPU device keeps of the parameters on the host: fp32 masters, the
/// Adam moments (where the optimizer runs), each parameter use's gradient
/// for the stages held, and the working copies the kernels read. One
/// update path for both CPU devices, so their bits cannot drift apart.
struct HostParameters {
  std::vector<std::vector<float>> weights, adamM, adamV; // by parameter
  /// The distributed optimizer's moments instead of adamM / adamV:
  /// [part][param], part d's elements (Artifact::shardOf) of each; a
  /// part this copy does not hold is empty (heldShards).
  std::vector<std::vector<std::vector<float>>> shardM, shardV;
  std::vector<bool> heldShards; // by part (Artifact::optimizerParts), under the distributed optimizer
  std::vector<std::vector<std::vector<float>>> slotGrads; // [stage][slot]; empty for stages not held
  WorkingWeights working;
  ReducedGradients reduced; // the optimizer's buffers, kept between steps

  /// Initial values from the seed; moments sized only `withMoments`, and
  /// under the distributed optimizer only part `onlyShard`'s (all when -1).
  /// `settleTies`: as WorkingWeights'.
  HostParameters(const Artifact &a, bool withMoments, const std::function<bool(int64_t stage)> &holdsStage,
                 bool settleTies, int64_t onlyShard = -1);
  float *weight(int param) { return working.at(weights, size_t(param)); }
  /// Reduces every stage's slot gradients and applies the optimizer
  /// (Optimizer.h's completeStep), then refreshes the working copies; a
  /// validation step only summarizes the losses. `replicaLosses`: the last
  /// stage's [replica][mb][loss], taken in the global batch's order
  /// (Artifact::globalMicrobatch).
  void update(const Artifact &a, const TrainOptions &options,
              const std::vector<std::vector<std::vector<double>>> &replicaLosses, bool evaluateOnly,
              StepResult &result);
  /// The held shards' moments, for completeStep / applyOptimizer.
  MomentRanges shardMoments(const Artifact &a);
  /// Masters from `state` (moments too where given and `withMoments`: the
  /// held shards' parts of them).
  void load(const Artifact &a, const ParameterState &state, bool withMoments);
  /// The moments this copy holds, for checkpoints: whole, or under the
  /// distributed optimizer the held parts as pieces (ParameterState; every
  /// part in one process makes them whole again).
  void heldMoments(const Artifact &a, ParameterState &state) const;
};

using SlotGrads = std::vector<std::vector<std::vector<float>>>; // [stage][slot]

/// Slot gradients shaped as a tensor-parallel rank's blocks (TensorSplit.h;
/// whole parameters at tp = 1), zero-filled, for every stage (or those
/// `holds`; the others empty).
SlotGrads blockGrads(const Artifact &a, const std::function<bool(int64_t stage)> &holds = {});
/// Tensor rank t's blocks of the split weights ([param]; empty for the
/// replicated ones), cut from the weights kernels read (`weightOf`).
std::vector<std::vector<float>> tensorBlocks(const Artifact &a, int64_t t,
                                             const std::function<const float *(int param)> &weightOf);
/// Tensor parallelism: the whole gradient of every slot of `whole`'s stages
/// from the tensor ranks' (`blocksOf(t)`, after the data-parallel sum): each
/// split weight's blocks put in place; a replicated weight's gradient is
/// tensor rank 0's (every rank computed the same bits from the same rows),
/// or under sequence parallelism (and for a "partial" one, whose gradient
/// each rank sums over its heads) the sum over the ranks in tensor-rank
/// order. Both CPU devices assemble here, so their bits agree.
void assembleTensorParallel(const Artifact &a, const std::function<const SlotGrads &(int64_t t)> &blocksOf,
                            SlotGrads &whole);
/// The last stage's losses by replica ([replica][mb][loss]) from each
/// (replica, context rank)'s, `memberLosses[replica x cp + context rank]`:
/// a replica's context ranks hold their rows' share of every loss, summed
/// in context-rank order.
std::vector<std::vector<std::vector<double>>>
sumContextLosses(const Artifact &a, const std::vector<std::vector<std::vector<double>>> &memberLosses);

/// The arithmetic of the group collectives, shared by the two CPU devices
/// (threads over host memory, processes over sockets) so that they give the
/// same bits: `parts` are the members' in member order. combineParts: out =
/// ((parts[0] + parts[1]) + ...), or the maxima, element by element (`out`
/// is none of the parts).
/// placeRows: member k's r-th row to row rowsOf(k)[r] of `all` (a gather).
void combineParts(const std::vector<const float *> &parts, int64_t count, bool max, float *out);
void placeRows(const std::vector<const float *> &parts, const std::function<std::vector<int64_t>(int64_t)> &rowsOf,
               int64_t cols, float *all);

/// The rows tensor rank `tensorRank` holds under sequence parallelism: of
/// each sequence, its tensorRank-th share of the sequence's rows, in order
/// (Megatron splits the sequence dimension). The rows are the microbatch's,
/// or with context parallelism the context-parallel rank's (indices into
/// contextRows: its seq_len / cp rows a sequence, split into tp shares).
std::vector<int64_t> sequenceRows(const Artifact &a, int64_t tensorRank);

class CpuRankBase : public Device {
public:
  /// `rank`: the global rank (Artifact.h's mesh).
  CpuRankBase(const Artifact &a, const TrainOptions &options, int64_t rank);

  int64_t rank() const override { return rank_; }
  int64_t pipelineRank() const override { return pipelineRank_; }
  int64_t replica() const override { return replica_; }
  const std::string &error() const override { return error_; }

  Buffer allocate(int64_t count, Dtype dtype, Queue queue, bool zeroed) override;
  int64_t auxCount(int64_t stage, size_t index) const override { return a_.stages[stage].forward[index].auxSize; }
  void release(Buffer &buffer, Queue queue) override;
  void copy(Buffer dst, const Buffer &src) override;
  bool download(const Buffer &buffer, float *host) override;
  bool forward(int64_t stage, int64_t mb, size_t index, StageState &state) override;
  /// `fresh` needs nothing here: allocate() always zero-fills.
  bool backward(int64_t stage, int64_t mb, size_t index, BackwardPart part, StageState &state,
                const std::vector<int> &fresh) override;
  void waitFor(Transfer &) override {} // a receive completes inside exchange
  bool expectCollectives(const Instr *first, size_t count) override;
  bool collectivesIssued() override;
  bool interposeCollectives(const Instr *first, size_t count) override;
  bool resumeCollectives() override;
  void takeProfile(std::map<std::string, double> &profileMs) override;

protected:
  /// The weight a kernel reads for `param`, and the gradient slot it adds into.
  virtual float *weight(int param) = 0;
  virtual float *slotGrad(int64_t stage, int slot) = 0;
  /// Context parallelism: every rank of this rank's context-parallel group
  /// contributes its rows (rowsPerRank x cols), gathered into microbatch
  /// order in `all` (StageContext::gatherRows); false when a rank failed.
  virtual bool gatherRows(const float *local, int64_t cols, float *all) { return false; }
  /// Tensor parallelism: the collectives of this rank's tensor-parallel
  /// group (TensorGroup in TensorParallel.h); false when a rank failed.
  virtual bool tensorAllReduce(float *data, int64_t count, bool max) { return false; }
  virtual bool tensorGatherRows(const float *local, int64_t cols, float *all) { return false; }
  virtual bool tensorReduceScatterRows(const float *all, int64_t cols, float *local) { return false; }

  bool fail(const std::string &message);
  /// Starts a step: the inputs kernels read, peak accounting from here.
  void beginInputs(const StepInputs &inputs);
  /// This step is a validation step (StepInputs::evaluateOnly).
  bool evaluating() const { return inputs_ && inputs_->evaluateOnly; }

  const Artifact &a_;
  const TrainOptions &options_;
  const int64_t rank_, pipelineRank_, replica_, contextRank_, tensorRank_;
  /// The microbatch row of each of this rank's rows (empty without context
  /// parallelism): chunks contextRank and 2 cp - 1 - contextRank of each sequence.
  std::vector<int64_t> rowMap_;
  std::string error_;
  int64_t live_ = 0, peak_ = 0;

private:
  StageContext<float> contextFor(int64_t stage, int64_t mb);

  /// A collective the kernels are about to issue, against the next one the
  /// schedule lists (CollectiveCheck.h); false (and error_) on a difference.
  bool issue(MeshAxis axis, CollectiveOp op, int64_t rows, int64_t cols);

  CollectiveCheck collectives_; // the current compute step's COLLECTIVEs
  const StepInputs *inputs_ = nullptr;
  bool gatherFailed_ = false; // a context- or tensor-parallel collective failed: the rank stops
  std::map<std::string, double> profile_;
};

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CPU_CPURANKBASE_H
