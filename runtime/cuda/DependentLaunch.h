//===- DependentLaunch.h - whether kernels launch as dependent launches -*- C++ -*-===//
//
// Programmatic dependent launch (ModelKernels.cu's kernelPrologue for the
// generated kernels, DependentLaunch.cuh for the runtime's own): on unless
// the environment sets MHCC_PDL=0, which launches every kernel after the one
// before it has completed, as plain stream order does.
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

} // namespace mhcc::runtime::cuda

#endif // MHCC_RUNTIME_CUDA_DEPENDENTLAUNCH_H
