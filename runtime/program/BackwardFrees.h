//===- BackwardFrees.h - what a stage's backward may release as it goes -*- C++ -*-===//
//
// A stage's forward keeps every value and aux buffer for its backward, and
// the backward adds a gradient buffer per value. Held until the stage's
// backward ends, both peak together at its end (at PP1 every layer's
// activations and gradients at once). An autograd engine drops each saved
// tensor after its last reader; this is that, computed once per stage
// program: after each backward instruction, the values and aux buffers no
// later backward instruction reads or adds into.
//
// Split into B and W (ZB-H1), B releases what neither a later B nor any W
// reads, and W the rest of what W reads after its last W reader: a W reads
// its forward's inputs, its output gradient and its aux (and the stash B
// left it), never an input gradient or its forward's output. Plain C++, no
// device.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_PROGRAM_BACKWARDFREES_H
#define MHCC_RUNTIME_PROGRAM_BACKWARDFREES_H

#include "runtime/program/Instructions.h"
#include "runtime/program/Program.h"

#include <cstddef>
#include <vector>

namespace mhcc::runtime {

struct BackwardFrees {
  /// Released before the first backward instruction: read by none of them.
  std::vector<int> valuesUnread;
  std::vector<size_t> auxUnread; // by forward instruction
  /// By backward instruction: released once it has run.
  std::vector<std::vector<int>> valuesAfter;
  std::vector<std::vector<size_t>> auxAfter;
};

/// The values a backward instruction touches by itself: its forward's inputs
/// and output, its output gradient and the gradients it adds into.
std::vector<int> ownBackwardReads(const StageProgram &p, const BackwardInstr &b);

/// What its W half reads: its forward's inputs and its output gradient;
/// nothing for an instruction without weights (W skips it).
std::vector<int> weightHalfReads(const StageProgram &p, const BackwardInstr &b);

/// What `part` of the stage's backward releases, and where. `extraReads[k]`
/// (empty, or one list per backward instruction): values the device's
/// backward instruction k reads besides its own when it computes input
/// gradients (a backend that moves work between instructions,
/// Device::backwardReads). The stage's boundary values (input, output and
/// their gradients) are never listed: the executor sends or hands them
/// over, and releases them itself.
BackwardFrees backwardFrees(const StageProgram &p, const std::vector<std::vector<int>> &extraReads,
                            BackwardPart part = BackwardPart::Both);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_PROGRAM_BACKWARDFREES_H
