//===- Schedule.cpp - static per-rank pipeline schedules --------------------===//
#include "passes/pipeline/Schedule.h"
#include "runtime/program/Collectives.h"

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
    // Receives not yet placed, per peer, by the sender's FIFO position: the
    // prefetch below takes a prefix of each, so the whole pass stays
    // O(L log L) for a list of L instructions.
    std::map<int64_t, std::map<int64_t, size_t>> pending;
    for (size_t i = 0; i < list.size(); ++i)
      if (list[i].kind == OpKind::Recv)
        if (int64_t k = senderIndex(list[i]); k >= 0)
          pending[list[i].peer][k] = i;
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
      // Prefetch the receives the sender issues before the latest one needed
      // (those already placed, this group's included, just leave the queue).
      for (const auto &[peer, latest] : highest) {
        std::map<int64_t, size_t> &queue = pending[peer];
        for (auto it = queue.begin(); it != queue.end() && it->first < latest; it = queue.erase(it)) {
          const size_t i = it->second;
          if (taken[i] || i < end)
            continue;
          Instr moved = list[i];
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

const std::vector<Instr> &StageSpec::collectivesOf(OpKind step) const {
  switch (step) {
  case OpKind::Forward: return forwardCollectives;
  case OpKind::BackwardInput: return inputCollectives;
  case OpKind::BackwardWeight: return weightCollectives;
  default: return backwardCollectives;
  }
}

std::vector<ScheduleError> checkStepCollectives(const Schedule &schedule, const ScheduleSpec &spec) {
  std::vector<ScheduleError> errors;
  const int64_t stages = static_cast<int64_t>(spec.stages.size());
  for (int64_t r = 0; r < static_cast<int64_t>(schedule.ranks.size()); ++r) {
    // A step of a stage out of range is the simulation's to name.
    for (const runtime::ListedCollectiveError &e :
         runtime::checkListedCollectives(schedule.ranks[r], [&](const Instr &step) -> std::optional<std::vector<Instr>> {
           if (step.stage < 0 || step.stage >= stages)
             return std::nullopt;
           return spec.stages[step.stage].collectivesOf(step.kind);
         }))
      errors.push_back({r, static_cast<int64_t>(e.index), e.message});
  }
  return errors;
}

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

namespace {

/// Pipeline rank r's instruction list: its compute steps in the schedule's
/// order (computeOrder, groups of g under interleaving), each followed by
/// its collectives; the receives a step needs posted at the communication
/// point before it (a fused pair's one point early), its sends at the one
/// after; a stage's gradient ALLREDUCE after its last backward; then the
/// optimizer step.
std::vector<Instr> rankInstructions(const ScheduleSpec &spec, int64_t g, int64_t r) {
  const int64_t p = spec.pp, m = spec.microbatches, stages = p * spec.vpp;
  auto rankOf = [&](int64_t stage) { return stage % p; };
  std::vector<Instr> list;
  std::vector<Instr> pending; // comms between two compute steps: one group
  std::vector<Instr> pendingFrees;
  // A stage's gradient ALLREDUCE, once its last backward (W under ZB-H1)
  // ran: it follows that step's sends, so the replicas sum one model
  // chunk while the rank goes on with the others' backwards (Megatron's
  // bucketed, overlapped gradient reduction with a bucket per chunk).
  std::vector<Instr> pendingReduces;
  std::map<int64_t, int64_t> backwardsLeft;
  if (spec.dp * spec.cp > 1)
    for (int64_t s = r; s < stages; s += p)
      if (spec.stages[s].params > 0) // an empty chunk has nothing to sum
        backwardsLeft[s] = m;
  const OpKind completing = spec.kind == ScheduleKind::ZeroBubbleH1 ? OpKind::BackwardWeight : OpKind::Backward;
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
    for (Instr &reduce : pendingReduces)
      list.push_back(reduce);
    pendingReduces.clear();
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
    for (Instr c : spec.stages[compute.stage].collectivesOf(compute.kind)) {
      c.stage = compute.stage;
      c.mb = compute.mb;
      list.push_back(c);
    }
    postSends(steps[i]);
    auto left = backwardsLeft.find(compute.stage);
    if (compute.kind == completing && left != backwardsLeft.end() && --left->second == 0) {
      Instr reduce;
      reduce.kind = OpKind::AllReduce;
      reduce.collective = spec.distributedOptimizer ? runtime::CollectiveOp::ReduceScatter : runtime::CollectiveOp::AllReduce;
      reduce.stage = compute.stage;
      reduce.tokens = 1;
      reduce.width = spec.stages[compute.stage].params;
      pendingReduces.push_back(reduce);
    }
  }
  flush();
  Instr optim;
  optim.kind = OpKind::Optimizer;
  list.push_back(optim);
  return list;
}

} // namespace

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
  schedule.dp = spec.dp;
  schedule.cp = spec.cp;
  schedule.tp = spec.tp;
  schedule.sequenceParallel = spec.sequenceParallel;
  schedule.distributedOptimizer = spec.distributedOptimizer;
  schedule.recomputeSublayers = spec.recomputeSublayers;
  schedule.recomputeNumSublayers = spec.recomputeNumSublayers;
  schedule.microbatches = m;
  schedule.groupSize = spec.kind == ScheduleKind::Interleaved ? g : 0;
  schedule.ranks.resize(p);
  for (int64_t r = 0; r < p; ++r)
    schedule.ranks[r] = rankInstructions(spec, g, r);
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

} // namespace mhcc::pipeline
