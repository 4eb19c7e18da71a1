//===- MixGroups.h - one mHC sublayer's three mixing backwards --------*- C++ -*-===//
//
// An mHC sublayer reads its residual input x in three instructions, the
// coefficients (MhcCoeffs), the pre-mix (MhcPre) and the post/res mix
// (MhcPostRes), and their backwards each add a term to x's gradient dx and
// (post/res, pre) to the coefficients' gradient. Run as written, dx (n C
// wide) is written by the first backward and read and rewritten by the
// other two. A backend may regroup that work so that dx is written once
// (the CUDA backend does: docs/runtime.md, "Backends", the backward's mixing
// in three passes), but only where nothing else touches the values in between; this
// finds those groups in a stage program. Plain C++, no device.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_PROGRAM_MIXGROUPS_H
#define MHCC_RUNTIME_PROGRAM_MIXGROUPS_H

#include "runtime/program/Program.h"

#include <cstddef>
#include <vector>

namespace mhcc::runtime {

/// Backward instruction indices of one sublayer's mixing backwards, in the
/// order they run (postRes < pre < coeffs), and the values they share.
struct MixGroup {
  size_t postRes = 0, pre = 0, coeffs = 0;
  int x = -1, coef = -1, y = -1;           // forward values
  int dx = -1, dCoef = -1, dy = -1;        // gradients the three add into
  int dOut = -1, du = -1;                  // post/res's and pre's output gradients
};

/// The groups of `p` whose values nobody else touches while they run: dx and
/// dCoef get no other term before post/res's backward (so both start there)
/// or before coeffs' (so dx is complete only after it), dOut gets none before
/// coeffs' and du none between pre's and coeffs' (so both still hold what
/// post/res and pre read). Ordered by postRes.
std::vector<MixGroup> findMixGroups(const StageProgram &p);

/// The group whose post/res, pre or coefficient backward is `index`, or null.
const MixGroup *mixGroupAt(const std::vector<MixGroup> &groups, size_t index);

/// Where `index` is a group's coefficient backward and the next backward
/// instruction the post/res backward of the sublayer before it, whose
/// output gradient that pass C writes (a backend may run its pass A inside
/// that pass C): that group, else null.
const MixGroup *mixGroupBefore(const std::vector<MixGroup> &groups, size_t index);

/// What a backend running the groups as passes reads at backward
/// instruction `index` beyond the instruction's own values (its group's
/// values, and at a pass C the group before's): Device::backwardReads.
std::vector<int> mixGroupReads(const std::vector<MixGroup> &groups, size_t index);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_PROGRAM_MIXGROUPS_H
