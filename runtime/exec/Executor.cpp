//===- Executor.cpp - one rank's step: the instruction list, once -----------===//
#include "runtime/exec/Executor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace mhcc::runtime {
namespace {

/// MHCC_BACKWARD_RELEASE=end (docs/runtime.md, diagnostic switches): hold a
/// stage's state until its backward ends, to tell a release problem from
/// any other.
bool releaseAsRead() {
  const char *value = std::getenv("MHCC_BACKWARD_RELEASE");
  return !value || std::strcmp(value, "end") != 0;
}

} // namespace

Executor::Executor(const Artifact &artifact, const TrainOptions &options, Device &device)
    : artifact_(artifact), options_(options), device_(device), rank_(device.pipelineRank()),
      globalRank_(device.rank()), replica_(device.replica()), releaseAsRead_(releaseAsRead()) {}

bool Executor::fail(const std::string &message) {
  if (error_.empty())
    error_ = "rank " + std::to_string(globalRank_) + " " + where_ + ": " + message;
  return false;
}

void Executor::tap(const ValueInfo &info, const Buffer &buffer, int64_t mb) {
  if (!options_.recordTaps || info.tap.empty() || !buffer)
    return;
  // A copy on the device, read after the pipeline: nothing here may block
  // the host (a blocked host can deadlock the pipeline).
  Buffer copy = device_.allocate(buffer.count, buffer.dtype, Queue::compute(), false);
  if (!copy) {
    fail(device_.error());
    return;
  }
  device_.copy(copy, buffer);
  // Named by the microbatch's place in the global batch, so that taps of
  // every replica (and of a run with another dp) line up.
  reads_.push_back({info.tap + "@mb" + std::to_string(artifact_.globalMicrobatch(mb, replica_)), mb, 0, copy});
}

void Executor::tapGradients(const StageProgram &p, const StageState &st, int64_t mb) {
  // The received output gradient was recorded on arrival.
  for (size_t v = 0; v < st.values.size(); ++v)
    if (p.values[v].tap.rfind("grad:", 0) == 0 && static_cast<int>(v) != p.gradOutput)
      tap(p.values[v], st.values[v], mb);
}

const RecomputePlan &Executor::recomputePlanOf(int64_t s) {
  auto found = recomputePlans_.find(s);
  if (found != recomputePlans_.end())
    return found->second;
  const StageProgram &p = program(s);
  std::vector<size_t> spanStarts;
  for (size_t i = 0; i < p.forward.size(); i += std::max<size_t>(device_.forwardSpan(s, i), 1))
    spanStarts.push_back(i);
  return recomputePlans_[s] = recomputePlan(p, spanStarts, deviceReadsOf(s), options_.recomputeNumSublayers);
}

std::vector<std::vector<int>> Executor::deviceReadsOf(int64_t s) const {
  std::vector<std::vector<int>> reads(program(s).backward.size());
  for (size_t k = 0; k < reads.size(); ++k)
    reads[k] = device_.backwardReads(s, k);
  return reads;
}

bool Executor::recomputeFor(int64_t s, int64_t mb, StageState &st, size_t index, size_t span) {
  auto dropped = dropped_.find({s, mb});
  if (dropped == dropped_.end())
    return true;
  const RecomputePlan &plan = recomputePlanOf(s);
  const CollectiveMesh mesh = artifact_.collectiveMesh();
  for (size_t j = index; j < index + span; ++j)
    for (size_t g : plan.needs[j])
      if (dropped->second[g]) {
        // Its tp / cp collectives come between the backward's; every rank
        // of the group runs the same segment at the same point.
        const auto [begin, end] = plan.segments[g];
        std::vector<Instr> issued = stageCollectives(program(s), OpKind::Forward, mesh, begin, end);
        for (Instr &c : issued) {
          c.stage = s;
          c.mb = mb;
        }
        if (!device_.interposeCollectives(issued.data(), issued.size()))
          return fail(device_.error().empty() ? "this backend runs no tensor- or context-parallel collectives"
                                              : device_.error());
        const bool ran = runForward(s, mb, st, begin, end, true);
        if (!device_.resumeCollectives() || !ran)
          return ran ? fail(device_.error()) : false;
        dropped->second[g] = false;
      }
  return true;
}

const BackwardFrees &Executor::backwardFreesOf(int64_t s, BackwardPart part) {
  auto found = backwardFrees_.find({s, part});
  if (found != backwardFrees_.end())
    return found->second;
  return backwardFrees_[{s, part}] = backwardFrees(program(s), deviceReadsOf(s), part);
}

void Executor::releaseRead(const StageProgram &p, StageState &st, int64_t mb, const std::vector<int> &values,
                           const std::vector<size_t> &aux, bool tapGradients) {
  for (int v : values) {
    // A gradient is complete once its last reader ran.
    if (tapGradients && p.values[v].tap.rfind("grad:", 0) == 0)
      tap(p.values[v], st.values[v], mb);
    device_.release(st.values[v], Queue::compute());
  }
  for (size_t j : aux)
    device_.release(st.aux[j], Queue::compute());
}

void Executor::releaseState(Key key) {
  auto it = states_.find(key);
  if (it == states_.end())
    return;
  for (auto *list : {&it->second.values, &it->second.aux, &it->second.stash})
    for (Buffer &b : *list)
      device_.release(b, Queue::compute());
  states_.erase(it);
  dropped_.erase(key);
}

bool Executor::forward(int64_t s, int64_t mb) {
  const StageProgram &p = program(s);
  const Key key{s, mb};
  const std::string at = "(s" + std::to_string(s) + ",mb" + std::to_string(mb) + ")";
  if (states_.count(key))
    return fail("FWD" + at + " runs twice");
  StageState &st = states_[key];
  st.values.assign(p.values.size(), {});
  st.aux.assign(p.forward.size(), {});
  st.stash.assign(p.forward.size(), {});
  if (p.input >= 0) {
    if (artifact_.rankOf(s - 1) == rank_) {
      // The previous chunk ran on this rank: its output moves over; its
      // backward never reads it.
      auto prev = states_.find({s - 1, mb});
      if (prev == states_.end() || !prev->second.values[program(s - 1).output])
        return fail("FWD" + at + " finds no output of stage " + std::to_string(s - 1));
      Buffer &out = prev->second.values[program(s - 1).output];
      st.values[p.input] = out;
      out = {};
    } else {
      auto in = activationsIn_.find(key);
      if (in == activationsIn_.end())
        return fail("FWD" + at + " before its activation arrived");
      device_.waitFor(in->second);
      st.values[p.input] = in->second.buffer;
      activationsIn_.erase(in);
    }
  }
  if (!options_.recompute)
    return runForward(s, mb, st, 0, p.forward.size(), false);
  // Segment by segment, each dropped but for its checkpoints once it ran.
  const RecomputePlan &plan = recomputePlanOf(s);
  std::vector<bool> &dropped = dropped_[key];
  dropped.assign(plan.segments.size(), false);
  for (size_t g = 0; g < plan.segments.size(); ++g) {
    if (!runForward(s, mb, st, plan.segments[g].first, plan.segments[g].second, false))
      return false;
    if (!plan.drops(g))
      continue;
    releaseRead(p, st, mb, plan.dropped[g], {}, false);
    for (size_t j = plan.segments[g].first; j < plan.segments[g].second; ++j)
      device_.release(st.aux[j], Queue::compute());
    dropped[g] = true;
  }
  return error_.empty();
}

bool Executor::runForward(int64_t s, int64_t mb, StageState &st, size_t begin, size_t end, bool again) {
  const StageProgram &p = program(s);
  for (size_t i = begin; i < end;) {
    const size_t span = std::clamp<size_t>(device_.forwardSpan(s, i), 1, p.forward.size() - i);
    if (i + span > end)
      return fail("internal: a forward span crosses a recomputed segment's end");
    // Run again, a span may write a checkpoint still held: it writes a
    // fresh buffer, dropped after (the same bits), and the held one stays.
    std::vector<std::pair<int, Buffer>> held;
    for (size_t j = i; j < i + span; ++j) {
      const ForwardInstr &f = p.forward[j];
      const ValueInfo &v = p.values[f.output];
      Buffer &out = st.values[f.output];
      if (out)
        held.emplace_back(f.output, std::exchange(out, Buffer{}));
      out = device_.allocate(v.rows * v.cols, dtypeOf(v.dtype), Queue::compute(), false);
      if (f.auxSize) // raw floats the device lays out
        st.aux[j] = device_.allocate(device_.auxCount(s, j), Dtype::F32, Queue::compute(), false);
      if (!out || (f.auxSize && !st.aux[j]))
        return fail(device_.error());
    }
    if (!device_.forward(s, mb, i, st))
      return fail(device_.error());
    for (auto &[id, buffer] : held) {
      device_.release(st.values[id], Queue::compute());
      st.values[id] = buffer;
    }
    for (size_t j = i; j < i + span && !again; ++j) {
      const ForwardInstr &f = p.forward[j];
      const Buffer &out = st.values[f.output];
      if (f.op == Prim::CrossEntropy) {
        // The loss scalar is read after the pipeline; the value itself dies
        // with the stage's backward.
        Buffer loss = device_.allocate(1, Dtype::F32, Queue::compute(), false);
        if (!loss)
          return fail(device_.error());
        device_.copy(loss, Buffer{out.data, 1, out.dtype});
        reads_.push_back({"", mb, size_t(f.loss), loss});
      }
      tap(p.values[f.output], out, mb);
    }
    i += span;
  }
  return error_.empty();
}

bool Executor::takeOutputGradient(int64_t s, int64_t mb, StageState &st) {
  const StageProgram &p = program(s);
  const Key key{s, mb};
  const std::string at = "BWD(s" + std::to_string(s) + ",mb" + std::to_string(mb) + ")";
  if (artifact_.rankOf(s + 1) == rank_) {
    // The next chunk ran its backward on this rank: its input gradient moves over.
    const Key next{s + 1, mb};
    auto found = states_.find(next);
    const int gradInput = program(s + 1).gradInput;
    if (found == states_.end() || !found->second.values[gradInput])
      return fail(at + " finds no input gradient of stage " + std::to_string(s + 1));
    st.values[p.gradOutput] = found->second.values[gradInput];
    found->second.values[gradInput] = {};
    if (!weightPending_.count(next))
      releaseState(next);
  } else {
    auto in = gradientsIn_.find(key);
    if (in == gradientsIn_.end())
      return fail(at + " before its gradient arrived");
    device_.waitFor(in->second);
    st.values[p.gradOutput] = in->second.buffer;
    gradientsIn_.erase(in);
  }
  tap(p.values[p.gradOutput], st.values[p.gradOutput], mb);
  return true;
}

bool Executor::backward(int64_t s, int64_t mb, BackwardPart part) {
  const StageProgram &p = program(s);
  const Key key{s, mb};
  const std::string at = "(s" + std::to_string(s) + ",mb" + std::to_string(mb) + ")";
  auto found = states_.find(key);
  if (found == states_.end())
    return fail("BWD" + at + " before its FWD");
  StageState &st = found->second;
  if (part == BackwardPart::Weight) {
    if (!weightPending_.erase(key))
      return fail("W" + at + " before its B");
  } else if (p.gradOutput >= 0 && !takeOutputGradient(s, mb, st)) {
    return false;
  }
  // Each value and aux buffer goes after its last reader (BackwardFrees.h;
  // split, what W reads stays until W).
  const BackwardFrees *frees = releaseAsRead_ ? &backwardFreesOf(s, part) : nullptr;
  // Gradient taps are recorded as B releases them, or after B (tapGradients).
  const bool tapReleased = part != BackwardPart::Weight;
  if (frees)
    releaseRead(p, st, mb, frees->valuesUnread, frees->auxUnread, tapReleased);
  for (size_t index = 0; index < p.backward.size();) {
    if (part == BackwardPart::Weight && p.forward[p.backward[index].forward].params.empty()) {
      ++index;
      continue; // W: only instructions with weights
    }
    const size_t span = part == BackwardPart::Weight
                            ? 1
                            : std::clamp<size_t>(device_.backwardSpan(s, index), 1, p.backward.size() - index);
    if (options_.recompute && !recomputeFor(s, mb, st, index, span))
      return false;
    std::vector<int> fresh;
    for (size_t j = index; j < index + span; ++j) {
      const BackwardInstr &b = p.backward[j];
      const ForwardInstr &f = p.forward[b.forward];
      for (int input : f.inputs)
        if (!st.values[input])
          return fail(std::string("the backward of ") + primName(f.op) + " reads a freed value");
      // The gradients it adds into; an output gradient nothing produced is
      // zero. Those allocated here are fresh: the device writes or fills them.
      std::vector<int> written;
      if (part != BackwardPart::Weight)
        written = b.gradInputs;
      written.push_back(b.gradOutput);
      for (int id : written) {
        if (id < 0 || st.values[id])
          continue;
        if (!(st.values[id] = device_.allocate(p.values[id].rows * p.values[id].cols,
                                               dtypeOf(p.values[id].dtype), Queue::compute(), false)))
          return fail(device_.error());
        fresh.push_back(id);
      }
    }
    if (!device_.backward(s, mb, index, part, st, fresh))
      return fail(device_.error());
    for (size_t j = index; frees && j < index + span; ++j)
      releaseRead(p, st, mb, frees->valuesAfter[j], frees->auxAfter[j], tapReleased);
    index += span;
  }
  if (part == BackwardPart::Input) {
    // B leaves everything W needs: inputs, aux, output gradients, the stash.
    weightPending_.insert(key);
    tapGradients(p, st, mb);
    return error_.empty();
  }
  if (part == BackwardPart::Weight) {
    // The input gradient was sent (or handed over) after B.
    releaseState(key);
    return true;
  }
  // Keep only the input gradient (to send back or hand over); the rest dies.
  tapGradients(p, st, mb);
  for (size_t v = 0; v < st.values.size(); ++v)
    if (static_cast<int>(v) != p.gradInput)
      device_.release(st.values[v], Queue::compute());
  for (auto *list : {&st.aux, &st.stash})
    for (Buffer &b : *list)
      device_.release(b, Queue::compute());
  dropped_.erase(key);
  if (p.gradInput < 0)
    states_.erase(key);
  return error_.empty();
}

bool Executor::communicate(const std::vector<const Instr *> &group) {
  std::vector<Transfer> transfers;
  for (const Instr *i : group) {
    Transfer t;
    t.instr = i;
    if (i->kind == OpKind::Send) {
      const StageProgram &p = program(i->srcStage);
      const int value = i->payload == Payload::Activation ? p.output : p.gradInput;
      auto it = states_.find({i->srcStage, i->mb});
      if (it == states_.end() || !it->second.values[value])
        return fail(i->describe() + ": nothing to send (computed? freed?)");
      t.buffer = it->second.values[value];
    }
    transfers.push_back(t);
  }
  if (!device_.exchange(transfers))
    return fail(device_.error());
  for (Transfer &t : transfers) {
    const Instr &i = *t.instr;
    if (i.kind == OpKind::Recv) {
      (i.payload == Payload::Activation ? activationsIn_ : gradientsIn_)[{i.dstStage, i.mb}] = t;
    } else if (i.payload == Payload::Activation) {
      outputPeer_[{i.srcStage, i.mb}] = i.peer; // released by its FREE
    } else {
      // A sent input gradient: its memory returns behind the send; unless W
      // still needs the rest, it was all that was left of (stage, mb).
      const Key key{i.srcStage, i.mb};
      device_.release(states_[key].values[program(i.srcStage).gradInput], Queue::sendTo(i.peer));
      if (!weightPending_.count(key))
        releaseState(key);
    }
  }
  return true;
}

bool Executor::freeOutput(const Instr &i) {
  const Key key{i.stage, i.mb};
  auto it = states_.find(key);
  auto peer = outputPeer_.find(key);
  if (it == states_.end() || peer == outputPeer_.end())
    return fail("FREE of an output that was not sent");
  // Ordered behind the send: the memory returns once the send completed,
  // without blocking the host.
  device_.release(it->second.values[program(i.stage).output], Queue::sendTo(peer->second));
  outputPeer_.erase(peer);
  return true;
}

bool Executor::computeStep(const std::vector<Instr> &list, size_t &index) {
  const Instr &i = list[index];
  // The tp / cp collectives it issues are listed right after it.
  size_t end = index + 1;
  while (end < list.size() && list[end].kind == OpKind::Collective)
    ++end;
  if (!device_.expectCollectives(list.data() + index + 1, end - index - 1))
    return fail(device_.error().empty() ? "this backend runs no tensor- or context-parallel collectives"
                                        : device_.error());
  index = end - 1;
  bool ok = false;
  switch (i.kind) {
  case OpKind::Forward: ok = forward(i.stage, i.mb); break;
  case OpKind::Backward: ok = backward(i.stage, i.mb, BackwardPart::Both); break;
  case OpKind::BackwardInput: ok = backward(i.stage, i.mb, BackwardPart::Input); break;
  default: ok = backward(i.stage, i.mb, BackwardPart::Weight); break;
  }
  return ok && (device_.collectivesIssued() || fail(device_.error()));
}

bool Executor::runPipeline() {
  states_.clear();
  dropped_.clear();
  activationsIn_.clear();
  gradientsIn_.clear();
  outputPeer_.clear();
  weightPending_.clear();
  reads_.clear();
  taps_.clear();
  trace_.clear();
  traceBracket_.clear();
  size_t brackets = 0; // with trace: instructions and communication groups issued
  using Clock = std::chrono::steady_clock;
  losses_.assign(artifact_.microbatches, std::vector<double>(artifact_.stages.back().losses.size(), 0.0));
  const std::vector<Instr> &list = artifact_.ranks[rank_];
  for (size_t index = 0; index < list.size(); ++index) {
    const Instr &i = list[index];
    where_ = "instruction #" + std::to_string(index) + " " + i.describe();
    const size_t first = index;
    const Clock::time_point started = options_.trace ? Clock::now() : Clock::time_point();
    device_.beginInstruction(i.describe());
    bool ok = true;
    if (i.isCompute()) {
      ok = computeStep(list, index);
    } else {
      switch (i.kind) {
      case OpKind::Send:
      case OpKind::Recv: {
        // One group's instructions are consecutive and posted together.
        std::vector<const Instr *> group;
        size_t end = index;
        while (end < list.size() && list[end].isComm() && list[end].group == i.group)
          group.push_back(&list[end++]);
        ok = communicate(group);
        index = end - 1;
        break;
      }
      case OpKind::Free: ok = freeOutput(i); break;
      case OpKind::AllReduce:
        ok = device_.allReduceGradients(i) ||
             fail(device_.error().empty() ? "this backend runs no data-parallel ALLREDUCE" : device_.error());
        break;
      case OpKind::Collective: ok = fail("a tp / cp COLLECTIVE that follows no compute instruction"); break;
      default: break; // the trainer runs OPTIM once the list is done
      }
    }
    device_.endInstruction();
    if (!ok)
      return false;
    if (options_.trace) {
      // A communication group's instructions share the group's interval.
      const double start = sinceEpochUs(started), end = sinceEpochUs(Clock::now());
      for (size_t k = first; k <= index; ++k)
        if (list[k].kind != OpKind::Collective) { // inside the compute step's slice
          trace_.push_back({globalRank_, list[k].describe(), traceCategory(list[k].kind), start, end - start, 0});
          traceBracket_.push_back(brackets);
        }
      ++brackets;
    }
  }
  where_ = "end of step";
  return collectResults() && (!options_.trace || deviceTimes(brackets));
}

void Executor::traceOptimizer(std::chrono::steady_clock::time_point start, std::chrono::steady_clock::time_point end) {
  for (TraceSlice &slice : trace_)
    if (slice.category == traceCategory(OpKind::Optimizer)) {
      slice.startUs = sinceEpochUs(start);
      slice.durationUs = sinceEpochUs(end) - slice.startUs;
    }
}

bool Executor::deviceTimes(size_t brackets) {
  if (!device_.timesInstructions())
    return true;
  std::vector<DeviceInterval> intervals;
  if (!device_.instructionTimes(intervals))
    return fail("--trace: " + device_.error());
  if (intervals.size() != brackets)
    return fail("--trace: the device timed " + std::to_string(intervals.size()) + " instructions of " +
                std::to_string(brackets));
  for (size_t k = 0; k < trace_.size(); ++k) {
    const DeviceInterval &interval = intervals[traceBracket_[k]];
    trace_[k].startUs = sinceEpochUs(interval.start);
    trace_[k].durationUs = std::max(0.0, sinceEpochUs(interval.end) - trace_[k].startUs);
  }
  return true;
}

bool Executor::collectResults() {
  if (!device_.finishPipeline())
    return fail(device_.error());
  for (PendingRead &read : reads_) {
    std::vector<float> host(read.buffer.count);
    if (!device_.download(read.buffer, host.data()))
      return fail(device_.error());
    if (read.name.empty())
      losses_[read.mb][read.loss] = host[0];
    else
      taps_[read.name] = std::move(host);
    device_.release(read.buffer, Queue::compute());
  }
  reads_.clear();
  while (!states_.empty())
    releaseState(states_.begin()->first);
  for (auto *arrived : {&activationsIn_, &gradientsIn_}) {
    for (auto &[key, t] : *arrived) {
      device_.waitFor(t);
      device_.release(t.buffer, Queue::compute());
    }
    arrived->clear();
  }
  return device_.error().empty() || fail(device_.error());
}

} // namespace mhcc::runtime
