//===- PipeSchedule.cpp - -pipe-schedule --------------------------------------===//
#include "passes/Passes.h"
#include "passes/PipelineIR.h"

#include "passes/ModelUnits.h"

#define DEBUG_TYPE "pipe-schedule"

using namespace mlir;

namespace mhcc {

#define GEN_PASS_DEF_PIPESCHEDULE
#include "passes/Passes.h.inc"

namespace {
struct PipeSchedulePass : public impl::PipeScheduleBase<PipeSchedulePass> {
  using PipeScheduleBase::PipeScheduleBase;

  void runOnOperation() override {
    FailureOr<func::FuncOp> func = findModelFunc(getOperation());
    if (failed(func))
      return signalPassFailure();
    std::optional<pipeline::ScheduleKind> scheduleKind = pipeline::parseScheduleKind(kind);
    if (!scheduleKind) {
      func->emitError() << "unknown schedule '" << kind
                        << "'; choose gpipe, 1f1b, interleaved or zb-h1";
      return signalPassFailure();
    }
    if (!getOperation().getOps<pipe::ScheduleOp>().empty()) {
      func->emitError() << "the module already has a pipe.schedule";
      return signalPassFailure();
    }
    FailureOr<pipeline::ScheduleSpec> spec =
        scheduleSpecOf(*func, *scheduleKind, microbatches, groupSize, SimulationOptions{}, cp, tp, sequenceParallel,
                       recomputeSublayers, recomputeNumSublayers);
    if (failed(spec))
      return signalPassFailure();
    spec->dp = dp;
    spec->distributedOptimizer = distributedOptimizer;
    std::string error;
    std::optional<pipeline::Schedule> schedule = pipeline::buildSchedule(*spec, error);
    if (!schedule) {
      func->emitError() << "cannot build the " << kind << " schedule: " << error;
      return signalPassFailure();
    }
    auto config = (*func)->getAttrOfType<mhc::ModelConfigAttr>(mhc::kConfigAttrName);
    emitSchedule(*func, *schedule, config.getDtype());
  }
};
} // namespace

} // namespace mhcc
