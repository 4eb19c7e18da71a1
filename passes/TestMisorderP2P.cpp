//===- TestMisorderP2P.cpp - -pipe-test-misorder-p2p (test only) ---------------===//
#include "passes/Passes.h"

#define DEBUG_TYPE "pipe-test-misorder-p2p"

using namespace mlir;

namespace mhcc {

#define GEN_PASS_DEF_PIPETESTMISORDERP2P
#include "passes/Passes.h.inc"

namespace {
struct PipeTestMisorderP2PPass : public impl::PipeTestMisorderP2PBase<PipeTestMisorderP2PPass> {
  void runOnOperation() override {
    for (auto schedule : getOperation().getOps<pipe::ScheduleOp>()) {
      auto ranks = llvm::to_vector(schedule.getBody().front().getOps<pipe::RankOp>());
      if (ranks.empty())
        continue;
      auto recvs = llvm::to_vector(ranks.back().getBody().front().getOps<pipe::RecvOp>());
      for (size_t i = 0; i < recvs.size(); ++i)
        for (size_t j = i + 1; j < recvs.size(); ++j) {
          pipe::RecvOp a = recvs[i], b = recvs[j];
          if (a.getPeer() != b.getPeer() || a.getPayload() == b.getPayload() ||
              a.getTensorType() != b.getTensorType())
            continue;
          // Swap what the two receives expect; their positions stay.
          for (StringRef name : {"payload", "src_stage", "dst_stage", "mb"}) {
            Attribute first = a->getAttr(name);
            a->setAttr(name, b->getAttr(name));
            b->setAttr(name, first);
          }
          return;
        }
    }
    getOperation().emitError() << "no two same-peer receives of different payloads to swap";
    signalPassFailure();
  }
};
} // namespace

} // namespace mhcc
