//===- StreamTimeline.cpp - instructions timed on their CUDA streams ------===//
#include "runtime/cuda/StreamTimeline.h"

#include <algorithm>

namespace mhcc::runtime::cuda {

StreamTimeline::~StreamTimeline() {
  for (cudaEvent_t e : pool_)
    cudaEventDestroy(e);
}

cudaEvent_t StreamTimeline::event() {
  if (used_ == pool_.size()) {
    cudaEvent_t e = nullptr;
    cudaEventCreate(&e); // timing enabled: elapsed times are read from it
    pool_.push_back(e);
  }
  return pool_[used_++];
}

bool StreamTimeline::startStep(cudaStream_t stream) {
  used_ = 0;
  brackets_.clear();
  open_ = false;
  origin_ = event();
  cudaEventRecord(origin_, stream);
  // The host's clock read right after the event completes is its time, to
  // within the synchronization's latency (a few microseconds).
  const bool ok = cudaEventSynchronize(origin_) == cudaSuccess;
  originHost_ = std::chrono::steady_clock::now();
  return ok;
}

void StreamTimeline::openBracket() {
  brackets_.emplace_back();
  open_ = true;
}

void StreamTimeline::work(cudaStream_t stream) {
  if (!open_ || !origin_)
    return;
  std::vector<OnStream> &on = brackets_.back();
  if (std::any_of(on.begin(), on.end(), [&](const OnStream &s) { return s.stream == stream; }))
    return;
  cudaEvent_t start = event();
  cudaEventRecord(start, stream);
  on.push_back({stream, start, nullptr});
}

void StreamTimeline::closeBracket(cudaStream_t idle) {
  if (!open_ || !origin_)
    return;
  open_ = false;
  std::vector<OnStream> &on = brackets_.back();
  if (on.empty()) { // a point where the compute stream stands
    cudaEvent_t mark = event();
    cudaEventRecord(mark, idle);
    on.push_back({idle, mark, mark});
    return;
  }
  for (OnStream &s : on) {
    s.end = event();
    cudaEventRecord(s.end, s.stream);
  }
}

bool StreamTimeline::read(std::vector<DeviceInterval> &intervals, std::string &error) {
  intervals.clear();
  if (!origin_) {
    error = "the trace's clock event was never recorded";
    return false;
  }
  auto at = [&](cudaEvent_t e, std::chrono::steady_clock::time_point &t) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, origin_, e) != cudaSuccess)
      return false;
    t = originHost_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          std::chrono::duration<double, std::milli>(ms));
    return true;
  };
  for (const std::vector<OnStream> &on : brackets_) {
    DeviceInterval interval;
    for (size_t k = 0; k < on.size(); ++k) {
      std::chrono::steady_clock::time_point start, end;
      if (!at(on[k].start, start) || !at(on[k].end, end)) {
        error = "reading the trace's events: " + std::string(cudaGetErrorString(cudaGetLastError()));
        return false;
      }
      interval.start = k == 0 ? start : std::min(interval.start, start);
      interval.end = k == 0 ? end : std::max(interval.end, end);
    }
    intervals.push_back(interval);
  }
  return true;
}

} // namespace mhcc::runtime::cuda
