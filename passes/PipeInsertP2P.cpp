//===- PipeInsertP2P.cpp - -pipe-insert-p2p -----------------------------------===//
#include "passes/Passes.h"
#include "passes/PipelineIR.h"

#include "mlir/IR/Builders.h"

#define DEBUG_TYPE "pipe-insert-p2p"

using namespace mlir;

namespace mhcc {

#define GEN_PASS_DEF_PIPEINSERTP2P
#include "passes/Passes.h.inc"

namespace {
struct PipeInsertP2PPass : public impl::PipeInsertP2PBase<PipeInsertP2PPass> {
  void runOnOperation() override {
    FailureOr<func::FuncOp> func = findModelFunc(getOperation());
    if (failed(func))
      return signalPassFailure();
    FailureOr<pipeline::Layout> layout = layoutOf(*func);
    if (failed(layout))
      return signalPassFailure();
    const int64_t pp = layout->pp;
    auto stageOf = [](Operation *op) -> std::optional<int64_t> {
      if (auto attr = op->getAttrOfType<IntegerAttr>(pipe::kStageAttr))
        return attr.getInt();
      return std::nullopt;
    };
    if (!func->getOps<pipe::BoundaryOp>().empty()) {
      func->emitError() << "already has pipe.boundary ops; run -pipe-insert-p2p once";
      return signalPassFailure();
    }
    // The chain of boundaries leaving each value, indexed by destination stage.
    DenseMap<Value, SmallVector<Value>> crossings;
    OpBuilder builder(func->getContext());
    SmallVector<Operation *> users;
    for (Operation &op : func->getBody().front())
      if (stageOf(&op))
        users.push_back(&op);
    for (Operation *user : users) {
      int64_t dst = *stageOf(user);
      for (OpOperand &operand : user->getOpOperands()) {
        Operation *producer = operand.get().getDefiningOp();
        if (!producer)
          continue; // token ids and labels: every rank's data loader has them
        std::optional<int64_t> src = stageOf(producer);
        if (!src) {
          producer->emitOpError() << "feeds stage " << dst << " but has no " << pipe::kStageAttr;
          return signalPassFailure();
        }
        if (*src > dst) {
          user->emitOpError() << "in stage " << dst << " reads a value from the later stage "
                              << *src << "; stages must follow the forward order";
          return signalPassFailure();
        }
        if (*src == dst)
          continue;
        SmallVector<Value> &chain = crossings[operand.get()];
        Value current = chain.empty() ? operand.get() : chain.back();
        builder.setInsertionPointAfter(chain.empty() ? producer : chain.back().getDefiningOp());
        for (int64_t s = *src + static_cast<int64_t>(chain.size()); s < dst; ++s) {
          int64_t srcRank = s % pp, dstRank = (s + 1) % pp;
          bool wraparound = pp > 1 && srcRank == pp - 1 && dstRank == 0;
          auto boundary = pipe::BoundaryOp::create(builder, producer->getLoc(), current.getType(),
                                                   current, s, s + 1, srcRank, dstRank, wraparound);
          current = boundary.getResult();
          chain.push_back(current);
        }
        operand.set(chain[dst - *src - 1]);
      }
    }
  }
};
} // namespace

} // namespace mhcc
