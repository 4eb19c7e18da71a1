//===- MhcDialect.h - mhc dialect ---------------------------------*- C++ -*-===//
#ifndef MHCC_DIALECTS_MHC_IR_MHCDIALECT_H
#define MHCC_DIALECTS_MHC_IR_MHCDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Dialect.h"

#include "dialects/mhc/IR/MhcDialect.h.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/mhc/IR/MhcAttrs.h.inc"

namespace mhcc::mhc {
/// Name of the function attribute holding the #mhc.config of a model.
inline constexpr llvm::StringLiteral kConfigAttrName = "mhc.config";
} // namespace mhcc::mhc

#endif // MHCC_DIALECTS_MHC_IR_MHCDIALECT_H
