//===- Autodiff.h - reverse-mode autodiff of stage programs -------*- C++ -*-===//
//
// Plain C++ (no MLIR): derives a stage's backward list from its forward list
// at compile time, so the runtime only executes.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_PASSES_AUTODIFF_AUTODIFF_H
#define MHCC_PASSES_AUTODIFF_AUTODIFF_H

#include "runtime/program/Program.h"

#include <string>

namespace mhcc {

/// Reverse-mode autodiff over a forward list: allocates one gradient value
/// per value that reaches a loss or the stage output, walks the forward list
/// backwards emitting one BackwardInstr per live forward instruction, and
/// lets values with several uses accumulate their gradients in that fixed
/// order (so every layout sums them identically). Sets gradInput and
/// gradOutput. Returns an error message, or empty.
std::string differentiate(runtime::StageProgram &program);

} // namespace mhcc

#endif // MHCC_PASSES_AUTODIFF_AUTODIFF_H
