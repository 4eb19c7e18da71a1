//===- PipelineIR.cpp - between the pipe IR and the plain C++ algorithms ----===//
#include "passes/PipelineIR.h"

#include "dialects/mhc/IR/MhcOps.h"
#include "passes/ModelUnits.h"
#include "passes/pipeline/RecomputeCost.h"
#include "runtime/program/Collectives.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/TypeSwitch.h"

#include <algorithm>

using namespace mlir;

namespace mhcc {
namespace {

/// Index of the partition unit (E = 0, layer k = 1 + k, L = 1 + layers) an op
/// belongs to, or -1 for ops that are not model units.
int64_t unitIndexOf(Operation *op, int64_t layers) {
  std::optional<UnitKind> kind = unitKindOf(op);
  if (!kind)
    return -1;
  switch (*kind) {
  case UnitKind::Embedding:
    return 0;
  case UnitKind::Expand:
    return 1; // the residual is formed where the first layer runs
  case UnitKind::AttentionSublayer:
  case UnitKind::GdnSublayer:
  case UnitKind::MlpSublayer:
    return 1 + cast<mhc::HyperConnectionOp>(op).getLayer();
  default:
    return 1 + layers;
  }
}

/// The element type a boundary carries: its tensor's (bf16 activations, or
/// an f32 residual stream in a bf16 model).
Type boundaryElementType(pipe::BoundaryOp boundary) {
  return cast<RankedTensorType>(boundary.getInput().getType()).getElementType();
}

int64_t boundaryElementBytes(pipe::BoundaryOp boundary) {
  return std::max<int64_t>(1, boundaryElementType(boundary).getIntOrFloatBitWidth() / 8);
}

int64_t countOps(func::FuncOp func, function_ref<bool(Operation *)> pred) {
  int64_t count = 0;
  for (Operation &op : func.getBody().front())
    count += pred(&op);
  return count;
}

} // namespace

FailureOr<func::FuncOp> findModelFunc(ModuleOp module) {
  func::FuncOp found;
  for (auto func : module.getOps<func::FuncOp>()) {
    if (!func->hasAttr(mhc::kConfigAttrName))
      continue;
    if (found)
      return func.emitError() << "a module holds one mhc model; '" << found.getSymName()
                              << "' is the first";
    found = func;
  }
  if (!found)
    return module.emitError() << "no mhc model (a func.func with #mhc.config) in the module";
  return found;
}

pipeline::ModelShape modelShapeOf(func::FuncOp func) {
  pipeline::ModelShape shape;
  shape.layers = countOps(func, [](Operation *op) { return isa<mhc::HyperConnectionOp>(op); }) / 2;
  shape.mtpModules = countOps(func, [](Operation *op) { return isa<mhc::MtpOp>(op); });
  return shape;
}

FailureOr<std::vector<pipeline::PartitionUnit>> partitionUnitsOf(func::FuncOp func, bool recomputeSublayers,
                                                                 int64_t sublayersPerSegment) {
  FailureOr<ModelInfo> dims = modelInfoOf(func);
  if (failed(dims))
    return failure();
  pipeline::ModelShape shape = modelShapeOf(func);
  // Embedding, the layers, the loss (layers >= 0: the verifier counted them).
  std::vector<pipeline::PartitionUnit> units(static_cast<size_t>(std::max<int64_t>(shape.layers, 0)) + 2);
  pipeline::PartitionUnit &first = units.front(), &last = units.back();
  first.symbol = 'E';
  last.symbol = 'L';
  last.mtpModules = shape.mtpModules;
  const double tokens = dims->tokens();
  // fp32 master weights, gradients and two Adam moments.
  constexpr double kBytesPerParameter = 16;
  double pendingDrop = 0; // dropped whole, joining the next sublayer's segment
  // With MTP the runtime's segments also cut after the MTP sublayers'
  // residual updates: all the last stage runs before its last MTP module's
  // tail (the main head and loss, each module's prelude, earlier modules'
  // tails) is dropped and run again too, and joins the working set of the
  // segment it ends in.
  int64_t mtpSeen = 0;
  const double k = double(std::max<int64_t>(sublayersPerSegment, 1));
  for (Operation &op : func.getBody().front()) {
    int64_t index = unitIndexOf(&op, shape.layers);
    if (index < 0)
      continue;
    const UnitKind kind = *unitKindOf(&op);
    const bool lastMtp = kind == UnitKind::Mtp && ++mtpSeen == shape.mtpModules;
    pipeline::PartitionUnit &unit = units[index];
    const std::vector<UnitCost> pieces =
        kind == UnitKind::Mtp ? mtpPieces(*dims) : std::vector<UnitCost>{unitCost(kind, *dims)};
    for (size_t i = 0; i < pieces.size(); ++i) {
      const UnitCost &cost = pieces[i];
      // Recomputed, a segment of k sublayers keeps its input residual and
      // runs its forward twice: per sublayer, 1 / k of a checkpoint on
      // average, and a segment's working set k sublayers' (partitioning
      // needs no more).
      const bool sublayer = recomputeSublayers && cost.checkpointBytesPerToken > 0;
      const bool beforeLastTail = recomputeSublayers && !sublayer && index == int64_t(units.size()) - 1 &&
                                  shape.mtpModules > 0 && !(lastMtp && i + 1 == pieces.size());
      unit.time += (sublayer || beforeLastTail ? 4 : 3) * cost.forwardFlopsPerToken * tokens;
      unit.parameterBytes += kBytesPerParameter * cost.params;
      if (beforeLastTail) {
        pendingDrop += double(cost.savedBytesPerToken) * tokens;
      } else if (sublayer) { // in program order: the layer's last sublayer comes last
        unit.activationBytes += cost.checkpointBytesPerToken / k * tokens;
        const double drop = (double(cost.savedBytesPerToken) - cost.checkpointBytesPerToken / k) * tokens;
        unit.lastSublayerDrop = k * drop;
        unit.largestSublayerDrop = std::max(unit.largestSublayerDrop, k * drop + pendingDrop);
        pendingDrop = 0;
      } else {
        unit.activationBytes += cost.savedBytesPerToken * tokens;
        unit.lastSublayerDrop = 0; // a kept piece ends the stage's last segment after it
      }
    }
  }
  return units;
}

LogicalResult applyLayout(func::FuncOp func, const pipeline::Layout &layout) {
  pipeline::ModelShape shape = modelShapeOf(func);
  if (std::optional<std::string> problem = pipeline::validateLayout(layout, shape))
    return func.emitError() << "invalid pipeline layout '" << layout.toString()
                            << "': " << *problem;
  std::vector<int64_t> stageOfUnit(shape.layers + 2, -1);
  int64_t layer = 0;
  for (size_t s = 0; s < layout.stages.size(); ++s)
    for (char symbol : layout.stages[s]) {
      if (symbol == 'E')
        stageOfUnit[0] = s;
      else if (symbol == 't')
        stageOfUnit[1 + layer++] = s;
      else if (symbol == 'L')
        stageOfUnit[1 + shape.layers] = s;
    }
  Builder builder(func.getContext());
  for (Operation &op : func.getBody().front()) {
    int64_t index = unitIndexOf(&op, shape.layers);
    if (index >= 0)
      op.setAttr(pipe::kStageAttr, builder.getI64IntegerAttr(stageOfUnit[index]));
  }
  func->setAttr(pipe::kLayoutAttr, builder.getStringAttr(layout.toString()));
  func->setAttr(pipe::kPpAttr, builder.getI64IntegerAttr(layout.pp));
  func->setAttr(pipe::kVppAttr, builder.getI64IntegerAttr(layout.vpp));
  return success();
}

FailureOr<pipeline::Layout> layoutOf(func::FuncOp func) {
  auto text = func->getAttrOfType<StringAttr>(pipe::kLayoutAttr);
  auto pp = func->getAttrOfType<IntegerAttr>(pipe::kPpAttr);
  auto vpp = func->getAttrOfType<IntegerAttr>(pipe::kVppAttr);
  if (!text || !pp || !vpp)
    return func.emitError() << "the model is not partitioned (run -pipe-partition first)";
  std::string error;
  pipeline::Layout layout;
  layout.pp = pp.getInt();
  layout.vpp = vpp.getInt();
  std::optional<std::vector<std::string>> stages = pipeline::expandLayout(text.str(), error);
  if (!stages)
    return func.emitError() << "bad " << pipe::kLayoutAttr << ": " << error;
  layout.stages = *stages;
  if (std::optional<std::string> problem = pipeline::validateLayout(layout, modelShapeOf(func)))
    return func.emitError() << "bad " << pipe::kLayoutAttr << ": " << *problem;
  return layout;
}

/// A unit, or one piece of an MTP module (mtpPieces), with the primitives
/// among its kernels that issue tensor- or context-parallel collectives
/// (runtime/program/Collectives.h), in forward order, as the compiler
/// lowers it (compiler/Lowering.cpp); the others issue none.
struct UnitPiece {
  UnitCost cost;
  std::vector<runtime::CollectiveStep> collectives;
};

static std::vector<UnitPiece> piecesOf(UnitKind kind, const ModelInfo &dims) {
  using runtime::Prim;
  switch (kind) {
  case UnitKind::Embedding:
    return {{unitCost(kind, dims), {{Prim::Embed, false}}}};
  case UnitKind::AttentionSublayer:
    return {{unitCost(kind, dims), {{Prim::Attention}}}};
  case UnitKind::GdnSublayer:
    return {{unitCost(kind, dims), {{Prim::GatedDeltaNet}}}};
  case UnitKind::MlpSublayer:
    return {{unitCost(kind, dims), {{Prim::SwiGlu}}}};
  case UnitKind::LmHead:
    return {{unitCost(kind, dims), {{Prim::LmHead}}}};
  case UnitKind::Loss:
    return {{unitCost(kind, dims), {{Prim::CrossEntropy, true, false}}}};
  case UnitKind::Mtp: { // its embedding, one attention and MLP sublayer, the shared head and its loss
    std::vector<UnitCost> costs = mtpPieces(dims);
    return {{costs[0], {{Prim::Embed, false}}},
            {costs[1], {{Prim::Attention}}},
            {costs[2], {{Prim::SwiGlu}}},
            {costs[3], {{Prim::LmHead}, {Prim::CrossEntropy, true, false}}}};
  }
  default:
    return {{unitCost(kind, dims), {}}};
  }
}

/// Each stage's collectives per compute step (FWD in forward order, the
/// backwards in reverse), and their time on the rank's ring over the link,
/// added to the step's: a rank waits in its group's collectives. A
/// recomputed segment's forward issues its forward collectives again inside
/// the backward (`recomputed`: those units' steps, runtime/program/Recompute.h).
static void addCollectives(pipeline::ScheduleSpec &spec, const std::vector<std::vector<runtime::CollectiveStep>> &steps,
                           const std::vector<std::vector<runtime::CollectiveStep>> &recomputed,
                           const runtime::CollectiveMesh &mesh) {
  auto time = [&](const std::vector<pipeline::Instr> &list) {
    double total = 0;
    for (const pipeline::Instr &c : list) {
      const int64_t group = c.axis == runtime::MeshAxis::Tensor ? mesh.tp : mesh.cp;
      const runtime::CollectiveTraffic traffic = runtime::ringTraffic(c, group, spec.elementBytes);
      if (spec.linkBytesPerTime > 0)
        total += traffic.bytes / spec.linkBytesPerTime + double(traffic.latencies) * spec.linkLatency;
    }
    return total;
  };
  for (size_t s = 0; s < spec.stages.size(); ++s) {
    pipeline::StageSpec &stage = spec.stages[s];
    std::vector<runtime::CollectiveStep> backward(steps[s].rbegin(), steps[s].rend());
    stage.forwardCollectives = runtime::collectivesOf(steps[s], pipeline::OpKind::Forward, mesh);
    stage.backwardCollectives = runtime::collectivesOf(backward, pipeline::OpKind::Backward, mesh);
    stage.inputCollectives = runtime::collectivesOf(backward, pipeline::OpKind::BackwardInput, mesh);
    stage.weightCollectives = runtime::collectivesOf(backward, pipeline::OpKind::BackwardWeight, mesh);
    stage.forwardTime += time(stage.forwardCollectives);
    stage.backwardTime += time(runtime::collectivesOf(recomputed[s], pipeline::OpKind::Forward, mesh));
    // Under ZB-H1 the simulator times B as the backward less W, and the
    // two halves issue their own collectives (W gathers again what it reads).
    const bool split = spec.kind == pipeline::ScheduleKind::ZeroBubbleH1;
    stage.backwardTime += split ? time(stage.inputCollectives) + time(stage.weightCollectives)
                                : time(stage.backwardCollectives);
    stage.weightGradTime += time(stage.weightCollectives);
  }
}

/// A stage's forward pieces in program order, for recomputeEffect, with
/// the collectives each issues.
struct StagePieces {
  std::vector<pipeline::RecomputePiece> pieces;
  std::vector<std::vector<runtime::CollectiveStep>> collectives;
};

/// Activation recomputation's effect on each stage: the saved bytes its
/// recomputed segments drop leave its peak, and their forwards (with their
/// collectives, added by addCollectives) join its backward; W
/// (weightGradTime) runs no forward again.
static std::vector<std::vector<runtime::CollectiveStep>>
applyRecomputation(pipeline::ScheduleSpec &spec, const std::vector<StagePieces> &stages) {
  std::vector<std::vector<runtime::CollectiveStep>> recomputed(stages.size());
  for (size_t s = 0; s < stages.size(); ++s) {
    const pipeline::RecomputeEffect effect =
        pipeline::recomputeEffect(stages[s].pieces, spec.recomputeNumSublayers);
    pipeline::StageSpec &stage = spec.stages[s];
    stage.savedBytes -= effect.droppedBytes;
    stage.recomputedBytes = effect.droppedBytes;
    stage.recomputeWorkingBytes = effect.largestSegmentBytes;
    stage.backwardTime += effect.forwardMs;
    for (size_t i = 0; i < effect.recomputed.size(); ++i)
      if (effect.recomputed[i])
        recomputed[s].insert(recomputed[s].end(), stages[s].collectives[i].begin(), stages[s].collectives[i].end());
  }
  return recomputed;
}

FailureOr<pipeline::ScheduleSpec> scheduleSpecOf(func::FuncOp func, pipeline::ScheduleKind kind,
                                                 int64_t microbatches, int64_t groupSize,
                                                 const SimulationOptions &options, int64_t cp, int64_t tp,
                                                 bool sequenceParallel, bool recomputeSublayers,
                                                 int64_t sublayersPerSegment) {
  FailureOr<pipeline::Layout> layout = layoutOf(func);
  FailureOr<ModelInfo> dims = modelInfoOf(func);
  if (failed(layout) || failed(dims))
    return failure();
  pipeline::ScheduleSpec spec;
  spec.kind = kind;
  spec.pp = layout->pp;
  spec.vpp = layout->vpp;
  spec.microbatches = microbatches;
  spec.groupSize = groupSize;
  // Under context parallelism every rank holds 1 / cp of each sequence, and
  // under sequence parallelism 1 / tp of that: what a boundary carries.
  const int64_t computedTokens = dims->tokens() / cp;
  spec.tokens = computedTokens / (sequenceParallel ? tp : 1);
  spec.cp = cp;
  spec.tp = tp;
  spec.sequenceParallel = sequenceParallel;
  spec.recomputeSublayers = recomputeSublayers;
  spec.recomputeNumSublayers = recomputeSublayers ? std::max<int64_t>(sublayersPerSegment, 1) : 1;
  spec.elementBytes = dims->dtypeBytes();
  const DeviceProfile &profile = options.profile;
  spec.linkBytesPerTime = profile.linkGBps * 1e6; // bytes per millisecond
  spec.linkLatency = profile.linkLatencyUs * 1e-3;
  spec.sharedCores = profile.sharedCores;
  const int64_t stages = layout->numStages();
  spec.stages.assign(stages, {});
  std::vector<std::vector<runtime::CollectiveStep>> collectiveSteps(stages);
  std::vector<StagePieces> recompute(stages);
  for (Operation &op : func.getBody().front()) {
    if (auto boundary = dyn_cast<pipe::BoundaryOp>(op)) {
      int64_t src = boundary.getSrcStage();
      if (src + 1 >= stages)
        return boundary.emitOpError() << "leaves the last stage " << stages - 1;
      pipeline::StageSpec &stage = spec.stages[src];
      if (stage.outputWidth != 0)
        return boundary.emitOpError()
               << "is the second boundary out of stage " << src
               << "; the model is a chain, one tensor crosses each boundary";
      stage.outputWidth = boundary.getWidth();
      stage.outputElementBytes = boundaryElementBytes(boundary);
      continue;
    }
    std::optional<UnitKind> kind = unitKindOf(&op);
    auto stageAttr = op.getAttrOfType<IntegerAttr>(pipe::kStageAttr);
    if (!kind)
      continue;
    if (!stageAttr)
      return op.emitOpError() << "has no " << pipe::kStageAttr << " (run -pipe-partition first)";
    UnitCost cost = unitCost(*kind, *dims);
    pipeline::StageSpec &stage = spec.stages[stageAttr.getInt()];
    // Tensor parallelism splits the GEMMs and heads evenly, not the mHC
    // mixing, expand, contract or final norm, which only sequence
    // parallelism splits (DeviceProfile; its collectives are priced by
    // addCollectives); a rank holds 1 / tp of the GEMM weights and of the
    // GEMMs' saved activations, and all of the rest (the residual, u and
    // normed u whole unless sequence parallelism shards their rows).
    const double forwardMs = profile.forwardMs(cost, computedTokens, tp, sequenceParallel);
    const double backward = profile.backwardMs(cost, computedTokens, tp, sequenceParallel);
    stage.forwardTime += forwardMs;
    stage.backwardTime += backward;
    stage.weightGradTime += backward / 2; // W: the weight-gradient GEMMs, half the backward
    const int64_t replicatedRows = sequenceParallel ? computedTokens / tp : computedTokens;
    auto savedBytes = [&](const UnitCost &c) {
      return (c.savedBytesPerToken - c.replicatedSavedBytesPerToken) * computedTokens / tp +
             c.replicatedSavedBytesPerToken * replicatedRows;
    };
    stage.savedBytes += savedBytes(cost);
    stage.params += cost.params - cost.splitParams + cost.splitParams / tp;
    // An MTP module's pieces share its forward time by their FLOPs.
    for (const UnitPiece &piece : piecesOf(*kind, *dims)) {
      std::vector<runtime::CollectiveStep> &steps = collectiveSteps[stageAttr.getInt()];
      steps.insert(steps.end(), piece.collectives.begin(), piece.collectives.end());
      const double share = cost.forwardFlopsPerToken > 0
                               ? piece.cost.forwardFlopsPerToken / cost.forwardFlopsPerToken : 1.0;
      StagePieces &stagePieces = recompute[stageAttr.getInt()];
      stagePieces.pieces.push_back({savedBytes(piece.cost), piece.cost.checkpointBytesPerToken * replicatedRows,
                                    *kind == UnitKind::Embedding, forwardMs * share});
      stagePieces.collectives.push_back(piece.collectives);
    }
  }
  std::vector<std::vector<runtime::CollectiveStep>> recomputedCollectives(stages);
  if (recomputeSublayers)
    recomputedCollectives = applyRecomputation(spec, recompute);
  spec.optimizerNsPerParam = profile.optimizerNsPerParam;
  addCollectives(spec, collectiveSteps, recomputedCollectives,
                 {tp, cp, sequenceParallel, dims->tokens(), dims->hidden, dims->heads});
  for (int64_t s = 0; s + 1 < stages; ++s)
    if (spec.stages[s].outputWidth == 0)
      return func.emitError() << "no pipe.boundary from stage " << s << " to " << s + 1
                              << " (run -pipe-insert-p2p first)";
  return spec;
}

FailureOr<pipeline::SimulationResult> simulateModuleSchedule(ModuleOp module, const SimulationOptions &options) {
  FailureOr<func::FuncOp> func = findModelFunc(module);
  auto scheduleOps = module.getOps<pipe::ScheduleOp>();
  if (failed(func) || scheduleOps.empty())
    return failure();
  pipeline::Schedule schedule = readSchedule(*scheduleOps.begin());
  FailureOr<pipeline::ScheduleSpec> spec =
      scheduleSpecOf(*func, schedule.kind, schedule.microbatches, schedule.groupSize, options, schedule.cp,
                     schedule.tp, schedule.sequenceParallel, schedule.recomputeSublayers,
                     schedule.recomputeNumSublayers);
  if (failed(spec))
    return failure();
  return pipeline::simulateSchedule(schedule, *spec);
}

pipe::ScheduleOp emitSchedule(func::FuncOp func, const pipeline::Schedule &schedule,
                              Type elementType) {
  auto module = func->getParentOfType<ModuleOp>();
  OpBuilder builder(module.getBodyRegion());
  builder.setInsertionPointToEnd(module.getBody());
  Location loc = func.getLoc();
  auto i64 = [&](int64_t value) { return builder.getI64IntegerAttr(value); };
  auto op = pipe::ScheduleOp::create(
      builder, loc, builder.getStringAttr(pipeline::scheduleKindName(schedule.kind)),
      FlatSymbolRefAttr::get(func.getSymNameAttr()), i64(schedule.pp), i64(schedule.vpp),
      i64(schedule.microbatches), i64(schedule.groupSize),
      schedule.dp > 1 ? i64(schedule.dp) : IntegerAttr(), schedule.cp > 1 ? i64(schedule.cp) : IntegerAttr(),
      schedule.tp > 1 ? i64(schedule.tp) : IntegerAttr(),
      schedule.sequenceParallel ? builder.getUnitAttr() : UnitAttr(),
      schedule.distributedOptimizer ? builder.getUnitAttr() : UnitAttr(),
      schedule.recomputeSublayers ? builder.getUnitAttr() : UnitAttr(),
      schedule.recomputeSublayers && schedule.recomputeNumSublayers > 1 ? i64(schedule.recomputeNumSublayers)
                                                                        : IntegerAttr());
  builder.setInsertionPointToStart(&op.getBody().emplaceBlock());
  // A message has its boundary's element type (the residual may be f32 in a bf16 model).
  llvm::DenseMap<int64_t, Type> boundaryElements;
  for (auto boundary : func.getBody().front().getOps<pipe::BoundaryOp>())
    boundaryElements[boundary.getSrcStage()] = boundaryElementType(boundary);
  for (int64_t r = 0; r < schedule.pp; ++r) {
    auto rankOp = pipe::RankOp::create(builder, loc, i64(r));
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPointToStart(&rankOp.getBody().emplaceBlock());
    for (const pipeline::Instr &instr : schedule.ranks[r]) {
      auto stage = i64(instr.stage), mb = i64(instr.mb);
      switch (instr.kind) {
      case pipeline::OpKind::Forward:
        pipe::ForwardOp::create(builder, loc, stage, mb);
        break;
      case pipeline::OpKind::Backward:
        pipe::BackwardOp::create(builder, loc, stage, mb);
        break;
      case pipeline::OpKind::BackwardInput:
        pipe::BackwardInputOp::create(builder, loc, stage, mb);
        break;
      case pipeline::OpKind::BackwardWeight:
        pipe::BackwardWeightOp::create(builder, loc, stage, mb);
        break;
      case pipeline::OpKind::Free:
        pipe::FreeOp::create(builder, loc, stage, mb);
        break;
      case pipeline::OpKind::Optimizer:
        pipe::OptimizerOp::create(builder, loc);
        break;
      case pipeline::OpKind::AllReduce:
        pipe::AllReduceOp::create(builder, loc, builder.getStringAttr("dp"), i64(instr.stage), i64(instr.width),
                                  instr.collective == runtime::CollectiveOp::ReduceScatter ? builder.getUnitAttr() : UnitAttr());
        break;
      case pipeline::OpKind::Collective:
        pipe::CollectiveOp::create(builder, loc, builder.getStringAttr(runtime::meshAxisName(instr.axis)),
                                   builder.getStringAttr(runtime::collectiveOpName(instr.collective)), stage, mb,
                                   TypeAttr::get(RankedTensorType::get({instr.tokens, instr.width}, elementType)));
        break;
      case pipeline::OpKind::Send:
      case pipeline::OpKind::Recv: {
        auto payload = builder.getStringAttr(
            instr.payload == pipeline::Payload::Activation ? "act" : "grad");
        Type element = boundaryElements.lookup(std::min(instr.srcStage, instr.dstStage));
        auto type = TypeAttr::get(RankedTensorType::get({instr.tokens, instr.width}, element ? element : elementType));
        if (instr.kind == pipeline::OpKind::Send)
          pipe::SendOp::create(builder, loc, payload, i64(instr.srcStage), i64(instr.dstStage), mb,
                               i64(instr.peer), i64(instr.group), i64(instr.order), type);
        else
          pipe::RecvOp::create(builder, loc, payload, i64(instr.srcStage), i64(instr.dstStage), mb,
                               i64(instr.peer), i64(instr.group), i64(instr.order), type);
        break;
      }
      }
    }
  }
  return op;
}

pipeline::Schedule readSchedule(pipe::ScheduleOp op,
                                std::vector<std::vector<Operation *>> *instrOps) {
  pipeline::Schedule schedule;
  schedule.kind = pipeline::parseScheduleKind(op.getKind().str()).value_or(pipeline::ScheduleKind::OneFOneB);
  schedule.pp = op.getPp();
  schedule.vpp = op.getVpp();
  schedule.microbatches = op.getMicrobatches();
  schedule.groupSize = op.getGroupSize();
  schedule.dp = op.getDp().value_or(1);
  schedule.cp = op.getCp().value_or(1);
  schedule.tp = op.getTp().value_or(1);
  schedule.sequenceParallel = op.getSequenceParallel();
  schedule.distributedOptimizer = op.getDistributedOptimizer();
  schedule.recomputeSublayers = op.getRecomputeSublayers();
  schedule.recomputeNumSublayers = op.getRecomputeNumSublayers().value_or(1);
  if (instrOps)
    instrOps->clear();
  for (auto rank : op.getBody().front().getOps<pipe::RankOp>()) {
    std::vector<pipeline::Instr> &list = schedule.ranks.emplace_back();
    if (instrOps)
      instrOps->emplace_back();
    for (Operation &inner : rank.getBody().front()) {
      pipeline::Instr instr;
      auto compute = [&](pipeline::OpKind kind, int64_t stage, int64_t mb) {
        instr.kind = kind;
        instr.stage = stage;
        instr.mb = mb;
      };
      auto comm = [&](pipeline::OpKind kind, auto c) {
        instr.kind = kind;
        instr.payload = c.getPayload() == "act" ? pipeline::Payload::Activation
                                                : pipeline::Payload::Gradient;
        instr.srcStage = c.getSrcStage();
        instr.dstStage = c.getDstStage();
        instr.stage = kind == pipeline::OpKind::Send ? instr.srcStage : instr.dstStage;
        instr.mb = c.getMb();
        instr.peer = c.getPeer();
        instr.group = c.getGroup();
        instr.order = c.getOrder();
        auto type = cast<RankedTensorType>(c.getTensorType());
        instr.tokens = type.getDimSize(0);
        instr.width = type.getDimSize(1);
      };
      llvm::TypeSwitch<Operation *>(&inner)
          .Case([&](pipe::ForwardOp o) { compute(pipeline::OpKind::Forward, o.getStage(), o.getMb()); })
          .Case([&](pipe::BackwardOp o) { compute(pipeline::OpKind::Backward, o.getStage(), o.getMb()); })
          .Case([&](pipe::BackwardInputOp o) {
            compute(pipeline::OpKind::BackwardInput, o.getStage(), o.getMb());
          })
          .Case([&](pipe::BackwardWeightOp o) {
            compute(pipeline::OpKind::BackwardWeight, o.getStage(), o.getMb());
          })
          .Case([&](pipe::FreeOp o) { compute(pipeline::OpKind::Free, o.getStage(), o.getMb()); })
          .Case([&](pipe::OptimizerOp) { instr.kind = pipeline::OpKind::Optimizer; })
          .Case([&](pipe::AllReduceOp o) {
            instr.kind = pipeline::OpKind::AllReduce;
            instr.stage = o.getStage();
            instr.tokens = 1;
            instr.width = o.getElements();
            instr.collective = o.getScatter() ? runtime::CollectiveOp::ReduceScatter : runtime::CollectiveOp::AllReduce;
          })
          .Case([&](pipe::CollectiveOp o) {
            // The op's verifier admits only known names.
            instr.kind = pipeline::OpKind::Collective;
            instr.axis = runtime::parseMeshAxis(o.getAxis().str()).value_or(runtime::MeshAxis::Tensor);
            instr.collective =
                runtime::parseCollectiveOp(o.getCollective().str()).value_or(runtime::CollectiveOp::AllReduce);
            instr.stage = o.getStage();
            instr.mb = o.getMb();
            auto type = cast<RankedTensorType>(o.getTensorType());
            instr.tokens = type.getDimSize(0);
            instr.width = type.getDimSize(1);
          })
          .Case([&](pipe::SendOp o) { comm(pipeline::OpKind::Send, o); })
          .Case([&](pipe::RecvOp o) { comm(pipeline::OpKind::Recv, o); });
      list.push_back(instr);
      if (instrOps)
        instrOps->back().push_back(&inner);
    }
  }
  return schedule;
}

} // namespace mhcc
