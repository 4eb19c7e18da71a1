//===- Schedule.cpp - static per-rank pipeline schedules --------------------===//
#include "passes/pipeline/Schedule.h"

#include "passes/CostModel.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

namespace mhcc::pipeline {

const char *scheduleKindName(ScheduleKind kind) {
  switch (kind) {
  case ScheduleKind::GPipe: return "gpipe";
  case ScheduleKind::OneFOneB: return "1f1b";
  case ScheduleKind::Interleaved: return "interleaved";
  case ScheduleKind::ZeroBubbleH1: return "zb-h1";
  }
  return "?";
}

std::optional<ScheduleKind> parseScheduleKind(const std::string &name) {
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB,
                            ScheduleKind::Interleaved, ScheduleKind::ZeroBubbleH1})
    if (name == scheduleKindName(kind))
      return kind;
  return std::nullopt;
}

namespace {

struct ComputeStep {
  OpKind kind;
  int64_t stage;
  int64_t mb;
  /// No communication point after this step: its sends and the next step's
  /// receives join the group after the next step (Megatron's interleaved
  /// steady state runs F then B and exchanges everything in one batch).
  bool fusedWithNext = false;
};

/// Megatron's interleaved order: microbatches in groups of g; within a group
/// every chunk in turn. Entry k is the k-th virtual microbatch's (mb, chunk).
std::vector<std::pair<int64_t, int64_t>> interleavedTable(int64_t m, int64_t v, int64_t g) {
  std::vector<std::pair<int64_t, int64_t>> table;
  for (int64_t start = 0; start < m; start += g) {
    int64_t end = start + g >= m ? m : start + g;
    for (int64_t chunk = 0; chunk < v; ++chunk)
      for (int64_t mb = start; mb < end; ++mb)
        table.push_back({mb, chunk});
    if (end == m)
      break;
  }
  return table;
}

std::vector<ComputeStep> computeOrder(const ScheduleSpec &spec, int64_t g, int64_t rank) {
  const int64_t p = spec.pp, v = spec.vpp, m = spec.microbatches;
  std::vector<ComputeStep> steps;
  auto F = [&](int64_t stage, int64_t mb) { steps.push_back({OpKind::Forward, stage, mb}); };
  auto B = [&](OpKind kind, int64_t stage, int64_t mb) { steps.push_back({kind, stage, mb}); };
  switch (spec.kind) {
  case ScheduleKind::GPipe:
    for (int64_t mb = 0; mb < m; ++mb)
      F(rank, mb);
    for (int64_t mb = 0; mb < m; ++mb)
      B(OpKind::Backward, rank, mb);
    break;
  case ScheduleKind::OneFOneB:
  case ScheduleKind::ZeroBubbleH1: {
    bool split = spec.kind == ScheduleKind::ZeroBubbleH1;
    OpKind backward = split ? OpKind::BackwardInput : OpKind::Backward;
    // ZB-H1 keeps 1F1B's F and B order and delays each W by `rank` B's, so
    // the W's fill the drain bubble while in-flight work stays at p.
    int64_t delay = rank, nextW = 0;
    auto emitB = [&](int64_t mb) {
      B(backward, rank, mb);
      if (split && mb - delay >= 0)
        B(OpKind::BackwardWeight, rank, nextW++);
    };
    int64_t warmup = std::min(p - rank - 1, m);
    for (int64_t mb = 0; mb < warmup; ++mb)
      F(rank, mb);
    for (int64_t i = 0; i < m - warmup; ++i) {
      F(rank, warmup + i);
      emitB(i);
    }
    for (int64_t mb = m - warmup; mb < m; ++mb)
      emitB(mb);
    while (split && nextW < m)
      B(OpKind::BackwardWeight, rank, nextW++);
    break;
  }
  case ScheduleKind::Interleaved: {
    auto table = interleavedTable(m, v, g);
    int64_t total = m * v;
    int64_t warmup = std::min((p - rank - 1) * 2 + (v - 1) * g, total);
    auto fwd = [&](int64_t k) { F(table[k].second * p + rank, table[k].first); };
    auto bwd = [&](int64_t k) {
      B(OpKind::Backward, (v - 1 - table[k].second) * p + rank, table[k].first);
    };
    for (int64_t k = 0; k < warmup; ++k)
      fwd(k);
    for (int64_t k = 0; k < total - warmup; ++k) {
      fwd(warmup + k);
      steps.back().fusedWithNext = true;
      bwd(k);
    }
    for (int64_t k = total - warmup; k < total; ++k)
      bwd(k);
    break;
  }
  }
  return steps;
}

/// Sort key inside one group, the fixed order that keeps both ends of every
/// peer pair in step: sends to next, sends to prev, receives from prev,
/// receives from next. (With p = 2 next and prev are the same peer.)
int commRank(const Instr &instr) {
  bool send = instr.kind == OpKind::Send;
  bool act = instr.payload == Payload::Activation;
  if (send)
    return act ? 0 : 1;
  return act ? 2 : 3;
}

/// Makes every rank receive from each peer in the order that peer sends
/// (NCCL matches a directed pair's messages in issue order). Within a group,
/// receives from one peer are sorted by the sender's order; and when a group
/// needs a message that the sender issues after others this rank receives
/// only in later groups, those receives are pulled forward into the group
/// (prefetched into their buffers early). With p = 2 the previous and next
/// rank are one peer, and a fixed rule such as "activations before
/// gradients" can contradict the sender's order; the sender's order cannot.
void alignReceivesToSenders(Schedule &schedule) {
  using MessageKey = std::tuple<int, int64_t, int64_t, int64_t>;
  auto id = [](const Instr &i) {
    return MessageKey(static_cast<int>(i.payload), i.srcStage, i.dstStage, i.mb);
  };
  const int64_t p = schedule.pp;
  // sendIndex[{from, to}][message] = position in from's FIFO to `to`.
  std::map<std::pair<int64_t, int64_t>, std::map<MessageKey, int64_t>> sendIndex;
  for (int64_t r = 0; r < p; ++r) {
    std::map<int64_t, int64_t> counter;
    for (const Instr &instr : schedule.ranks[r])
      if (instr.kind == OpKind::Send)
        sendIndex[{r, instr.peer}][id(instr)] = counter[instr.peer]++;
  }
  for (int64_t r = 0; r < p; ++r) {
    std::vector<Instr> &list = schedule.ranks[r];
    auto senderIndex = [&](const Instr &recv) -> int64_t {
      auto &index = sendIndex[{recv.peer, r}];
      auto it = index.find(id(recv));
      return it == index.end() ? -1 : it->second;
    };
    std::vector<bool> taken(list.size(), false);
    std::map<int64_t, int64_t> nextFromPeer;
    std::vector<Instr> out;
    for (size_t begin = 0; begin < list.size();) {
      if (taken[begin]) {
        ++begin;
        continue;
      }
      if (!list[begin].isComm()) {
        out.push_back(list[begin++]);
        continue;
      }
      size_t end = begin;
      while (end < list.size() && list[end].isComm() && list[end].group == list[begin].group)
        ++end;
      std::vector<Instr> sends, recvs;
      std::map<int64_t, int64_t> highest; // per peer, the latest message needed
      for (size_t i = begin; i < end; ++i) {
        if (taken[i])
          continue;
        taken[i] = true;
        (list[i].kind == OpKind::Send ? sends : recvs).push_back(list[i]);
        if (list[i].kind == OpKind::Recv)
          highest[list[i].peer] = std::max(highest[list[i].peer], senderIndex(list[i]));
      }
      // Prefetch the receives the sender issues before the latest one needed.
      for (size_t i = end; i < list.size(); ++i) {
        const Instr &later = list[i];
        if (taken[i] || later.kind != OpKind::Recv || !highest.count(later.peer))
          continue;
        int64_t k = senderIndex(later);
        if (k >= 0 && k < highest[later.peer]) {
          Instr moved = later;
          moved.group = list[begin].group;
          recvs.push_back(moved);
          taken[i] = true;
        }
      }
      std::stable_sort(recvs.begin(), recvs.end(), [&](const Instr &a, const Instr &b) {
        if (a.peer != b.peer)
          return a.peer < b.peer;
        return senderIndex(a) < senderIndex(b);
      });
      out.insert(out.end(), sends.begin(), sends.end());
      out.insert(out.end(), recvs.begin(), recvs.end());
      begin = end;
    }
    list = std::move(out);
  }
}

} // namespace

std::optional<std::string> checkScheduleShape(ScheduleKind kind, int64_t p, int64_t v, int64_t m,
                                              int64_t groupSize) {
  if (p < 1 || v < 1 || m < 1)
    return std::string("--pp, --vpp and --microbatches must be at least 1");
  if (kind != ScheduleKind::Interleaved && v > 1)
    return std::string("the ") + scheduleKindName(kind) +
           " schedule runs one chunk per rank; with --vpp " + std::to_string(v) +
           " use --schedule interleaved";
  if (kind != ScheduleKind::Interleaved)
    return std::nullopt;
  const int64_t g = groupSize > 0 ? groupSize : p;
  if (m < p)
    return "interleaved 1F1B needs at least p = " + std::to_string(p) + " microbatches, got " +
           std::to_string(m);
  if (g < p || g > m)
    return "the microbatch group size g = " + std::to_string(g) +
           " must satisfy p <= g <= m (p = " + std::to_string(p) + ", m = " + std::to_string(m) +
           ")";
  if (m % g != 0 && m % g < p)
    return "m % g = " + std::to_string(m % g) + " (m = " + std::to_string(m) +
           ", g = " + std::to_string(g) + ") must be 0 or at least p = " + std::to_string(p) +
           ": the last, partial group would leave a stage waiting on a microbatch that is not "
           "in flight";
  return std::nullopt;
}

std::optional<Schedule> buildSchedule(const ScheduleSpec &spec, std::string &error) {
  const int64_t p = spec.pp, v = spec.vpp, m = spec.microbatches;
  const int64_t stages = p * v;
  if (std::optional<std::string> problem =
          checkScheduleShape(spec.kind, p, v, m, spec.groupSize)) {
    error = *problem;
    return std::nullopt;
  }
  if (static_cast<int64_t>(spec.stages.size()) != stages) {
    error = "internal: " + std::to_string(spec.stages.size()) + " stage costs for " +
            std::to_string(stages) + " virtual stages";
    return std::nullopt;
  }
  const int64_t g = spec.groupSize > 0 ? spec.groupSize : p;

  Schedule schedule;
  schedule.kind = spec.kind;
  schedule.pp = p;
  schedule.vpp = v;
  schedule.microbatches = m;
  schedule.groupSize = spec.kind == ScheduleKind::Interleaved ? g : 0;
  schedule.ranks.resize(p);
  auto rankOf = [&](int64_t stage) { return stage % p; };

  for (int64_t r = 0; r < p; ++r) {
    std::vector<Instr> &list = schedule.ranks[r];
    std::vector<Instr> pending; // comms between two compute steps: one group
    std::vector<Instr> pendingFrees;
    int64_t groupId = 0;
    auto flush = [&]() {
      if (!pending.empty()) {
        std::stable_sort(pending.begin(), pending.end(),
                         [](const Instr &a, const Instr &b) { return commRank(a) < commRank(b); });
        for (Instr &instr : pending) {
          instr.group = groupId;
          list.push_back(instr);
        }
        ++groupId;
        pending.clear();
      }
      for (Instr &free : pendingFrees)
        list.push_back(free);
      pendingFrees.clear();
    };
    auto message = [&](OpKind kind, Payload payload, int64_t src, int64_t dst, int64_t mb) {
      Instr instr;
      instr.kind = kind;
      instr.payload = payload;
      instr.srcStage = src;
      instr.dstStage = dst;
      instr.stage = kind == OpKind::Send ? src : dst;
      instr.mb = mb;
      instr.peer = rankOf(kind == OpKind::Send ? dst : src);
      instr.tokens = spec.tokens;
      // Both directions of an edge carry the boundary's width.
      instr.width = spec.stages[std::min(src, dst)].outputWidth;
      pending.push_back(instr);
    };
    // Receives for a step are posted at the communication point before it,
    // sends at the one after it; a point is between two steps unless the
    // first is fused with the second, so a fused pair's receives are
    // prefetched one point early, as Megatron's batched exchange does.
    std::vector<ComputeStep> steps = computeOrder(spec, g, r);
    auto postReceives = [&](const ComputeStep &step) {
      int64_t s = step.stage;
      if (step.kind == OpKind::Forward && s > 0 && rankOf(s - 1) != r)
        message(OpKind::Recv, Payload::Activation, s - 1, s, step.mb);
      if ((step.kind == OpKind::Backward || step.kind == OpKind::BackwardInput) &&
          s < stages - 1 && rankOf(s + 1) != r)
        message(OpKind::Recv, Payload::Gradient, s + 1, s, step.mb);
    };
    auto postSends = [&](const ComputeStep &step) {
      int64_t s = step.stage;
      if (step.kind == OpKind::Forward && s < stages - 1 && rankOf(s + 1) != r) {
        message(OpKind::Send, Payload::Activation, s, s + 1, step.mb);
        Instr free;
        free.kind = OpKind::Free;
        free.stage = s;
        free.mb = step.mb;
        pendingFrees.push_back(free);
      }
      if ((step.kind == OpKind::Backward || step.kind == OpKind::BackwardInput) && s > 0 &&
          rankOf(s - 1) != r)
        message(OpKind::Send, Payload::Gradient, s, s - 1, step.mb);
    };
    size_t next = 0; // first step whose receives are not posted yet
    auto prefetchUntil = [&](size_t last) {
      for (; next <= last && next < steps.size(); ++next)
        postReceives(steps[next]);
    };
    prefetchUntil(0);
    for (size_t i = 0; i < steps.size(); ++i) {
      if (i == 0 || !steps[i - 1].fusedWithNext) {
        prefetchUntil(steps[i].fusedWithNext ? i + 1 : i);
        flush();
      }
      Instr compute;
      compute.kind = steps[i].kind;
      compute.stage = steps[i].stage;
      compute.mb = steps[i].mb;
      list.push_back(compute);
      postSends(steps[i]);
    }
    flush();
    Instr optim;
    optim.kind = OpKind::Optimizer;
    list.push_back(optim);

  }
  alignReceivesToSenders(schedule);
  // Order keys: position in the FIFO to (or from) each peer.
  for (auto &list : schedule.ranks) {
    std::map<std::pair<int64_t, bool>, int64_t> counters;
    for (Instr &instr : list)
      if (instr.isComm())
        instr.order = counters[{instr.peer, instr.kind == OpKind::Send}]++;
  }
  return schedule;
}

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
  Simulator(const Schedule &schedule, const ScheduleSpec &spec)
      : schedule_(schedule), spec_(spec), p_(schedule.pp),
        stages_(schedule.pp * schedule.vpp) {}

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
  };

  void error(int64_t rank, int64_t index, std::string message) {
    result_->errors.push_back({rank, index, std::move(message)});
  }

  int64_t rankOf(int64_t stage) const { return stage % p_; }

  double computeTime(const Instr &instr) const {
    const StageSpec &s = spec_.stages[instr.stage];
    switch (instr.kind) {
    case OpKind::Forward: return s.forwardTime;
    case OpKind::Backward: return s.backwardTime;
    case OpKind::BackwardInput: return s.backwardTime - s.weightGradTime;
    case OpKind::BackwardWeight: return s.weightGradTime;
    default: return 0;
    }
  }

  int64_t messageBytes(const Instr &instr) const {
    return instr.tokens * instr.width * spec_.elementBytes;
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
      double transfer = bandwidth > 0 ? messageBytes(s) / bandwidth : 0;
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
        int64_t out = spec_.tokens * stage->outputWidth * spec_.elementBytes;
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
      if (instr.kind == OpKind::Backward)
        release(r, key, stage);
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
    case OpKind::Optimizer:
      break;
    default:
      break;
    }
    double duration = computeTime(instr);
    result_->timeline[r][index] = {st.clock, st.clock + duration};
    st.clock += duration;
    result_->busy[r] += duration;
  }

  void releaseOutput(int64_t r, std::pair<int64_t, int64_t> key) {
    RankState &st = ranks_[r];
    if (st.outLive.erase(key))
      track(r, -spec_.tokens * spec_.stages[key.first].outputWidth * spec_.elementBytes);
  }

  /// The microbatch's backward is complete on this stage: its saved
  /// activations and received input go.
  void release(int64_t r, std::pair<int64_t, int64_t> key, const StageSpec *stage) {
    RankState &st = ranks_[r];
    --st.inFlight;
    int64_t freed = stage->savedBytes;
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
    }
  }

  const Schedule &schedule_;
  const ScheduleSpec &spec_;
  int64_t p_, stages_;
  std::vector<RankState> ranks_;
  std::vector<std::vector<double>> complete_;
  std::map<std::pair<int64_t, int64_t>, std::deque<Posted>> sends_, recvs_;
  SimulationResult *result_ = nullptr;
};

} // namespace

SimulationResult simulateSchedule(const Schedule &schedule, const ScheduleSpec &spec) {
  return Simulator(schedule, spec).run();
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

} // namespace mhcc::pipeline
