//===- Validate.cpp - everything the executor indexes, checked up front ------===//
#include "runtime/artifact/Artifact.h"
#include "runtime/artifact/TensorSplit.h"
#include "runtime/program/Collectives.h"

#include <cmath>

#include <map>
#include <sstream>
#include <tuple>

namespace mhcc::runtime {
namespace {

struct Shape {
  int64_t rows, cols;
  bool operator!=(const Shape &o) const { return rows != o.rows || cols != o.cols; }
};

std::string str(Shape s) { return "[" + std::to_string(s.rows) + " x " + std::to_string(s.cols) + "]"; }

class Checker {
public:
  explicit Checker(const Artifact &a) : a_(a) {}

  std::string run() {
    const ModelInfo &m = a_.model;
    if (m.vocab < 2 || m.hidden < 1 || m.heads < 1 || m.hidden % m.heads || m.seqLen < 1 ||
        m.microBatch < 1 || m.streams < 1 || m.ffnHidden < 1 || m.sinkhornIterations < 1)
      return "bad model sizes";
    if (a_.pp < 1 || a_.vpp < 1 || a_.microbatches < 1)
      return "bad pipeline sizes";
    if (a_.dp < 1 || a_.dp > kMaxDataParallel || a_.cp < 1 || a_.cp > kMaxContextParallel || a_.tp < 1 ||
        a_.tp > kMaxTensorParallel || a_.pp * a_.dp * a_.cp * a_.tp > kMaxWorldSize)
      return "bad rank mesh (dp = " + std::to_string(a_.dp) + " replicas of pp = " + std::to_string(a_.pp) +
             " ranks, cp = " + std::to_string(a_.cp) + ", tp = " + std::to_string(a_.tp) + "; at most " +
             std::to_string(kMaxDataParallel) + " replicas, " + std::to_string(kMaxContextParallel) +
             " context-parallel ranks, " + std::to_string(kMaxTensorParallel) + " tensor-parallel ranks and " +
             std::to_string(kMaxWorldSize) + " ranks)";
    // The load-balanced causal split cuts each sequence into 2 cp equal chunks.
    if (m.seqLen % (2 * a_.cp) != 0 && a_.cp > 1)
      return "seq_len " + std::to_string(m.seqLen) + " does not split into 2 cp = " + std::to_string(2 * a_.cp) +
             " equal chunks";
    if (a_.recomputeNumSublayers < 1 || a_.recomputeNumSublayers > 1024 ||
        (a_.recomputeNumSublayers > 1 && !a_.recomputeSublayers))
      return "recompute_num_sublayers " + std::to_string(a_.recomputeNumSublayers) +
             " (1 to 1024 sublayers a recomputed segment, above 1 only with recompute_sublayers)";
    if (a_.distributedOptimizer && a_.reduceGroupSize() < 2)
      return "the distributed optimizer shards over the gradient group and needs dp x cp > 1 (dp = " +
             std::to_string(a_.dp) + ", cp = " + std::to_string(a_.cp) + ")";
    if (a_.sequenceParallel && (a_.tp < 2 || (m.seqLen / a_.cp) % a_.tp != 0))
      return "sequence parallelism needs tp > 1 dividing seq_len / cp = " + std::to_string(m.seqLen / a_.cp) +
             " (tp = " + std::to_string(a_.tp) + ")";
    if (a_.tp > 1 && (m.heads % a_.tp || m.ffnHidden % a_.tp || m.vocab % a_.tp))
      return "tp = " + std::to_string(a_.tp) + " does not divide the heads, the FFN width and the vocabulary";
    for (const ParamInfo &p : a_.params)
      if (std::string problem = splitProblem(p, a_.tp); !problem.empty())
        return "parameter " + p.name + " (split '" + p.tpSplit + "'): " + problem + " do not split over tp = " +
               std::to_string(a_.tp);
    if (m.dtype != "f32" && m.dtype != "bf16")
      return "unknown model dtype '" + m.dtype + "' (f32 or bf16)";
    if (m.residualStorage() != m.dtype && m.residualStorage() != "f32")
      return "residual dtype '" + m.residualStorage() + "' in a " + m.dtype + " model (the model's dtype, or f32)";
    for (const StageProgram &p : a_.stages)
      for (const ValueInfo &v : p.values)
        if ((v.dtype != "f32" && v.dtype != "bf16") || (m.dtype == "f32" && v.dtype != "f32"))
          return "stage " + std::to_string(p.stage) + ": a value stored as '" + v.dtype + "' in a " + m.dtype +
                 " model";
    if (const auto &code = a_.deviceCode) {
      if (code->streams != m.streams || code->sinkhornIterations != m.sinkhornIterations)
        return "the CUDA kernels were generated for n = " + std::to_string(code->streams) + " streams and " +
               std::to_string(code->sinkhornIterations) + " Sinkhorn iterations, the model has " +
               std::to_string(m.streams) + " and " + std::to_string(m.sinkhornIterations);
      if (code->arch.rfind("sm_", 0) != 0 || code->image.empty())
        return "the CUDA kernels have no image for a GPU architecture (arch '" + code->arch + "')";
    }
    if (const auto &p = a_.prediction)
      if (!std::isfinite(p->stepMs) || p->stepMs < 0 || !(p->bubbleFraction >= 0 && p->bubbleFraction < 1))
        return "the recorded prediction is not a step time and a bubble fraction in [0, 1)";
    if (static_cast<int64_t>(a_.stages.size()) != a_.pp * a_.vpp)
      return std::to_string(a_.stages.size()) + " stage programs for pp * vpp = " +
             std::to_string(a_.pp * a_.vpp);
    if (static_cast<int64_t>(a_.ranks.size()) != a_.pp)
      return std::to_string(a_.ranks.size()) + " rank lists for pp = " + std::to_string(a_.pp);
    for (const ParamInfo &p : a_.params)
      if (p.rows < 1 || p.cols < 1)
        return "parameter " + p.name + " has no elements";
    for (size_t s = 0; s < a_.stages.size(); ++s) {
      std::string problem = stage(a_.stages[s], static_cast<int64_t>(s));
      if (!problem.empty())
        return "stage " + std::to_string(s) + ": " + problem;
    }
    for (size_t r = 0; r < a_.ranks.size(); ++r)
      for (size_t i = 0; i < a_.ranks[r].size(); ++i) {
        std::string problem = instr(a_.ranks[r][i], static_cast<int64_t>(r));
        if (!problem.empty())
          return "rank " + std::to_string(r) + " instruction " + std::to_string(i) + " (" +
                 a_.ranks[r][i].describe() + "): " + problem;
      }
    for (size_t r = 0; r < a_.ranks.size(); ++r)
      if (std::string problem = rankSemantics(int64_t(r)); !problem.empty())
        return "rank " + std::to_string(r) + ": " + problem;
    for (size_t r = 0; r < a_.ranks.size(); ++r)
      if (std::string problem = collectivesMatch(int64_t(r)); !problem.empty())
        return "rank " + std::to_string(r) + ": " + problem;
    return messagesMatch();
  }

  /// What the executor assumes of one rank's list, beyond valid indices: every
  /// (stage, microbatch) of the rank's stages is computed exactly once (one
  /// FWD, then one BWD or one B followed by one W), a FREE follows the SEND of
  /// the output it frees, with dp x cp > 1 every stage's gradient ALLREDUCE
  /// comes once, after the stage's last backward, and one OPTIM ends the
  /// list. An edited (and
  /// resealed) artifact that breaks this is refused here, not mid-step.
  std::string rankSemantics(int64_t rank) {
    struct Seen {
      int fwd = 0, bwd = 0, b = 0, w = 0, sent = 0, freed = 0;
    };
    std::map<std::pair<int64_t, int64_t>, Seen> seen;
    std::map<int64_t, int> reduced; // ALLREDUCEs per stage
    const std::vector<Instr> &list = a_.ranks[rank];
    int optimizers = 0;
    for (size_t k = 0; k < list.size(); ++k) {
      const Instr &i = list[k];
      const std::string at = "instruction " + std::to_string(k) + " (" + i.describe() + ")";
      if (optimizers)
        return at + " follows the OPTIM, which must end the list";
      if (i.kind == OpKind::Optimizer) {
        ++optimizers;
        continue;
      }
      if (i.kind == OpKind::AllReduce) {
        // The replicas sum the stage's gradients of every microbatch.
        for (int64_t mb = 0; mb < a_.microbatches; ++mb) {
          const Seen &x = seen[{i.stage, mb}];
          if (x.bwd + x.w == 0)
            return at + " comes before the backward of microbatch " + std::to_string(mb);
        }
        if (reduced[i.stage]++)
          return at + " reduces the stage a second time";
        continue;
      }
      const bool sendsOutput = i.kind == OpKind::Send && i.payload == Payload::Activation;
      Seen &s = seen[{sendsOutput ? i.srcStage : i.stage, i.mb}];
      switch (i.kind) {
      case OpKind::Forward:
        if (s.fwd++)
          return at + " runs a second time";
        break;
      case OpKind::Backward:
        if (!s.fwd || s.bwd++ || s.b)
          return at + (s.fwd ? " runs a second time, or beside B / W" : " comes before its FWD");
        break;
      case OpKind::BackwardInput:
        if (!s.fwd || s.b++ || s.bwd)
          return at + (s.fwd ? " runs a second time, or beside BWD" : " comes before its FWD");
        break;
      case OpKind::BackwardWeight:
        if (!s.b || s.w++)
          return at + (s.b ? " runs a second time" : " comes before its B");
        break;
      case OpKind::Send:
        if (sendsOutput)
          ++s.sent;
        break;
      case OpKind::Free:
        if (!s.sent || s.freed++)
          return at + (s.sent ? " frees an output twice" : " frees an output that was never sent");
        break;
      case OpKind::Recv:
      case OpKind::Optimizer:
      case OpKind::AllReduce:
      case OpKind::Collective:
        break;
      }
    }
    if (optimizers != 1)
      return "the list must end with one OPTIM, it has " + std::to_string(optimizers);
    const bool reduces = a_.reduceGroupSize() > 1;
    for (int64_t s = rank; s < a_.pp * a_.vpp; s += a_.pp) {
      const int wanted = reduces && !a_.stages[s].params.empty() ? 1 : 0; // an empty chunk has nothing to sum
      if (reduced[s] != wanted)
        return "with dp = " + std::to_string(a_.dp) + ", cp = " + std::to_string(a_.cp) + " stage " +
               std::to_string(s) + " needs " + (wanted ? "one" : "no") + " gradient ALLREDUCE before OPTIM, it has " +
               std::to_string(reduced[s]);
    }
    for (int64_t s = rank; s < a_.pp * a_.vpp; s += a_.pp)
      for (int64_t mb = 0; mb < a_.microbatches; ++mb) {
        const Seen &x = seen[{s, mb}];
        if (x.fwd != 1 || (x.bwd + x.b) != 1 || x.b != x.w)
          return "stage " + std::to_string(s) + " microbatch " + std::to_string(mb) +
                 " is not computed exactly once (" + std::to_string(x.fwd) + " FWD, " + std::to_string(x.bwd) +
                 " BWD, " + std::to_string(x.b) + " B, " + std::to_string(x.w) + " W)";
      }
    return "";
  }

  /// The tp / cp collectives a compute step of stage `s` issues, from its
  /// stage program (runtime/program/Collectives.h): FWD over the forward
  /// list, the backwards over the backward list.
  std::vector<Instr> stepCollectives(int64_t s, OpKind kind) const {
    return stageCollectives(a_.stages[s], kind, a_.collectiveMesh());
  }

  /// Each compute step is followed by exactly the collectives its stage
  /// program issues (what the CPU device checks again while its kernels
  /// run): an edited artifact whose group members would wait in different
  /// collectives is refused here. Stages are in range (checked before).
  std::string collectivesMatch(int64_t rank) const {
    const std::vector<ListedCollectiveError> errors = checkListedCollectives(
        a_.ranks[rank], [&](const Instr &step) { return std::optional(stepCollectives(step.stage, step.kind)); });
    return errors.empty() ? "" : "instruction " + std::to_string(errors[0].index) + " (" + errors[0].message + ")";
  }

  /// Every directed pair's receives expect exactly the messages its sends
  /// issue, in the same order (the compiler's verifier proves more; this
  /// catches an edited artifact before it could wait for a message that
  /// never comes).
  std::string messagesMatch() {
    using Message = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t>;
    std::map<std::pair<int64_t, int64_t>, std::vector<Message>> sent, expected;
    for (size_t r = 0; r < a_.ranks.size(); ++r)
      for (const Instr &i : a_.ranks[r]) {
        if (!i.isComm())
          continue;
        Message m{int(i.payload), i.srcStage, i.dstStage, i.mb, i.tokens, i.width};
        if (i.kind == OpKind::Send)
          sent[{int64_t(r), i.peer}].push_back(m);
        else
          expected[{i.peer, int64_t(r)}].push_back(m);
      }
    for (const auto &[pair, list] : expected) {
      const std::vector<Message> &issued = sent[pair];
      for (size_t k = 0; k < list.size(); ++k)
        if (k >= issued.size() || issued[k] != list[k])
          return "rank " + std::to_string(pair.second) + "'s receive #" + std::to_string(k) + " from rank " +
                 std::to_string(pair.first) + " matches no send in order";
    }
    for (const auto &[pair, list] : sent)
      if (list.size() != expected[pair].size())
        return "rank " + std::to_string(pair.first) + " sends " + std::to_string(list.size()) +
               " messages to rank " + std::to_string(pair.second) + ", which receives " +
               std::to_string(expected[pair].size());
    return "";
  }

private:
  std::string stage(const StageProgram &p, int64_t s) {
    const int64_t last = a_.pp * a_.vpp - 1;
    int64_t numValues = static_cast<int64_t>(p.values.size());
    auto valid = [&](int v) { return v >= 0 && v < numValues; };
    if (p.stage != s)
      return "labelled stage " + std::to_string(p.stage);
    for (const ValueInfo &v : p.values)
      if (v.rows < 1 || v.cols < 1)
        return "a value has no elements";
    if ((s == 0) != (p.input < 0) || (p.input >= 0 && (!valid(p.input) || !valid(p.gradInput))))
      return "bad input value";
    if ((s == last) != (p.output < 0) || (p.output >= 0 && (!valid(p.output) || !valid(p.gradOutput))))
      return "bad output value";
    for (const ParamSlot &slot : p.params)
      if (slot.param < 0 || slot.param >= static_cast<int64_t>(a_.params.size()))
        return "a parameter slot names no parameter";
    for (size_t i = 0; i < p.forward.size(); ++i) {
      std::string problem = forward(p, p.forward[i]);
      if (!problem.empty())
        return "forward " + std::to_string(i) + " (" + primName(p.forward[i].op) + "): " + problem;
    }
    for (size_t i = 0; i < p.backward.size(); ++i) {
      const BackwardInstr &b = p.backward[i];
      if (b.forward < 0 || b.forward >= static_cast<int>(p.forward.size()))
        return "backward " + std::to_string(i) + " refers to no forward instruction";
      const ForwardInstr &f = p.forward[b.forward];
      if (b.gradInputs.size() != f.inputs.size())
        return "backward " + std::to_string(i) + " has the wrong number of input gradients";
      if ((f.op == Prim::CrossEntropy) != (b.gradOutput < 0) ||
          (b.gradOutput >= 0 && (!valid(b.gradOutput) || shape(p, b.gradOutput) != shape(p, f.output))))
        return "backward " + std::to_string(i) + " has a bad output gradient";
      for (size_t k = 0; k < b.gradInputs.size(); ++k)
        if (b.gradInputs[k] >= 0 &&
            (!valid(b.gradInputs[k]) || shape(p, b.gradInputs[k]) != shape(p, f.inputs[k])))
          return "backward " + std::to_string(i) + " has a bad input gradient";
    }
    return "";
  }

  Shape shape(const StageProgram &p, int v) { return {p.values[v].rows, p.values[v].cols}; }

  std::string forward(const StageProgram &p, const ForwardInstr &f) {
    const ModelInfo &m = a_.model;
    const int64_t T = a_.rowsPerRank(), C = m.hidden, n = f.streams, K = n * n + 2 * n;
    // Under tensor parallelism the GEMM primitives see G rows (every row of
    // a context-parallel share) and hold 1 / tp of the heads, FFN columns and
    // vocabulary; their parameters are named whole.
    const int64_t tp = a_.tp, G = m.tokens() / a_.cp, D = C / tp, Vs = m.vocab / tp;
    const bool usesStreams = f.op == Prim::Expand || f.op == Prim::Contract || f.op == Prim::MhcCoeffs ||
                             f.op == Prim::MhcPre || f.op == Prim::MhcPostRes;
    if (a_.deviceCode && usesStreams && f.streams != a_.deviceCode->streams)
      return "n = " + std::to_string(f.streams) + " streams, but the CUDA kernels are compiled for n = " +
             std::to_string(a_.deviceCode->streams);
    if (a_.deviceCode && f.op == Prim::MhcCoeffs && f.sinkhornIterations != a_.deviceCode->sinkhornIterations)
      return std::to_string(f.sinkhornIterations) + " Sinkhorn iterations, but the CUDA kernels are compiled for " +
             std::to_string(a_.deviceCode->sinkhornIterations);
    int64_t numValues = static_cast<int64_t>(p.values.size());
    for (int in : f.inputs)
      if (in < 0 || in >= numValues)
        return "an input names no value";
    if (f.output < 0 || f.output >= numValues)
      return "the output names no value";
    for (int slot : f.params)
      if (slot < 0 || slot >= static_cast<int64_t>(p.params.size()))
        return "a parameter names no slot";
    if (f.auxSize < 0 || f.seqLen < 1 || m.tokens() % f.seqLen || n < 1) // sequences of the whole microbatch
      return "bad attributes";
    // The residual stream is stored as the model says (residual_dtype): the
    // backends read it so, and the pipeline boundaries carry it so.
    const bool writesResidual = f.op == Prim::Expand || f.op == Prim::MhcPostRes || f.op == Prim::Residual;
    if (writesResidual && p.values[f.output].dtype != m.residualStorage())
      return "its output (the residual stream) is stored as '" + p.values[f.output].dtype +
             "', but the model's residual dtype is '" + m.residualStorage() + "'";
    auto in = [&](size_t k) { return shape(p, f.inputs[k]); };
    auto param = [&](size_t k) {
      const ParamInfo &info = a_.params[p.params[f.params[k]].param];
      return Shape{info.rows, info.cols};
    };
    auto expect = [&](size_t inputs, size_t params, std::vector<Shape> inShapes,
                      std::vector<Shape> paramShapes, Shape out, int64_t aux) -> std::string {
      if (f.inputs.size() != inputs || f.params.size() != params)
        return "takes " + std::to_string(inputs) + " inputs and " + std::to_string(params) + " parameters";
      for (size_t k = 0; k < inputs; ++k)
        if (in(k) != inShapes[k])
          return "input " + std::to_string(k) + " is " + str(in(k)) + ", expected " + str(inShapes[k]);
      for (size_t k = 0; k < params; ++k)
        if (param(k) != paramShapes[k])
          return "parameter " + std::to_string(k) + " is " + str(param(k)) + ", expected " +
                 str(paramShapes[k]);
      if (shape(p, f.output) != out)
        return "output is " + str(shape(p, f.output)) + ", expected " + str(out);
      if (f.auxSize != aux)
        return "scratch size " + std::to_string(f.auxSize) + ", expected " + std::to_string(aux);
      return "";
    };
    switch (f.op) {
    case Prim::Identity:
      return f.inputs.size() != 1 ? "takes one input" : expect(1, 0, {in(0)}, {}, in(0), 0);
    case Prim::Embed:
      if (f.shift < 0 || f.shift >= f.seqLen)
        return "bad shift";
      return expect(0, 1, {}, {{m.vocab, C}}, {T, C}, 0);
    case Prim::Expand:
      return expect(1, 0, {{T, C}}, {}, {T, n * C}, 0);
    case Prim::Contract:
      return expect(1, 0, {{T, n * C}}, {}, {T, C}, 0);
    case Prim::MhcCoeffs:
      if (f.sinkhornIterations < 1)
        return "needs at least one Sinkhorn iteration";
      return expect(1, 3, {{T, n * C}}, {{n * C, K}, {1, K}, {1, 3}}, {T, K}, T * (K + 1));
    case Prim::MhcPre:
      return expect(2, 0, {{T, n * C}, {T, K}}, {}, {T, C}, 0);
    case Prim::MhcPostRes:
      return expect(3, 0, {{T, n * C}, {T, K}, {T, C}}, {}, {T, n * C}, 0);
    case Prim::Residual:
      return expect(2, 0, {{T, C}, {T, C}}, {}, {T, C}, 0);
    case Prim::RmsNorm:
      if (!(f.eps > 0))
        return "eps must be positive";
      return expect(1, 1, {{T, C}}, {{1, C}}, {T, C}, T);
    case Prim::Attention:
      if (f.heads < 1 || f.heads * tp != m.heads || (D / f.heads) % 2)
        return "bad head count";
      return expect(1, 2, {{T, C}}, {{C, 3 * C}, {C, C}}, {T, C}, G * 4 * D + G * f.heads);
    case Prim::GatedDeltaNet: {
      // f.heads: the rank's (H / tp); parameters are whole, aux the rank's.
      if (f.heads < 1 || f.heads * tp != m.heads || D % f.heads || !(f.eps > 0))
        return "bad head count or norm eps";
      const int64_t H = m.heads;
      return expect(1, 8, {{T, C}},
                    {{C, 3 * C}, {4, 3 * C}, {C, 2 * H}, {1, H}, {1, H}, {1, C / H}, {C, C}, {C, C}}, {T, C},
                    G * (11 * D + 5 * f.heads));
    }
    case Prim::SwiGlu:
      if (f.ffn < 1)
        return "bad FFN size";
      return expect(1, 3, {{T, C}}, {{C, f.ffn * tp}, {C, f.ffn * tp}, {f.ffn * tp, C}}, {T, C}, 3 * G * f.ffn);
    case Prim::LmHead:
      return expect(1, 1, {{T, C}}, {{C, m.vocab}}, {G, Vs}, 0);
    case Prim::ConcatProj:
      return expect(2, 1, {{T, C}, {T, C}}, {{2 * C, C}}, {T, C}, 0);
    case Prim::CrossEntropy:
      if (f.loss < 0 || f.loss >= static_cast<int>(p.losses.size()))
        return "names no loss";
      if (f.shift < 0 || f.shift >= f.seqLen)
        return "bad shift";
      return expect(1, 0, {{G, Vs}}, {}, {1, 1}, G);
    }
    return "unknown kernel";
  }

  std::string instr(const Instr &i, int64_t rank) {
    const int64_t stages = a_.pp * a_.vpp;
    if (i.kind == OpKind::Optimizer)
      return "";
    if (i.kind == OpKind::AllReduce) {
      if (a_.reduceGroupSize() < 2 || i.width <= 0)
        return "a gradient ALLREDUCE needs dp x cp > 1 and a size";
      if ((i.collective == CollectiveOp::ReduceScatter) != a_.distributedOptimizer)
        return a_.distributedOptimizer ? "a whole-gradient ALLREDUCE under the distributed optimizer, whose "
                                         "reductions are REDUCESCATTERs (an artifact from before them? recompile it)"
                                       : "a REDUCESCATTER without the distributed optimizer";
      return i.stage >= 0 && i.stage < stages && a_.rankOf(i.stage) == rank
                 ? ""
                 : "a gradient ALLREDUCE of no stage of this rank (an artifact from before the per-stage "
                   "ALLREDUCE? recompile it)";
    }
    if (i.stage < 0 || i.stage >= stages || i.mb < 0 || i.mb >= a_.microbatches)
      return "stage or microbatch out of range";
    if (i.kind == OpKind::Collective && (i.axis == MeshAxis::Tensor ? a_.tp : a_.cp) < 2)
      return std::string("a collective of the ") + meshAxisName(i.axis) + " group in an artifact with " +
             meshAxisName(i.axis) + " = 1";
    if (!i.isComm())
      return a_.rankOf(i.stage) == rank ? "" : "runs a stage of another rank";
    if (i.peer < 0 || i.peer >= a_.pp || i.peer == rank)
      return "bad peer";
    bool act = i.payload == Payload::Activation;
    if (i.srcStage < 0 || i.srcStage >= stages || i.dstStage != i.srcStage + (act ? 1 : -1))
      return "bad edge";
    const StageProgram &from = a_.stages[act ? i.srcStage : i.dstStage];
    int boundary = from.output;
    if (boundary < 0)
      return "the edge leaves no stage output";
    if (i.tokens != from.values[boundary].rows || i.width != from.values[boundary].cols)
      return "shape differs from the stage boundary";
    return "";
  }

  const Artifact &a_;
};

} // namespace

std::string validateArtifact(const Artifact &artifact) { return Checker(artifact).run(); }

} // namespace mhcc::runtime
