//===- PipelineIR.h - between the pipe IR and the plain C++ algorithms -*- C++ -*-===//
//
// The pipeline passes are thin: they read the IR into the plain structures of
// passes/pipeline (layouts, partition units, schedule specs and schedules),
// call the algorithms, and write the result back as attributes and ops.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_PASSES_PIPELINEIR_H
#define MHCC_PASSES_PIPELINEIR_H

#include "dialects/pipe/IR/PipeOps.h"
#include "passes/CostModel.h"
#include "passes/DeviceProfile.h"
#include "passes/pipeline/AutoPartition.h"
#include "passes/pipeline/Layout.h"
#include "passes/pipeline/Schedule.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"

namespace mhcc {

/// The one function of `module` carrying #mhc.config.
mlir::FailureOr<mlir::func::FuncOp> findModelFunc(mlir::ModuleOp module);

/// How many layers and MTP modules a layout must place.
pipeline::ModelShape modelShapeOf(mlir::func::FuncOp func);

/// The model as a chain of partition units (E, each layer, L with the MTP
/// modules) costed for one microbatch: time in FLOPs of forward + backward,
/// fp32 weights + gradients + Adam moments, saved activations (with
/// `recomputeSublayers`, a segment's input residual, `sublayersPerSegment`
/// sublayers a segment, and a second forward).
mlir::FailureOr<std::vector<pipeline::PartitionUnit>> partitionUnitsOf(mlir::func::FuncOp func,
                                                                       bool recomputeSublayers = false,
                                                                       int64_t sublayersPerSegment = 1);

/// Sets `pipe.stage` on every top-level mhc op per `layout` (mhc.expand goes
/// with the first layer; contract, final norm, head and losses with L) and
/// records the layout on the function.
mlir::LogicalResult applyLayout(mlir::func::FuncOp func, const pipeline::Layout &layout);

/// The partition recorded on a function by applyLayout.
mlir::FailureOr<pipeline::Layout> layoutOf(mlir::func::FuncOp func);

/// The rates the schedule simulator assumes (DeviceProfile.h); the passes'
/// own verification uses the nominal rates with free communication.
struct SimulationOptions {
  DeviceProfile profile = nominalProfile(400, 0);
};

/// Per-stage costs (forward/backward time in ms, saved bytes) and boundary
/// widths of a partitioned function with its pipe.boundary ops.
mlir::FailureOr<pipeline::ScheduleSpec> scheduleSpecOf(mlir::func::FuncOp func,
                                                       pipeline::ScheduleKind kind,
                                                       int64_t microbatches, int64_t groupSize,
                                                       const SimulationOptions &options, int64_t cp = 1,
                                                       int64_t tp = 1, bool sequenceParallel = false,
                                                       bool recomputeSublayers = false,
                                                       int64_t sublayersPerSegment = 1);

/// Simulates the module's (first) pipe.schedule with `options`' rates:
/// failure when the module has no model function or schedule, or the
/// schedule cannot be costed (after a diagnostic).
mlir::FailureOr<pipeline::SimulationResult> simulateModuleSchedule(mlir::ModuleOp module,
                                                                   const SimulationOptions &options);

/// Writes `schedule` as a pipe.schedule op at the end of the module.
pipe::ScheduleOp emitSchedule(mlir::func::FuncOp func, const pipeline::Schedule &schedule,
                              mlir::Type elementType);

/// Reads a pipe.schedule back; `instrOps[r][i]` is the op of instruction i
/// of rank r, for diagnostics.
pipeline::Schedule readSchedule(pipe::ScheduleOp op,
                                std::vector<std::vector<mlir::Operation *>> *instrOps = nullptr);

} // namespace mhcc

#endif // MHCC_PASSES_PIPELINEIR_H
