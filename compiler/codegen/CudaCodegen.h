//===- CudaCodegen.h - the model's CUDA kernels, generated and compiled -*- C++ -*-===//
//
// mhcc specializes the kernel library (runtime/cuda/ModelKernels.cu and its
// parts MhcKernels.cu, MhcMixKernels.cu, MhcFusedKernels.cu, MhcBackwardKernels.cu, LayerKernels.cu,
// TensorParallelKernels.cu, beside
// the runtime's launch table for it: every non-GEMM piece
// of the forward and backward) to one model by prepending its constants
// (stream count n, Sinkhorn iterations) and its activation storage type
// (act_t: float, or __nv_bfloat16 for a bf16 model), then compiles it with nvcc into a
// cubin for one GPU architecture. The artifact carries source and image; the
// runtime loads the image through the driver API.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_COMPILER_CODEGEN_CUDACODEGEN_H
#define MHCC_COMPILER_CODEGEN_CUDACODEGEN_H

#include "runtime/artifact/Artifact.h"

#include <optional>
#include <string>

namespace mhcc::codegen {

/// The CUDA source of the model's kernels: constants and act_t, then the library.
std::string emitModelKernels(const runtime::ModelInfo &model, const std::string &modelHash);

/// The one GPU architecture mhcc compiles the kernels for. The runtime runs
/// nothing else: its GPU check accepts compute capability 9.x only
/// (kKernelComputeMajor in runtime/gpu/Gpus.h), and its kernel loader
/// (runtime/cuda/ModelKernels.cpp) wants the artifact's architecture to be
/// the GPU's sm_XY exactly, so neither another sm_XY nor sm_90a would load.
inline constexpr const char kCudaArch[] = "sm_90";

/// nvcc to use: `requested` if given (must exist), else $CUDA_HOME/bin/nvcc,
/// /usr/local/cuda/bin/nvcc, then PATH. nullopt when none is found (error
/// says where it looked).
std::optional<std::string> findNvcc(const std::string &requested, std::string &error);

/// Compiles `source` with `nvcc` for `arch` into DeviceCode (source, cubin,
/// nvcc's version). On failure, error names nvcc's first message and where
/// the source was kept.
std::optional<runtime::DeviceCode> compileModelKernels(const runtime::ModelInfo &model,
                                                       const std::string &source,
                                                       const std::string &nvcc,
                                                       const std::string &arch, std::string &error);

} // namespace mhcc::codegen

#endif // MHCC_COMPILER_CODEGEN_CUDACODEGEN_H
