//===- DependentLaunch.cuh - programmatic dependent launch for runtime kernels -*- CUDA -*-===//
//
// The runtime's own kernels (flash attention, the column sums) launched as
// the generated ones are (ModelKernels.cu, kernelPrologue): with
// programmatic stream serialization, so a kernel's launch and block
// scheduling hide in the last wave of the kernel before it. A kernel
// launched by launchDependent must call dependentPrologue() before its first
// memory access: it waits there until the previous kernel completed and its
// writes are visible, so only scheduling changes, never a bit. MHCC_PDL=0
// launches in plain stream order.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CUDA_DEPENDENTLAUNCH_CUH
#define MHCC_RUNTIME_CUDA_DEPENDENTLAUNCH_CUH

#include "runtime/cuda/DependentLaunch.h"

#include <cuda_runtime.h>

#include <utility>

namespace mhcc::runtime::cuda {

__device__ __forceinline__ void dependentPrologue() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" :::);
#endif
}

/// kernel<<<grid, block, smemBytes, stream>>>(args...), launched early
/// where dependentLaunchEnabled(); the kernel begins with dependentPrologue.
template <typename... Params, typename... Args>
cudaError_t launchDependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smemBytes, cudaStream_t stream,
                            Args &&...args) {
  cudaLaunchAttribute early{};
  early.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  early.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smemBytes;
  config.stream = stream;
  config.attrs = &early;
  config.numAttrs = dependentLaunchEnabled() ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

} // namespace mhcc::runtime::cuda

#endif // MHCC_RUNTIME_CUDA_DEPENDENTLAUNCH_CUH
