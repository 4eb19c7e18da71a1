//===- CpuProcessDevice.cpp - one CPU pipeline rank per process ---------------===//
#include "runtime/cpu/CpuProcessDevice.h"
#include "runtime/exec/TestFaults.h"

#include "runtime/cpu/CpuRankBase.h"
#include "runtime/cpu/SocketMesh.h"
#include "runtime/dist/StopSignal.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace mhcc::runtime {
namespace {

/// Appends and reads back plain values and arrays in a frame's bytes.
struct Packer {
  std::vector<char> &bytes;
  template <typename T> void put(const T *data, size_t count) {
    const char *p = reinterpret_cast<const char *>(data);
    bytes.insert(bytes.end(), p, p + count * sizeof(T));
  }
  template <typename T> void put(T value) { put(&value, 1); }
};
struct Unpacker {
  const std::vector<char> &bytes;
  size_t at = 0;
  template <typename T> bool get(T *data, size_t count) {
    if (at + count * sizeof(T) > bytes.size())
      return false;
    std::memcpy(data, bytes.data() + at, count * sizeof(T));
    at += count * sizeof(T);
    return true;
  }
  template <typename T> bool get(T &value) { return get(&value, 1); }
};

class CpuProcessDevice final : public CpuRankBase {
public:
  CpuProcessDevice(const Artifact &a, const TrainOptions &options, std::unique_ptr<SocketMesh> mesh, int64_t rank)
      : CpuRankBase(a, options, rank), mesh_(std::move(mesh)), faults_(rank), shard_(a.optimizerShardOf(rank)),
        // Rank 0 reduces the whole gradients of every stage, assembled from
        // the ranks' blocks, and takes the norm; it holds every moment, or
        // under the distributed optimizer part 0's, each gradient-group
        // member's first rank holding (and updating) its member's part.
        params_(a, rank == 0 || shard_ >= 0, [rank](int64_t) { return rank == 0; }, options.storeParamRemainders,
                shard_),
        grads_(blockGrads(a, [&a, rank](int64_t s) { return a.rankOf(s) == a.pipelineRankOf(rank); })) {
    if (rank == 0)
      gathered_.assign(a.tp, blockGrads(a));
    cutBlocks();
  }

  bool beginStep(const StepInputs &inputs) override {
    mesh_->setLocalWork(false); // from here a peer waiting on this rank sees its instructions
    mesh_->progressed();
    beginInputs(inputs);
    ++stepsRun_;
    exchanged_ = false;
    for (auto &stage : grads_)
      for (std::vector<float> &g : stage)
        std::fill(g.begin(), g.end(), 0.0f);
    return true;
  }
  bool finishPipeline() override { return true; } // every receive completed inside exchange
  bool optimizerStep(int64_t step, const std::vector<std::vector<double>> &losses, StepResult &result) override {
    const bool ok = rank_ == 0 ? reduceAndUpdate(step, losses, result) : sendAndTake(losses, result);
    mesh_->setLocalWork(true); // until the next step: printing, saving
    return ok;
  }
  // Each instruction is progress a waiting peer sees (SocketMesh's heartbeats).
  bool forward(int64_t stage, int64_t mb, size_t index, StageState &state) override {
    faults_.slowDown();
    const bool ok = CpuRankBase::forward(stage, mb, index, state);
    mesh_->progressed();
    return ok;
  }
  bool backward(int64_t stage, int64_t mb, size_t index, BackwardPart part, StageState &state,
                const std::vector<int> &fresh) override {
    faults_.slowDown();
    const bool ok = CpuRankBase::backward(stage, mb, index, part, state, fresh);
    mesh_->progressed();
    return ok;
  }

  bool exchange(std::vector<Transfer> &group) override {
    const bool firstOfStep = !exchanged_;
    exchanged_ = true;
    for (Transfer &t : group)
      if (t.instr->kind == OpKind::Send) {
        const Instr &i = *t.instr;
        Frame frame{Frame::Data, int32_t(i.payload), i.srcStage, i.dstStage, i.mb, {}};
        Packer{frame.bytes}.put(t.buffer.data, size_t(t.buffer.count));
        if (!mesh_->send(a_.globalRank(i.peer, replica_, contextRank_, tensorRank_), frame, error_))
          return false;
      }
    for (Transfer &t : group)
      if (t.instr->kind == OpKind::Recv && !receive(t))
        return false;
    // Once the step's first exchange is done, whoever this rank heard from
    // is in this step too (rank 0 has finished the last step's optimizer
    // and metrics line), so a fault here is "mid-step" for everyone.
    if (firstOfStep)
      faults_.atExchange(stepsRun_);
    return true;
  }
  /// The members of this rank's reduce group (its pipeline and tensor rank,
  /// every replica and context rank) send their stages' gradients to the
  /// first, which adds them in member order (the thread ranks' sum, bit for
  /// bit). Only rank 0 runs the optimizer, gathering from the first members,
  /// so the others need not receive the sum back.
  bool allReduceGradients(const Instr &instr) override {
    const int64_t first = a_.globalRank(pipelineRank_, 0, 0, tensorRank_);
    if (rank_ != first) {
      Frame frame{Frame::Reduce, 0, rank_, first, 0, {}};
      packStageGrads(Packer{frame.bytes}, instr.stage);
      return mesh_->send(first, frame, error_);
    }
    for (int64_t member = 1; member < a_.dp * a_.cp; ++member) {
      Frame frame;
      const int64_t from = a_.globalRank(pipelineRank_, member / a_.cp, member % a_.cp, tensorRank_);
      if (!mesh_->receive(from, frame, error_))
        return false;
      Unpacker in{frame.bytes};
      bool ok = frame.kind == Frame::Reduce;
      for (std::vector<float> &sum : grads_[instr.stage]) {
        std::vector<float> g(sum.size());
        ok = ok && in.get(g.data(), g.size());
        for (size_t e = 0; ok && e < sum.size(); ++e)
          sum[e] = sum[e] + g[e];
      }
      if (!ok || in.at != frame.bytes.size())
        return fail("rank " + std::to_string(from) + "'s gradients for the ALLREDUCE are malformed (the ranks run "
                    "different artifacts?)");
      mesh_->progressed();
    }
    return true;
  }
  void downloadParameters(std::vector<std::vector<float>> &weights) override { weights = params_.weights; }
  // Rank 0 saves the weights (every rank holds all of them) and the moments
  // it holds: all, or under the distributed optimizer part 0's; each other
  // part's rank saves its part of the moments, as pieces of its own shard.
  bool saveState(ParameterState &state) override {
    if (rank_ == 0)
      state.weights = params_.weights;
    if (rank_ == 0 || shard_ > 0)
      params_.heldMoments(a_, state);
    return true;
  }
  bool loadState(const ParameterState &state) override {
    params_.load(a_, state, rank_ == 0 || shard_ >= 0);
    cutBlocks();
    return true;
  }
  void abort() override {
    // Pass on what this rank saw; a peer's report goes on as its root cause,
    // so that a rank which hears only of this one (its connection closing
    // next) still learns which rank failed first.
    if (!error_.empty()) {
      const std::string relay = " reported: ";
      const size_t at = error_.rfind(relay);
      mesh_->reportFailure(at == std::string::npos ? error_ : error_.substr(at + relay.size()));
    }
    mesh_->abort();
  }

private:
  float *weight(int param) override {
    return blocks_.empty() || blocks_[param].empty() ? params_.weight(param) : blocks_[param].data();
  }
  float *slotGrad(int64_t stage, int slot) override { return grads_[stage][slot].data(); }
  /// Tensor parallelism: this rank's blocks of the split weights, cut after
  /// every change of the weights.
  void cutBlocks() {
    if (a_.tp > 1)
      blocks_ = tensorBlocks(a_, tensorRank_, [this](int p) { return params_.weight(p); });
  }

  // The tensor- and context-parallel collectives over the sockets: every
  // member sends its part to every other (sends never block) and adds what
  // it receives in member order, the thread ranks' order, so the two CPU
  // devices give the same bits.
  bool sendPart(int64_t peer, const float *data, int64_t count) {
    Frame frame{Frame::Collective, int32_t(collectives_ & 0x7fffffff), rank_, peer, count, {}};
    Packer{frame.bytes}.put(data, size_t(count));
    return mesh_->send(peer, frame, error_);
  }
  bool receivePart(int64_t peer, int64_t count, std::vector<float> &out) {
    Frame frame;
    if (!mesh_->receive(peer, frame, error_))
      return false;
    if (frame.kind != Frame::Collective || frame.payload != int32_t(collectives_ & 0x7fffffff) ||
        int64_t(frame.bytes.size()) != count * 4)
      return fail("rank " + std::to_string(peer) + "'s part of collective #" + std::to_string(collectives_) +
                  " is not this rank's (the ranks run different artifacts?)");
    out.resize(size_t(count));
    std::memcpy(out.data(), frame.bytes.data(), frame.bytes.size());
    return true;
  }
  /// Every member's `count` floats (this rank's `mine`), in member order.
  bool allParts(const std::vector<int64_t> &members, const float *mine, int64_t count,
                std::vector<std::vector<float>> &parts) {
    ++collectives_;
    parts.assign(members.size(), {});
    for (int64_t peer : members)
      if (peer != rank_ && !sendPart(peer, mine, count))
        return false;
    for (size_t k = 0; k < members.size(); ++k)
      if (members[k] == rank_)
        parts[k].assign(mine, mine + count);
      else if (!receivePart(members[k], count, parts[k]))
        return false;
    mesh_->progressed();
    return true;
  }
  static std::vector<const float *> pointers(const std::vector<std::vector<float>> &parts) {
    std::vector<const float *> out;
    for (const std::vector<float> &p : parts)
      out.push_back(p.data());
    return out;
  }
  bool tensorAllReduce(float *data, int64_t count, bool max) override {
    std::vector<std::vector<float>> parts;
    if (!allParts(a_.tensorGroupOf(rank_), data, count, parts))
      return false;
    combineParts(pointers(parts), count, max, data);
    return true;
  }
  bool tensorGatherRows(const float *local, int64_t cols, float *all) override {
    std::vector<std::vector<float>> parts;
    if (!allParts(a_.tensorGroupOf(rank_), local, a_.rowsPerRank() * cols, parts))
      return false;
    placeRows(pointers(parts), [&](int64_t t) { return sequenceRows(a_, t); }, cols, all);
    return true;
  }
  /// Each member is sent only the rows it keeps: member t's rows of `all`.
  bool tensorReduceScatterRows(const float *all, int64_t cols, float *local) override {
    ++collectives_;
    const std::vector<int64_t> members = a_.tensorGroupOf(rank_), mine = sequenceRows(a_, tensorRank_);
    for (int64_t t = 0; t < a_.tp; ++t) {
      if (t == tensorRank_)
        continue;
      std::vector<float> rows;
      for (int64_t row : sequenceRows(a_, t))
        rows.insert(rows.end(), all + row * cols, all + (row + 1) * cols);
      if (!sendPart(members[t], rows.data(), int64_t(rows.size())))
        return false;
    }
    std::vector<std::vector<float>> received(a_.tp);
    for (int64_t t = 0; t < a_.tp; ++t)
      if (t != tensorRank_ && !receivePart(members[t], int64_t(mine.size()) * cols, received[t]))
        return false;
    std::vector<const float *> parts(a_.tp);
    for (size_t r = 0; r < mine.size(); ++r) {
      for (int64_t t = 0; t < a_.tp; ++t)
        parts[t] = t == tensorRank_ ? all + mine[r] * cols : received[t].data() + int64_t(r) * cols;
      combineParts(parts, cols, false, local + int64_t(r) * cols);
    }
    mesh_->progressed();
    return true;
  }
  bool gatherRows(const float *local, int64_t cols, float *all) override {
    std::vector<std::vector<float>> parts;
    if (!allParts(a_.contextGroupOf(rank_), local, int64_t(rowMap_.size()) * cols, parts))
      return false;
    placeRows(pointers(parts), [&](int64_t c) { return a_.contextRows(c); }, cols, all);
    return true;
  }

  bool receive(Transfer &t) {
    const Instr &i = *t.instr;
    const int64_t peer = a_.globalRank(i.peer, replica_, contextRank_, tensorRank_);
    Frame frame;
    if (!mesh_->receive(peer, frame, error_))
      return false;
    if (frame.kind != Frame::Data || frame.payload != int32_t(i.payload) || frame.src != i.srcStage ||
        frame.dst != i.dstStage || frame.mb != i.mb || int64_t(frame.bytes.size()) != i.tokens * i.width * 4)
      return fail("received a different message from rank " + std::to_string(peer) + " (s" +
                  std::to_string(frame.src) + "->s" + std::to_string(frame.dst) + " mb" + std::to_string(frame.mb) +
                  "); the ranks run different artifacts?");
    t.buffer = allocate(i.tokens * i.width, messageDtype(a_, i), Queue::recvFrom(i.peer), false);
    if (!t.buffer)
      return false;
    std::memcpy(t.buffer.data, frame.bytes.data(), frame.bytes.size());
    return true;
  }

  /// This rank's stages' slot gradients (its blocks), in stage and slot order.
  /// The gradients of one of the rank's stages, or (-1) of all of them.
  void packStageGrads(Packer pack, int64_t only = -1) const {
    for (size_t s = pipelineRank_; s < a_.stages.size(); s += a_.pp)
      if (only < 0 || int64_t(s) == only)
        for (const std::vector<float> &g : grads_[s])
          pack.put(g.data(), g.size());
  }

  bool reduceAndUpdate(int64_t step, const std::vector<std::vector<double>> &losses, StepResult &out);
  bool sendAndTake(const std::vector<std::vector<double>> &losses, StepResult &out);
  // The distributed optimizer across processes (below).
  bool shardsUpdates() const { return a_.distributedOptimizer && options_.optimizer != "sgd" && !evaluating(); }
  bool updateOtherShards(int64_t step);
  /// Rank 0: the next frame of `kind` from each other part's rank
  /// (Artifact::optimizerPartRank), in part order, read by read(d, in)
  /// (false, or bytes left: malformed).
  template <typename Read> bool readShardFrames(int32_t kind, const std::string &what, Read read) {
    for (int64_t d = 1; d < a_.optimizerParts(); ++d) {
      const int64_t from = a_.optimizerPartRank(d);
      Frame frame;
      if (!mesh_->receive(from, frame, error_))
        return false;
      Unpacker in{frame.bytes};
      if (frame.kind != kind || !read(d, in) || in.at != frame.bytes.size())
        return fail("rank " + std::to_string(from) + "'s " + what +
                    " is malformed (the ranks run different artifacts?)");
    }
    return true;
  }
  bool updateOwnShard();

  std::unique_ptr<SocketMesh> mesh_;
  const TestFaults faults_; // the fault tests' hooks (runtime/exec/TestFaults.h)
  const int64_t shard_;     // Artifact::optimizerShardOf: the distributed optimizer's shard this rank updates, or -1
  int64_t stepsRun_ = 0;
  bool exchanged_ = false;
  HostParameters params_; // every weight on every rank; moments (or a shard's) and whole gradients on rank 0
  SlotGrads grads_;       // this rank's stages' gradients: its tensor rank's blocks
  std::vector<SlotGrads> gathered_; // rank 0: the first reduce members' blocks, by tensor rank
  std::vector<std::vector<float>> blocks_; // tp > 1: this rank's blocks of the split weights
  uint64_t collectives_ = 0; // tensor- and context-parallel collectives run, to match the parts
};

/// A rank's end of step for rank 0: peak, stop signal, losses, then (the
/// first member of each reduce group: the group's sum) its stages' slot
/// gradients, its tensor rank's blocks, in stage and slot order.
bool CpuProcessDevice::sendAndTake(const std::vector<std::vector<double>> &losses, StepResult &out) {
  Frame gather{Frame::Gather, 0, rank_, 0, 0, {}};
  Packer pack{gather.bytes};
  pack.put<int64_t>(peak_);
  pack.put<int64_t>(stopSignal());
  pack.put<int64_t>(int64_t(losses.size()));
  for (const std::vector<double> &row : losses) {
    pack.put<int64_t>(int64_t(row.size()));
    pack.put(row.data(), row.size());
  }
  if (replica_ == 0 && contextRank_ == 0)
    packStageGrads(pack);
  Frame reply;
  if (!mesh_->send(0, gather, error_) || (shard_ > 0 && shardsUpdates() && !updateOwnShard()) ||
      !mesh_->receive(0, reply, error_))
    return false;
  Unpacker in{reply.bytes};
  int32_t hasMtp = 0;
  double mtpLoss = 0;
  bool ok = reply.kind == Frame::Reply && in.get(out.lmLoss) && in.get(hasMtp) && in.get(mtpLoss) &&
            in.get(out.gradNorm) && in.get(out.numZeros) && in.get(out.learningRate) && in.get(out.stopSignal);
  out.peakBytes.assign(a_.worldSize(), 0);
  ok = ok && in.get(out.peakBytes.data(), out.peakBytes.size());
  for (std::vector<float> &w : params_.weights)
    ok = ok && in.get(w.data(), w.size());
  if (!ok || in.at != reply.bytes.size())
    return fail("rank 0's update after the step is malformed (the ranks run different artifacts?)");
  params_.working.refresh(params_.weights);
  cutBlocks();
  if (hasMtp)
    out.mtpLoss = mtpLoss;
  return true;
}

/// Rank 0: gathers every rank's part (gradients from the first members of
/// the reduce groups, which hold their sums), assembles the tensor ranks'
/// blocks and updates as CpuWorld's completeStep does, sends the weights and
/// the numbers back.
bool CpuProcessDevice::reduceAndUpdate(int64_t step, const std::vector<std::vector<double>> &myLosses,
                                       StepResult &out) {
  // Every tensor rank computes the same losses; tensor rank 0's count.
  const int64_t lossRank = a_.rankOf(int64_t(a_.stages.size()) - 1);
  std::vector<std::vector<std::vector<double>>> memberLosses(a_.dp * a_.cp);
  if (lossRank == 0)
    memberLosses[0] = myLosses;
  for (size_t s = 0; s < a_.stages.size(); s += a_.pp)
    gathered_[0][s] = grads_[s];
  std::vector<int64_t> peaks(a_.worldSize(), 0);
  peaks[0] = peak_;
  int stop = stopSignal();
  for (int64_t r = 1; r < a_.worldSize(); ++r) {
    Frame gather;
    if (!mesh_->receive(r, gather, error_))
      return false;
    Unpacker in{gather.bytes};
    int64_t rankStop = 0, rows = 0;
    bool ok = gather.kind == Frame::Gather && in.get(peaks[r]) && in.get(rankStop) && in.get(rows) && rows >= 0;
    std::vector<std::vector<double>> rankLosses(ok ? size_t(rows) : 0);
    for (std::vector<double> &row : rankLosses) {
      int64_t cols = 0;
      ok = ok && in.get(cols) && cols >= 0 && (row.resize(size_t(cols)), in.get(row.data(), row.size()));
    }
    if (a_.replicaOf(r) == 0 && a_.contextRankOf(r) == 0)
      for (size_t s = a_.pipelineRankOf(r); s < a_.stages.size(); s += a_.pp)
        for (std::vector<float> &g : gathered_[a_.tensorRankOf(r)][s])
          ok = ok && in.get(g.data(), g.size());
    if (!ok || in.at != gather.bytes.size())
      return fail("rank " + std::to_string(r) + "'s gradients are malformed (the ranks run different artifacts?)");
    if (a_.pipelineRankOf(r) == lossRank && a_.tensorRankOf(r) == 0)
      memberLosses[a_.reduceMemberOf(r)] = std::move(rankLosses);
    stop = std::max<int>(stop, int(rankStop));
  }
  StepResult result;
  result.step = step;
  mesh_->setLocalWork(true); // the others wait on this update: it is progress
  if (!evaluating())
    assembleTensorParallel(a_, [this](int64_t t) -> const SlotGrads & { return gathered_[t]; }, params_.slotGrads);
  params_.update(a_, options_, sumContextLosses(a_, memberLosses), evaluating(), result);
  if (shardsUpdates() && !updateOtherShards(step))
    return false;
  cutBlocks();
  Frame reply{Frame::Reply, 0, 0, 0, 0, {}};
  Packer pack{reply.bytes};
  pack.put(result.lmLoss);
  pack.put<int32_t>(result.mtpLoss.has_value());
  pack.put(result.mtpLoss.value_or(0.0));
  pack.put(result.gradNorm);
  pack.put(result.numZeros);
  pack.put(result.learningRate);
  pack.put<int>(stop);
  pack.put(peaks.data(), peaks.size());
  for (const std::vector<float> &w : params_.weights)
    pack.put(w.data(), w.size());
  for (int64_t r = 1; r < a_.worldSize(); ++r)
    if (!mesh_->send(r, reply, error_))
      return false;
  out.lmLoss = result.lmLoss;
  out.mtpLoss = result.mtpLoss;
  out.gradNorm = result.gradNorm;
  out.numZeros = result.numZeros;
  out.learningRate = result.learningRate;
  out.peakBytes = peaks;
  out.stopSignal = stop;
  out.paramGrads = std::move(result.paramGrads);
  return true;
}

// ---- the distributed optimizer across processes ----------------------------------------
// Rank 0 reduces the gradients and takes their norm as without it (the same
// bits), and updates part 0; it sends each other part's rank (a gradient-group
// member's first rank) that part of the reduced gradients, which updates it with the moments
// it alone holds (the same arithmetic per element) and sends the weights'
// shard back; rank 0 then sends every rank the whole weights, as always.

/// Rank 0: shards 1.. of this step's update, by their ranks.
bool CpuProcessDevice::updateOtherShards(int64_t step) {
  const ReducedGradients &reduced = params_.reduced;
  for (int64_t d = 1; d < a_.optimizerParts(); ++d) {
    Frame frame{Frame::Shard, 0, 0, a_.optimizerPartRank(d), step, {}};
    Packer pack{frame.bytes};
    pack.put(reduced.norm);
    for (size_t p = 0; p < a_.params.size(); ++p) {
      const auto [begin, end] = a_.shardOf(a_.params[p].count(), d);
      pack.put(reduced.grads[p].data() + begin, size_t(end - begin));
    }
    if (!mesh_->send(frame.dst, frame, error_))
      return false;
  }
  const bool ok = readShardFrames(Frame::ShardWeights, "updated shard", [this](int64_t d, Unpacker &in) {
    for (size_t p = 0; p < a_.params.size(); ++p) {
      const auto [begin, end] = a_.shardOf(a_.params[p].count(), d);
      if (!in.get(params_.weights[p].data() + begin, size_t(end - begin)))
        return false;
    }
    return true;
  });
  params_.working.refresh(params_.weights);
  return ok;
}

/// A part's rank (part > 0): its part of the step's update.
bool CpuProcessDevice::updateOwnShard() {
  Frame frame;
  if (!mesh_->receive(0, frame, error_))
    return false;
  Unpacker in{frame.bytes};
  ReducedGradients shard; // whole-sized (applyOptimizer indexes by element), filled on the shard
  bool ok = frame.kind == Frame::Shard && in.get(shard.norm);
  shard.grads.resize(a_.params.size());
  for (size_t p = 0; ok && p < a_.params.size(); ++p) {
    const auto [begin, end] = a_.shardOf(a_.params[p].count(), shard_);
    shard.grads[p].assign(size_t(a_.params[p].count()), 0.0f);
    ok = in.get(shard.grads[p].data() + begin, size_t(end - begin));
  }
  if (!ok || in.at != frame.bytes.size())
    return fail("rank 0's gradient shard is malformed (the ranks run different artifacts?)");
  applyOptimizer(a_, options_, frame.mb, shard, params_.weights, params_.shardMoments(a_));
  Frame back{Frame::ShardWeights, 0, rank_, 0, frame.mb, {}};
  Packer pack{back.bytes};
  for (size_t p = 0; p < a_.params.size(); ++p) {
    const auto [begin, end] = a_.shardOf(a_.params[p].count(), shard_);
    pack.put(params_.weights[p].data() + begin, size_t(end - begin));
  }
  return mesh_->send(0, back, error_);
}

} // namespace

DeviceFactory cpuProcessDevice(int64_t rank, int64_t size, std::string socketDir) {
  return [=](const Artifact &artifact, const TrainOptions &options, std::atomic<bool> &, std::string &error) {
    std::vector<std::unique_ptr<Device>> devices;
    if (size != artifact.worldSize()) {
      error = std::to_string(size) + " processes for an artifact of " + artifact.meshDescription() + " = " +
              std::to_string(artifact.worldSize()) + " ranks: start one process per rank";
      return devices;
    }
    // Starting may take longer than a step's waits (the processes start
    // and read the artifact at their own pace): at least the old 120 s.
    std::unique_ptr<SocketMesh> mesh = SocketMesh::connect(
        rank, size, socketDir, std::max(120.0, options.recvTimeoutSeconds), options.recvTimeoutSeconds, error);
    if (mesh)
      devices.push_back(std::make_unique<CpuProcessDevice>(artifact, options, std::move(mesh), rank));
    return devices;
  };
}

} // namespace mhcc::runtime
