// The fixture of the CUDA kernel tests: the model kernels mhcc generated into
// the artifact named on the command line, loaded on GPU 0 beside cuBLASLt;
// skips cleanly where no GPU is visible. Device memory from allocate() is
// freed after each test; the helpers move values to and from the device.
#ifndef MHCC_TESTS_RUNTIME_MODELKERNELSTEST_H
#define MHCC_TESTS_RUNTIME_MODELKERNELSTEST_H

#include "runtime/artifact/Artifact.h"
#include "runtime/cpu/Bf16.h"
#include "runtime/cuda/DeviceKernels.h"
#include "runtime/cuda/Gemm.h"
#include "runtime/cuda/Gpus.h"
#include "runtime/cuda/ModelKernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace mhcc::runtime {

inline const char *gArtifact = nullptr; // from main: an artifact with the model kernels

/// `count` normal values of deviation `scale`, rounded to bf16 where
/// `bf16` (so the host copy is exactly what a bf16 tensor on the GPU holds).
inline std::vector<float> normalValues(std::mt19937 &rng, size_t count, float scale, bool bf16) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(count);
  for (float &x : v)
    x = bf16 ? roundToBf16(normal(rng)) : normal(rng);
  return v;
}

class ModelKernelsTest : public ::testing::Test {
protected:
  /// The artifact's kernels must be for `activationBytes` (4: fp32, 2: bf16),
  /// a residual stream of `residualBytes` (0: as the activations) and
  /// `streams` (0: any, then streams() says which); `sinkhornIterations` is
  /// checked unless 0.
  ModelKernelsTest(int activationBytes, int64_t streams, int64_t sinkhornIterations, int residualBytes = 0)
      : activationBytes_(activationBytes), residualBytes_(residualBytes ? residualBytes : activationBytes),
        streams_(streams), sinkhornIterations_(sinkhornIterations) {}

  void SetUp() override {
    GpuInventory gpus = queryGpus();
    if (gpus.gpus.empty())
      GTEST_SKIP() << gpus.unavailableReason;
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    gemms_ = std::make_unique<cuda::Gemms>();
    ASSERT_EQ(gemms_->init(nullptr), "");
    std::string error;
    std::optional<Artifact> artifact = readArtifact(gArtifact, error);
    ASSERT_TRUE(artifact) << error;
    ASSERT_TRUE(artifact->deviceCode) << gArtifact << " carries no CUDA kernels";
    if (streams_ == 0)
      streams_ = artifact->deviceCode->streams;
    ASSERT_EQ(artifact->deviceCode->streams, streams_);
    if (sinkhornIterations_ != 0) {
      ASSERT_EQ(artifact->deviceCode->sinkhornIterations, sinkhornIterations_);
    }
    kernels_ = cuda::ModelKernels::load(*artifact->deviceCode, 0, activationBytes_, residualBytes_, error);
    ASSERT_TRUE(kernels_) << error << (activationBytes_ == 2 ? " (the test wants a bf16 model's artifact)" : "");
  }
  void TearDown() override {
    for (void *p : allocations_)
      cudaFree(p);
    gemms_.reset();
  }

  /// `count` elements of D (at least one) on the device, freed after the test.
  template <typename D> D *allocate(size_t count) {
    void *p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(1, count) * sizeof(D)), cudaSuccess);
    allocations_.push_back(p);
    return static_cast<D *>(p);
  }

  /// `host` on the device (rounded to bf16, or as fp32), `offset` elements
  /// into a fresh allocation (an offset of 1 misaligns it, for the kernels'
  /// element paths).
  __nv_bfloat16 *uploadBf16(const std::vector<float> &host, size_t offset = 0) {
    std::vector<__nv_bfloat16> b(host.size());
    for (size_t i = 0; i < host.size(); ++i)
      b[i] = __float2bfloat16_rn(host[i]);
    __nv_bfloat16 *p = allocate<__nv_bfloat16>(host.size() + offset) + offset;
    cudaMemcpy(p, b.data(), b.size() * 2, cudaMemcpyHostToDevice);
    return p;
  }
  float *uploadF32(const std::vector<float> &host, size_t offset = 0) {
    float *p = allocate<float>(host.size() + offset) + offset;
    cudaMemcpy(p, host.data(), host.size() * 4, cudaMemcpyHostToDevice);
    return p;
  }
  /// `count` device values, widened, after the device's work so far.
  std::vector<float> downloadBf16(const __nv_bfloat16 *p, size_t count) {
    std::vector<__nv_bfloat16> b(count);
    cudaDeviceSynchronize();
    cudaMemcpy(b.data(), p, count * 2, cudaMemcpyDeviceToHost);
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i)
      v[i] = __bfloat162float(b[i]);
    return v;
  }
  std::vector<float> downloadF32(const float *p, size_t count) {
    std::vector<float> v(count);
    cudaDeviceSynchronize();
    cudaMemcpy(v.data(), p, count * 4, cudaMemcpyDeviceToHost);
    return v;
  }
  /// No launch failed since the last check.
  void noErrors(const char *what) {
    ASSERT_EQ(kernels_->takeError(), "") << what;
    ASSERT_EQ(cuda::lastError(what), "") << what;
  }
  /// The largest difference over the largest reference value.
  static double relativeError(const std::vector<float> &got, const std::vector<float> &want) {
    double diff = 0, ref = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      diff = std::max(diff, double(std::abs(got[i] - want[i])));
      ref = std::max(ref, double(std::abs(want[i])));
    }
    return diff / std::max(ref, 1e-30);
  }

  /// The image's residual streams (after SetUp).
  int64_t streams() const { return streams_; }

  std::unique_ptr<cuda::Gemms> gemms_;
  std::unique_ptr<cuda::ModelKernels> kernels_;

private:
  int activationBytes_, residualBytes_;
  int64_t streams_, sinkhornIterations_;
  std::vector<void *> allocations_;
};

/// main() of a kernel test: gtest's flags, then the artifact (`artifact`
/// says which kind).
inline int runModelKernelTests(int argc, char **argv, const char *artifact) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s ARTIFACT (%s)\n", argv[0], artifact);
    return 2;
  }
  gArtifact = argv[1];
  return RUN_ALL_TESTS();
}

} // namespace mhcc::runtime

#endif // MHCC_TESTS_RUNTIME_MODELKERNELSTEST_H
