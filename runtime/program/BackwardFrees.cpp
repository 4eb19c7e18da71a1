//===- BackwardFrees.cpp - what a stage's backward may release as it goes ----===//
#include "runtime/program/BackwardFrees.h"

namespace mhcc::runtime {

std::vector<int> ownBackwardReads(const StageProgram &p, const BackwardInstr &b) {
  const ForwardInstr &f = p.forward[b.forward];
  std::vector<int> reads = f.inputs;
  reads.push_back(f.output);
  reads.push_back(b.gradOutput);
  reads.insert(reads.end(), b.gradInputs.begin(), b.gradInputs.end());
  return reads;
}

BackwardFrees backwardFrees(const StageProgram &p, const std::vector<std::vector<int>> &extraReads) {
  const size_t B = p.backward.size();
  // The last backward instruction reading each value and aux buffer; -1: none.
  std::vector<long> lastValue(p.values.size(), -1), lastAux(p.forward.size(), -1);
  auto note = [&](std::vector<long> &last, int id, size_t k) {
    if (id >= 0 && size_t(id) < last.size())
      last[id] = long(k);
  };
  for (size_t k = 0; k < B; ++k) {
    const BackwardInstr &b = p.backward[k];
    for (int id : ownBackwardReads(p, b))
      note(lastValue, id, k);
    if (k < extraReads.size())
      for (int id : extraReads[k])
        note(lastValue, id, k);
    note(lastAux, b.forward, k);
  }
  BackwardFrees frees;
  frees.valuesAfter.resize(B);
  frees.auxAfter.resize(B);
  for (size_t v = 0; v < p.values.size(); ++v) {
    const int id = int(v);
    if (id == p.input || id == p.output || id == p.gradInput || id == p.gradOutput)
      continue;
    (lastValue[v] < 0 ? frees.valuesUnread : frees.valuesAfter[lastValue[v]]).push_back(id);
  }
  for (size_t j = 0; j < p.forward.size(); ++j)
    (lastAux[j] < 0 ? frees.auxUnread : frees.auxAfter[lastAux[j]]).push_back(j);
  return frees;
}

} // namespace mhcc::runtime
