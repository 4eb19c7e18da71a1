//===- Gpus.h - which GPUs this process can use -------------------*- C++ -*-===//
//
// The runtime asks here before it touches a GPU, so that "no GPU", "no
// driver" and "wrong architecture" become one clear message instead of a
// failure deep inside a kernel launch.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CUDA_GPUS_H
#define MHCC_RUNTIME_CUDA_GPUS_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mhcc::runtime {

struct GpuInfo {
  int index = 0;
  std::string name;
  int computeMajor = 0;
  int computeMinor = 0;
  size_t memoryBytes = 0;
};

struct GpuInventory {
  std::vector<GpuInfo> gpus;
  /// Why no GPU is usable (no driver, no device); empty when gpus is not empty.
  std::string unavailableReason;
};

/// Lists the visible GPUs. Never fails: with no driver or no device it
/// returns an empty list and the reason.
GpuInventory queryGpus();

/// "" when `gpus` has a GPU for every `ranksPerGpu` of `ranks` ranks; else
/// the one-line refusal (how many are visible, why none, and the fix).
/// `mesh` names a mesh beyond pipeline ranks ("pp = 2 x dp = 2").
std::string missingGpus(const GpuInventory &gpus, int64_t ranks, int64_t ranksPerGpu = 1, const std::string &mesh = "");

/// The compute capability our kernels are compiled for (sm_90: Hopper).
inline constexpr int kKernelComputeMajor = 9;
inline constexpr int kKernelComputeMinor = 0;

/// Runs a small kernel on `device` and checks its result, so a wrong
/// architecture or a broken device is found before training starts. Returns
/// an empty string on success, else one line naming the device and the fix.
std::string gpuSelfTest(int device);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CUDA_GPUS_H
