//===- DependentLaunch.h - whether kernels launch as dependent launches -*- C++ -*-===//
//
// Programmatic dependent launch (ModelKernels.cu's kernelPrologue for the
// generated kernels, DependentLaunch.cuh for the runtime's own): on unless
// the environment sets MHCC_PDL=0, which launches every kernel after the one
// before it has completed, as plain stream order does. MHCC_EARLY_LOADS=1
// also lets the kernels that can (the mHC backward's passes B and C, the
// Sinkhorn backward, the gate partials: kernelPrologue's comment) read what
// was written two or more kernels back before their wait; opt-in until
// measured on a GPU.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CUDA_DEPENDENTLAUNCH_H
#define MHCC_RUNTIME_CUDA_DEPENDENTLAUNCH_H

#include <cstdlib>
#include <cstring>

namespace mhcc::runtime::cuda {

inline bool dependentLaunchEnabled() {
  static const bool enabled = [] {
    const char *value = std::getenv("MHCC_PDL");
    return !(value && std::strcmp(value, "0") == 0);
  }();
  return enabled;
}

/// The `early` argument of the kernels that take one: 1 where
/// MHCC_EARLY_LOADS=1 and dependent launch is on (the same bits either way).
inline int earlyLoads() {
  static const int early = [] {
    const char *value = std::getenv("MHCC_EARLY_LOADS");
    return value && std::strcmp(value, "1") == 0 && dependentLaunchEnabled() ? 1 : 0;
  }();
  return early;
}

} // namespace mhcc::runtime::cuda

#endif // MHCC_RUNTIME_CUDA_DEPENDENTLAUNCH_H
