//===- Trainer.cpp - training steps on the CPU reference backend ------------===//
#include "runtime/train/Trainer.h"

#include "runtime/cpu/Parallel.h"
#include "runtime/cpu/StageExecutor.h"
#include "runtime/train/Optimizer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include <xxhash.h>

namespace mhcc::runtime {

std::vector<float> initialParameter(const ParamInfo &info, int64_t seed) {
  std::vector<float> values(info.count());
  const uint64_t stream = mix64(uint64_t(seed) ^ XXH3_64bits(info.name.data(), info.name.size()));
  auto uniform = [&](uint64_t counter) { // in (0, 1]
    return (double(mix64(stream + counter) >> 11) + 1.0) * 0x1.0p-53;
  };
  enum { Normal, Xavier, Ones, Constant, Zeros } kind =
      info.init == "normal" ? Normal : info.init == "xavier_uniform" ? Xavier : info.init == "ones" ? Ones
      : info.init == "constant" ? Constant : Zeros;
  // Each element depends on its index alone, so any split gives the same bits.
  auto fill = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      double v = 0;
      switch (kind) {
      case Normal: {
        double u1 = uniform(2 * i), u2 = uniform(2 * i + 1);
        v = info.scale * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
        break;
      }
      case Xavier:
        v = info.scale * (2.0 * uniform(i) - 1.0);
        break;
      case Ones:
        v = 1.0;
        break;
      case Constant:
        v = info.scale;
        break;
      case Zeros:
        break;
      }
      values[i] = static_cast<float>(v);
    }
  };
  // A normal sample (log, sqrt, cos) costs about as much as 16 multiply-adds.
  parallelFor(static_cast<int64_t>(values.size()), 16, [&](int64_t begin, int64_t end) { fill(begin, end); });
  return values;
}

namespace {

using Key = std::pair<int64_t, int64_t>; // (stage, microbatch)

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

using StageState = StageBuffers<float>;

} // namespace

struct CpuTrainer::Impl {
  const Artifact &a;
  const TrainOptions &options;
  std::vector<std::vector<float>> &weights;
  std::vector<std::vector<std::vector<float>>> slotGrads; // [stage][slot]
  std::vector<std::vector<int32_t>> tokens, labels;       // [mb]
  std::vector<std::vector<double>> losses;                // [mb][loss]
  std::map<std::pair<int64_t, int64_t>, Channel> channels;
  std::atomic<bool> aborted{false};
  std::mutex errorMutex, tapMutex;
  std::string error;
  std::map<std::string, std::vector<float>> taps;
  std::vector<int64_t> peakBytes;

  Impl(const Artifact &artifact, const TrainOptions &opts, std::vector<std::vector<float>> &w)
      : a(artifact), options(opts), weights(w) {
    for (int64_t from = 0; from < a.pp; ++from)
      for (int64_t to = 0; to < a.pp; ++to)
        if (from != to)
          channels[{from, to}];
  }

  void fail(const std::string &message) {
    {
      std::lock_guard<std::mutex> lock(errorMutex);
      if (error.empty())
        error = message;
    }
    aborted = true;
    for (auto &[key, channel] : channels)
      channel.ready.notify_all();
  }

  // ---- one rank ---------------------------------------------------------------
  struct Rank {
    Impl &impl;
    int64_t rank;
    std::map<Key, StageState> states;
    std::map<Key, std::vector<float>> actIn, gradIn;
    int64_t live = 0, peak = 0;
    std::map<std::string, double> profileMs; // with options.profile

    const StageProgram &program(int64_t s) const { return impl.a.stages[s]; }

    void take(std::vector<float> &buffer, int64_t size) {
      buffer.assign(size, 0.0f);
      live += size * 4;
      peak = std::max(peak, live);
    }
    void adopt(std::vector<float> &buffer, std::vector<float> data) {
      buffer = std::move(data);
      live += buffer.size() * 4;
      peak = std::max(peak, live);
    }
    void release(std::vector<float> &buffer) {
      live -= buffer.size() * 4;
      std::vector<float>().swap(buffer);
    }
    void releaseState(Key key) {
      auto it = states.find(key);
      if (it == states.end())
        return;
      for (auto &v : it->second.values)
        release(v);
      for (auto &v : it->second.aux)
        release(v);
      states.erase(it);
    }

    void tap(const ValueInfo &info, const std::vector<float> &data, int64_t mb) {
      if (!impl.options.recordTaps || info.tap.empty())
        return;
      std::lock_guard<std::mutex> lock(impl.tapMutex);
      impl.taps[info.tap + "@mb" + std::to_string(mb)] = data;
    }

    StageContext<float> contextFor(int64_t s, int64_t mb) {
      StageContext<float> c{program(s), impl.a.model};
      c.microbatches = impl.a.microbatches;
      c.tokens = impl.tokens[mb].data();
      c.labels = impl.labels[mb].data();
      c.param = [this, s](int slot) { return impl.weights[program(s).params[slot].param].data(); };
      c.paramGrad = [this, s](int slot) { return impl.slotGrads[s][slot].data(); };
      c.allocate = [this](std::vector<float> &buffer, int64_t size) { take(buffer, size); };
      if (impl.options.profile) {
        c.profile = &profileMs;
        c.profilePrefix = "rank " + std::to_string(rank) + " ";
      }
      return c;
    }

    /// StageState and StageBuffers hold the same two lists.
    static StageBuffers<float> &buffers(StageState &st) { return st; }

    bool forward(int64_t s, int64_t mb) {
      const StageProgram &p = program(s);
      Key key{s, mb};
      if (states.count(key))
        return failAt("FWD(s" + std::to_string(s) + ",mb" + std::to_string(mb) + ") runs twice");
      StageState &st = states[key];
      st.values.resize(p.values.size());
      st.aux.resize(p.forward.size());
      if (p.input >= 0) {
        if (impl.a.rankOf(s - 1) == rank) {
          // The previous chunk ran on this rank: take its output in place of a message.
          auto prev = states.find({s - 1, mb});
          if (prev == states.end() || prev->second.values[program(s - 1).output].empty())
            return failAt("FWD(s" + std::to_string(s) + ") finds no output of stage " + std::to_string(s - 1));
          std::vector<float> &out = prev->second.values[program(s - 1).output];
          adopt(st.values[p.input], out);
          release(out);
        } else {
          auto in = actIn.find(key);
          if (in == actIn.end())
            return failAt("FWD(s" + std::to_string(s) + ",mb" + std::to_string(mb) + ") before its activation arrived");
          live -= in->second.size() * 4;
          adopt(st.values[p.input], std::move(in->second));
          actIn.erase(in);
        }
      }
      StageContext<float> context = contextFor(s, mb);
      std::vector<double> losses;
      runForward(context, buffers(st), losses, [&](int value) { tap(p.values[value], st.values[value], mb); });
      for (size_t l = 0; l < losses.size(); ++l)
        impl.losses[mb][l] = losses[l];
      return true;
    }

    /// Records the tapped gradients the backward computed (the received
    /// output gradient was recorded on arrival).
    void tapGradients(const StageProgram &p, const StageState &st, int64_t mb) {
      for (size_t v = 0; v < st.values.size(); ++v)
        if (p.values[v].tap.rfind("grad:", 0) == 0 && static_cast<int>(v) != p.gradOutput &&
            !st.values[v].empty())
          tap(p.values[v], st.values[v], mb);
    }

    /// Microbatches whose B ran and whose W has not: their state stays.
    std::set<Key> weightPending;

    bool backward(int64_t s, int64_t mb, BackwardPart part) {
      const StageProgram &p = program(s);
      Key key{s, mb};
      auto found = states.find(key);
      if (found == states.end())
        return failAt("BWD(s" + std::to_string(s) + ",mb" + std::to_string(mb) + ") before its FWD");
      StageState &st = found->second;
      if (part == BackwardPart::Weight) {
        if (!weightPending.erase(key))
          return failAt("W(s" + std::to_string(s) + ",mb" + std::to_string(mb) + ") before its B");
      } else if (p.gradOutput >= 0) {
        if (impl.a.rankOf(s + 1) == rank) {
          auto next = states.find({s + 1, mb});
          if (next == states.end() || next->second.values[program(s + 1).gradInput].empty())
            return failAt("BWD(s" + std::to_string(s) + ") finds no input gradient of stage " + std::to_string(s + 1));
          std::vector<float> &g = next->second.values[program(s + 1).gradInput];
          adopt(st.values[p.gradOutput], g);
          releaseState({s + 1, mb});
        } else {
          auto in = gradIn.find(key);
          if (in == gradIn.end())
            return failAt("BWD(s" + std::to_string(s) + ",mb" + std::to_string(mb) + ") before its gradient arrived");
          live -= in->second.size() * 4;
          adopt(st.values[p.gradOutput], std::move(in->second));
          gradIn.erase(in);
        }
        tap(p.values[p.gradOutput], st.values[p.gradOutput], mb);
      }
      StageContext<float> context = contextFor(s, mb);
      std::string problem = runBackward(context, buffers(st), part);
      if (!problem.empty())
        return failAt("BWD(s" + std::to_string(s) + ",mb" + std::to_string(mb) + "): " + problem);
      if (part == BackwardPart::Input) {
        // B leaves everything W needs: inputs, scratch, output gradients.
        weightPending.insert(key);
        tapGradients(p, st, mb);
        return true;
      }
      if (part == BackwardPart::Weight) {
        // The input gradient was sent (or handed over) after B.
        for (auto &v : st.values)
          release(v);
        for (auto &v : st.aux)
          release(v);
        states.erase(key);
        return true;
      }
      // Keep only the input gradient (to send back or hand over); the rest dies.
      tapGradients(p, st, mb);
      for (size_t v = 0; v < st.values.size(); ++v)
        if (static_cast<int>(v) != p.gradInput)
          release(st.values[v]);
      for (auto &v : st.aux)
        release(v);
      if (p.gradInput < 0)
        states.erase(key);
      return true;
    }

    bool send(const Instr &i) {
      Key key{i.srcStage, i.mb};
      auto it = states.find(key);
      const StageProgram &p = program(i.srcStage);
      int value = i.payload == Payload::Activation ? p.output : p.gradInput;
      if (it == states.end() || it->second.values[value].empty())
        return failAt(i.describe() + ": nothing to send (computed? freed?)");
      Message message{i.payload, i.srcStage, i.dstStage, i.mb, it->second.values[value]};
      if (i.payload == Payload::Gradient) {
        if (weightPending.count(key))
          release(it->second.values[value]); // W still needs the rest
        else
          releaseState(key); // the input gradient was all that was left
      }
      Channel &channel = impl.channels[{rank, i.peer}];
      {
        std::lock_guard<std::mutex> lock(channel.mutex);
        channel.queue.push_back(std::move(message));
      }
      channel.ready.notify_all();
      return true;
    }

    bool receive(const Instr &i) {
      Channel &channel = impl.channels[{i.peer, rank}];
      std::unique_lock<std::mutex> lock(channel.mutex);
      auto deadline = std::chrono::steady_clock::now() +
                      std::chrono::duration<double>(impl.options.recvTimeoutSeconds);
      while (channel.queue.empty()) {
        if (impl.aborted)
          return false;
        if (channel.ready.wait_until(lock, deadline) == std::cv_status::timeout && channel.queue.empty())
          return failAt(i.describe() + ": no message from rank " + std::to_string(i.peer) + " within " +
                        std::to_string(int(impl.options.recvTimeoutSeconds)) + " s");
      }
      Message message = std::move(channel.queue.front());
      channel.queue.pop_front();
      lock.unlock();
      if (message.payload != i.payload || message.src != i.srcStage || message.dst != i.dstStage ||
          message.mb != i.mb || int64_t(message.data.size()) != i.tokens * i.width)
        return failAt(i.describe() + ": received a different message (s" + std::to_string(message.src) +
                      "->s" + std::to_string(message.dst) + " mb" + std::to_string(message.mb) + ")");
      auto &slot = (i.payload == Payload::Activation ? actIn : gradIn)[{i.dstStage, i.mb}];
      adopt(slot, std::move(message.data));
      return true;
    }

    std::string where;
    bool failAt(const std::string &message) {
      impl.fail("rank " + std::to_string(rank) + " " + where + ": " + message);
      return false;
    }

    void run() {
      const auto &list = impl.a.ranks[rank];
      for (size_t index = 0; index < list.size() && !impl.aborted; ++index) {
        const Instr &i = list[index];
        where = "instruction #" + std::to_string(index);
        bool ok = true;
        switch (i.kind) {
        case OpKind::Forward: ok = forward(i.stage, i.mb); break;
        case OpKind::Backward: ok = backward(i.stage, i.mb, BackwardPart::Both); break;
        case OpKind::BackwardInput: ok = backward(i.stage, i.mb, BackwardPart::Input); break;
        case OpKind::BackwardWeight: ok = backward(i.stage, i.mb, BackwardPart::Weight); break;
        case OpKind::Send: ok = send(i); break;
        case OpKind::Recv: ok = receive(i); break;
        case OpKind::Free: {
          auto it = states.find({i.stage, i.mb});
          if (it != states.end())
            release(it->second.values[program(i.stage).output]);
          break;
        }
        case OpKind::Optimizer: break; // applied by the trainer once every rank is done
        }
        if (!ok)
          return;
      }
      impl.peakBytes[rank] = peak;
    }
  };
};

CpuTrainer::CpuTrainer(Artifact artifact, const TokenDataset &data, TrainOptions options)
    : artifact_(std::move(artifact)), data_(data), options_(std::move(options)) {
  for (const ParamInfo &info : artifact_.params) {
    weights_.push_back(initialParameter(info, artifact_.model.seed));
    adamM_.emplace_back(info.count(), 0.0f);
    adamV_.emplace_back(info.count(), 0.0f);
  }
}

CpuTrainer::~CpuTrainer() = default;

std::optional<StepResult> CpuTrainer::step(std::string &error) {
  const Artifact &a = artifact_;
  const ModelInfo &m = a.model;
  auto start = std::chrono::steady_clock::now();
  Impl impl(a, options_, weights_);
  impl.slotGrads.resize(a.stages.size());
  for (size_t s = 0; s < a.stages.size(); ++s)
    for (const ParamSlot &slot : a.stages[s].params)
      impl.slotGrads[s].emplace_back(a.params[slot.param].count(), 0.0f);
  impl.tokens.assign(a.microbatches, std::vector<int32_t>(m.tokens()));
  impl.labels.assign(a.microbatches, std::vector<int32_t>(m.tokens()));
  for (int64_t mb = 0; mb < a.microbatches; ++mb)
    data_.sample(options_.dataSeed, stepsDone_, mb, m.seqLen, m.microBatch, impl.tokens[mb].data(),
                 impl.labels[mb].data());
  const StageProgram &last = a.stages.back();
  impl.losses.assign(a.microbatches, std::vector<double>(last.losses.size(), 0.0));
  impl.peakBytes.assign(a.pp, 0);

  std::vector<Impl::Rank> ranks;
  for (int64_t r = 0; r < a.pp; ++r)
    ranks.push_back(Impl::Rank{impl, r});
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < a.pp; ++r)
    threads.emplace_back([&ranks, r] { ranks[r].run(); });
  for (std::thread &t : threads)
    t.join();
  if (!impl.error.empty()) {
    error = impl.error;
    return std::nullopt;
  }
  auto pipelineDone = std::chrono::steady_clock::now();

  StepResult result;
  result.step = ++stepsDone_;
  std::vector<std::vector<const float *>> slotGrads(a.stages.size());
  for (size_t s = 0; s < a.stages.size(); ++s)
    for (const std::vector<float> &g : impl.slotGrads[s])
      slotGrads[s].push_back(g.data());
  completeStep(a, options_, impl.losses, slotGrads, weights_, adamM_, adamV_, result);
  auto end = std::chrono::steady_clock::now();
  result.seconds = std::chrono::duration<double>(end - start).count();
  if (options_.profile) {
    for (const Impl::Rank &r : ranks)
      for (const auto &[name, ms] : r.profileMs)
        result.profileMs[name] += ms;
    result.profileMs["host: pipeline (all ranks, wall)"] =
        std::chrono::duration<double, std::milli>(pipelineDone - start).count();
    result.profileMs["host: gradient reduction and optimizer"] =
        std::chrono::duration<double, std::milli>(end - pipelineDone).count();
  }
  result.tokens = a.microbatches * m.tokens();
  result.peakBytes = impl.peakBytes;
  if (options_.recordTaps)
    result.taps = std::move(impl.taps);
  return result;
}

} // namespace mhcc::runtime
