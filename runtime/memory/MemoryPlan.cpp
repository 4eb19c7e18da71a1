//===- MemoryPlan.cpp - offsets, cross-stream waits, record and replay --------===//
#include "runtime/memory/MemoryPlan.h"

#include <algorithm>
#include <numeric>

namespace mhcc::runtime {
namespace {

bool liveTogether(const BufferLifetime &a, const BufferLifetime &b) {
  return a.allocAt < b.freeAt && b.allocAt < a.freeAt;
}

bool overlap(int64_t offsetA, int64_t bytesA, int64_t offsetB, int64_t bytesB) {
  return offsetA < offsetB + bytesB && offsetB < offsetA + bytesA;
}

int64_t alignUp(int64_t value, int64_t alignment) { return (value + alignment - 1) / alignment * alignment; }

/// The lowest aligned offset where `bytes` fit between `taken` ranges
/// (sorted by offset), at or above 0; limit < 0: no upper limit.
int64_t lowestFit(std::vector<std::pair<int64_t, int64_t>> &taken, int64_t bytes, int64_t alignment,
                  int64_t limit) {
  std::sort(taken.begin(), taken.end());
  int64_t candidate = 0;
  for (const auto &[offset, size] : taken) {
    if (candidate + bytes <= offset)
      break;
    candidate = std::max(candidate, alignUp(offset + size, alignment));
  }
  return limit >= 0 && candidate + bytes > limit ? -1 : candidate;
}

} // namespace

MemoryPlan planMemory(const std::vector<BufferLifetime> &buffers, int64_t alignment, bool avoidCrossStreamReuse) {
  const int count = static_cast<int>(buffers.size());
  MemoryPlan plan;
  plan.offsets.assign(count, -1);
  plan.waitsFor.assign(count, {});
  plan.freeIsWaitedOn.assign(count, false);

  // The lower bound: the most bytes live at one position.
  std::vector<std::pair<int64_t, int64_t>> events; // (position, +bytes / -bytes)
  for (const BufferLifetime &b : buffers) {
    events.push_back({b.allocAt, b.bytes});
    events.push_back({b.freeAt, -b.bytes});
  }
  std::sort(events.begin(), events.end());
  int64_t live = 0;
  for (const auto &[position, delta] : events) {
    live += delta;
    plan.peakLiveBytes = std::max(plan.peakLiveBytes, live);
  }

  std::vector<int> order(count);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
    return buffers[x].bytes != buffers[y].bytes ? buffers[x].bytes > buffers[y].bytes
                                                : buffers[x].allocAt < buffers[y].allocAt;
  });
  std::vector<int> placed;
  for (int j : order) {
    const BufferLifetime &b = buffers[j];
    std::vector<std::pair<int64_t, int64_t>> conflicts, avoid;
    for (int i : placed) {
      if (liveTogether(buffers[i], b))
        conflicts.push_back({plan.offsets[i], buffers[i].bytes});
      else if (avoidCrossStreamReuse && buffers[i].freeAt < b.allocAt && buffers[i].freeStream != b.allocStream)
        avoid.push_back({plan.offsets[i], buffers[i].bytes});
    }
    int64_t offset = -1;
    if (!avoid.empty()) {
      // Below the arena's current end without waiting on another stream, if possible.
      std::vector<std::pair<int64_t, int64_t>> both = conflicts;
      both.insert(both.end(), avoid.begin(), avoid.end());
      offset = lowestFit(both, b.bytes, alignment, plan.arenaBytes);
    }
    if (offset < 0)
      offset = lowestFit(conflicts, b.bytes, alignment, -1);
    plan.offsets[j] = offset;
    plan.arenaBytes = std::max(plan.arenaBytes, offset + b.bytes);
    placed.push_back(j);
  }

  // Every reuse of memory freed on another stream waits for that free.
  for (int j = 0; j < count; ++j)
    for (int i = 0; i < count; ++i)
      if (i != j && buffers[i].freeAt < buffers[j].allocAt && buffers[i].freeStream != buffers[j].allocStream &&
          overlap(plan.offsets[i], buffers[i].bytes, plan.offsets[j], buffers[j].bytes)) {
        plan.waitsFor[j].push_back(i);
        plan.freeIsWaitedOn[i] = true;
      }
  return plan;
}

std::string checkPlan(const std::vector<BufferLifetime> &buffers, const MemoryPlan &plan) {
  const int count = static_cast<int>(buffers.size());
  if (static_cast<int>(plan.offsets.size()) != count)
    return "the plan has " + std::to_string(plan.offsets.size()) + " offsets for " + std::to_string(count) + " buffers";
  for (int i = 0; i < count; ++i) {
    if (plan.offsets[i] < 0 || plan.offsets[i] + buffers[i].bytes > plan.arenaBytes)
      return "buffer " + std::to_string(i) + " lies outside the arena";
    for (int j = i + 1; j < count; ++j) {
      if (!overlap(plan.offsets[i], buffers[i].bytes, plan.offsets[j], buffers[j].bytes))
        continue;
      if (liveTogether(buffers[i], buffers[j]))
        return "buffers " + std::to_string(i) + " and " + std::to_string(j) + " are live together and overlap";
      int first = buffers[i].freeAt < buffers[j].allocAt ? i : j, second = first == i ? j : i;
      if (buffers[first].freeStream != buffers[second].allocStream) {
        const std::vector<int> &waits = plan.waitsFor[second];
        if (std::find(waits.begin(), waits.end(), first) == waits.end())
          return "buffer " + std::to_string(second) + " reuses the memory of buffer " + std::to_string(first) +
                 ", freed on another stream, without waiting for that free";
      }
    }
  }
  return "";
}

int PlannedAllocator::recordAlloc(int64_t bytes, int stream, uintptr_t address) {
  int index = static_cast<int>(buffers_.size());
  buffers_.push_back({bytes, position_++, -1, stream, stream});
  liveByAddress_[address] = index;
  return index;
}

bool PlannedAllocator::recordFree(uintptr_t address, int stream, std::string &error) {
  auto it = liveByAddress_.find(address);
  if (it == liveByAddress_.end()) {
    error = "memory plan: a free of memory the recorded step did not allocate";
    return false;
  }
  buffers_[it->second].freeAt = position_++;
  buffers_[it->second].freeStream = stream;
  liveByAddress_.erase(it);
  return true;
}

bool PlannedAllocator::finishRecording(int64_t alignment, std::string &error) {
  if (!liveByAddress_.empty()) {
    error = "memory plan: " + std::to_string(liveByAddress_.size()) +
            " buffer(s) of the recorded step were never freed (buffer " +
            std::to_string(liveByAddress_.begin()->second) + " first)";
    return false;
  }
  plan_ = planMemory(buffers_, alignment);
  std::string problem = checkPlan(buffers_, plan_);
  if (!problem.empty()) {
    error = "memory plan: " + problem;
    return false;
  }
  planned_ = true;
  return true;
}

int64_t PlannedAllocator::alloc(int64_t bytes, int stream, const Hooks &hooks, std::string &error) {
  const int index = static_cast<int>(next_);
  if (next_ >= static_cast<int64_t>(buffers_.size())) {
    error = "memory plan: allocation " + std::to_string(next_) + " of a step that recorded " +
            std::to_string(buffers_.size());
    return -1;
  }
  const BufferLifetime &b = buffers_[index];
  if (b.bytes != bytes || b.allocStream != stream) {
    error = "memory plan: allocation " + std::to_string(index) + " asks for " + std::to_string(bytes) +
            " bytes on stream " + std::to_string(stream) + ", the recorded step for " + std::to_string(b.bytes) +
            " on stream " + std::to_string(b.allocStream) + " (the step is not the one recorded)";
    return -1;
  }
  ++next_;
  for (int earlier : plan_.waitsFor[index])
    hooks.waitForFree(stream, earlier);
  liveByOffset_[plan_.offsets[index]] = index;
  return plan_.offsets[index];
}

bool PlannedAllocator::free(int64_t offset, int stream, const Hooks &hooks, std::string &error) {
  auto it = liveByOffset_.find(offset);
  if (it == liveByOffset_.end()) {
    error = "memory plan: a free at offset " + std::to_string(offset) + " where no buffer is live";
    return false;
  }
  const int index = it->second;
  if (buffers_[index].freeStream != stream) {
    error = "memory plan: buffer " + std::to_string(index) + " freed on stream " + std::to_string(stream) +
            ", recorded on stream " + std::to_string(buffers_[index].freeStream);
    return false;
  }
  liveByOffset_.erase(it);
  if (plan_.freeIsWaitedOn[index])
    hooks.recordFree(index, stream);
  return true;
}

bool PlannedAllocator::endStep(std::string &error) {
  if (next_ != static_cast<int64_t>(buffers_.size()) || !liveByOffset_.empty()) {
    error = "memory plan: the step allocated " + std::to_string(next_) + " of " + std::to_string(buffers_.size()) +
            " recorded buffers and left " + std::to_string(liveByOffset_.size()) + " live";
    return false;
  }
  next_ = 0;
  return true;
}

} // namespace mhcc::runtime
