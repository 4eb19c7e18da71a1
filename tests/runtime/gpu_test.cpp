// GPU tests skip cleanly where no GPU is visible (CI); on a lent H200 they run
// a real kernel through the same nvcc-built objects the runtime uses.
#include "runtime/cuda/Gpus.h"

#include <gtest/gtest.h>

using mhcc::runtime::GpuInventory;
using mhcc::runtime::queryGpus;

TEST(Gpus, InventoryExplainsAbsence) {
  GpuInventory inventory = queryGpus();
  if (inventory.gpus.empty())
    EXPECT_FALSE(inventory.unavailableReason.empty());
  else
    EXPECT_TRUE(inventory.unavailableReason.empty());
}

TEST(Gpus, SelfTestPassesOnEveryGpu) {
  GpuInventory inventory = queryGpus();
  if (inventory.gpus.empty())
    GTEST_SKIP() << inventory.unavailableReason;
  for (const auto &gpu : inventory.gpus) {
    EXPECT_EQ(gpu.computeMajor, mhcc::runtime::kKernelComputeMajor) << gpu.name;
    EXPECT_GT(gpu.memoryBytes, 0u);
    EXPECT_EQ(mhcc::runtime::gpuSelfTest(gpu.index), "") << gpu.name;
  }
}
