//===- Autodiff.cpp - reverse-mode autodiff of stage programs ---------------===//
#include "passes/autodiff/Autodiff.h"

#include <vector>

namespace mhcc {

using namespace runtime;

std::string differentiate(StageProgram &program) {
  const int numValues = static_cast<int>(program.values.size());
  std::vector<int> producer(numValues, -1);
  for (size_t i = 0; i < program.forward.size(); ++i) {
    int out = program.forward[i].output;
    if (out < 0 || out >= numValues)
      return "forward instruction " + std::to_string(i) + " writes no valid value";
    if (producer[out] >= 0 || out == program.input)
      return "value " + std::to_string(out) + " is written twice";
    producer[out] = static_cast<int>(i);
  }
  // A value needs a gradient if it reaches a loss or the stage output: walk
  // backwards from the losses and the output.
  std::vector<bool> live(numValues, false);
  if (program.output >= 0)
    live[program.output] = true;
  for (int i = static_cast<int>(program.forward.size()) - 1; i >= 0; --i) {
    const ForwardInstr &instr = program.forward[i];
    if (instr.op == Prim::CrossEntropy)
      live[instr.output] = true;
    if (!live[instr.output])
      continue;
    for (int in : instr.inputs)
      live[in] = true;
  }
  std::vector<int> grad(numValues, -1);
  auto gradOf = [&](int value) {
    if (grad[value] < 0) {
      ValueInfo info = program.values[value];
      info.tap = info.tap.empty() ? "" : "grad:" + info.tap;
      grad[value] = static_cast<int>(program.values.size());
      program.values.push_back(info);
    }
    return grad[value];
  };
  if (program.output >= 0)
    program.gradOutput = gradOf(program.output);
  program.backward.clear();
  for (int i = static_cast<int>(program.forward.size()) - 1; i >= 0; --i) {
    const ForwardInstr &instr = program.forward[i];
    if (!live[instr.output])
      continue;
    BackwardInstr b;
    b.forward = i;
    b.gradOutput = instr.op == Prim::CrossEntropy ? -1 : gradOf(instr.output);
    for (int in : instr.inputs)
      b.gradInputs.push_back(gradOf(in));
    program.backward.push_back(b);
  }
  if (program.input >= 0)
    program.gradInput = gradOf(program.input);
  return "";
}

} // namespace mhcc
