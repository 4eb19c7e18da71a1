//===- AutoSchedule.h - mhcc --schedule auto ----------------------*- C++ -*-===//
//
// `--schedule auto` compiles every candidate schedule of the imported model
// (1F1B and ZB-H1 with one chunk per rank, interleaved with 2, 3 or 4 chunks;
// with --layout, the kinds its chunk count allows), simulates each with the
// simulator's rates, and keeps the fastest predicted step (ties: the smaller
// peak of live activations). Candidates the partition cannot place (too few
// layers, over --memory-cap-gib) or the schedule refuses are ranked as
// refused, with the reason; under --memory-cap-gib one the cap refuses is
// tried again with activation recomputation.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_COMPILER_AUTOSCHEDULE_H
#define MHCC_COMPILER_AUTOSCHEDULE_H

#include "compiler/Pipeline.h"
#include "passes/PipelineIR.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/Support/raw_ostream.h"

namespace mhcc {

/// The largest chunk count `auto` tries.
inline constexpr int64_t kAutoMaxVpp = 4;

/// Compiles the candidates from `imported` (left as it is), writes the
/// ranking to `report` and returns the winner's module; null when no
/// candidate compiles (the ranking says why).
mlir::OwningOpRef<mlir::ModuleOp> compileAutoSchedule(mlir::ModuleOp imported, const PipelineOptions &options,
                                                      const SimulationOptions &simulation,
                                                      llvm::raw_ostream &report);

} // namespace mhcc

#endif // MHCC_COMPILER_AUTOSCHEDULE_H
