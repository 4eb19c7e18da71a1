//===- MemoryPlan.h - a static memory plan for one rank's step ------*- C++ -*-===//
//
// A pipeline rank allocates the same buffers in the same order every step
// (its instruction list is static). The plan records that sequence once,
// gives every buffer a fixed offset in one arena, and replays it: no
// allocation at all inside later steps, and a footprint fixed before they
// run. Buffers may be freed on another stream than the one that allocates
// their memory next (an output freed behind its send); the plan then names
// the free the next allocation must wait for (a device-side event wait in
// the CUDA backend), which the stream-ordered pool decided by timing instead.
//
// Plain C++: the CUDA backend supplies arena memory and the event calls.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_MEMORY_MEMORYPLAN_H
#define MHCC_RUNTIME_MEMORY_MEMORYPLAN_H

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace mhcc::runtime {

/// One buffer of a recorded step: its size and where it lives in the
/// sequence of allocation and free events (positions count both kinds).
struct BufferLifetime {
  int64_t bytes = 0;
  int64_t allocAt = 0, freeAt = 0; // freeAt: the step's end when never freed
  int allocStream = 0, freeStream = 0;
};

struct MemoryPlan {
  std::vector<int64_t> offsets; // by buffer, aligned
  int64_t arenaBytes = 0;
  int64_t peakLiveBytes = 0; // the lower bound no plan can beat
  /// Per buffer: earlier buffers freed on another stream whose memory it
  /// reuses; its stream must wait for those frees.
  std::vector<std::vector<int>> waitsFor;
  /// Per buffer: some later buffer waits for its free (record an event).
  std::vector<bool> freeIsWaitedOn;
};

/// Greedy by size (largest first, lowest offset that fits beside every
/// buffer whose lifetime overlaps): deterministic for a given trace.
/// With `avoidCrossStreamReuse`, memory freed on one stream is reused by
/// allocations on another only when nothing else fits below the arena's
/// current end (so waits are rare, never needed for size).
MemoryPlan planMemory(const std::vector<BufferLifetime> &buffers, int64_t alignment,
                      bool avoidCrossStreamReuse = true);

/// Problems of a plan, for tests and a runtime self-check: two buffers
/// that are live together and overlap, or a cross-stream reuse without a
/// wait. Empty when the plan is sound.
std::string checkPlan(const std::vector<BufferLifetime> &buffers, const MemoryPlan &plan);

/// Records a step's allocations and frees (first step), then serves the
/// same sequence from the plan (later steps), checking that it is the same.
class PlannedAllocator {
public:
  struct Hooks {
    std::function<void(int buffer, int stream)> recordFree;         // after buffer's free on stream
    std::function<void(int stream, int buffer)> waitForFree;        // before stream reuses it
  };

  /// Recording: returns the buffer's index; the caller allocates itself.
  int recordAlloc(int64_t bytes, int stream, uintptr_t address);
  /// Recording: the buffer at `address` is freed on `stream`.
  bool recordFree(uintptr_t address, int stream, std::string &error);
  /// Ends the recording and plans; false when a buffer is still live.
  bool finishRecording(int64_t alignment, std::string &error);

  bool planned() const { return planned_; }
  const MemoryPlan &plan() const { return plan_; }
  const std::vector<BufferLifetime> &lifetimes() const { return buffers_; }

  /// Replay: the offset of the next allocation, after the waits it needs;
  /// -1 and `error` when the step asks for something else than recorded.
  int64_t alloc(int64_t bytes, int stream, const Hooks &hooks, std::string &error);
  /// Replay: frees the buffer at `offset`.
  bool free(int64_t offset, int stream, const Hooks &hooks, std::string &error);
  /// Replay: the step's end; false when it allocated fewer buffers.
  bool endStep(std::string &error);

private:
  std::vector<BufferLifetime> buffers_;
  std::map<uintptr_t, int> liveByAddress_; // recording
  int64_t position_ = 0;
  bool planned_ = false;
  MemoryPlan plan_;
  // Replay.
  int64_t next_ = 0;
  std::map<int64_t, int> liveByOffset_;
};

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_MEMORY_MEMORYPLAN_H
