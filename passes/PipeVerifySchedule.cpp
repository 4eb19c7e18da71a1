//===- PipeVerifySchedule.cpp - -pipe-verify-schedule --------------------------===//
#include "passes/Passes.h"
#include "passes/PipelineIR.h"

#define DEBUG_TYPE "pipe-verify-schedule"

using namespace mlir;

namespace mhcc {

#define GEN_PASS_DEF_PIPEVERIFYSCHEDULE
#include "passes/Passes.h.inc"

namespace {
struct PipeVerifySchedulePass : public impl::PipeVerifyScheduleBase<PipeVerifySchedulePass> {
  void runOnOperation() override {
    FailureOr<func::FuncOp> func = findModelFunc(getOperation());
    if (failed(func))
      return signalPassFailure();
    bool failedAny = false;
    for (auto scheduleOp : getOperation().getOps<pipe::ScheduleOp>()) {
      std::vector<std::vector<Operation *>> ops;
      pipeline::Schedule schedule = readSchedule(scheduleOp, &ops);
      FailureOr<pipeline::ScheduleSpec> spec =
          scheduleSpecOf(*func, schedule.kind, schedule.microbatches, schedule.groupSize,
                         SimulationOptions{}, schedule.cp, schedule.tp, schedule.sequenceParallel,
                         schedule.recomputeSublayers, schedule.recomputeNumSublayers);
      if (failed(spec))
        return signalPassFailure();
      if (spec->pp != schedule.pp || spec->vpp != schedule.vpp) {
        scheduleOp.emitOpError() << "is for pp = " << schedule.pp << ", vpp = " << schedule.vpp
                                 << " but the model is partitioned for pp = " << spec->pp
                                 << ", vpp = " << spec->vpp;
        return signalPassFailure();
      }
      pipeline::SimulationResult result = pipeline::simulateSchedule(schedule, *spec);
      for (const pipeline::ScheduleError &error : result.errors) {
        Operation *at = error.instr >= 0 && error.rank >= 0 &&
                                error.instr < static_cast<int64_t>(ops[error.rank].size())
                            ? ops[error.rank][error.instr]
                            : scheduleOp.getOperation();
        at->emitError() << "rank " << error.rank << " instruction #" << error.instr << ": "
                        << error.message;
        failedAny = true;
      }
    }
    if (failedAny)
      signalPassFailure();
    markAllAnalysesPreserved();
  }
};
} // namespace

} // namespace mhcc
