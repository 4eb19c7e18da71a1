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

std::vector<int> weightHalfReads(const StageProgram &p, const BackwardInstr &b) {
  const ForwardInstr &f = p.forward[b.forward];
  if (f.params.empty())
    return {};
  std::vector<int> reads = f.inputs;
  reads.push_back(b.gradOutput);
  return reads;
}

BackwardFrees backwardFrees(const StageProgram &p, const std::vector<std::vector<int>> &extraReads,
                            BackwardPart part) {
  const size_t B = p.backward.size();
  // The last instruction of this part reading each value and aux buffer
  // (-1: none), and, split, what the W half keeps from B.
  std::vector<long> lastValue(p.values.size(), -1), lastAux(p.forward.size(), -1);
  std::vector<bool> weightValue(p.values.size(), false), weightAux(p.forward.size(), false);
  auto mark = [](auto &list, int id, auto what) {
    if (id >= 0 && size_t(id) < list.size())
      list[id] = what;
  };
  for (size_t k = 0; k < B; ++k) {
    const BackwardInstr &b = p.backward[k];
    const bool weighted = !p.forward[b.forward].params.empty();
    const std::vector<int> weightReads = weightHalfReads(p, b);
    for (int id : weightReads)
      mark(weightValue, id, true);
    if (weighted)
      mark(weightAux, b.forward, true);
    if (part == BackwardPart::Weight) {
      for (int id : weightReads)
        mark(lastValue, id, long(k));
      if (weighted)
        mark(lastAux, b.forward, long(k));
      continue;
    }
    for (int id : ownBackwardReads(p, b))
      mark(lastValue, id, long(k));
    if (k < extraReads.size())
      for (int id : extraReads[k])
        mark(lastValue, id, long(k));
    mark(lastAux, b.forward, long(k));
  }
  // Whole: everything. B: what W does not read. W: what W reads.
  auto releasedHere = [&](bool readByWeight) {
    return part == BackwardPart::Both || (part == BackwardPart::Weight) == readByWeight;
  };
  BackwardFrees frees;
  frees.valuesAfter.resize(B);
  frees.auxAfter.resize(B);
  for (size_t v = 0; v < p.values.size(); ++v) {
    const int id = int(v);
    if (id == p.input || id == p.output || id == p.gradInput || id == p.gradOutput || !releasedHere(weightValue[v]))
      continue;
    (lastValue[v] < 0 ? frees.valuesUnread : frees.valuesAfter[lastValue[v]]).push_back(id);
  }
  for (size_t j = 0; j < p.forward.size(); ++j)
    if (releasedHere(weightAux[j]))
      (lastAux[j] < 0 ? frees.auxUnread : frees.auxAfter[lastAux[j]]).push_back(j);
  return frees;
}

} // namespace mhcc::runtime
