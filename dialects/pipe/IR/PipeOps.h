//===- PipeOps.h - pipe dialect operations ------------------------*- C++ -*-===//
#ifndef MHCC_DIALECTS_PIPE_IR_PIPEOPS_H
#define MHCC_DIALECTS_PIPE_IR_PIPEOPS_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "dialects/pipe/IR/PipeDialect.h"

#define GET_OP_CLASSES
#include "dialects/pipe/IR/PipeOps.h.inc"

#endif // MHCC_DIALECTS_PIPE_IR_PIPEOPS_H
