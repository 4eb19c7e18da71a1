//===- Lowering.cpp - partitioned mhc IR -> artifact --------------------------===//
#include "compiler/Lowering.h"

#include "dialects/mhc/IR/MhcOps.h"
#include "dialects/pipe/IR/PipeOps.h"
#include "passes/ModelUnits.h"
#include "passes/PipelineIR.h"
#include "passes/autodiff/Autodiff.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/TypeSwitch.h"

#include <cmath>
#include <map>
#include <sstream>

using namespace mlir;
using namespace mhcc::runtime;

namespace mhcc {
namespace {

class StageLowering {
public:
  StageLowering(Artifact &artifact, func::FuncOp func, int64_t numLayers)
      : artifact_(artifact), func_(func), numLayers_(numLayers) {
    const ModelInfo &m = artifact.model;
    tokens_ = artifact.rowsPerRank(); // a context- (or sequence-) parallel rank's share of each microbatch
    tp_ = artifact.tp;
    gemmTokens_ = m.tokens() / artifact.cp; // what the tensor-parallel GEMMs see: sequence shares gathered
    artifact.stages.resize(artifact.pp * artifact.vpp);
    for (size_t s = 0; s < artifact.stages.size(); ++s)
      artifact.stages[s].stage = s;
  }

  LogicalResult run() {
    for (auto embed : func_.getOps<mhc::EmbeddingOp>())
      embeddingParam_ = embed.getNode().str() + ".weight";
    for (auto head : func_.getOps<mhc::LmHeadOp>())
      headParam_ = head.getNode().str() + ".weight";
    for (Operation &op : func_.getBody().front()) {
      if (auto boundary = dyn_cast<pipe::BoundaryOp>(op)) {
        lowerBoundary(boundary);
        continue;
      }
      auto stageAttr = op.getAttrOfType<IntegerAttr>(pipe::kStageAttr);
      if (isa<func::ReturnOp>(op))
        continue;
      if (!stageAttr)
        return op.emitOpError() << "has no " << pipe::kStageAttr << "; run the pipeline phases first";
      stage_ = stageAttr.getInt();
      if (failed(lowerOp(&op)))
        return failure();
    }
    for (StageProgram &program : artifact_.stages) {
      // An empty stage forwards its input into a buffer of its own.
      if (program.input >= 0 && program.output == program.input) {
        stage_ = program.stage;
        program.output = emit(Prim::Identity, {program.input}, {}, shape(program, program.input), 0);
      }
      std::string error = differentiate(program);
      if (!error.empty())
        return func_.emitError() << "autodiff of stage " << program.stage << ": " << error;
    }
    return success();
  }

private:
  using Shape = std::pair<int64_t, int64_t>;

  StageProgram &program() { return artifact_.stages[stage_]; }
  Shape shape(StageProgram &p, int value) { return {p.values[value].rows, p.values[value].cols}; }

  int newValue(Shape s, std::string tap = "") {
    program().values.push_back({s.first, s.second, std::move(tap)});
    return static_cast<int>(program().values.size()) - 1;
  }

  int valueOf(Value v) {
    auto it = values_.find({stage_, v.getAsOpaquePointer()});
    return it == values_.end() ? -1 : it->second;
  }

  void bind(Value v, int id) { values_[{stage_, v.getAsOpaquePointer()}] = id; }

  /// A parameter slot of the current stage for parameter `name`, created in
  /// the table on first use anywhere (shared parameters keep one entry).
  int slot(const std::string &name, int64_t rows, int64_t cols, const std::string &init,
           double scale, bool decay, const std::string &tpSplit = "") {
    auto it = paramIndex_.find(name);
    int param;
    if (it == paramIndex_.end()) {
      param = static_cast<int>(artifact_.params.size());
      artifact_.params.push_back({name, rows, cols, init, scale, decay, tpSplit});
      paramIndex_[name] = param;
    } else {
      param = it->second;
    }
    program().params.push_back({param, useOrder_++});
    return static_cast<int>(program().params.size()) - 1;
  }

  int emit(Prim op, std::vector<int> inputs, std::vector<int> params, Shape out, int64_t aux,
           std::string tap = "", ForwardInstr attrs = {}) {
    ForwardInstr instr = attrs;
    instr.op = op;
    instr.inputs = std::move(inputs);
    instr.params = std::move(params);
    instr.output = newValue(out, std::move(tap));
    program().values[instr.output].dtype = storageOf(op, instr.inputs);
    instr.auxSize = aux;
    if (instr.seqLen <= 1)
      instr.seqLen = artifact_.model.seqLen;
    program().forward.push_back(instr);
    return instr.output;
  }

  /// How an instruction's output is stored (docs/precision.md): a bf16
  /// model keeps its activations in bf16, except the mHC coefficients
  /// (computed and kept in fp32, with Sinkhorn) and the losses; the residual
  /// stream (expand, post-res mix, residual add) in the model's residual
  /// dtype; a copy keeps its input's storage.
  std::string storageOf(Prim op, const std::vector<int> &inputs) {
    if (artifact_.model.dtype != "bf16")
      return "f32";
    switch (op) {
    case Prim::MhcCoeffs:
    case Prim::CrossEntropy:
      return "f32";
    case Prim::Expand:
    case Prim::MhcPostRes:
    case Prim::Residual:
      return artifact_.model.residualStorage();
    case Prim::Identity:
      return program().values[inputs[0]].dtype;
    default:
      return "bf16";
    }
  }

  void lowerBoundary(pipe::BoundaryOp boundary) {
    stage_ = boundary.getSrcStage();
    int sent = valueOf(boundary.getInput());
    program().output = sent;
    const std::string dtype = program().values[sent].dtype; // the message carries it as stored
    stage_ = boundary.getDstStage();
    auto type = cast<RankedTensorType>(boundary.getInput().getType());
    // The IR's tensors are the whole microbatch; a rank holds its context-parallel share.
    int received = newValue({tokens_, type.getDimSize(1)});
    program().values[received].dtype = dtype;
    program().input = received;
    bind(boundary.getResult(), received);
  }

  ForwardInstr attrs(std::function<void(ForwardInstr &)> set) {
    ForwardInstr a;
    set(a);
    return a;
  }

  double outputScale() const { return 0.02 / std::sqrt(2.0 * std::max<int64_t>(1, numLayers_)); }

  /// A Gated DeltaNet (runtime/cpu/GdnKernels.h): its parameters as FLA
  /// initializes them where it matters (A_log = 0, dt_bias so that
  /// softplus(dt_bias) = 0.01: the state decays by ~1% a token at first;
  /// no weight decay on either) and what its forward keeps.
  int lowerGatedDeltaNet(const std::string &name, int normed, double eps) {
    const ModelInfo &m = artifact_.model;
    const int64_t T = tokens_, C = m.hidden, H = m.heads;
    const double dtBias = std::log(std::expm1(0.01));
    // Under tensor parallelism a rank holds H / tp whole heads: their q, k, v
    // columns, conv channels, gate logits, decays and gate columns, and the
    // rows of W_o (row-parallel out, as attention); out_norm is per head
    // and shared: every rank holds it, its gradient summed over the ranks.
    return emit(Prim::GatedDeltaNet, {normed},
                {slot(name + ".w_qkv", C, 3 * C, "normal", 0.02, true, "qkv"),
                 slot(name + ".conv", 4, 3 * C, "normal", 0.29, true, "qkv"), // PyTorch's depthwise conv: U(-1/2, 1/2)
                 slot(name + ".w_ab", C, 2 * H, "normal", 0.02, true, "ab"),
                 slot(name + ".a_log", 1, H, "zeros", 0, false, "cols"),
                 slot(name + ".dt_bias", 1, H, "constant", dtBias, false, "cols"),
                 slot(name + ".out_norm", 1, C / H, "ones", 0, false, "partial"),
                 slot(name + ".w_gate", C, C, "normal", 0.02, true, "cols"),
                 slot(name + ".w_o", C, C, "normal", outputScale(), true, "rows")},
                {T, C}, gemmTokens_ * (11 * C + 5 * H) / tp_, "", attrs([&](ForwardInstr &a) {
                  a.heads = H / tp_;
                  a.eps = eps;
                }));
  }

  /// One mHC-wrapped sublayer (or the plain residual of n = 1); kind:
  /// "attention", "gdn" or "mlp".
  int lowerSublayer(const std::string &name, const std::string &kind, int x, double eps) {
    const ModelInfo &m = artifact_.model;
    const int64_t T = tokens_, C = m.hidden, n = m.streams, K = n * n + 2 * n;
    int u = x, coef = -1;
    if (n > 1) {
      double bound = std::sqrt(6.0 / double(n * C + K));
      coef = emit(Prim::MhcCoeffs, {x},
                  {slot(name + ".w_map", n * C, K, "xavier_uniform", bound, true),
                   slot(name + ".b", 1, K, "zeros", 0, false),
                   slot(name + ".alpha", 1, 3, "constant", m.gatingFactor, false)},
                  {T, K}, T * (K + 1), "",
                  attrs([&](ForwardInstr &a) {
                    a.streams = n;
                    a.sinkhornIterations = m.sinkhornIterations;
                  }));
      u = emit(Prim::MhcPre, {x, coef}, {}, {T, C}, 0, "", attrs([&](ForwardInstr &a) { a.streams = n; }));
    } else if (m.roundsSublayerInput()) {
      // n = 1 with an fp32 residual beside bf16 activations: the sublayer
      // still reads u in bf16 (the IR's body argument), rounded where n > 1
      // rounds its pre-mix; a contraction of one stream is that copy, up to
      // the sign of a zero (docs/precision.md).
      u = emit(Prim::Contract, {x}, {}, {T, C}, 0, "", attrs([&](ForwardInstr &a) { a.streams = 1; }));
    }
    int normed = emit(Prim::RmsNorm, {u}, {slot(name + ".norm", 1, C, "ones", 0, false)}, {T, C}, T,
                      "", attrs([&](ForwardInstr &a) { a.eps = eps; }));
    int y;
    if (kind == "gdn")
      y = lowerGatedDeltaNet(name, normed, eps);
    // Under tensor parallelism a rank holds heads / tp whole heads and ffn / tp
    // FFN columns (column-parallel in, row-parallel out), and keeps their
    // aux for every row the GEMMs see.
    else if (kind == "attention")
      y = emit(Prim::Attention, {normed},
               {slot(name + ".w_qkv", C, 3 * C, "normal", 0.02, true, "qkv"),
                slot(name + ".w_o", C, C, "normal", outputScale(), true, "rows")},
               {T, C}, gemmTokens_ * (4 * C + m.heads) / tp_, "",
               attrs([&](ForwardInstr &a) { a.heads = m.heads / tp_; }));
    else
      y = emit(Prim::SwiGlu, {normed},
               {slot(name + ".w_gate", C, m.ffnHidden, "normal", 0.02, true, "cols"),
                slot(name + ".w_up", C, m.ffnHidden, "normal", 0.02, true, "cols"),
                slot(name + ".w_down", m.ffnHidden, C, "normal", outputScale(), true, "rows")},
               {T, C}, 3 * gemmTokens_ * m.ffnHidden / tp_, "",
               attrs([&](ForwardInstr &a) { a.ffn = m.ffnHidden / tp_; }));
    if (n > 1)
      return emit(Prim::MhcPostRes, {x, coef, y}, {}, {T, n * C}, 0, name,
                  attrs([&](ForwardInstr &a) { a.streams = n; }));
    return emit(Prim::Residual, {x, y}, {}, {T, C}, 0, name);
  }

  int lowerLoss(int logits, const std::string &lossName, double weight, int64_t shift,
                const std::string &tap) {
    program().losses.push_back({lossName, weight});
    int loss = static_cast<int>(program().losses.size()) - 1;
    return emit(Prim::CrossEntropy, {logits}, {}, {1, 1}, gemmTokens_, tap,
                attrs([&](ForwardInstr &a) {
                  a.loss = loss;
                  a.shift = shift;
                }));
  }

  LogicalResult lowerOp(Operation *op) {
    const ModelInfo &m = artifact_.model;
    const int64_t T = tokens_, C = m.hidden, n = m.streams, V = m.vocab;
    auto input = [&](unsigned k) -> int {
      int id = valueOf(op->getOperand(k));
      if (id < 0)
        op->emitOpError() << "reads a value stage " << stage_ << " does not have";
      return id;
    };
    auto nodeOf = [&]() { return op->getAttrOfType<StringAttr>("node").str(); };
    int result = -1;
    bool ok = true;
    llvm::TypeSwitch<Operation *>(op)
        .Case([&](mhc::EmbeddingOp) {
          result = emit(Prim::Embed, {}, {slot(embeddingParam_, V, C, "normal", 0.02, true, "rows")},
                        {T, C}, 0, nodeOf());
        })
        .Case([&](mhc::ExpandOp) {
          int x = input(0);
          ok = x >= 0;
          result = ok ? emit(Prim::Expand, {x}, {}, {T, n * C}, 0, nodeOf(),
                             attrs([&](ForwardInstr &a) { a.streams = n; }))
                      : -1;
        })
        .Case([&](mhc::HyperConnectionOp hc) {
          int x = input(0);
          ok = x >= 0;
          double eps = m.normEps;
          for (auto norm : hc.getBody().getOps<mhc::RmsNormOp>())
            eps = norm.getEps().convertToDouble();
          result = ok ? lowerSublayer(nodeOf(), hc.getSublayerKind().str(), x, eps) : -1;
        })
        .Case([&](mhc::ContractOp) {
          int x = input(0);
          ok = x >= 0;
          result = ok ? emit(Prim::Contract, {x}, {}, {T, C}, 0, nodeOf(),
                             attrs([&](ForwardInstr &a) { a.streams = n; }))
                      : -1;
        })
        .Case([&](mhc::RmsNormOp norm) {
          int x = input(0);
          ok = x >= 0;
          result = ok ? emit(Prim::RmsNorm, {x}, {slot(nodeOf() + ".weight", 1, C, "ones", 0, false)},
                             {T, C}, T, nodeOf(),
                             attrs([&](ForwardInstr &a) { a.eps = norm.getEps().convertToDouble(); }))
                      : -1;
        })
        .Case([&](mhc::LmHeadOp) {
          int x = input(0);
          ok = x >= 0;
          result = ok ? emit(Prim::LmHead, {x}, {slot(headParam_, C, V, "normal", 0.02, true, "cols")},
                             {gemmTokens_, V / tp_}, 0, nodeOf())
                      : -1;
        })
        .Case([&](mhc::CrossEntropyOp ce) {
          int logits = input(0);
          ok = logits >= 0;
          result = ok ? lowerLoss(logits, ce.getLossName().str(), 1.0, 0, nodeOf()) : -1;
        })
        .Case([&](mhc::MtpOp mtp) {
          int x = input(0);
          ok = x >= 0;
          if (ok)
            result = lowerMtp(mtp, x);
        })
        .Default([&](Operation *other) {
          other->emitOpError() << "cannot be lowered to a stage program";
          ok = false;
        });
    if (!ok)
      return failure();
    bind(op->getResult(0), result);
    return success();
  }

  /// DeepSeek-V3-style MTP: contract and normalize the final residual,
  /// normalize the embedding of the token `depth` ahead, project their
  /// concatenation, run one mHC layer, the final norm, the shared head, and
  /// a cross-entropy `depth` tokens further ahead.
  int lowerMtp(mhc::MtpOp mtp, int x) {
    const ModelInfo &m = artifact_.model;
    const int64_t T = tokens_, C = m.hidden, n = m.streams, V = m.vocab;
    const std::string name = mtp.getNode().str();
    const int64_t depth = mtp.getDepth();
    ForwardInstr withStreams = attrs([&](ForwardInstr &a) { a.streams = n; });
    ForwardInstr withEps = attrs([&](ForwardInstr &a) { a.eps = m.normEps; });
    int h = emit(Prim::Contract, {x}, {}, {T, C}, 0, "", withStreams);
    int hn = emit(Prim::RmsNorm, {h}, {slot(name + ".norm_hidden", 1, C, "ones", 0, false)}, {T, C}, T,
                  "", withEps);
    int e = emit(Prim::Embed, {}, {slot(embeddingParam_, V, C, "normal", 0.02, true, "rows")}, {T, C}, 0, "",
                 attrs([&](ForwardInstr &a) { a.shift = depth; }));
    int en = emit(Prim::RmsNorm, {e}, {slot(name + ".norm_embedding", 1, C, "ones", 0, false)},
                  {T, C}, T, "", withEps);
    int z = emit(Prim::ConcatProj, {hn, en}, {slot(name + ".proj", 2 * C, C, "normal", 0.02, true)},
                 {T, C}, 0);
    int r = emit(Prim::Expand, {z}, {}, {T, n * C}, 0, "", withStreams);
    r = lowerSublayer(name + ".attn", "attention", r, m.normEps);
    r = lowerSublayer(name + ".mlp", "mlp", r, m.normEps);
    int c = emit(Prim::Contract, {r}, {}, {T, C}, 0, "", withStreams);
    int f = emit(Prim::RmsNorm, {c}, {slot(name + ".final_norm", 1, C, "ones", 0, false)}, {T, C}, T,
                 "", withEps);
    int logits = emit(Prim::LmHead, {f}, {slot(headParam_, C, V, "normal", 0.02, true, "cols")},
                      {gemmTokens_, V / tp_}, 0);
    return lowerLoss(logits, "mtp loss", mtp.getLossWeight().convertToDouble(), depth, name);
  }

  Artifact &artifact_;
  func::FuncOp func_;
  int64_t numLayers_;
  int64_t tokens_ = 0;
  int64_t tp_ = 1, gemmTokens_ = 0;
  int64_t stage_ = 0;
  int64_t useOrder_ = 0;
  std::string embeddingParam_, headParam_;
  std::map<std::string, int> paramIndex_;
  std::map<std::pair<int64_t, const void *>, int> values_;
};

} // namespace

FailureOr<Artifact> buildArtifact(ModuleOp module, llvm::StringRef modelHash) {
  FailureOr<func::FuncOp> func = findModelFunc(module);
  if (failed(func))
    return failure();
  auto schedules = llvm::to_vector(module.getOps<pipe::ScheduleOp>());
  if (schedules.size() != 1)
    return func->emitError() << "the artifact needs exactly one pipe.schedule (compile through "
                                "the schedule phase)";
  FailureOr<pipeline::Layout> layout = layoutOf(*func);
  if (failed(layout))
    return failure();
  FailureOr<ModelUnits> units = collectModelUnits(*func);
  if (failed(units))
    return failure();
  Artifact artifact;
  ModelInfo &m = artifact.model;
  m = units->dims; // the sizes as the cost model read them from #mhc.config
  m.trainingFlopsPerToken = totalCost(units->units, m).trainingFlopsPerToken();
  artifact.modelHash = modelHash.str();
  pipeline::Schedule schedule = readSchedule(schedules.front());
  artifact.pp = schedule.pp;
  artifact.vpp = schedule.vpp;
  artifact.dp = schedule.dp;
  artifact.cp = schedule.cp;
  artifact.tp = schedule.tp;
  artifact.sequenceParallel = schedule.sequenceParallel;
  artifact.distributedOptimizer = schedule.distributedOptimizer;
  artifact.recomputeSublayers = schedule.recomputeSublayers;
  artifact.recomputeNumSublayers = schedule.recomputeNumSublayers;
  artifact.microbatches = schedule.microbatches;
  artifact.groupSize = schedule.groupSize;
  artifact.scheduleKind = pipeline::scheduleKindName(schedule.kind);
  artifact.layout = layout->toString();
  artifact.ranks = schedule.ranks;
  if (failed(StageLowering(artifact, *func, modelShapeOf(*func).layers).run()))
    return failure();
  std::string problem = validateArtifact(artifact);
  if (!problem.empty())
    return func->emitError() << "internal error: the lowered artifact is inconsistent: " << problem;
  llvm::raw_string_ostream ir(artifact.ir);
  module.print(ir);
  return artifact;
}

std::string formatPrograms(const Artifact &artifact) {
  std::ostringstream os;
  for (const StageProgram &p : artifact.stages) {
    os << "stage " << p.stage << " (rank " << artifact.rankOf(p.stage) << "): input %" << p.input
       << ", output %" << p.output << ", grad input %" << p.gradInput << ", grad output %"
       << p.gradOutput << "\n";
    auto value = [&](int v) {
      std::ostringstream s;
      s << "%" << v << "[" << p.values[v].rows << "x" << p.values[v].cols
        << (p.values[v].dtype == "f32" ? "" : "x" + p.values[v].dtype) << "]";
      return s.str();
    };
    for (const ForwardInstr &f : p.forward) {
      os << "  fwd " << value(f.output) << " = " << primName(f.op) << "(";
      for (size_t k = 0; k < f.inputs.size(); ++k)
        os << (k ? ", " : "") << value(f.inputs[k]);
      os << ")";
      for (int s : f.params)
        os << " " << artifact.params[p.params[s].param].name;
      if (!p.values[f.output].tap.empty())
        os << "  ; " << p.values[f.output].tap;
      os << "\n";
    }
    for (const BackwardInstr &b : p.backward) {
      const ForwardInstr &f = p.forward[b.forward];
      os << "  bwd " << primName(f.op) << " #" << b.forward << ": d" << (b.gradOutput >= 0 ? value(b.gradOutput) : std::string("loss"))
         << " ->";
      for (int g : b.gradInputs)
        os << " " << (g >= 0 ? value(g) : std::string("-"));
      os << "\n";
    }
  }
  return os.str();
}

} // namespace mhcc
