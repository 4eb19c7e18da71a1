//===- Gpus.cu - which GPUs this process can use ----------------------------===//
#include "runtime/cuda/Gpus.h"

#include <cuda_runtime.h>

#include <cmath>
#include <vector>

namespace mhcc::runtime {
namespace {

__global__ void scaleAddKernel(const float *x, float *y, float alpha, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    y[i] = alpha * x[i] + y[i];
}

std::string describe(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}

} // namespace

GpuInventory queryGpus() {
  GpuInventory inventory;
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError(); // clear the sticky error so later calls start clean
    inventory.unavailableReason = "no usable CUDA GPU (" + describe(status) + ")";
    return inventory;
  }
  if (count == 0) {
    inventory.unavailableReason = "no CUDA GPU is visible (check CUDA_VISIBLE_DEVICES)";
    return inventory;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess)
      continue;
    inventory.gpus.push_back(
        {i, prop.name, prop.major, prop.minor, static_cast<size_t>(prop.totalGlobalMem)});
  }
  return inventory;
}

std::string missingGpus(const GpuInventory &gpus, int64_t ranks, int64_t ranksPerGpu, const std::string &mesh) {
  const int64_t needed = (ranks + ranksPerGpu - 1) / ranksPerGpu;
  if (static_cast<int64_t>(gpus.gpus.size()) >= needed)
    return "";
  const std::string visible = std::to_string(gpus.gpus.size()) + " GPU(s) are visible" +
                              (gpus.gpus.empty() ? " (" + gpus.unavailableReason + ")" : "");
  const std::string has = "the artifact has " + (mesh.empty() ? "pp = " + std::to_string(ranks) : mesh) +
                          (mesh.empty() ? " pipeline ranks" : " = " + std::to_string(ranks) + " ranks");
  if (ranksPerGpu > 1)
    return has + ", " + std::to_string(ranksPerGpu) + " a GPU (--ranks-per-gpu) need " + std::to_string(needed) +
           " GPU(s), but " + visible + "; raise --ranks-per-gpu or run on more GPUs";
  return has + " and needs one GPU each, but " + visible +
         "; recompile with a smaller mesh, run on more GPUs, or share them (--in-process --ranks-per-gpu N)";
}

std::string gpuSelfTest(int device) {
  std::string where = "GPU " + std::to_string(device) + ": ";
  cudaError_t status = cudaSetDevice(device);
  if (status != cudaSuccess)
    return where + "cannot select the device (" + describe(status) + ")";
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, device);
  if (prop.major != kKernelComputeMajor)
    return where + prop.name + " is sm_" + std::to_string(prop.major * 10 + prop.minor) +
           ", but mhcc's kernels are built for sm_" +
           std::to_string(kKernelComputeMajor * 10 + kKernelComputeMinor) +
           " (Hopper); run on H100/H200 GPUs";
  const int n = 1 << 20;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 97) * 0.5f;
    y[i] = static_cast<float>(i % 89);
  }
  float *dx = nullptr, *dy = nullptr;
  std::string error;
  auto check = [&](cudaError_t s, const char *what) {
    if (s != cudaSuccess && error.empty())
      error = where + what + " failed (" + describe(s) + ")";
    return s == cudaSuccess;
  };
  if (check(cudaMalloc(&dx, n * sizeof(float)), "cudaMalloc") &&
      check(cudaMalloc(&dy, n * sizeof(float)), "cudaMalloc") &&
      check(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice), "copy to device") &&
      check(cudaMemcpy(dy, y.data(), n * sizeof(float), cudaMemcpyHostToDevice), "copy to device")) {
    scaleAddKernel<<<(n + 255) / 256, 256>>>(dx, dy, 2.0f, n);
    if (check(cudaGetLastError(), "kernel launch") &&
        check(cudaDeviceSynchronize(), "kernel") &&
        check(cudaMemcpy(y.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost), "copy to host")) {
      for (int i = 0; i < n && error.empty(); ++i) {
        float expected = 2.0f * (static_cast<float>(i % 97) * 0.5f) + static_cast<float>(i % 89);
        if (y[i] != expected)
          error = where + "self-test kernel computed a wrong value at " + std::to_string(i);
      }
    }
  }
  cudaFree(dx);
  cudaFree(dy);
  return error;
}

} // namespace mhcc::runtime
