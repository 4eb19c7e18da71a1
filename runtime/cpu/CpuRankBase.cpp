//===- CpuRankBase.cpp - what both CPU devices share --------------------------===//
#include "runtime/cpu/CpuRankBase.h"

#include "runtime/artifact/TensorSplit.h"
#include "runtime/cpu/Bf16.h"
#include "runtime/train/Optimizer.h"
#include "runtime/train/ParamRemainders.h"
#include "runtime/train/Parameters.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>

#include <malloc.h>

namespace mhcc::runtime {
namespace {

std::vector<float *> pointers(const std::vector<Buffer> &buffers) {
  std::vector<float *> out(buffers.size());
  for (size_t k = 0; k < buffers.size(); ++k)
    out[k] = buffers[k].data;
  return out;
}

/// An instruction's output is written in its value's storage type when the
/// instruction completes (docs/precision.md).
void storeAs(const StageProgram &p, int value, StageState &state) {
  if (value >= 0 && p.values[value].dtype == "bf16")
    roundBf16(state.values[value].data, state.values[value].count);
}

} // namespace

void WorkingWeights::refresh(std::vector<std::vector<float>> &masters) {
  if (!bf16_)
    return;
  if (settleTies_)
    for (std::vector<float> &w : masters)
      for (float &v : w) {
        uint32_t bits;
        std::memcpy(&bits, &v, sizeof bits);
        bits = settleOffBf16Tie(bits);
        std::memcpy(&v, &bits, sizeof bits);
      }
  copies_ = masters;
  for (std::vector<float> &w : copies_)
    roundBf16(w.data(), int64_t(w.size()));
}

int64_t hostParameterBytes(const Artifact &a) {
  // Masters, the moments (every part's, where the distributed optimizer
  // shards them: this copy holds them all), the reduced gradient, and a
  // bf16 model's working copies: floats a parameter element.
  const int64_t perElement = 1 + 2 + 1 + (a.model.dtype == "bf16" ? 1 : 0);
  int64_t floats = 0, slotFloats = 0, blockFloats = 0;
  for (const ParamInfo &info : a.params) {
    floats += perElement * info.count();
    if (a.tp > 1 && !info.tpSplit.empty() && !isPartial(info))
      floats += a.tp * shardCount(info, a.tp); // each tensor rank's block (CpuWorld::blocks, tensorBlocks)
  }
  for (const StageProgram &stage : a.stages)
    for (const ParamSlot &slot : stage.params) {
      slotFloats += a.params[slot.param].count();
      blockFloats += shardCount(a.params[slot.param], a.tp);
    }
  // A gradient a use; the other replicas', context and tensor ranks' own
  // (CpuWorld::rankGrads: each rank's blocks under tp, else the gradient
  // group's other members').
  const int64_t others = a.tp > 1 ? a.dp * a.cp * a.tp : a.reduceGroupSize() - 1;
  return 4 * (floats + slotFloats + others * blockFloats);
}

int64_t hostProcessesParameterBytes(const Artifact &a) {
  const int64_t copies = a.model.dtype == "bf16" ? 1 : 0;
  int64_t elements = 0, ownBlock = 0, allSlots = 0, allBlocks = 0;
  for (const ParamInfo &info : a.params) {
    elements += info.count();
    if (a.tp > 1 && !info.tpSplit.empty() && !isPartial(info))
      ownBlock += shardCount(info, a.tp);
  }
  std::vector<int64_t> stageBlocks(a.stages.size(), 0);
  for (size_t s = 0; s < a.stages.size(); ++s)
    for (const ParamSlot &slot : a.stages[s].params) {
      allSlots += a.params[slot.param].count();
      stageBlocks[s] += shardCount(a.params[slot.param], a.tp);
    }
  for (int64_t blocks : stageBlocks)
    allBlocks += blocks;
  int64_t floats = 0;
  for (int64_t rank = 0; rank < a.worldSize(); ++rank) {
    floats += elements * (1 + copies) + ownBlock;
    for (size_t s = 0; s < a.stages.size(); ++s)
      if (a.rankOf(int64_t(s)) == a.pipelineRankOf(rank))
        floats += stageBlocks[s];
  }
  floats += 3 * elements + allSlots + a.tp * allBlocks; // rank 0: moments, reduced, uses, gathered
  return 4 * floats;
}

HostParameters::HostParameters(const Artifact &a, bool withMoments,
                               const std::function<bool(int64_t stage)> &holdsStage, bool settleTies,
                               int64_t onlyShard)
    : working(a, settleTies) {
  const bool whole = withMoments && !a.distributedOptimizer;
  for (const ParamInfo &info : a.params) {
    weights.push_back(initialParameter(info, a.model.seed)); // the same bits wherever they are held
    adamM.emplace_back(whole ? info.count() : 0, 0.0f);
    adamV.emplace_back(whole ? info.count() : 0, 0.0f);
  }
  if (withMoments && a.distributedOptimizer)
    for (int64_t d = 0; d < a.optimizerParts(); ++d) {
      heldShards.push_back(onlyShard < 0 || onlyShard == d);
      shardM.emplace_back();
      for (const ParamInfo &info : a.params) {
        const auto [begin, end] = a.shardOf(info.count(), d);
        shardM.back().emplace_back(heldShards.back() ? end - begin : 0, 0.0f);
      }
      shardV.push_back(shardM.back());
    }
  slotGrads.resize(a.stages.size());
  for (size_t s = 0; s < a.stages.size(); ++s)
    if (holdsStage(int64_t(s)))
      for (const ParamSlot &slot : a.stages[s].params)
        slotGrads[s].emplace_back(a.params[slot.param].count(), 0.0f);
  working.refresh(weights);
}

void HostParameters::update(const Artifact &a, const TrainOptions &options,
                            const std::vector<std::vector<std::vector<double>>> &replicaLosses, bool evaluateOnly,
                            StepResult &result) {
  std::vector<std::vector<double>> losses(a.microbatches * a.dp);
  for (int64_t d = 0; d < a.dp; ++d)
    for (int64_t mb = 0; mb < a.microbatches && mb < int64_t(replicaLosses[d].size()); ++mb)
      losses[a.globalMicrobatch(mb, d)] = replicaLosses[d][mb];
  if (evaluateOnly) {
    summarizeLosses(a.stages.back(), losses, result);
    return;
  }
  std::vector<std::vector<const float *>> grads(a.stages.size());
  for (size_t s = 0; s < a.stages.size(); ++s)
    for (const std::vector<float> &g : slotGrads[s])
      grads[s].push_back(g.data());
  if (shardM.empty()) {
    completeStep(a, options, losses, grads, weights, runtime::wholeMoments(adamM, adamV), reduced, result);
  } else {
    // Each part of every parameter updated with its own moments (ZeRO-1):
    // the same arithmetic per element, so the same bits as without
    // sharding. Parts held elsewhere (one CPU process a rank) are updated
    // there. The CPU backend sums whole gradients (the same bits as the
    // GPU's reduce-scatter gives each part).
    completeStep(a, options, losses, grads, weights, shardMoments(a), reduced, result);
  }
  working.refresh(weights);
}

MomentRanges HostParameters::shardMoments(const Artifact &a) {
  return [this, &a](size_t p) {
    std::vector<MomentRange> ranges;
    for (int64_t d = 0; d < a.optimizerParts(); ++d)
      if (heldShards[d]) {
        const auto [begin, end] = a.shardOf(a.params[p].count(), d);
        ranges.push_back({begin, end, shardM[d][p].data(), shardV[d][p].data()});
      }
    return ranges;
  };
}

void HostParameters::heldMoments(const Artifact &a, ParameterState &state) const {
  if (shardM.empty()) {
    state.adamM = adamM;
    state.adamV = adamV;
    return;
  }
  for (int64_t d = 0; d < a.optimizerParts(); ++d)
    for (size_t p = 0; heldShards[d] && p < shardM[d].size(); ++p) {
      const auto [begin, end] = a.shardOf(a.params[p].count(), d);
      if (begin == end)
        continue;
      const TensorPiece piece{1, 0, begin, end};
      scatterPiece(a.params[p], piece, shardM[d][p].data(), state.adamM[p]);
      scatterPiece(a.params[p], piece, shardV[d][p].data(), state.adamV[p]);
      state.momentPieces[p].push_back(piece);
    }
}

void HostParameters::load(const Artifact &a, const ParameterState &state, bool withMoments) {
  for (size_t p = 0; p < weights.size(); ++p) {
    weights[p] = state.weights[p];
    if (withMoments && !shardM.empty()) {
      // Each held part of the whole moments.
      for (int64_t d = 0; d < a.optimizerParts(); ++d) {
        const int64_t at = a.shardOf(int64_t(weights[p].size()), d).first, n = int64_t(shardM[d][p].size());
        if (!state.adamM[p].empty())
          std::copy_n(state.adamM[p].begin() + at, n, shardM[d][p].begin());
        if (!state.adamV[p].empty())
          std::copy_n(state.adamV[p].begin() + at, n, shardV[d][p].begin());
      }
      continue;
    }
    if (withMoments && !state.adamM[p].empty())
      adamM[p] = state.adamM[p];
    if (withMoments && !state.adamV[p].empty())
      adamV[p] = state.adamV[p];
  }
  working.refresh(weights);
}

bool CpuRankBase::fail(const std::string &message) {
  if (error_.empty())
    error_ = message;
  return false;
}

void CpuRankBase::beginInputs(const StepInputs &inputs) {
  inputs_ = &inputs;
  peak_ = live_;
}

/// Keeps freed memory in the process: glibc returns large blocks (mmap'd
/// above its threshold, or trimmed off the heap's top) to the kernel, and
/// every step then faults the same pages in again. On the 2-core VM a page
/// fault costs enough that this doubled tiny's step (PP1: 323 -> 162 ms, the
/// idle between primitives 24% -> 1%). Blocks above 32 MiB (glibc's largest
/// threshold) are still mapped afresh.
static void keepFreedMemory() {
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  });
}

Buffer CpuRankBase::allocate(int64_t count, Dtype dtype, Queue, bool) {
  // Always zero-filled, so no kernel can read stale values.
  auto *data = static_cast<float *>(std::calloc(std::max<int64_t>(count, 1), sizeof(float)));
  if (!data) {
    fail("out of host memory allocating " + std::to_string(count * 4) + " bytes");
    return {};
  }
  live_ += count * 4;
  peak_ = std::max(peak_, live_);
  return {data, count, dtype}; // floats, whatever the dtype (rounded by the kernels)
}

void CpuRankBase::release(Buffer &buffer, Queue) {
  if (!buffer)
    return;
  std::free(buffer.data);
  live_ -= buffer.count * 4;
  buffer = {};
}

void CpuRankBase::copy(Buffer dst, const Buffer &src) {
  std::memcpy(dst.data, src.data, std::min(dst.count, src.count) * sizeof(float));
}

bool CpuRankBase::download(const Buffer &buffer, float *host) {
  std::memcpy(host, buffer.data, buffer.count * sizeof(float));
  return true;
}

SlotGrads blockGrads(const Artifact &a, const std::function<bool(int64_t stage)> &holds) {
  SlotGrads grads(a.stages.size());
  for (size_t s = 0; s < a.stages.size(); ++s)
    for (const ParamSlot &slot : a.stages[s].params)
      if (!holds || holds(int64_t(s)))
        grads[s].emplace_back(shardCount(a.params[slot.param], a.tp), 0.0f);
  return grads;
}

std::vector<std::vector<float>> tensorBlocks(const Artifact &a, int64_t t,
                                             const std::function<const float *(int param)> &weightOf) {
  std::vector<std::vector<float>> blocks(a.params.size());
  for (size_t p = 0; p < a.params.size(); ++p)
    if (!a.params[p].tpSplit.empty() && !isPartial(a.params[p])) {
      blocks[p].resize(shardCount(a.params[p], a.tp));
      gatherShard(a.params[p], a.tp, t, weightOf(int(p)), blocks[p].data());
    }
  return blocks;
}

void assembleTensorParallel(const Artifact &a, const std::function<const SlotGrads &(int64_t t)> &blocksOf,
                            SlotGrads &whole) {
  for (size_t s = 0; s < whole.size(); ++s)
    for (size_t k = 0; k < whole[s].size(); ++k) {
      const ParamInfo &info = a.params[a.stages[s].params[k].param];
      std::vector<float> &sum = whole[s][k];
      if (!info.tpSplit.empty() && !isPartial(info)) {
        for (int64_t t = 0; t < a.tp; ++t)
          scatterShard(info, a.tp, t, blocksOf(t)[s][k].data(), sum.data());
        continue;
      }
      sum = blocksOf(0)[s][k];
      for (int64_t t = 1; (a.sequenceParallel || isPartial(info)) && t < a.tp; ++t) {
        const std::vector<float> &part = blocksOf(t)[s][k];
        for (size_t e = 0; e < sum.size(); ++e)
          sum[e] = sum[e] + part[e];
      }
    }
}

std::vector<std::vector<std::vector<double>>>
sumContextLosses(const Artifact &a, const std::vector<std::vector<std::vector<double>>> &memberLosses) {
  std::vector<std::vector<std::vector<double>>> out(a.dp);
  for (int64_t d = 0; d < a.dp; ++d)
    for (int64_t c = 0; c < a.cp; ++c) {
      const auto &part = memberLosses[d * a.cp + c];
      if (c == 0) {
        out[d] = part;
        continue;
      }
      for (size_t mb = 0; mb < part.size() && mb < out[d].size(); ++mb)
        for (size_t k = 0; k < part[mb].size() && k < out[d][mb].size(); ++k)
          out[d][mb][k] += part[mb][k];
    }
  return out;
}

void combineParts(const std::vector<const float *> &parts, int64_t count, bool max, float *out) {
  std::copy_n(parts[0], count, out);
  for (size_t k = 1; k < parts.size(); ++k)
    for (int64_t e = 0; e < count; ++e)
      out[e] = max ? std::max(out[e], parts[k][e]) : out[e] + parts[k][e];
}

void placeRows(const std::vector<const float *> &parts, const std::function<std::vector<int64_t>(int64_t)> &rowsOf,
               int64_t cols, float *all) {
  for (size_t k = 0; k < parts.size(); ++k) {
    const std::vector<int64_t> rows = rowsOf(int64_t(k));
    for (size_t r = 0; r < rows.size(); ++r)
      std::memcpy(all + rows[r] * cols, parts[k] + int64_t(r) * cols, cols * sizeof(float));
  }
}

std::vector<int64_t> sequenceRows(const Artifact &a, int64_t tensorRank) {
  std::vector<int64_t> rows;
  const int64_t seq = a.model.seqLen / a.cp, share = seq / a.tp; // a context-parallel rank's rows a sequence
  for (int64_t b = 0; b < a.model.microBatch; ++b)
    for (int64_t i = 0; i < share; ++i)
      rows.push_back(b * seq + tensorRank * share + i);
  return rows;
}

CpuRankBase::CpuRankBase(const Artifact &a, const TrainOptions &options, int64_t rank)
    : a_(a), options_(options), rank_(rank), pipelineRank_(a.pipelineRankOf(rank)), replica_(a.replicaOf(rank)),
      contextRank_(a.contextRankOf(rank)), tensorRank_(a.tensorRankOf(rank)), rowMap_(a.contextRows(contextRank_)) {
  keepFreedMemory();
}

StageContext<float> CpuRankBase::contextFor(int64_t s, int64_t mb) {
  const StageProgram &p = a_.stages[s];
  StageContext<float> c{p, a_.model};
  c.microbatches = a_.microbatches * a_.dp; // the global batch's: every replica's microbatches
  c.tokens = inputs_->tokens[mb].data();
  c.labels = inputs_->labels[mb].data();
  if (!inputs_->positions.empty())
    c.documents.positions = inputs_->positions[mb].data();
  if (!inputs_->firstKeys.empty())
    c.documents.firstKeys = inputs_->firstKeys[mb].data();
  if (!rowMap_.empty()) {
    c.rows = c.contextRows = int64_t(rowMap_.size());
    c.rowMap = rowMap_.data();
    c.gatherRows = [this](const float *local, int64_t cols, float *all) {
      return (issue(MeshAxis::Context, CollectiveOp::AllGather, int64_t(rowMap_.size()), cols) &&
              gatherRows(local, cols, all)) ||
             !(gatherFailed_ = true);
    };
    c.addsMixerWeightGrads = contextRank_ == 0;
  }
  if (a_.tp > 1) {
    c.tensor.size = a_.tp;
    c.tensor.rank = tensorRank_;
    c.tensor.sequenceParallel = a_.sequenceParallel;
    if (a_.sequenceParallel)
      c.rows = a_.rowsPerRank(); // the row-local primitives' share; the GEMMs gather every row
    auto failed = [this](bool ok) { return ok || !(gatherFailed_ = true); };
    c.tensor.allReduce = [this, failed](float *data, int64_t count, bool max) {
      return failed(issue(MeshAxis::Tensor, max ? CollectiveOp::AllReduceMax : CollectiveOp::AllReduce, count, 1) &&
                    tensorAllReduce(data, count, max));
    };
    c.tensor.gatherRows = [this, failed](const float *local, int64_t cols, float *all) {
      return failed(issue(MeshAxis::Tensor, CollectiveOp::AllGather, a_.rowsPerRank(), cols) &&
                    tensorGatherRows(local, cols, all));
    };
    c.tensor.reduceScatterRows = [this, failed](const float *all, int64_t cols, float *local) {
      return failed(issue(MeshAxis::Tensor, CollectiveOp::ReduceScatter, a_.rowsPerRank() * a_.tp, cols) &&
                    tensorReduceScatterRows(all, cols, local));
    };
  }
  c.param = [this, &p](int slot) { return weight(p.params[slot].param); };
  c.paramGrad = [this, s](int slot) { return slotGrad(s, slot); };
  if (a_.model.dtype == "bf16")
    c.store = &roundBf16;
  if (options_.profile) {
    c.profile = &profile_;
    c.profilePrefix = "rank " + std::to_string(rank_) + " ";
  }
  return c;
}

bool CpuRankBase::forward(int64_t stage, int64_t mb, size_t index, StageState &state) {
  StageContext<float> c = contextFor(stage, mb);
  forwardInstr(c, pointers(state.values).data(), pointers(state.aux).data(), index);
  if (gatherFailed_)
    return fail("stopped in a collective of its context- or tensor-parallel group: another rank failed");
  storeAs(c.program, c.program.forward[index].output, state);
  return true;
}

bool CpuRankBase::backward(int64_t stage, int64_t mb, size_t index, BackwardPart part, StageState &state,
                           const std::vector<int> &) {
  StageContext<float> c = contextFor(stage, mb);
  const BackwardInstr &b = c.program.backward[index];
  if (!backwardInstr(c, pointers(state.values).data(), pointers(state.aux).data(), b, part) || gatherFailed_)
    return fail("stopped in a collective of its context- or tensor-parallel group: another rank failed");
  if (part != BackwardPart::Weight)
    for (int id : b.gradInputs)
      storeAs(c.program, id, state);
  return true;
}

bool CpuRankBase::expectCollectives(const Instr *first, size_t count) {
  collectives_.expect(first, count);
  return true;
}

bool CpuRankBase::issue(MeshAxis axis, CollectiveOp op, int64_t rows, int64_t cols) {
  const std::string problem = collectives_.issue(axis, op, rows, cols);
  return problem.empty() || fail(problem);
}

bool CpuRankBase::collectivesIssued() {
  const std::string problem = collectives_.finished();
  return problem.empty() || fail(problem);
}

bool CpuRankBase::interposeCollectives(const Instr *first, size_t count) {
  collectives_.interpose(first, count);
  return true;
}

bool CpuRankBase::resumeCollectives() {
  const std::string problem = collectives_.resume();
  return problem.empty() || fail(problem);
}

void CpuRankBase::takeProfile(std::map<std::string, double> &profileMs) {
  for (auto &[name, ms] : profile_)
    profileMs[name] += ms;
  profile_.clear();
}

} // namespace mhcc::runtime
