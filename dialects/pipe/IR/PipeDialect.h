//===- PipeDialect.h - pipe dialect -------------------------------*- C++ -*-===//
#ifndef MHCC_DIALECTS_PIPE_IR_PIPEDIALECT_H
#define MHCC_DIALECTS_PIPE_IR_PIPEDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/Dialect.h"

#include "dialects/pipe/IR/PipeDialect.h.inc"

namespace mhcc::pipe {
/// Discardable attributes the partition pass sets.
inline constexpr llvm::StringLiteral kStageAttr = "pipe.stage";   // on each mhc op
inline constexpr llvm::StringLiteral kLayoutAttr = "pipe.layout"; // on the model func
inline constexpr llvm::StringLiteral kPpAttr = "pipe.pp";
inline constexpr llvm::StringLiteral kVppAttr = "pipe.vpp";
} // namespace mhcc::pipe

#endif // MHCC_DIALECTS_PIPE_IR_PIPEDIALECT_H
