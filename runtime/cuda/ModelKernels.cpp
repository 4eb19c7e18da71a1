//===- ModelKernels.cpp - loading the artifact's cubin ------------------------===//
#include "runtime/cuda/ModelKernels.h"

#include "runtime/artifact/Artifact.h"
#include "runtime/cuda/DependentLaunch.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>

namespace mhcc::runtime::cuda {
namespace {

/// The few driver functions we need, resolved through the runtime so that
/// binaries load on machines without a driver (CI) and never link libcuda.
struct Driver {
  CUresult (*moduleLoadData)(CUmodule *, const void *) = nullptr;
  CUresult (*moduleUnload)(CUmodule) = nullptr;
  CUresult (*moduleGetFunction)(CUfunction *, CUmodule, const char *) = nullptr;
  CUresult (*moduleGetGlobal)(CUdeviceptr *, size_t *, CUmodule, const char *) = nullptr;
  CUresult (*launchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **) = nullptr;
  CUresult (*funcSetAttribute)(CUfunction, CUfunction_attribute, int) = nullptr;
  CUresult (*getErrorName)(CUresult, const char **) = nullptr;
  std::string error;
};

template <typename Fn> void resolve(const char *symbol, Fn &fn, std::string &error) {
  void *address = nullptr;
  cudaDriverEntryPointQueryResult status{};
  if (cudaGetDriverEntryPointByVersion(symbol, &address, 12000, cudaEnableDefault, &status) != cudaSuccess ||
      status != cudaDriverEntryPointSuccess || !address) {
    if (error.empty())
      error = std::string("the CUDA driver does not provide ") + symbol + "; update the NVIDIA driver";
    return;
  }
  fn = reinterpret_cast<Fn>(address);
}

const Driver &driver() {
  static const Driver d = [] {
    Driver d;
    resolve("cuModuleLoadData", d.moduleLoadData, d.error);
    resolve("cuModuleUnload", d.moduleUnload, d.error);
    resolve("cuModuleGetFunction", d.moduleGetFunction, d.error);
    resolve("cuModuleGetGlobal", d.moduleGetGlobal, d.error);
    resolve("cuLaunchKernelEx", d.launchKernelEx, d.error);
    resolve("cuFuncSetAttribute", d.funcSetAttribute, d.error);
    resolve("cuGetErrorName", d.getErrorName, d.error);
    return d;
  }();
  return d;
}

std::string errorName(CUresult status) {
  const char *name = nullptr;
  if (driver().getErrorName && driver().getErrorName(status, &name) == CUDA_SUCCESS && name)
    return name;
  return "CUresult " + std::to_string(int(status));
}

const char *const kKernelNames[] = {
#define MHCC_KERNEL_NAME(id, name) name,
    MHCC_MODEL_KERNELS(MHCC_KERNEL_NAME)
#undef MHCC_KERNEL_NAME
};

} // namespace

std::unique_ptr<ModelKernels> ModelKernels::load(const DeviceCode &code, int device, int activationBytes,
                                                 int residualBytes, std::string &error) {
  const std::string where = "GPU " + std::to_string(device) + ": ";
  const Driver &d = driver();
  if (!d.error.empty()) {
    error = where + d.error;
    return nullptr;
  }
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  const std::string arch = "sm_" + std::to_string(major * 10 + minor);
  if (arch != code.arch) {
    // mhcc compiles for sm_90 only (its --cuda-arch rule): an sm_90 GPU
    // needs a recompile, any other GPU is not supported.
    error = where + "the artifact's kernels are compiled for " + code.arch + ", but this GPU is " + arch +
            (arch == "sm_90" ? "; recompile the model with 'mhcc --cuda-arch sm_90'"
                             : "; mhcc's kernels run on sm_90 (Hopper) GPUs only: use one, or --backend cpu");
    return nullptr;
  }
  std::unique_ptr<ModelKernels> kernels(new ModelKernels());
  if (CUresult status = d.moduleLoadData(&kernels->module_, code.image.data()); status != CUDA_SUCCESS) {
    kernels->module_ = nullptr;
    error = where + "cannot load the artifact's kernels (" + errorName(status) +
            "); recompile the model with this CUDA toolkit or update the driver";
    return nullptr;
  }
  for (int k = 0; k < int(ModelKernel::Count); ++k)
    if (CUresult status = d.moduleGetFunction(&kernels->functions_[k], kernels->module_, kKernelNames[k]);
        status != CUDA_SUCCESS) {
      error = where + "the artifact's kernels lack " + kKernelNames[k] + " (" + errorName(status) +
              "); the artifact is from another mhcc version: recompile the model";
      return nullptr;
    }
  // The image's conventions against ours and the model's.
  struct Expected {
    const char *global;
    int64_t value;
  } expected[] = {{"mhcc_abi_version", kModelKernelsAbi},
                  {"mhcc_abi_block_threads", kBlockThreads},
                  {"mhcc_abi_chunk_rows", kColumnChunkRows},
                  {"mhcc_abi_input_grad_columns", kInputGradColumns},
                  {"mhcc_abi_input_grad_tokens", kInputGradTokens},
                  {"mhcc_abi_mix_columns", kMixColumns},
                  {"mhcc_abi_mix_tokens", kMixTokens},
                  {"mhcc_abi_fused_tokens", kFusedTokens},
                  {"mhcc_abi_fused_warps", fusedWarps(code.streams)},
                  {"mhcc_abi_cluster_blocks", kClusterBlocks},
                  {"mhcc_abi_cluster_pad", kClusterTilePad},
                  {"mhcc_abi_streams", code.streams},
                  {"mhcc_abi_sinkhorn_iterations", code.sinkhornIterations}};
  auto readGlobal = [&](const char *global, int &value) {
    CUdeviceptr address = 0;
    size_t bytes = 0;
    return d.moduleGetGlobal(&address, &bytes, kernels->module_, global) == CUDA_SUCCESS && bytes == sizeof(int) &&
           cudaMemcpy(&value, reinterpret_cast<void *>(address), sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess;
  };
  for (const Expected &e : expected) {
    int value = 0;
    if (!readGlobal(e.global, value) || value != e.value) {
      error = where + "the artifact's kernels disagree with this mhcrun on " + e.global + " (image " +
              std::to_string(value) + ", expected " + std::to_string(e.value) +
              "); recompile the model with the mhcc of this release";
      return nullptr;
    }
  }
  // The storage types the image was compiled for: act_t and res_t.
  auto describe = [](int bytes) {
    return bytes == 4 ? std::string("fp32 (4 bytes)")
                      : bytes == 2 ? std::string("bf16 (2 bytes)") : std::to_string(bytes) + " bytes";
  };
  struct Storage {
    const char *global, *what;
    int bytes;
  } storages[] = {{"mhcc_abi_activation_bytes", "activations", activationBytes},
                  {"mhcc_abi_residual_bytes", "residual stream", residualBytes}};
  for (const Storage &storage : storages) {
    int imageBytes = 0;
    if (!readGlobal(storage.global, imageBytes) || imageBytes != storage.bytes) {
      error = where + "the artifact's kernels store the " + storage.what + " as " + describe(imageBytes) +
              ", where this model asks for " + describe(storage.bytes) + " (" + storage.global +
              "); recompile the artifact with this mhcc";
      return nullptr;
    }
  }
  // The cluster kernel's x' tile is dynamic shared memory beyond the 48 KB
  // default; where the device refuses it, the one-block kernel runs instead.
  const CUfunction cluster = kernels->functions_[int(ModelKernel::MhcPostResCoeffsPreForwardCluster)];
  kernels->clusterForwardReady_ = d.funcSetAttribute(cluster, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                     int(kClusterTileBytes)) == CUDA_SUCCESS;
  return kernels;
}

ModelKernels::~ModelKernels() {
  for (auto &[key, table] : ropeTables_)
    cudaFree(table);
  if (module_)
    driver().moduleUnload(module_);
}

const float *ModelKernels::ropeTable(int64_t seq, int64_t d, cudaStream_t stream) const {
  float *&table = ropeTables_[{seq, d}];
  if (!table) {
    const int64_t count = seq * (d / 2);
    if (cudaMalloc(&table, std::max<int64_t>(count, 1) * 2 * sizeof(float)) != cudaSuccess) {
      table = nullptr;
      if (firstError_.empty())
        firstError_ = "out of GPU memory for the rotary table";
      return nullptr;
    }
    launch(ModelKernel::RopeTable, unsigned(std::min<int64_t>((count + 255) / 256, 4096)), 1, 256, stream, table,
           seq, d);
  }
  return table;
}

void ModelKernels::launchRaw(ModelKernel kernel, unsigned gridX, unsigned gridY, unsigned block,
                             unsigned sharedBytes, cudaStream_t stream, void **params) const {
  if (gridX == 0 || gridY == 0)
    return;
  // The image's kernels wait in kernelPrologue (ABI 12 on) before they read
  // what the one before wrote, so each may start while that one drains,
  // unless MHCC_PDL=0.
  CUlaunchAttribute early{};
  early.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  early.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig config{};
  config.gridDimX = gridX;
  config.gridDimY = gridY;
  config.gridDimZ = 1;
  config.blockDimX = block;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = sharedBytes;
  config.hStream = reinterpret_cast<CUstream>(stream);
  config.attrs = &early;
  config.numAttrs = dependentLaunchEnabled() ? 1 : 0;
  const CUresult status = driver().launchKernelEx(&config, functions_[int(kernel)], params, nullptr);
  if (status != CUDA_SUCCESS && firstError_.empty())
    firstError_ = std::string("launch of ") + kKernelNames[int(kernel)] + ": " + errorName(status);
}

std::string ModelKernels::takeError() const {
  std::string e;
  e.swap(firstError_);
  return e;
}

} // namespace mhcc::runtime::cuda
