//===- ModelUnits.h - mhc IR -> cost-model units ------------------*- C++ -*-===//
#ifndef MHCC_PASSES_MODELUNITS_H
#define MHCC_PASSES_MODELUNITS_H

#include "passes/CostModel.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Support/LogicalResult.h"

#include <optional>
#include <string>

namespace mhcc {

struct ModelUnits {
  ModelInfo dims; // with the model's name

  std::vector<UnitCost> units; // in forward order
};

/// The cost-model unit a top-level mhc op is, if any (nullopt for the
/// function's terminator and pipe ops).
std::optional<UnitKind> unitKindOf(mlir::Operation *op);

/// The model's sizes (and name) from `func`'s #mhc.config: the one place
/// they are read, for the cost model, the partitioner, P2P and the artifact.
mlir::FailureOr<ModelInfo> modelInfoOf(mlir::func::FuncOp func);

/// Reads the #mhc.config of `func` and costs each top-level mhc op in order.
/// Fails with a diagnostic on the function if it is not an mhc model.
mlir::FailureOr<ModelUnits> collectModelUnits(mlir::func::FuncOp func);

/// The multi-line summary printed by `mhcc` and -mhc-model-summary.
std::string formatModelSummary(const ModelUnits &model);

} // namespace mhcc

#endif // MHCC_PASSES_MODELUNITS_H
