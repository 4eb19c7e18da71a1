//===- MhcOps.h - mhc dialect operations --------------------------*- C++ -*-===//
#ifndef MHCC_DIALECTS_MHC_IR_MHCOPS_H
#define MHCC_DIALECTS_MHC_IR_MHCOPS_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "dialects/mhc/IR/MhcDialect.h"

#define GET_OP_CLASSES
#include "dialects/mhc/IR/MhcOps.h.inc"

#endif // MHCC_DIALECTS_MHC_IR_MHCOPS_H
