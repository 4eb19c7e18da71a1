//===- Parallel.cpp - deterministic row-parallel loops -------------------------===//
#include "runtime/cpu/Parallel.h"

#include <algorithm>
#include <cstdlib>
#include <thread>
#include <vector>

namespace mhcc::runtime {
namespace {

int64_t threadLimit() {
  static const int64_t limit = [] {
    if (const char *value = std::getenv("MHCC_CPU_THREADS"))
      if (int64_t n = std::atoll(value); n > 0)
        return n;
    return static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  }();
  return limit;
}

} // namespace

void parallelFor(int64_t items, int64_t costPerItem, const std::function<void(int64_t, int64_t)> &body) {
  constexpr int64_t kWorkPerThread = int64_t(1) << 20; // multiply-adds worth a thread
  const int64_t work = items * std::max<int64_t>(1, costPerItem);
  const int64_t threads = std::min({threadLimit(), items, std::max<int64_t>(1, work / kWorkPerThread)});
  if (threads <= 1) {
    body(0, items);
    return;
  }
  std::vector<std::thread> workers;
  const int64_t chunk = (items + threads - 1) / threads;
  for (int64_t t = 1; t < threads; ++t) {
    int64_t begin = std::min(items, t * chunk), end = std::min(items, begin + chunk);
    if (begin < end)
      workers.emplace_back(body, begin, end);
  }
  body(0, std::min(items, chunk));
  for (std::thread &w : workers)
    w.join();
}

} // namespace mhcc::runtime
