//===- CpuDevice.cpp - the CPU reference backend's Device -------------------===//
#include "runtime/cpu/CpuDevice.h"

#include "runtime/cpu/CpuRankBase.h"
#include "runtime/exec/TestFaults.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

namespace mhcc::runtime {
namespace {

using Clock = std::chrono::steady_clock;
/// How often a waiting rank looks whether another one failed.
constexpr auto kWaitSlice = std::chrono::milliseconds(10);

struct Message {
  Payload payload;
  int64_t src, dst, mb;
  std::vector<float> data;
};

/// A directed pair's FIFO, as NCCL matches one pair's messages in order.
struct Channel {
  std::mutex mutex;
  std::condition_variable ready;
  std::deque<Message> queue;
};

/// What the CPU ranks share: every rank of the mesh (pp x dp x cp x tp, by global rank).
struct CpuWorld {
  const Artifact &a;
  const TrainOptions &options;
  std::atomic<bool> &failed;
  HostParameters params; // one copy, read by every rank; the update runs once
  /// The gradients of a pipeline rank's members (Artifact::memberOf), each
  /// summing its own microbatches and rows: member 0's are params.slotGrads
  /// without tensor parallelism, the others [member - 1] here; with it every
  /// member's blocks are here ([member]), and completeStep assembles them.
  std::vector<SlotGrads> rankGrads;
  /// Tensor parallelism: each tensor rank's blocks of the split weights
  /// ([tensor rank][param]; empty for the replicated ones), cut from the
  /// working copies after every change of the masters.
  std::vector<std::vector<std::vector<float>>> blocks;
  /// (from, to) between ranks of one replica and context rank.
  std::map<std::pair<int64_t, int64_t>, Channel> channels;

  /// A barrier's state: the ranks arrived in this generation, in arrival
  /// order (a rank waiting on the others names the first one missing).
  struct Group {
    std::vector<int64_t> arrived;
    uint64_t generation = 0;
  };
  // The optimizer barrier of every rank: the last to arrive runs the update.
  std::mutex mutex;
  std::condition_variable done;
  Group stepGroup;
  std::vector<std::vector<std::vector<double>>> losses; // the last stage's, [reduce member][mb][loss]
  std::vector<int64_t> peakBytes;          // by rank
  std::vector<Group> reduceGroups; // by pipeline rank: its members' ALLREDUCE barrier
  /// By (pipeline rank x dp + replica) x tp + tensor rank: its context-parallel ranks' row gathers.
  struct GatherGroup : Group {
    explicit GatherGroup(int64_t size) : sources(size) {}
    std::vector<const float *> sources; // by context (or tensor) rank
  };
  std::vector<GatherGroup> gatherGroups;
  /// By global rank / tp: its tensor-parallel ranks' collectives.
  std::vector<GatherGroup> tensorGroups;
  StepResult result;

  // By rank, for the receive deadline (--recv-timeout): when it last ran an
  // instruction or completed an exchange (Clock ticks), whom it waits on (-1: nobody).
  std::unique_ptr<std::atomic<int64_t>[]> lastProgress, waitingOn;

  CpuWorld(const Artifact &artifact, const TrainOptions &opts, std::atomic<bool> &failedFlag)
      : a(artifact), options(opts), failed(failedFlag), params(artifact, true, [](int64_t) { return true; }, opts.storeParamRemainders),
        rankGrads(artifact.tp > 1 ? artifact.dp * artifact.cp * artifact.tp : artifact.reduceGroupSize() - 1,
                  blockGrads(artifact)),
        losses(artifact.reduceGroupSize()), peakBytes(artifact.worldSize(), 0), reduceGroups(artifact.pp),
        gatherGroups(artifact.pp * artifact.dp * artifact.tp, GatherGroup(artifact.cp)),
        tensorGroups(artifact.worldSize() / artifact.tp, GatherGroup(artifact.tp)),
        lastProgress(new std::atomic<int64_t>[artifact.worldSize()]),
        waitingOn(new std::atomic<int64_t>[artifact.worldSize()]) {
    for (int64_t from = 0; from < a.worldSize(); ++from)
      for (int64_t to = 0; to < a.worldSize(); ++to)
        if (from != to && a.memberOf(from) == a.memberOf(to))
          channels[{from, to}];
    cutBlocks();
    for (int64_t r = 0; r < a.worldSize(); ++r) {
      lastProgress[r] = Clock::now().time_since_epoch().count();
      waitingOn[r] = -1;
    }
  }

  /// Follows the waits from `peer` to the rank at their end, the one that
  /// waits on nobody (or on `self`, or a cycle: then `peer`).
  int64_t stuckRank(int64_t peer, int64_t self) const {
    int64_t rank = peer;
    for (int64_t hops = 0; hops < a.worldSize(); ++hops) {
      const int64_t next = waitingOn[rank];
      if (next < 0 || next == self || next == rank)
        return rank;
      rank = next;
    }
    return peer;
  }

  /// Why a wait of `self` on `peer` that began at `start` must end now, or
  /// "" to keep waiting: the wait and the rank at the end of the chain of
  /// waits from `peer` have both gone --recv-timeout without progress (a
  /// slow rank that progresses is waited for, however long).
  std::string stuckProblem(int64_t self, int64_t peer, Clock::time_point start) const {
    const auto now = Clock::now();
    const std::chrono::duration<double> limit(options.recvTimeoutSeconds);
    if (now - start <= limit)
      return "";
    const int64_t stuck = stuckRank(peer, self);
    if (now - Clock::time_point(Clock::duration(lastProgress[stuck].load())) <= limit)
      return "";
    char text[32];
    std::snprintf(text, sizeof text, "%g", options.recvTimeoutSeconds);
    return "rank " + std::to_string(stuck) + " is stuck: it made no progress for " + text + " s" +
           (stuck == peer ? "" : ", and rank " + std::to_string(peer) + " waits on it") +
           " (--recv-timeout sets the limit)";
  }

  /// first .. first + count - 1: a pipeline rank's members, or the world.
  static std::vector<int64_t> rankRange(int64_t first, int64_t count) {
    std::vector<int64_t> members(count);
    for (int64_t k = 0; k < count; ++k)
      members[k] = first + k;
    return members;
  }

  /// The slot gradients of member `member` of a pipeline rank ([stage][slot]).
  SlotGrads &gradsOf(int64_t member) {
    return a.tp > 1 ? rankGrads[member] : member == 0 ? params.slotGrads : rankGrads[member - 1];
  }

  /// The weights a kernel of tensor rank t reads for `param`.
  float *weightFor(int64_t t, int param) {
    return blocks.empty() || blocks[t][param].empty() ? params.weight(param) : blocks[t][param].data();
  }
  void cutBlocks() {
    if (a.tp == 1)
      return;
    blocks.clear();
    for (int64_t t = 0; t < a.tp; ++t)
      blocks.push_back(tensorBlocks(a, t, [this](int p) { return params.weight(p); }));
  }

  /// The data-parallel all-reduce of stage s, on the host: for each tensor
  /// rank, its first member's gradients become the sum over the group, added
  /// in member order (((g0 + g1) + g2) ...), so the bits depend on dp and cp
  /// alone, never on the pipeline layout or on when each stage is reduced.
  void sumReplicas(size_t s) {
    for (int64_t t = 0; t < a.tp; ++t)
      for (size_t k = 0; k < params.slotGrads[s].size(); ++k) {
        std::vector<float> &sum = gradsOf(t)[s][k];
        for (int64_t m = t + a.tp; m < a.dp * a.cp * a.tp; m += a.tp)
          for (size_t e = 0; e < sum.size(); ++e)
            sum[e] = sum[e] + gradsOf(m)[s][k][e];
      }
  }

  /// Tensor parallelism: the whole gradients from the tensor ranks' (after sumReplicas).
  void assembleTensorParallel() {
    runtime::assembleTensorParallel(a, [this](int64_t t) -> const SlotGrads & { return gradsOf(t); },
                                    params.slotGrads);
  }

  /// A collective of `group` (its ranks `members`; this rank's source at
  /// `index`): every rank posts `mine`, then runs `work(sources)` once all
  /// have, and none returns before all have run it (the sources stay
  /// valid). False when a rank failed, with `problem` when one is stuck.
  template <typename Work>
  bool collective(int64_t rank, GatherGroup &group, const std::vector<int64_t> &members, int64_t index,
                  const float *mine, Work work, std::string &problem) {
    std::unique_lock<std::mutex> lock(mutex);
    group.sources[index] = mine;
    if (!barrier(rank, group, members, lock, [] {}, problem))
      return false;
    lock.unlock();
    work(group.sources);
    lock.lock();
    // Every member passed the first barrier and reads the others' sources:
    // none may return (and free its source) before all have read, even when
    // a rank elsewhere failed meanwhile.
    return barrier(rank, group, members, lock, [] {}, problem, false);
  }
  /// A collective of global rank `rank`'s tensor-parallel group.
  template <typename Work>
  bool tensorCollective(int64_t rank, const float *mine, Work work, std::string &problem) {
    return collective(rank, tensorGroups[rank / a.tp], a.tensorGroupOf(rank), a.tensorRankOf(rank), mine, work,
                      problem);
  }

  /// The tensor-parallel collectives (TensorGroup): sums and maxima in
  /// tensor-rank order (combineParts, placeRows), so every rank of the group
  /// gets the same bits, and the processes' device the threads' bits.
  bool tensorAllReduce(int64_t rank, float *data, int64_t count, bool max, std::string &problem) {
    std::vector<float> result(count);
    const bool ok = tensorCollective(rank, data, [&](const std::vector<const float *> &sources) {
      combineParts(sources, count, max, result.data());
    }, problem);
    if (ok) // every rank has read every source: the result may overwrite this rank's
      std::copy_n(result.data(), count, data);
    return ok;
  }
  bool tensorGatherRows(int64_t rank, const float *local, int64_t cols, float *all, std::string &problem) {
    return tensorCollective(rank, local, [&](const std::vector<const float *> &sources) {
      placeRows(sources, [&](int64_t t) { return sequenceRows(a, t); }, cols, all);
    }, problem);
  }
  bool tensorReduceScatterRows(int64_t rank, const float *all, int64_t cols, float *local, std::string &problem) {
    const std::vector<int64_t> rows = sequenceRows(a, a.tensorRankOf(rank));
    return tensorCollective(rank, all, [&](const std::vector<const float *> &sources) {
      std::vector<const float *> parts(sources.size());
      for (size_t r = 0; r < rows.size(); ++r) {
        for (size_t t = 0; t < sources.size(); ++t)
          parts[t] = sources[t] + rows[r] * cols;
        combineParts(parts, cols, false, local + int64_t(r) * cols);
      }
    }, problem);
  }

  /// Waits until every rank of `members` arrived at `group`; `onLast` runs
  /// once, by the last to arrive, with the lock held. False when a rank
  /// failed meanwhile (unless `stopOnFailure` is false), or with `problem`
  /// when the wait for a member that has not arrived found it stuck
  /// (stuckProblem: the receives' rule, so no collective waits forever).
  template <typename OnLast>
  bool barrier(int64_t rank, Group &group, const std::vector<int64_t> &members, std::unique_lock<std::mutex> &lock,
               OnLast onLast, std::string &problem, bool stopOnFailure = true) {
    const uint64_t mine = group.generation;
    group.arrived.push_back(rank);
    if (group.arrived.size() == members.size()) {
      group.arrived.clear();
      onLast();
      ++group.generation;
      done.notify_all();
      return true;
    }
    const auto start = Clock::now();
    bool ok = true;
    while (ok && group.generation == mine) {
      int64_t missing = -1; // the first member not arrived: whom this rank waits on
      for (size_t k = 0; k < members.size() && missing < 0; ++k)
        if (std::find(group.arrived.begin(), group.arrived.end(), members[k]) == group.arrived.end())
          missing = members[k];
      waitingOn[rank] = missing;
      if (failed && stopOnFailure)
        ok = false;
      else if (problem = stuckProblem(rank, missing, start); !problem.empty())
        ok = false;
      else
        done.wait_for(lock, kWaitSlice);
    }
    waitingOn[rank] = -1;
    if (ok) // the barrier passed: progress, as a completed receive is
      lastProgress[rank] = Clock::now().time_since_epoch().count();
    else if (auto it = std::find(group.arrived.begin(), group.arrived.end(), rank);
             stopOnFailure && it != group.arrived.end())
      // Gone: a member arriving later must not count this rank as there,
      // pass the barrier alone and read a source this rank no longer keeps.
      // (A collective's closing barrier, stopOnFailure false, counts those
      // done reading, which a rank leaving it still is.)
      group.arrived.erase(it);
    return ok;
  }

  /// A context-parallel gather (StageContext::gatherRows) of global rank
  /// `rank`: every rank of its group posts its rows, each copies all of them
  /// into microbatch order, and none returns before all have copied (the
  /// sources stay valid).
  bool gather(int64_t rank, const float *local, int64_t cols, float *all, std::string &problem) {
    // One group per (pipeline rank, replica, tensor rank): its context ranks.
    GatherGroup &group = gatherGroups[rank / (a.cp * a.tp) * a.tp + a.tensorRankOf(rank)];
    return collective(rank, group, a.contextGroupOf(rank), a.contextRankOf(rank), local,
                      [&](const std::vector<const float *> &sources) {
                        placeRows(sources, [&](int64_t c) { return a.contextRows(c); }, cols, all);
                      },
                      problem);
  }

  /// ALLREDUCE of stage `stage` by global rank `rank`: a barrier of its
  /// pipeline rank's members (the reduce groups of every tensor rank at
  /// once); the last to arrive sums. False when a rank failed meanwhile.
  bool allReduce(int64_t rank, int64_t stage, std::string &problem) {
    std::unique_lock<std::mutex> lock(mutex);
    const int64_t pipelineRank = a.pipelineRankOf(rank), members = a.dp * a.cp * a.tp;
    return barrier(rank, reduceGroups[pipelineRank], rankRange(pipelineRank * members, members), lock,
                   [&] { sumReplicas(size_t(stage)); }, problem);
  }

  /// Every rank calls this once per step; the last one reduces the
  /// gradients and updates the weights for all. False when a rank failed.
  bool completeStep(int64_t rank, int64_t step, const std::vector<std::vector<double>> &rankLosses,
                    int64_t peak, bool evaluateOnly, StepResult &out, std::string &problem) {
    std::unique_lock<std::mutex> lock(mutex);
    // Every tensor-parallel rank computes the same losses; rank 0's count.
    if (a.rankOf(int64_t(a.stages.size()) - 1) == a.pipelineRankOf(rank) && a.tensorRankOf(rank) == 0)
      losses[a.reduceMemberOf(rank)] = rankLosses;
    peakBytes[rank] = peak;
    const bool ok = barrier(rank, stepGroup, rankRange(0, a.worldSize()), lock, [&] {
      result = StepResult();
      result.step = step;
      // The replicas' gradients were summed by each rank's ALLREDUCE.
      if (a.tp > 1 && !evaluateOnly)
        assembleTensorParallel();
      params.update(a, options, sumContextLosses(a, losses), evaluateOnly, result);
      cutBlocks();
      result.peakBytes = peakBytes;
    }, problem);
    if (!ok)
      return false;
    out.lmLoss = result.lmLoss;
    out.mtpLoss = result.mtpLoss;
    out.gradNorm = result.gradNorm;
    out.numZeros = result.numZeros;
    out.learningRate = result.learningRate;
    out.peakBytes = result.peakBytes;
    if (rank == 0)
      out.paramGrads = std::move(result.paramGrads); // the trainer merges every rank's
    return true;
  }
};

class CpuDevice final : public CpuRankBase {
public:
  CpuDevice(std::shared_ptr<CpuWorld> world, int64_t rank)
      : CpuRankBase(world->a, world->options, rank), world_(std::move(world)), faults_(rank) {}

  bool beginStep(const StepInputs &inputs) override {
    ++stepsRun_;
    progressed();
    beginInputs(inputs);
    for (size_t s = pipelineRank_; s < a_.stages.size(); s += a_.pp)
      for (std::vector<float> &g : world_->gradsOf(a_.memberOf(rank_))[s])
        std::fill(g.begin(), g.end(), 0.0f);
    return true;
  }
  bool finishPipeline() override { return !world_->failed || fail("stopped: another rank failed"); }
  bool allReduceGradients(const Instr &instr) override {
    std::string problem;
    return collectiveDone(world_->allReduce(rank_, instr.stage, problem), "the gradient ALLREDUCE", problem);
  }
  bool optimizerStep(int64_t step, const std::vector<std::vector<double>> &losses, StepResult &result) override {
    std::string problem;
    return world_->completeStep(rank_, step, losses, peak_, evaluating(), result, problem) ||
           fail(problem.empty() ? "stopped: another rank failed" : "stopped at the step's end: " + problem);
  }

  bool exchange(std::vector<Transfer> &group) override {
    // Sends never block, so posting them first is what NCCL's group allows.
    for (Transfer &t : group)
      if (t.instr->kind == OpKind::Send) {
        const Instr &i = *t.instr;
        Channel &channel = world_->channels[{rank_, a_.globalRank(i.peer, replica_, contextRank_, tensorRank_)}];
        {
          std::lock_guard<std::mutex> lock(channel.mutex);
          channel.queue.push_back({i.payload, i.srcStage, i.dstStage, i.mb,
                                   std::vector<float>(t.buffer.data, t.buffer.data + t.buffer.count)});
        }
        channel.ready.notify_all();
      }
    for (Transfer &t : group)
      if (t.instr->kind == OpKind::Recv && !receive(t))
        return false;
    progressed();
    return true;
  }
  bool forward(int64_t stage, int64_t mb, size_t index, StageState &state) override {
    faults_.slowDown();
    if (!hung_ && faults_.hangsAt(stepsRun_)) {
      // The fault tests' stuck rank: a thread cannot be killed alone, so it
      // makes no progress until the others give up on it.
      hung_ = true;
      while (!world_->failed)
        std::this_thread::sleep_for(kWaitSlice);
      return fail("stopped: another rank failed");
    }
    const bool ok = CpuRankBase::forward(stage, mb, index, state);
    progressed();
    return ok;
  }
  bool backward(int64_t stage, int64_t mb, size_t index, BackwardPart part, StageState &state,
                const std::vector<int> &fresh) override {
    faults_.slowDown();
    const bool ok = CpuRankBase::backward(stage, mb, index, part, state, fresh);
    progressed();
    return ok;
  }
  void downloadParameters(std::vector<std::vector<float>> &weights) override { weights = world_->params.weights; }
  // The CPU world holds every parameter; rank 0 speaks for it.
  bool saveState(ParameterState &state) override {
    if (rank_ != 0)
      return true;
    state.weights = world_->params.weights;
    world_->params.heldMoments(world_->a, state);
    return true;
  }
  bool loadState(const ParameterState &state) override {
    if (rank_ != 0)
      return true;
    world_->params.load(world_->a, state, true);
    world_->cutBlocks();
    return true;
  }
  void abort() override { world_->failed = true; }

private:
  float *weight(int param) override { return world_->weightFor(tensorRank_, param); }
  float *slotGrad(int64_t stage, int slot) override { return world_->gradsOf(a_.memberOf(rank_))[stage][slot].data(); }
  bool tensorAllReduce(float *data, int64_t count, bool max) override {
    std::string problem;
    return collectiveDone(world_->tensorAllReduce(rank_, data, count, max, problem), kTensorCollective, problem);
  }
  bool tensorGatherRows(const float *local, int64_t cols, float *all) override {
    std::string problem;
    return collectiveDone(world_->tensorGatherRows(rank_, local, cols, all, problem), kTensorCollective, problem);
  }
  bool tensorReduceScatterRows(const float *all, int64_t cols, float *local) override {
    std::string problem;
    return collectiveDone(world_->tensorReduceScatterRows(rank_, all, cols, local, problem), kTensorCollective,
                          problem);
  }
  static constexpr const char *kTensorCollective = "a collective of its tensor-parallel group";
  /// A collective ended: progress either way; a failure names what stopped
  /// it (a rank found stuck) or, with no problem, that another rank failed.
  bool collectiveDone(bool ok, const std::string &where, const std::string &problem) {
    progressed();
    return ok || fail("stopped in " + where + ": " + (problem.empty() ? "another rank failed" : problem));
  }
  bool gatherRows(const float *local, int64_t cols, float *all) override {
    std::string problem;
    return collectiveDone(world_->gather(rank_, local, cols, all, problem),
                          "a row gather of its context-parallel group", problem);
  }

  void progressed() { world_->lastProgress[rank_] = Clock::now().time_since_epoch().count(); }

  /// Waits for the message; fails when the wait and the rank at the end of
  /// the chain of waits have both gone the limit without progress (a slow
  /// rank that progresses is waited for, however long).
  bool receive(Transfer &t) {
    const Instr &i = *t.instr;
    const int64_t peer = a_.globalRank(i.peer, replica_, contextRank_, tensorRank_);
    Channel &channel = world_->channels[{peer, rank_}];
    std::unique_lock<std::mutex> lock(channel.mutex);
    const auto start = Clock::now();
    world_->waitingOn[rank_] = peer;
    while (channel.queue.empty()) {
      std::string problem = world_->failed
                                ? "stopped while waiting for rank " + std::to_string(peer) + ": another rank failed"
                                : world_->stuckProblem(rank_, peer, start);
      if (!problem.empty()) {
        world_->waitingOn[rank_] = -1;
        return fail(problem);
      }
      channel.ready.wait_for(lock, kWaitSlice);
    }
    progressed(); // before the wait ends: never "waits on nobody" with an old progress
    world_->waitingOn[rank_] = -1;
    Message message = std::move(channel.queue.front());
    channel.queue.pop_front();
    lock.unlock();
    if (message.payload != i.payload || message.src != i.srcStage || message.dst != i.dstStage ||
        message.mb != i.mb || int64_t(message.data.size()) != i.tokens * i.width)
      return fail("received a different message (s" + std::to_string(message.src) + "->s" +
                  std::to_string(message.dst) + " mb" + std::to_string(message.mb) + ")");
    t.buffer = allocate(int64_t(message.data.size()), messageDtype(a_, i), Queue::recvFrom(i.peer), false);
    if (!t.buffer)
      return false;
    std::memcpy(t.buffer.data, message.data.data(), message.data.size() * sizeof(float));
    return true;
  }

  std::shared_ptr<CpuWorld> world_;
  const TestFaults faults_; // the fault tests' hooks (runtime/exec/TestFaults.h)
  int64_t stepsRun_ = 0;
  bool hung_ = false;
};

} // namespace

DeviceFactory cpuDevices() {
  return [](const Artifact &artifact, const TrainOptions &options, std::atomic<bool> &failed, std::string &) {
    auto world = std::make_shared<CpuWorld>(artifact, options, failed);
    std::vector<std::unique_ptr<Device>> devices;
    for (int64_t r = 0; r < artifact.worldSize(); ++r)
      devices.push_back(std::make_unique<CpuDevice>(world, r));
    return devices;
  };
}

} // namespace mhcc::runtime
