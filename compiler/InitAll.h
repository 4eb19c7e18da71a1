//===- InitAll.h - every dialect and pass mhcc tools register -----*- C++ -*-===//
//
// The one registration header shared by mhcc and mhc-opt, so both see the
// same dialects and passes.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_COMPILER_INITALL_H
#define MHCC_COMPILER_INITALL_H

#include "compiler/Pipeline.h"
#include "dialects/mhc/IR/MhcDialect.h"
#include "dialects/pipe/IR/PipeDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Transforms/Passes.h"
#include "passes/Passes.h"

namespace mhcc {

inline void registerAllDialects(mlir::DialectRegistry &registry) {
  registry.insert<mhc::MhcDialect, pipe::PipeDialect, mlir::func::FuncDialect>();
}

inline void registerAllPasses() {
  registerMhcPasses();
  registerMhccPipeline();
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
}

/// `mhc-opt`: MlirOptMain over our dialects and passes.
int runMhcOpt(int argc, char **argv);

/// `mhcc`: the compiler driver.
int runMhcc(int argc, char **argv);

} // namespace mhcc

#endif // MHCC_COMPILER_INITALL_H
