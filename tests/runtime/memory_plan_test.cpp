// The static memory plan: offsets never overlap for buffers live together,
// every reuse of memory freed on another stream waits for that free, the
// arena is never below the live peak, plans are deterministic, and the
// record / replay allocator refuses a step that differs from the recorded one.
#include "runtime/memory/MemoryPlan.h"

#include <gtest/gtest.h>

#include <random>

namespace mhcc::runtime {
namespace {

/// Builds lifetimes from a script of allocations and frees.
struct Trace {
  std::vector<BufferLifetime> buffers;
  int64_t position = 0;
  int alloc(int64_t bytes, int stream) {
    buffers.push_back({bytes, position++, -1, stream, stream});
    return static_cast<int>(buffers.size()) - 1;
  }
  void free(int buffer, int stream) {
    buffers[buffer].freeAt = position++;
    buffers[buffer].freeStream = stream;
  }
};

TEST(MemoryPlan, ReusesMemoryAlongOneStream) {
  Trace t;
  int a = t.alloc(1024, 0);
  t.free(a, 0);
  int b = t.alloc(1024, 0);
  t.free(b, 0);
  int c = t.alloc(512, 0);
  t.free(c, 0);
  MemoryPlan plan = planMemory(t.buffers, 256);
  EXPECT_EQ(checkPlan(t.buffers, plan), "");
  EXPECT_EQ(plan.arenaBytes, 1024);
  EXPECT_EQ(plan.peakLiveBytes, 1024);
  for (const auto &waits : plan.waitsFor)
    EXPECT_TRUE(waits.empty());
}

TEST(MemoryPlan, KeepsLiveBuffersApartAndAligned) {
  Trace t;
  int a = t.alloc(1000, 0), b = t.alloc(300, 0), c = t.alloc(10, 0);
  t.free(b, 0);
  t.free(a, 0);
  t.free(c, 0);
  MemoryPlan plan = planMemory(t.buffers, 256);
  EXPECT_EQ(checkPlan(t.buffers, plan), "");
  for (int64_t offset : plan.offsets)
    EXPECT_EQ(offset % 256, 0);
  EXPECT_EQ(plan.peakLiveBytes, 1310);
  EXPECT_EQ(plan.arenaBytes, 1024 + 512 + 10);
}

TEST(MemoryPlan, CrossStreamReuseWaitsForTheFree) {
  // An output freed behind its send (stream 1), then a buffer of the same
  // size on the compute stream (0): nothing else fits, so it reuses the
  // memory and must wait for the send's free.
  Trace t;
  int sent = t.alloc(4096, 0);
  t.free(sent, 1);
  int next = t.alloc(4096, 0);
  t.free(next, 0);
  MemoryPlan plan = planMemory(t.buffers, 256);
  EXPECT_EQ(checkPlan(t.buffers, plan), "");
  EXPECT_EQ(plan.arenaBytes, 4096);
  ASSERT_EQ(plan.waitsFor[next].size(), 1u);
  EXPECT_EQ(plan.waitsFor[next][0], sent);
  EXPECT_TRUE(plan.freeIsWaitedOn[sent]);
  EXPECT_FALSE(plan.freeIsWaitedOn[next]);
}

TEST(MemoryPlan, PrefersMemoryFreedOnItsOwnStream) {
  // Two equal holes: one freed on the send stream, one on the compute
  // stream. The compute allocation takes the one that needs no wait.
  Trace t;
  int sent = t.alloc(4096, 0), local = t.alloc(4096, 0);
  t.free(sent, 1);
  t.free(local, 0);
  int next = t.alloc(4096, 0);
  t.free(next, 0);
  MemoryPlan plan = planMemory(t.buffers, 256);
  EXPECT_EQ(checkPlan(t.buffers, plan), "");
  EXPECT_EQ(plan.arenaBytes, 8192);
  EXPECT_EQ(plan.offsets[next], plan.offsets[local]);
  EXPECT_TRUE(plan.waitsFor[next].empty());
}

TEST(MemoryPlan, CheckFindsBrokenPlans) {
  Trace t;
  int a = t.alloc(512, 0), b = t.alloc(512, 0);
  t.free(a, 1);
  t.free(b, 0);
  int c = t.alloc(512, 0);
  t.free(c, 0);
  MemoryPlan plan = planMemory(t.buffers, 256);
  ASSERT_EQ(checkPlan(t.buffers, plan), "");
  MemoryPlan overlapping = plan;
  overlapping.offsets[b] = overlapping.offsets[a];
  EXPECT_NE(checkPlan(t.buffers, overlapping).find("live together and overlap"), std::string::npos);
  MemoryPlan noWait = plan;
  noWait.offsets[c] = noWait.offsets[a];
  noWait.waitsFor[c].clear();
  EXPECT_NE(checkPlan(t.buffers, noWait).find("without waiting for that free"), std::string::npos);
}

TEST(MemoryPlan, RandomTracesGiveSoundDeterministicPlans) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    Trace t;
    std::vector<int> live;
    const int events = 20 + static_cast<int>(rng() % 200);
    for (int e = 0; e < events; ++e) {
      if (live.empty() || rng() % 3 != 0) {
        live.push_back(t.alloc(4 * (1 + rng() % 5000), static_cast<int>(rng() % 3)));
      } else {
        size_t k = rng() % live.size();
        t.free(live[k], static_cast<int>(rng() % 3));
        live.erase(live.begin() + k);
      }
    }
    for (int b : live)
      t.free(b, 0);
    MemoryPlan plan = planMemory(t.buffers, 256);
    ASSERT_EQ(checkPlan(t.buffers, plan), "") << "trial " << trial;
    EXPECT_GE(plan.arenaBytes, plan.peakLiveBytes);
    int64_t total = 0;
    for (const BufferLifetime &b : t.buffers)
      total += (b.bytes + 255) / 256 * 256;
    EXPECT_LE(plan.arenaBytes, total);
    MemoryPlan again = planMemory(t.buffers, 256);
    EXPECT_EQ(again.offsets, plan.offsets) << "trial " << trial;
    EXPECT_EQ(again.waitsFor, plan.waitsFor) << "trial " << trial;
  }
}

TEST(MemoryPlan, AllocatorRecordsThenReplaysWithTheWaits) {
  PlannedAllocator allocator;
  std::string error;
  // Step 1, recorded: addresses come from whatever allocated them.
  allocator.recordAlloc(4096, 0, 0x1000);
  ASSERT_TRUE(allocator.recordFree(0x1000, 1, error)) << error;
  allocator.recordAlloc(4096, 0, 0x1000);
  ASSERT_TRUE(allocator.recordFree(0x1000, 0, error)) << error;
  ASSERT_TRUE(allocator.finishRecording(256, error)) << error;
  EXPECT_EQ(allocator.plan().arenaBytes, 4096);

  std::vector<std::string> calls;
  PlannedAllocator::Hooks hooks{
      [&](int buffer, int stream) { calls.push_back("record " + std::to_string(buffer) + "@" + std::to_string(stream)); },
      [&](int stream, int buffer) { calls.push_back("wait " + std::to_string(stream) + "<-" + std::to_string(buffer)); }};
  for (int step = 0; step < 2; ++step) {
    calls.clear();
    int64_t first = allocator.alloc(4096, 0, hooks, error);
    ASSERT_EQ(first, 0) << error;
    ASSERT_TRUE(allocator.free(first, 1, hooks, error)) << error;
    int64_t second = allocator.alloc(4096, 0, hooks, error);
    ASSERT_EQ(second, 0) << error;
    ASSERT_TRUE(allocator.free(second, 0, hooks, error)) << error;
    ASSERT_TRUE(allocator.endStep(error)) << error;
    EXPECT_EQ(calls, (std::vector<std::string>{"record 0@1", "wait 0<-0"})) << "step " << step;
  }
}

TEST(MemoryPlan, AllocatorRefusesADifferentStep) {
  PlannedAllocator allocator;
  std::string error;
  allocator.recordAlloc(1024, 0, 0x10);
  ASSERT_TRUE(allocator.recordFree(0x10, 0, error));
  ASSERT_TRUE(allocator.finishRecording(256, error)) << error;
  PlannedAllocator::Hooks hooks{[](int, int) {}, [](int, int) {}};
  EXPECT_EQ(allocator.alloc(2048, 0, hooks, error), -1);
  EXPECT_NE(error.find("asks for 2048 bytes on stream 0, the recorded step for 1024"), std::string::npos) << error;
  ASSERT_EQ(allocator.alloc(1024, 0, hooks, error), 0);
  EXPECT_FALSE(allocator.free(0, 2, hooks, error));
  EXPECT_NE(error.find("freed on stream 2, recorded on stream 0"), std::string::npos) << error;
  EXPECT_FALSE(allocator.endStep(error));
  EXPECT_NE(error.find("left 1 live"), std::string::npos) << error;
  EXPECT_EQ(allocator.alloc(1024, 0, hooks, error), -1);
  EXPECT_NE(error.find("allocation 1 of a step that recorded 1"), std::string::npos) << error;
}

TEST(MemoryPlan, RecordingRefusesLeaksAndUnknownFrees) {
  PlannedAllocator allocator;
  std::string error;
  allocator.recordAlloc(1024, 0, 0x10);
  EXPECT_FALSE(allocator.recordFree(0x20, 0, error));
  EXPECT_NE(error.find("did not allocate"), std::string::npos) << error;
  EXPECT_FALSE(allocator.finishRecording(256, error));
  EXPECT_NE(error.find("never freed"), std::string::npos) << error;
}

} // namespace
} // namespace mhcc::runtime
