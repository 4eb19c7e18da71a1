//===- PipeDialect.cpp - pipe dialect ---------------------------------------===//
#include "dialects/pipe/IR/PipeDialect.h"

#include "dialects/pipe/IR/PipeOps.h"
#include "runtime/program/Instructions.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"

using namespace mlir;
using namespace mhcc::pipe;

#include "dialects/pipe/IR/PipeDialect.cpp.inc"

void PipeDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialects/pipe/IR/PipeOps.cpp.inc"
      >();
}

LogicalResult BoundaryOp::verify() {
  auto type = cast<RankedTensorType>(getInput().getType());
  if (type.getRank() != 2)
    return emitOpError() << "carries a tensor<T x W>, got " << type;
  if (getDstStage() != getSrcStage() + 1)
    return emitOpError() << "connects stage " << getSrcStage() << " to "
                         << getDstStage() << "; a boundary joins s and s + 1";
  return success();
}

LogicalResult ScheduleOp::verify() {
  uint64_t expected = 0;
  for (Operation &op : getBody().front()) {
    auto rank = dyn_cast<RankOp>(op);
    if (!rank)
      return op.emitOpError() << "only pipe.rank ops may appear in pipe.schedule";
    if (rank.getRank() != expected)
      return rank.emitOpError() << "ranks must be listed 0.." << getPp() - 1
                                << " in order; expected rank " << expected;
    ++expected;
  }
  if (expected != getPp())
    return emitOpError() << "has " << expected << " ranks but pp = " << getPp();
  if (getKind() != "gpipe" && getKind() != "1f1b" && getKind() != "interleaved" &&
      getKind() != "zb-h1")
    return emitOpError() << "unknown schedule kind '" << getKind() << "'";
  if (getDistributedOptimizer() && getDp().value_or(1) * getCp().value_or(1) < 2)
    return emitOpError() << "distributed_optimizer shards the optimizer over the gradient group; it needs dp x cp > 1";
  if (getSequenceParallel() && getTp().value_or(1) < 2)
    return emitOpError() << "sequence_parallel splits sequences over the tensor-parallel ranks; it needs tp > 1";
  if (getRecomputeNumSublayers() && !getRecomputeSublayers())
    return emitOpError() << "recompute_num_sublayers sizes the recomputed segments; it needs recompute_sublayers";
  if (getRecomputeNumSublayers().value_or(1) > 1024)
    return emitOpError() << "recompute_num_sublayers must be at most 1024 sublayers a segment, got "
                         << *getRecomputeNumSublayers();
  return success();
}

LogicalResult ScheduleOp::verifySymbolUses(SymbolTableCollection &symbols) {
  if (!symbols.lookupNearestSymbolFrom<func::FuncOp>(*this, getModelAttr()))
    return emitOpError() << "refers to no function " << getModelAttr();
  return success();
}

namespace {
template <typename CommOp>
LogicalResult verifyComm(CommOp op) {
  StringRef payload = op.getPayload();
  int64_t src = op.getSrcStage(), dst = op.getDstStage();
  if (payload == "act" && dst != src + 1)
    return op.emitOpError() << "an activation goes from stage s to s + 1, got "
                            << src << " -> " << dst;
  if (payload == "grad" && dst + 1 != src)
    return op.emitOpError() << "a gradient goes from stage s to s - 1, got "
                            << src << " -> " << dst;
  if (payload != "act" && payload != "grad")
    return op.emitOpError() << "payload must be \"act\" or \"grad\", got \""
                            << payload << "\"";
  auto type = cast<RankedTensorType>(op.getTensorType());
  if (type.getRank() != 2 || !type.hasStaticShape())
    return op.emitOpError() << "carries a static tensor<T x W>, got " << type;
  return success();
}
} // namespace

LogicalResult SendOp::verify() { return verifyComm(*this); }
LogicalResult RecvOp::verify() { return verifyComm(*this); }

LogicalResult AllReduceOp::verify() {
  if (getGroup() != "dp")
    return emitOpError() << "reduces over the data-parallel group \"dp\", got \"" << getGroup() << "\"";
  auto schedule = (*this)->getParentOfType<ScheduleOp>();
  if (schedule && schedule.getDp().value_or(1) * schedule.getCp().value_or(1) < 2)
    return emitOpError() << "needs a schedule with dp x cp > 1 (the schedule has dp = "
                         << schedule.getDp().value_or(1) << ", cp = " << schedule.getCp().value_or(1) << ")";
  if (schedule && getScatter() != schedule.getDistributedOptimizer())
    return emitOpError() << (getScatter() ? "scatters the sum, which only the distributed optimizer's members expect"
                                          : "sums whole gradients in a schedule with distributed_optimizer, whose "
                                            "reductions are reduce-scatters (scatter)");
  return success();
}

LogicalResult CollectiveOp::verify() {
  const bool tensor = getAxis() == "tp";
  if (!tensor && getAxis() != "cp")
    return emitOpError() << "runs in the tensor-parallel group \"tp\" or the context-parallel group \"cp\", got \""
                         << getAxis() << "\"";
  if (!mhcc::runtime::parseCollectiveOp(getCollective().str()))
    return emitOpError() << "is all_gather, reduce_scatter, all_reduce or all_reduce_max, got \""
                         << getCollective() << "\"";
  auto type = cast<RankedTensorType>(getTensorType());
  if (type.getRank() != 2 || type.getDimSize(0) < 1 || type.getDimSize(1) < 1)
    return emitOpError() << "carries a [rows, cols] tensor, got " << type;
  auto schedule = (*this)->getParentOfType<ScheduleOp>();
  const int64_t group = !schedule ? 2 : tensor ? schedule.getTp().value_or(1) : schedule.getCp().value_or(1);
  if (group < 2)
    return emitOpError() << "needs a schedule with " << getAxis() << " > 1";
  return success();
}

#define GET_OP_CLASSES
#include "dialects/pipe/IR/PipeOps.cpp.inc"
