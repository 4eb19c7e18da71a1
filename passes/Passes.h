//===- Passes.h - mhcc passes -------------------------------------*- C++ -*-===//
#ifndef MHCC_PASSES_PASSES_H
#define MHCC_PASSES_PASSES_H

#include "dialects/mhc/IR/MhcOps.h"
#include "dialects/pipe/IR/PipeOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace mhcc {

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

} // namespace mhcc

#endif // MHCC_PASSES_PASSES_H
