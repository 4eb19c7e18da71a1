//===- Importer.h - ModelGraph -> mhc dialect ---------------------*- C++ -*-===//
#ifndef MHCC_COMPILER_IMPORTER_H
#define MHCC_COMPILER_IMPORTER_H

#include "compiler/ModelGraph.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"

namespace mhcc {

/// Lowers a validated model graph into one func.func of mhc ops taking
/// (%tokens, %labels : tensor<T x i32>) and returning the losses (the lm loss
/// first, then each MTP loss). `file` names the source in op locations.
mlir::OwningOpRef<mlir::ModuleOp> importModelGraph(mlir::MLIRContext &context,
                                                   const ModelGraph &graph,
                                                   llvm::StringRef file);

} // namespace mhcc

#endif // MHCC_COMPILER_IMPORTER_H
