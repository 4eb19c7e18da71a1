//===- MixGroups.cpp - one mHC sublayer's three mixing backwards ------------===//
#include "runtime/program/MixGroups.h"

#include <algorithm>
#include <optional>

namespace mhcc::runtime {
namespace {

bool adds(const BackwardInstr &b, int value) {
  return std::find(b.gradInputs.begin(), b.gradInputs.end(), value) != b.gradInputs.end();
}

/// The group whose post/res backward is p.backward[i], if it has one.
std::optional<MixGroup> groupAt(const StageProgram &p, size_t i) {
  const BackwardInstr &post = p.backward[i];
  const ForwardInstr &fPost = p.forward[post.forward];
  if (fPost.op != Prim::MhcPostRes || fPost.inputs.size() != 3 || post.gradInputs.size() != 3 ||
      post.gradOutput < 0)
    return std::nullopt;
  MixGroup g;
  g.postRes = i;
  g.x = fPost.inputs[0], g.coef = fPost.inputs[1], g.y = fPost.inputs[2];
  g.dx = post.gradInputs[0], g.dCoef = post.gradInputs[1], g.dy = post.gradInputs[2];
  g.dOut = post.gradOutput;
  if (g.dx < 0 || g.dCoef < 0 || g.dy < 0)
    return std::nullopt;
  // The pre-mix and the coefficients of the same x, in that order after it.
  size_t pre = 0, coeffs = 0;
  for (size_t j = i + 1; j < p.backward.size() && !coeffs; ++j) {
    const BackwardInstr &b = p.backward[j];
    const ForwardInstr &f = p.forward[b.forward];
    if (!pre && f.op == Prim::MhcPre && f.inputs.size() == 2 && f.inputs[0] == g.x && f.inputs[1] == g.coef &&
        b.gradInputs.size() == 2 && b.gradInputs[0] == g.dx && b.gradInputs[1] == g.dCoef && b.gradOutput >= 0) {
      pre = j;
      g.du = b.gradOutput;
    } else if (pre && f.op == Prim::MhcCoeffs && f.output == g.coef && f.inputs.size() == 1 && f.inputs[0] == g.x &&
               b.gradInputs.size() == 1 && b.gradInputs[0] == g.dx && b.gradOutput == g.dCoef) {
      coeffs = j;
    }
  }
  if (!pre || !coeffs)
    return std::nullopt;
  g.pre = pre, g.coeffs = coeffs;
  // Nothing else adds into dx or dCoef before the group ends, into dOut
  // before coeffs, into du between pre and coeffs; nobody differentiates
  // through dx (an instruction whose output gradient is dx) meanwhile.
  for (size_t j = 0; j < p.backward.size(); ++j) {
    if (j == g.postRes || j == g.pre || j == g.coeffs || j > g.coeffs)
      continue;
    const BackwardInstr &b = p.backward[j];
    if (adds(b, g.dx) || adds(b, g.dCoef) || b.gradOutput == g.dx || b.gradOutput == g.dCoef)
      return std::nullopt;
    if (j > g.postRes && adds(b, g.dOut))
      return std::nullopt;
    if (j > g.pre && adds(b, g.du))
      return std::nullopt;
  }
  return g;
}

} // namespace

std::vector<MixGroup> findMixGroups(const StageProgram &p) {
  std::vector<MixGroup> groups;
  for (size_t i = 0; i < p.backward.size(); ++i)
    if (std::optional<MixGroup> g = groupAt(p, i))
      groups.push_back(*g);
  return groups;
}

const MixGroup *mixGroupAt(const std::vector<MixGroup> &groups, size_t index) {
  for (const MixGroup &g : groups)
    if (index == g.postRes || index == g.pre || index == g.coeffs)
      return &g;
  return nullptr;
}

const MixGroup *mixGroupBefore(const std::vector<MixGroup> &groups, size_t index) {
  const MixGroup *group = nullptr, *before = nullptr;
  for (const MixGroup &g : groups) {
    if (g.coeffs == index)
      group = &g;
    if (g.postRes == index + 1)
      before = &g;
  }
  return group && before && before->dOut == group->dx ? before : nullptr;
}

std::vector<int> mixGroupReads(const std::vector<MixGroup> &groups, size_t index) {
  std::vector<int> reads;
  for (const MixGroup *g : {mixGroupAt(groups, index), mixGroupBefore(groups, index)})
    if (g)
      reads.insert(reads.end(), {g->x, g->coef, g->y, g->dx, g->dCoef, g->dy, g->dOut, g->du});
  return reads;
}

} // namespace mhcc::runtime
