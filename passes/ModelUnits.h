//===- ModelUnits.h - mhc IR -> cost-model units ------------------*- C++ -*-===//
#ifndef MHCC_PASSES_MODELUNITS_H
#define MHCC_PASSES_MODELUNITS_H

#include "passes/CostModel.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Support/LogicalResult.h"

#include <string>

namespace mhcc {

struct ModelUnits {
  std::string name;
  ModelDims dims;
  std::vector<UnitCost> units; // in forward order
};

/// Reads the #mhc.config of `func` and costs each top-level mhc op in order.
/// Fails with a diagnostic on the function if it is not an mhc model.
mlir::FailureOr<ModelUnits> collectModelUnits(mlir::func::FuncOp func);

/// The multi-line summary printed by `mhcc` and -mhc-model-summary.
std::string formatModelSummary(const ModelUnits &model);

} // namespace mhcc

#endif // MHCC_PASSES_MODELUNITS_H
