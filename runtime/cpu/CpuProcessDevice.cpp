//===- CpuProcessDevice.cpp - one CPU pipeline rank per process ---------------===//
#include "runtime/cpu/CpuProcessDevice.h"

#include "runtime/cpu/CpuRankBase.h"
#include "runtime/cpu/SocketMesh.h"
#include "runtime/dist/StopSignal.h"
#include "runtime/train/Optimizer.h"
#include "runtime/train/Parameters.h"

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

/// MHCC_TEST_KILL_RANK_AT / MHCC_TEST_HANG_RANK_AT = "R:K": rank R SIGKILLs
/// itself, or sleeps forever, in the first exchange of the K-th step this
/// process runs: a rank lost or stuck mid-step, for the fault tests only.
int64_t testFaultStep(const char *name, int64_t rank) {
  const char *value = std::getenv(name);
  long long r = -1, k = -1;
  if (!value || std::sscanf(value, "%lld:%lld", &r, &k) != 2 || r != rank)
    return -1;
  return k;
}

class CpuProcessDevice final : public CpuRankBase {
public:
  CpuProcessDevice(const Artifact &a, const TrainOptions &options, std::unique_ptr<SocketMesh> mesh, int64_t rank)
      : CpuRankBase(a, options, rank), mesh_(std::move(mesh)), killAt_(testFaultStep("MHCC_TEST_KILL_RANK_AT", rank)),
        hangAt_(testFaultStep("MHCC_TEST_HANG_RANK_AT", rank)), working_(a) {
    for (const ParamInfo &info : a.params) {
      weights_.push_back(initialParameter(info, a.model.seed)); // every rank: the same seed, the same bits
      adamM_.emplace_back(rank == 0 ? info.count() : 0, 0.0f);   // the optimizer runs on rank 0 only
      adamV_.emplace_back(rank == 0 ? info.count() : 0, 0.0f);
    }
    // Rank 0 holds every stage's gradients (its own and the gathered ones),
    // the others their own stages'.
    slotGrads_.resize(a.stages.size());
    for (size_t s = 0; s < a.stages.size(); ++s)
      if (rank == 0 || a.rankOf(int64_t(s)) == rank)
        for (const ParamSlot &slot : a.stages[s].params)
          slotGrads_[s].emplace_back(a.params[slot.param].count(), 0.0f);
    working_.refresh(weights_);
  }

  bool beginStep(const StepInputs &inputs) override {
    beginInputs(inputs);
    ++stepsRun_;
    exchanged_ = false;
    for (auto &stage : slotGrads_)
      for (std::vector<float> &g : stage)
        std::fill(g.begin(), g.end(), 0.0f);
    return true;
  }
  bool finishPipeline() override { return true; } // every receive completed inside exchange
  bool optimizerStep(int64_t step, const std::vector<std::vector<double>> &losses, StepResult &result) override {
    return rank_ == 0 ? reduceAndUpdate(step, losses, result) : sendAndTake(losses, result);
  }

  bool exchange(std::vector<Transfer> &group) override {
    if (!exchanged_) {
      exchanged_ = true;
      injectTestFault();
    }
    for (Transfer &t : group)
      if (t.instr->kind == OpKind::Send) {
        const Instr &i = *t.instr;
        Frame frame{Frame::Data, int32_t(i.payload), i.srcStage, i.dstStage, i.mb, {}};
        Packer{frame.bytes}.put(t.buffer.data, size_t(t.buffer.count));
        if (!mesh_->send(i.peer, frame, error_))
          return false;
      }
    for (Transfer &t : group)
      if (t.instr->kind == OpKind::Recv && !receive(t))
        return false;
    return true;
  }
  void downloadParameters(std::vector<std::vector<float>> &weights) override { weights = weights_; }
  // Rank 0 holds the moments, so it alone saves; every rank loads the weights.
  bool saveState(ParameterState &state) override {
    if (rank_ != 0)
      return true;
    state.weights = weights_;
    state.adamM = adamM_;
    state.adamV = adamV_;
    return true;
  }
  bool loadState(const ParameterState &state) override {
    for (size_t p = 0; p < a_.params.size(); ++p) {
      weights_[p] = state.weights[p];
      if (rank_ == 0 && !state.adamM[p].empty())
        adamM_[p] = state.adamM[p];
      if (rank_ == 0 && !state.adamV[p].empty())
        adamV_[p] = state.adamV[p];
    }
    working_.refresh(weights_);
    return true;
  }
  void abort() override {
    // Pass on what this rank saw, unless it only repeats a peer's report.
    if (!error_.empty() && error_.find(" reported: ") == std::string::npos)
      mesh_->reportFailure(error_);
    mesh_->abort();
  }

private:
  float *weight(int param) override { return working_.at(weights_, param); }
  float *slotGrad(int64_t stage, int slot) override { return slotGrads_[stage][slot].data(); }

  void injectTestFault() {
    if (stepsRun_ == killAt_)
      std::raise(SIGKILL);
    if (stepsRun_ == hangAt_)
      while (true)
        std::this_thread::sleep_for(std::chrono::hours(1));
  }

  bool receive(Transfer &t) {
    const Instr &i = *t.instr;
    Frame frame;
    if (!mesh_->receive(i.peer, frame, options_.recvTimeoutSeconds, error_))
      return false;
    if (frame.kind != Frame::Data || frame.payload != int32_t(i.payload) || frame.src != i.srcStage ||
        frame.dst != i.dstStage || frame.mb != i.mb || int64_t(frame.bytes.size()) != i.tokens * i.width * 4)
      return fail("received a different message from rank " + std::to_string(i.peer) + " (s" +
                  std::to_string(frame.src) + "->s" + std::to_string(frame.dst) + " mb" + std::to_string(frame.mb) +
                  "); the ranks run different artifacts?");
    t.buffer = allocate(i.tokens * i.width, Queue::recvFrom(i.peer), false);
    if (!t.buffer)
      return false;
    std::memcpy(t.buffer.data, frame.bytes.data(), frame.bytes.size());
    return true;
  }

  bool reduceAndUpdate(int64_t step, const std::vector<std::vector<double>> &losses, StepResult &out);
  bool sendAndTake(const std::vector<std::vector<double>> &losses, StepResult &out);

  std::unique_ptr<SocketMesh> mesh_;
  const int64_t killAt_, hangAt_;
  int64_t stepsRun_ = 0;
  bool exchanged_ = false;
  std::vector<std::vector<float>> weights_, adamM_, adamV_; // fp32 masters (moments on rank 0)
  WorkingWeights working_;                                   // what the kernels read
  std::vector<std::vector<std::vector<float>>> slotGrads_;  // [stage][slot]
};

/// A rank's end of step for rank 0: peak, stop signal, losses, then its
/// stages' slot gradients in stage and slot order.
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
  for (size_t s = rank_; s < a_.stages.size(); s += a_.pp)
    for (const std::vector<float> &g : slotGrads_[s])
      pack.put(g.data(), g.size());
  Frame reply;
  if (!mesh_->send(0, gather, error_) || !mesh_->receive(0, reply, options_.recvTimeoutSeconds, error_))
    return false;
  Unpacker in{reply.bytes};
  int32_t hasMtp = 0;
  double mtpLoss = 0;
  bool ok = reply.kind == Frame::Reply && in.get(out.lmLoss) && in.get(hasMtp) && in.get(mtpLoss) &&
            in.get(out.gradNorm) && in.get(out.numZeros) && in.get(out.learningRate) && in.get(out.stopSignal);
  out.peakBytes.assign(a_.pp, 0);
  ok = ok && in.get(out.peakBytes.data(), out.peakBytes.size());
  for (std::vector<float> &w : weights_)
    ok = ok && in.get(w.data(), w.size());
  if (!ok || in.at != reply.bytes.size())
    return fail("rank 0's update after the step is malformed (the ranks run different artifacts?)");
  working_.refresh(weights_);
  if (hasMtp)
    out.mtpLoss = mtpLoss;
  return true;
}

/// Rank 0: gathers every rank's part, runs CpuWorld's completeStep on the
/// same arrays, sends the weights and the numbers back.
bool CpuProcessDevice::reduceAndUpdate(int64_t step, const std::vector<std::vector<double>> &myLosses,
                                       StepResult &out) {
  const int64_t lossRank = a_.rankOf(int64_t(a_.stages.size()) - 1);
  std::vector<std::vector<double>> losses = myLosses;
  std::vector<int64_t> peaks(a_.pp, 0);
  peaks[0] = peak_;
  int stop = stopSignal();
  for (int64_t r = 1; r < a_.pp; ++r) {
    Frame gather;
    if (!mesh_->receive(r, gather, options_.recvTimeoutSeconds, error_))
      return false;
    Unpacker in{gather.bytes};
    int64_t rankStop = 0, rows = 0;
    bool ok = gather.kind == Frame::Gather && in.get(peaks[r]) && in.get(rankStop) && in.get(rows) && rows >= 0;
    std::vector<std::vector<double>> rankLosses(ok ? size_t(rows) : 0);
    for (std::vector<double> &row : rankLosses) {
      int64_t cols = 0;
      ok = ok && in.get(cols) && cols >= 0 && (row.resize(size_t(cols)), in.get(row.data(), row.size()));
    }
    for (size_t s = r; s < a_.stages.size(); s += a_.pp)
      for (std::vector<float> &g : slotGrads_[s])
        ok = ok && in.get(g.data(), g.size());
    if (!ok || in.at != gather.bytes.size())
      return fail("rank " + std::to_string(r) + "'s gradients are malformed (the ranks run different artifacts?)");
    if (r == lossRank)
      losses = std::move(rankLosses);
    stop = std::max<int>(stop, int(rankStop));
  }
  StepResult result;
  result.step = step;
  std::vector<std::vector<const float *>> grads(a_.stages.size());
  for (size_t s = 0; s < a_.stages.size(); ++s)
    for (const std::vector<float> &g : slotGrads_[s])
      grads[s].push_back(g.data());
  runtime::completeStep(a_, options_, losses, grads, weights_, adamM_, adamV_, result);
  working_.refresh(weights_);
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
  for (const std::vector<float> &w : weights_)
    pack.put(w.data(), w.size());
  for (int64_t r = 1; r < a_.pp; ++r)
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

} // namespace

DeviceFactory cpuProcessDevice(int64_t rank, int64_t size, std::string socketDir) {
  return [=](const Artifact &artifact, const TrainOptions &options, std::atomic<bool> &, std::string &error) {
    std::vector<std::unique_ptr<Device>> devices;
    if (size != artifact.pp) {
      error = std::to_string(size) + " processes for an artifact of pp = " + std::to_string(artifact.pp) +
              ": start one process per pipeline rank";
      return devices;
    }
    std::unique_ptr<SocketMesh> mesh =
        SocketMesh::connect(rank, size, socketDir, options.recvTimeoutSeconds, error);
    if (mesh)
      devices.push_back(std::make_unique<CpuProcessDevice>(artifact, options, std::move(mesh), rank));
    return devices;
  };
}

} // namespace mhcc::runtime
