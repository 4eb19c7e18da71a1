//===- Collectives.cpp - the tp / cp collectives of one compute step -------===//
#include "runtime/program/Collectives.h"

#include <algorithm>

namespace mhcc::runtime {
namespace {

/// Appends collectives to one step's list.
struct StepList {
  std::vector<Instr> &out;
  void add(MeshAxis axis, CollectiveOp op, int64_t rows, int64_t cols) {
    Instr c;
    c.kind = OpKind::Collective;
    c.axis = axis;
    c.collective = op;
    c.tokens = rows;
    c.width = cols;
    out.push_back(c);
  }
};

bool isMixer(Prim op) { return op == Prim::Attention || op == Prim::GatedDeltaNet; }

/// Sizes shared by the rules: the rows the tensor-parallel GEMMs see (a
/// context-parallel rank's share of the microbatch, or all of it), a
/// tensor-parallel rank's rows of them under sequence parallelism, the
/// rank's heads' width and count.
struct Sizes {
  int64_t gemmRows, localRows, C, inner, heads;
  explicit Sizes(const CollectiveMesh &m)
      : gemmRows(m.tokens / m.cp), localRows(gemmRows / (m.sequenceParallel ? m.tp : 1)), C(m.hidden),
        inner(m.hidden / m.tp), heads(m.heads / m.tp) {}
};

/// Megatron's g after a row-parallel GEMM: the group's sum (split by rows
/// under sequence parallelism).
void reduceRowParallel(StepList &list, const CollectiveMesh &m, const Sizes &z) {
  list.add(MeshAxis::Tensor, m.sequenceParallel ? CollectiveOp::ReduceScatter : CollectiveOp::AllReduce,
           z.gemmRows, z.C);
}

/// Sequence parallelism's all-gather of a [rows, C] input before a
/// column-parallel GEMM.
void gatherSequence(StepList &list, const CollectiveMesh &m, const Sizes &z) {
  if (m.sequenceParallel)
    list.add(MeshAxis::Tensor, CollectiveOp::AllGather, z.localRows, z.C);
}

/// A token mixer under context parallelism (StageExecutor.h's
/// contextParallelMixer): attention exchanges k and v forward, q k v, dO
/// and the queries' statistics backward; Gated DeltaNet gathers its input
/// (and the output gradient backward) and runs the whole microbatch.
void contextParallelMixer(StepList &list, Prim op, bool backward, const Sizes &z) {
  auto gather = [&](int64_t cols) { list.add(MeshAxis::Context, CollectiveOp::AllGather, z.gemmRows, cols); };
  if (op == Prim::Attention) {
    if (!backward) {
      gather(2 * z.inner);
      return;
    }
    gather(3 * z.inner);
    gather(z.inner);
    gather(2 * z.heads);
    return;
  }
  gather(z.C);
  if (backward)
    gather(z.C);
}

void forwardCollectives(StepList &list, const CollectiveStep &p, const CollectiveMesh &m, const Sizes &z) {
  const bool tensor = m.tp > 1;
  switch (p.op) {
  case Prim::Embed:
    if (tensor)
      reduceRowParallel(list, m, z); // the vocabulary-parallel table's rows
    return;
  case Prim::Attention:
  case Prim::GatedDeltaNet:
  case Prim::SwiGlu:
    if (tensor)
      gatherSequence(list, m, z);
    if (isMixer(p.op) && m.cp > 1)
      contextParallelMixer(list, p.op, false, z);
    if (tensor)
      reduceRowParallel(list, m, z);
    return;
  case Prim::LmHead:
    if (tensor)
      gatherSequence(list, m, z);
    return;
  case Prim::CrossEntropy:
    if (tensor) { // the vocabulary-parallel softmax: row maxima, sums of exponentials, the label's logit
      list.add(MeshAxis::Tensor, CollectiveOp::AllReduceMax, z.gemmRows, 1);
      list.add(MeshAxis::Tensor, CollectiveOp::AllReduce, z.gemmRows, 1);
      list.add(MeshAxis::Tensor, CollectiveOp::AllReduce, z.gemmRows, 1);
    }
    return;
  default:
    return;
  }
}

void backwardCollectives(StepList &list, const CollectiveStep &p, OpKind kind, const CollectiveMesh &m,
                         const Sizes &z) {
  const bool tensor = m.tp > 1, weights = kind != OpKind::BackwardInput;
  const bool inputGradient = kind != OpKind::BackwardWeight && p.inputGradient;
  switch (p.op) {
  case Prim::Embed:
    if (tensor && weights)
      gatherSequence(list, m, z); // the output gradient's rows
    return;
  case Prim::Attention:
  case Prim::GatedDeltaNet:
  case Prim::SwiGlu: {
    // The input is gathered for the weight gradients, and for a mixer
    // under context parallelism (which recomputes from it); then the
    // output gradient.
    if (tensor && (weights || (isMixer(p.op) && m.cp > 1)))
      gatherSequence(list, m, z);
    if (tensor)
      gatherSequence(list, m, z);
    if (isMixer(p.op) && m.cp > 1)
      contextParallelMixer(list, p.op, true, z);
    if (tensor && inputGradient)
      reduceRowParallel(list, m, z); // Megatron's f backward: the column-parallel input gradient
    return;
  }
  case Prim::LmHead:
    if (tensor && weights)
      gatherSequence(list, m, z);
    if (tensor && inputGradient)
      reduceRowParallel(list, m, z);
    return;
  default:
    return;
  }
}

} // namespace

std::vector<Instr> collectivesOf(const std::vector<CollectiveStep> &prims, OpKind kind, const CollectiveMesh &mesh) {
  std::vector<Instr> out;
  if (!mesh.active())
    return out;
  StepList list{out};
  const Sizes sizes(mesh);
  for (const CollectiveStep &p : prims) {
    if (kind == OpKind::BackwardWeight && !p.weights)
      continue; // the executor's W skips it
    if (kind == OpKind::Forward)
      forwardCollectives(list, p, mesh, sizes);
    else
      backwardCollectives(list, p, kind, mesh, sizes);
  }
  return out;
}

std::vector<Instr> stageCollectives(const StageProgram &p, OpKind kind, const CollectiveMesh &mesh, size_t begin,
                                    size_t end) {
  std::vector<CollectiveStep> prims;
  if (kind == OpKind::Forward)
    for (size_t j = begin; j < std::min(end, p.forward.size()); ++j)
      prims.push_back({p.forward[j].op, true, !p.forward[j].params.empty()});
  else
    for (const BackwardInstr &b : p.backward)
      prims.push_back({p.forward[b.forward].op, !b.gradInputs.empty(), !p.forward[b.forward].params.empty()});
  return collectivesOf(prims, kind, mesh);
}

std::vector<ListedCollectiveError>
checkListedCollectives(const std::vector<Instr> &list,
                       const std::function<std::optional<std::vector<Instr>>(const Instr &step)> &issuedBy) {
  std::vector<ListedCollectiveError> errors;
  auto error = [&](size_t index, const std::string &message) {
    errors.push_back({index, list[index].describe() + ": " + message});
  };
  for (size_t i = 0; i < list.size(); ++i) {
    const Instr &step = list[i];
    if (step.kind == OpKind::Collective) {
      error(i, "follows no compute step (a step's collectives are listed right after it)");
      continue;
    }
    if (!step.isCompute())
      continue;
    const std::optional<std::vector<Instr>> expected = issuedBy(step);
    auto wanted = [&](size_t k) {
      Instr c = (*expected)[k];
      c.stage = step.stage;
      c.mb = step.mb;
      return c;
    };
    size_t k = 0;
    bool reported = !expected;
    for (; i + 1 < list.size() && list[i + 1].kind == OpKind::Collective; ++k) {
      const Instr &c = list[++i];
      if (reported)
        continue;
      if (k >= expected->size()) {
        error(i, step.describe() + " issues " + std::to_string(expected->size()) + " collectives, this is #" +
                     std::to_string(k + 1));
        reported = true;
      } else if (const Instr w = wanted(k); c.axis != w.axis || c.collective != w.collective ||
                                            c.tokens != w.tokens || c.width != w.width || c.stage != w.stage ||
                                            c.mb != w.mb) {
        error(i, "collective #" + std::to_string(k + 1) + " of " + step.describe() + " is " + w.describe() +
                     " (the group's ranks would wait in different collectives)");
        reported = true;
      }
    }
    if (!reported && k < expected->size())
      errors.push_back({i, step.describe() + " lists " + std::to_string(k) + " of the " +
                               std::to_string(expected->size()) + " collectives its stage issues; next: " +
                               wanted(k).describe()});
  }
  return errors;
}

CollectiveTraffic ringTraffic(const Instr &c, int64_t groupSize, int64_t elementBytes) {
  if (groupSize < 2)
    return {};
  const double g = double(groupSize);
  // An all-gather's operand is one rank's rows; the others', the whole tensor's.
  const double whole = double(c.tokens * c.width) * (c.collective == CollectiveOp::AllGather ? g : 1.0);
  const int passes = c.collective == CollectiveOp::AllReduce || c.collective == CollectiveOp::AllReduceMax ? 2 : 1;
  return {passes * (g - 1) / g * whole * double(elementBytes), passes * (groupSize - 1)};
}

} // namespace mhcc::runtime
