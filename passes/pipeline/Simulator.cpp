//===- Simulator.cpp - every rank's schedule run together, with timings -----===//
//
// The verifier and predictor behind -pipe-verify-schedule and
// --print-schedule (Schedule.h): it runs all ranks' lists with NCCL's
// matching rules, finds deadlocks and misrouted messages, and times each
// instruction from the stage costs to predict the step, bubble and memory.
//
//===----------------------------------------------------------------------===//
#include "passes/pipeline/Schedule.h"

#include "passes/CostModel.h"
#include "passes/pipeline/SharedCores.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

namespace mhcc::pipeline {

namespace {

struct MessageId {
  Payload payload;
  int64_t src, dst, mb;
  bool operator==(const MessageId &o) const {
    return payload == o.payload && src == o.src && dst == o.dst && mb == o.mb;
  }
};

struct Posted {
  int64_t rank, index;
  double time;
};

class Simulator {
public:
  /// `stretch` ([rank][instruction], or null): each compute instruction's
  /// time over its work's (the processor sharing of simulateSchedule).
  Simulator(const Schedule &schedule, const ScheduleSpec &spec, const std::vector<std::vector<double>> *stretch)
      : schedule_(schedule), spec_(spec), p_(schedule.pp), stages_(schedule.pp * schedule.vpp),
        stretch_(stretch) {}

  SimulationResult run() {
    SimulationResult result;
    result.busy.assign(p_, 0);
    result.peakBytes.assign(p_, 0);
    result.peakInFlight.assign(p_, 0);
    result.timeline.resize(p_);
    for (int64_t r = 0; r < p_; ++r)
      result.timeline[r].assign(schedule_.ranks[r].size(), {});
    ranks_.assign(p_, RankState{});
    complete_.resize(p_);
    for (int64_t r = 0; r < p_; ++r)
      complete_[r].assign(schedule_.ranks[r].size(), -1.0);
    result_ = &result;
    result.errors = checkStepCollectives(schedule_, spec_);

    bool progress = true;
    while (progress && result.errors.empty()) {
      progress = false;
      for (int64_t r = 0; r < p_ && result.errors.empty(); ++r)
        progress |= advance(r);
    }
    if (result.errors.empty()) {
      for (int64_t r = 0; r < p_; ++r) {
        const auto &list = schedule_.ranks[r];
        const RankState &st = ranks_[r];
        bool reported = false;
        for (const auto &[id, queue] : st.streams)
          if (!queue.empty()) {
            int64_t i = queue.front().index;
            error(r, i, "deadlock: " + list[i].describe() +
                            " is never matched (the peer never reaches it)");
            reported = true;
          }
        if (!reported && st.pc < static_cast<int64_t>(list.size()))
          error(r, st.pc, "deadlock: waits forever at " + list[st.pc].describe());
      }
    }
    if (result.errors.empty())
      checkCompleteness();
    for (int64_t r = 0; r < p_; ++r) {
      result.makespan = std::max(result.makespan, ranks_[r].clock);
      for (const auto &[id, free] : ranks_[r].streamFree)
        result.makespan = std::max(result.makespan, free);
    }
    double busiest = *std::max_element(result.busy.begin(), result.busy.end()), idle = 0;
    result.bubbleOverhead = busiest > 0 ? (result.makespan - busiest) / busiest : 0;
    for (double busy : result.busy) {
      result.rankBubbleFraction.push_back(result.makespan > 0 ? (result.makespan - busy) / result.makespan : 0);
      idle += result.makespan - busy;
    }
    result.bubbleFraction = result.makespan > 0 ? idle / (double(p_) * result.makespan) : 0;
    return result;
  }

private:
  struct StreamOp {
    int64_t index;  // instruction
    double reached; // when the host issued it
    bool posted;
  };

  struct RankState {
    int64_t pc = 0;
    double clock = 0; // the host (compute stream)
    // Keyed by (peer, is-send).
    std::map<std::pair<int64_t, bool>, std::deque<StreamOp>> streams;
    std::map<std::pair<int64_t, bool>, double> streamFree;
    int64_t waitingOnGroup = -1; // the host waits for the receives issued from here
    std::set<std::pair<int64_t, int64_t>> fwd, bwd, wgrad, actIn, gradIn, outLive, freeRequested;
    std::map<std::pair<int64_t, int64_t>, double> sendDone;
    std::map<std::pair<int64_t, int64_t>, int64_t> inBytes;
    int64_t liveBytes = 0, inFlight = 0;
    std::set<int64_t> reduced; // stages whose gradient ALLREDUCE ran
  };

  void error(int64_t rank, int64_t index, std::string message) {
    result_->errors.push_back({rank, index, std::move(message)});
  }

  int64_t rankOf(int64_t stage) const { return stage % p_; }

  /// A compute instruction's time; 0 for the rest, whose `stage` may be -1
  /// (the optimizer step): the stage is looked up only where it is one.
  double computeTime(int64_t rank, const Instr &instr) const {
    switch (instr.kind) {
    case OpKind::Optimizer: return optimizerTime(rank);
    case OpKind::AllReduce: return allReduceTime(instr);
    case OpKind::Forward: return spec_.stages[instr.stage].forwardTime;
    case OpKind::Backward: return spec_.stages[instr.stage].backwardTime;
    case OpKind::BackwardInput:
      return spec_.stages[instr.stage].backwardTime - spec_.stages[instr.stage].weightGradTime;
    case OpKind::BackwardWeight: return spec_.stages[instr.stage].weightGradTime;
    default: return 0;
    }
  }

  /// A ring all-reduce of the rank's fp32 gradients over the gradient group
  /// (dp x cp): each link carries 2 (group - 1) / group of them, a
  /// reduce-scatter (the distributed optimizer's) half that (free when
  /// communication is).
  double allReduceTime(const Instr &instr) const {
    if (spec_.linkBytesPerTime <= 0 || schedule_.reduceGroup() < 2)
      return 0;
    const double group = double(schedule_.reduceGroup());
    const double passes = instr.collective == runtime::CollectiveOp::ReduceScatter ? 1.0 : 2.0;
    const double bytes = passes * (group - 1) / group * double(instr.width) * 4.0;
    return bytes / spec_.linkBytesPerTime + passes * (group - 1) * spec_.linkLatency;
  }

  /// AdamW over the parameters of rank r's stages (ms); on a shared host
  /// (the CPU backend) one update of every parameter that all ranks wait for.
  /// The rank's update; under the distributed optimizer its part of it
  /// (1 / group) and the all-gather of the updated parts (each link
  /// carrying (group - 1) / group of the weights, at the activations'
  /// element size: a bf16 model gathers its bf16 copies).
  double optimizerTime(int64_t r) const {
    int64_t params = 0;
    for (size_t s = spec_.sharedCores > 0 ? 0 : r; s < spec_.stages.size(); s += spec_.sharedCores > 0 ? 1 : p_)
      params += spec_.stages[s].params;
    const double group = double(schedule_.reduceGroup());
    if (!schedule_.distributedOptimizer || group < 2)
      return params * spec_.optimizerNsPerParam * 1e-6;
    double gather = 0;
    if (spec_.linkBytesPerTime > 0)
      gather = (group - 1) / group * double(params) * double(spec_.elementBytes) / spec_.linkBytesPerTime +
               (group - 1) * spec_.linkLatency;
    return params / group * spec_.optimizerNsPerParam * 1e-6 + gather;
  }

  int64_t messageBytes(const Instr &instr) const {
    return instr.tokens * instr.width * boundaryElementBytes(std::min(instr.srcStage, instr.dstStage));
  }

  int64_t boundaryElementBytes(int64_t stage) const {
    int64_t bytes = spec_.stages[stage].outputElementBytes;
    return bytes > 0 ? bytes : spec_.elementBytes;
  }

  void track(int64_t r, int64_t delta) {
    RankState &st = ranks_[r];
    st.liveBytes += delta;
    result_->peakBytes[r] = std::max(result_->peakBytes[r], st.liveBytes);
  }

  /// Moves rank r's communication streams and host as far as they can go;
  /// returns whether anything moved.
  bool advance(int64_t r) {
    RankState &st = ranks_[r];
    const auto &list = schedule_.ranks[r];
    bool moved = false;
    for (bool again = true; again && result_->errors.empty();) {
      again = progressStreams(r);
      moved |= again;
      if (st.waitingOnGroup >= 0) {
        double done = st.clock;
        bool complete = true;
        for (int64_t i = st.waitingOnGroup; i < st.pc && complete; ++i)
          if (list[i].kind == OpKind::Recv) {
            complete = complete_[r][i] >= 0;
            done = std::max(done, complete_[r][i]);
          }
        if (!complete)
          continue; // the host waits for the receives of its last group
        st.clock = done;
        st.waitingOnGroup = -1;
        again = moved = true;
      }
      if (st.pc >= static_cast<int64_t>(list.size()))
        continue;
      const Instr &instr = list[st.pc];
      if (instr.isComm()) {
        int64_t begin = st.pc, end = st.pc;
        bool receives = false;
        while (end < static_cast<int64_t>(list.size()) && list[end].isComm() &&
               list[end].group == instr.group) {
          receives |= list[end].kind == OpKind::Recv;
          const Instr &op = list[end];
          if (op.kind == OpKind::Send && op.payload == Payload::Activation &&
              st.freeRequested.count({op.srcStage, op.mb})) {
            error(r, end, op.describe() + ": use after FREE of out(s" +
                              std::to_string(op.srcStage) + ",mb" + std::to_string(op.mb) + ")");
            return moved;
          }
          st.streams[{list[end].peer, list[end].kind == OpKind::Send}].push_back({end, st.clock, false});
          ++end;
        }
        st.pc = end;
        if (receives)
          st.waitingOnGroup = begin;
        again = moved = true;
        continue;
      }
      execute(r, st.pc);
      ++st.pc;
      again = moved = true;
    }
    return moved;
  }

  /// Whether out(key)'s send is queued on one of rank r's streams.
  bool sendQueued(int64_t r, std::pair<int64_t, int64_t> key) const {
    const auto &list = schedule_.ranks[r];
    for (const auto &[id, queue] : ranks_[r].streams)
      for (const StreamOp &op : queue) {
        const Instr &i = list[op.index];
        if (i.kind == OpKind::Send && i.payload == Payload::Activation &&
            i.srcStage == key.first && i.mb == key.second)
          return true;
      }
    return false;
  }

  /// One stream per peer and direction (a communicator per directed pair,
  /// as NCCL P2P is used here): its operations run in issue order; each is
  /// posted once the host issued it and the one before it completed.
  bool progressStreams(int64_t r) {
    RankState &st = ranks_[r];
    bool moved = false;
    for (auto &[id, queue] : st.streams) {
      double &free = st.streamFree[id];
      while (!queue.empty() && result_->errors.empty()) {
        StreamOp &op = queue.front();
        if (!op.posted) {
          op.posted = true;
          moved = true;
          post(r, op.index, std::max(op.reached, free));
          if (!result_->errors.empty())
            return moved;
        }
        double done = complete_[r][op.index];
        if (done < 0)
          break;
        result_->timeline[r][op.index] = {std::max(op.reached, free), done};
        finishComm(r, op.index, done);
        free = done;
        queue.pop_front();
        moved = true;
      }
    }
    return moved;
  }

  void post(int64_t r, int64_t index, double time) {
    const Instr &instr = schedule_.ranks[r][index];
    RankState &st = ranks_[r];
    if (instr.peer < 0 || instr.peer >= p_ || instr.peer == r) {
      error(r, index, instr.describe() + ": invalid peer");
      return;
    }
    if (instr.kind == OpKind::Send) {
      std::pair<int64_t, int64_t> key{instr.srcStage, instr.mb};
      bool ready = instr.payload == Payload::Activation ? st.fwd.count(key) : st.bwd.count(key);
      if (!ready) {
        error(r, index, instr.describe() + ": sends a tensor this rank has not computed yet");
        return;
      }
      if (instr.payload == Payload::Activation && !st.outLive.count(key)) {
        error(r, index, instr.describe() + ": use after FREE of out(s" +
                            std::to_string(instr.srcStage) + ",mb" + std::to_string(instr.mb) + ")");
        return;
      }
      sends_[{r, instr.peer}].push_back({r, index, time});
    } else {
      if (instr.payload == Payload::Activation) {
        // The receive buffer lives until the backward that needs it.
        int64_t bytes = messageBytes(instr);
        st.inBytes[{instr.dstStage, instr.mb}] += bytes;
        track(r, bytes);
      }
      recvs_[{instr.peer, r}].push_back({r, index, time});
    }
    match(instr.kind == OpKind::Send ? r : instr.peer, instr.kind == OpKind::Send ? instr.peer : r);
  }

  void match(int64_t from, int64_t to) {
    auto &sendQueue = sends_[{from, to}];
    auto &recvQueue = recvs_[{from, to}];
    while (!sendQueue.empty() && !recvQueue.empty()) {
      Posted send = sendQueue.front(), recv = recvQueue.front();
      sendQueue.pop_front();
      recvQueue.pop_front();
      const Instr &s = schedule_.ranks[send.rank][send.index];
      const Instr &q = schedule_.ranks[recv.rank][recv.index];
      MessageId sent{s.payload, s.srcStage, s.dstStage, s.mb};
      MessageId expected{q.payload, q.srcStage, q.dstStage, q.mb};
      if (!(sent == expected)) {
        error(recv.rank, recv.index,
              q.describe() + " (#" + std::to_string(recv.index) + ", order " +
                  std::to_string(q.order) + " from r" + std::to_string(from) +
                  ") would receive " + s.describe() + " (rank " + std::to_string(from) +
                  " #" + std::to_string(send.index) + ", order " + std::to_string(s.order) +
                  "): message order differs between the two ends" +
                  (s.tokens == q.tokens && s.width == q.width
                       ? "; the shapes are equal, so it would go unnoticed at run time"
                       : ""));
        return;
      }
      if (s.tokens != q.tokens || s.width != q.width) {
        error(recv.rank, recv.index,
              "shape mismatch: " + q.describe() + " expects [" + std::to_string(q.tokens) +
                  "x" + std::to_string(q.width) + "] but rank " + std::to_string(from) +
                  " #" + std::to_string(send.index) + " sends [" + std::to_string(s.tokens) +
                  "x" + std::to_string(s.width) + "]");
        return;
      }
      double bandwidth = spec_.linkBytesPerTime;
      double transfer = (bandwidth > 0 ? messageBytes(s) / bandwidth : 0) + spec_.linkLatency;
      double done = std::max(send.time, recv.time) + transfer;
      complete_[send.rank][send.index] = done;
      complete_[recv.rank][recv.index] = done;
    }
  }

  void finishComm(int64_t r, int64_t index, double time) {
    const Instr &instr = schedule_.ranks[r][index];
    RankState &st = ranks_[r];
    std::pair<int64_t, int64_t> key{instr.kind == OpKind::Send ? instr.srcStage : instr.dstStage,
                                    instr.mb};
    if (instr.kind == OpKind::Send) {
      if (instr.payload == Payload::Activation) {
        st.sendDone[key] = time;
        if (st.freeRequested.count(key))
          releaseOutput(r, key);
      }
    } else if (instr.payload == Payload::Activation) {
      st.actIn.insert(key);
    } else {
      st.gradIn.insert(key);
    }
  }

  void execute(int64_t r, int64_t index) {
    const Instr &instr = schedule_.ranks[r][index];
    RankState &st = ranks_[r];
    std::pair<int64_t, int64_t> key{instr.stage, instr.mb};
    auto fail = [&](const std::string &why) { error(r, index, instr.describe() + ": " + why); };
    if (instr.isCompute() && (instr.stage < 0 || instr.stage >= stages_ || rankOf(instr.stage) != r ||
                              instr.mb < 0 || instr.mb >= schedule_.microbatches))
      return fail("stage or microbatch does not belong to this rank");
    const StageSpec *stage = instr.isCompute() ? &spec_.stages[instr.stage] : nullptr;
    switch (instr.kind) {
    case OpKind::Forward: {
      if (st.fwd.count(key))
        return fail("runs twice");
      int64_t s = instr.stage;
      bool localInput = s > 0 && rankOf(s - 1) == r;
      if (s > 0 && !(localInput ? st.fwd.count({s - 1, instr.mb}) : st.actIn.count(key)))
        return fail("its input activation has not arrived");
      st.fwd.insert(key);
      ++st.inFlight;
      result_->peakInFlight[r] = std::max(result_->peakInFlight[r], st.inFlight);
      track(r, stage->savedBytes);
      if (s < stages_ - 1) {
        int64_t out = spec_.tokens * stage->outputWidth * boundaryElementBytes(s);
        if (rankOf(s + 1) == r) {
          st.inBytes[{s + 1, instr.mb}] += out; // handed to the next chunk in place
        } else {
          st.outLive.insert(key);
        }
        track(r, out);
      }
      break;
    }
    case OpKind::Backward:
    case OpKind::BackwardInput: {
      if (!st.fwd.count(key))
        return fail("runs before its FWD");
      if (st.bwd.count(key))
        return fail("runs twice");
      int64_t s = instr.stage;
      bool localGrad = s < stages_ - 1 && rankOf(s + 1) == r;
      if (s < stages_ - 1 && !(localGrad ? st.bwd.count({s + 1, instr.mb}) : st.gradIn.count(key)))
        return fail("its output gradient has not arrived");
      st.bwd.insert(key);
      if (instr.kind == OpKind::Backward) {
        // Recomputed segment by segment, each released as it is read.
        track(r, stage->recomputeWorkingBytes);
        track(r, -stage->recomputeWorkingBytes);
        release(r, key, stage);
      } else {
        track(r, stage->recomputedBytes); // W reads what B recomputed
      }
      break;
    }
    case OpKind::BackwardWeight:
      if (!st.bwd.count(key))
        return fail("runs before its B");
      if (st.wgrad.count(key))
        return fail("runs twice");
      st.wgrad.insert(key);
      release(r, key, stage);
      break;
    case OpKind::Free: {
      // Pseudo-deallocation does not block the host: the buffer is released
      // when its send completes (at once if it already has).
      if (!st.outLive.count(key) || st.freeRequested.count(key))
        return fail("frees a buffer that is not live (double FREE or never produced)");
      bool sent = st.sendDone.count(key);
      if (!sent && !sendQueued(r, key))
        return fail("frees out(s" + std::to_string(instr.stage) + ",mb" +
                    std::to_string(instr.mb) + ") before its send was issued");
      st.freeRequested.insert(key);
      if (sent)
        releaseOutput(r, key);
      break;
    }
    case OpKind::AllReduce: {
      if (schedule_.reduceGroup() < 2)
        return fail("an ALLREDUCE in a schedule without data or context parallelism (dp = cp = 1)");
      const int64_t s = instr.stage;
      if (s < 0 || s >= stages_ || rankOf(s) != r)
        return fail("ALLREDUCE of stage " + std::to_string(s) + ", which is not one of this rank's");
      if (st.reduced.count(s))
        return fail("a second ALLREDUCE of stage " + std::to_string(s));
      if (instr.width != spec_.stages[s].params)
        return fail("ALLREDUCE of " + std::to_string(instr.width) + " floats, but stage " + std::to_string(s) +
                    " holds " + std::to_string(spec_.stages[s].params) + " gradient floats");
      // The group sums every microbatch's gradient of the stage: none of its
      // backwards may run after it.
      const bool split = schedule_.kind == ScheduleKind::ZeroBubbleH1;
      for (int64_t mb = 0; mb < schedule_.microbatches; ++mb)
        if (!st.bwd.count({s, mb}) || (split && !st.wgrad.count({s, mb})))
          return fail("ALLREDUCE before the " + std::string(split ? "W" : "backward") + " of (s" +
                      std::to_string(s) + ",mb" + std::to_string(mb) + "): the replicas would sum "
                      "gradients that are not complete");
      st.reduced.insert(s);
      break;
    }
    case OpKind::Optimizer:
      break;
    default:
      break;
    }
    // Busy counts the work (the rank's time alone); the stretch of a shared
    // host is time spent waiting for a core, idle as the runtime measures it
    // (its primitives' wall time starts once the rank runs).
    const double work = computeTime(r, instr);
    const double duration = work * (stretch_ && instr.isCompute() ? (*stretch_)[r][index] : 1.0);
    result_->timeline[r][index] = {st.clock, st.clock + duration};
    st.clock += duration;
    result_->busy[r] += work;
  }

  void releaseOutput(int64_t r, std::pair<int64_t, int64_t> key) {
    RankState &st = ranks_[r];
    if (st.outLive.erase(key))
      track(r, -spec_.tokens * spec_.stages[key.first].outputWidth * boundaryElementBytes(key.first));
  }

  /// The microbatch's backward is complete on this stage: its saved
  /// activations and received input go.
  void release(int64_t r, std::pair<int64_t, int64_t> key, const StageSpec *stage) {
    RankState &st = ranks_[r];
    --st.inFlight;
    int64_t freed = stage->savedBytes + (schedule_.kind == ScheduleKind::ZeroBubbleH1 ? stage->recomputedBytes : 0);
    auto it = st.inBytes.find(key);
    if (it != st.inBytes.end()) {
      freed += it->second;
      st.inBytes.erase(it);
    }
    track(r, -freed);
  }

  void checkCompleteness() {
    bool split = schedule_.kind == ScheduleKind::ZeroBubbleH1;
    for (int64_t r = 0; r < p_; ++r) {
      const RankState &st = ranks_[r];
      const auto &list = schedule_.ranks[r];
      for (int64_t s = r; s < stages_; s += p_)
        for (int64_t mb = 0; mb < schedule_.microbatches; ++mb) {
          std::string what = "(s" + std::to_string(s) + ",mb" + std::to_string(mb) + ")";
          if (!st.fwd.count({s, mb}))
            error(r, -1, "never runs FWD" + what);
          else if (!st.bwd.count({s, mb}))
            error(r, -1, "never runs the backward of " + what);
          else if (split && !st.wgrad.count({s, mb}))
            error(r, -1, "never runs W" + what);
        }
      if (list.empty() || list.back().kind != OpKind::Optimizer)
        error(r, static_cast<int64_t>(list.size()) - 1, "the list must end with OPTIM");
      if (schedule_.reduceGroup() > 1)
        for (int64_t s = r; s < stages_; s += p_)
          if (spec_.stages[s].params > 0 && !st.reduced.count(s))
            error(r, -1, "never reduces stage " + std::to_string(s) + "'s gradients; with dp x cp = " +
                             std::to_string(schedule_.reduceGroup()) +
                             " every stage's are summed over the group once, after its last backward, before OPTIM");
    }
  }

  const Schedule &schedule_;
  const ScheduleSpec &spec_;
  int64_t p_, stages_;
  const std::vector<std::vector<double>> *stretch_;
  std::vector<RankState> ranks_;
  std::vector<std::vector<double>> complete_;
  std::map<std::pair<int64_t, int64_t>, std::deque<Posted>> sends_, recvs_;
  SimulationResult *result_ = nullptr;
};

} // namespace

SimulationResult simulateSchedule(const Schedule &schedule, const ScheduleSpec &spec) {
  SimulationResult result = Simulator(schedule, spec, nullptr).run();
  const int64_t hostRanks = schedule.dp * schedule.cp * schedule.tp;
  if (spec.sharedCores <= 0 || schedule.pp * hostRanks <= spec.sharedCores || !result.errors.empty())
    return result;
  // An instruction that got a share f of a core over its interval takes its
  // work / f. The first update takes that at once (deep pipelines settle
  // there); later ones are damped, half the old stretch and half the new,
  // since the plain update can swing between two overlaps (PP8 1F1B does).
  std::vector<std::vector<double>> stretch(schedule.pp);
  for (int64_t r = 0; r < schedule.pp; ++r)
    stretch[r].assign(schedule.ranks[r].size(), 1.0);
  for (int iteration = 0; iteration < kSharingIterations; ++iteration) {
    const std::vector<std::vector<double>> shares = coreShares(schedule, result, spec.sharedCores, hostRanks);
    for (int64_t r = 0; r < schedule.pp; ++r)
      for (size_t i = 0; i < stretch[r].size(); ++i)
        stretch[r][i] = iteration == 0 ? 1.0 / shares[r][i] : 0.5 * (stretch[r][i] + 1.0 / shares[r][i]);
    SimulationResult next = Simulator(schedule, spec, &stretch).run();
    const bool settled = std::abs(next.makespan - result.makespan) <= kSharingTolerance * result.makespan;
    result = std::move(next);
    if (settled)
      break;
  }
  return result;
}

std::string formatTimeline(const Schedule &schedule, const SimulationResult &result) {
  std::ostringstream os;
  const int columns = 96;
  double scale = result.makespan > 0 ? columns / result.makespan : 0;
  os << "schedule " << scheduleKindName(schedule.kind) << ": p = " << schedule.pp
     << ", v = " << schedule.vpp << ", m = " << schedule.microbatches;
  if (schedule.kind == ScheduleKind::Interleaved)
    os << ", g = " << schedule.groupSize;
  os << "\n";
  bool chunks = schedule.vpp > 1;
  os << "timeline (" << columns << " columns = " << result.makespan << " ms; "
     << (chunks ? "forward = chunk digit 0-9, backward = chunk letter a-j"
                : "F forward, B backward, b input gradient, W weight gradient")
     << ", . idle):\n";
  for (int64_t r = 0; r < schedule.pp; ++r) {
    std::string line(columns, '.');
    const auto &list = schedule.ranks[r];
    for (size_t i = 0; i < list.size(); ++i) {
      const Instr &instr = list[i];
      if (!instr.isCompute())
        continue;
      const TimedInstr &t = result.timeline[r][i];
      int from = static_cast<int>(std::floor(t.start * scale + 1e-9));
      int to = std::max(from + 1, static_cast<int>(std::floor(t.end * scale + 1e-9)));
      int chunk = static_cast<int>((instr.stage / schedule.pp) % 10);
      char mark;
      if (chunks)
        mark = instr.kind == OpKind::Forward ? static_cast<char>('0' + chunk)
                                             : static_cast<char>('a' + chunk);
      else
        mark = instr.kind == OpKind::Forward ? 'F'
               : instr.kind == OpKind::Backward ? 'B'
               : instr.kind == OpKind::BackwardInput ? 'b' : 'W';
      for (int c = from; c < to && c < columns; ++c)
        line[c] = mark;
    }
    os << "  rank " << r << " |" << line << "|\n";
  }
  os << "predicted bubble fraction (idle time / (ranks x makespan)): " << result.bubbleFraction
     << "; overhead over the busiest rank's compute: " << result.bubbleOverhead << "\n";
  for (int64_t r = 0; r < schedule.pp; ++r)
    os << "  rank " << r << ": idle " << result.rankBubbleFraction[r] << " of the step, peak activations "
       << humanBytes(result.peakBytes[r])
       << ", at most " << result.peakInFlight[r] << " microbatch-stages in flight, "
       << schedule.ranks[r].size() << " instructions\n";
  return os.str();
}

std::string predictedTrace(const Schedule &schedule, const SimulationResult &result) {
  std::vector<runtime::TraceSlice> slices;
  for (int64_t r = 0; r < schedule.pp; ++r)
    for (size_t i = 0; i < schedule.ranks[r].size(); ++i) {
      const runtime::Instr &instr = schedule.ranks[r][i];
      if (instr.kind == OpKind::Collective)
        continue; // issued inside the step before it, whose slice holds its time (as mhcrun --trace measures)
      const TimedInstr &t = result.timeline[r][i];
      // The simulator's times are milliseconds; trace events count microseconds.
      slices.push_back({r, instr.describe(), runtime::traceCategory(instr.kind), t.start * 1e3,
                        (t.end - t.start) * 1e3, 0});
    }
  return runtime::chromeTrace(slices, schedule.pp, "predicted by mhcc");
}

} // namespace mhcc::pipeline
