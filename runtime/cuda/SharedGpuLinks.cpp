//===- SharedGpuLinks.cpp - messages between ranks of one process ----------===//
//
// RankLinks for ranks of this process that may share a GPU (RankLinks.h).
// A send copies its data into a staging buffer on its own stream and posts
// (staging, the copy's event) to the pair's mailbox; the receive waits on
// the host until the message is posted, makes its stream wait for the
// event, copies the staging buffer into place and hands the staging buffer
// back to the sender with the event of that copy; the sender frees it on
// its stream behind that event at its next group (or at teardown). Sends
// never block, as on the CPU backend's channels, so posting a group's sends
// before waiting on its receives keeps every schedule NCCL can run.
//
// Every stream wait refers to an event recorded (on the host) before it, so
// no GPU queue ever waits on work queued after it: nothing can deadlock on
// the device, even with CUDA_DEVICE_MAX_CONNECTIONS=1 putting every rank's
// streams on one hardware queue.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/RankLinks.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

namespace mhcc::runtime::cuda {

namespace {

struct Message {
  void *staging = nullptr;
  int64_t bytes = 0;
  cudaEvent_t ready = nullptr; // the staging copy done
  int device = 0;
};

struct Returned {
  void *staging = nullptr;
  cudaEvent_t consumed = nullptr; // the receiver's copy out of it done
  int device = 0;
};

} // namespace

class SharedGpuPost {
public:
  /// How long a rank waits for its peers' host threads, and when it stops.
  struct Waiting {
    double timeoutSeconds;
    const std::atomic<bool> *peerFailed;
  };

  explicit SharedGpuPost(int64_t ranks) : ranks_(ranks), returned_(ranks), contributions_(ranks) {}
  ~SharedGpuPost() {
    // Messages never received (a failed run) and staging never taken back.
    for (auto &[pair, queue] : queues_)
      for (Message &m : queue) {
        cudaSetDevice(m.device);
        cudaEventSynchronize(m.ready);
        cudaEventDestroy(m.ready);
        cudaFree(m.staging);
      }
    for (std::vector<Returned> &list : returned_)
      for (Returned &r : list) {
        cudaSetDevice(r.device);
        cudaEventSynchronize(r.consumed);
        cudaEventDestroy(r.consumed);
        cudaFree(r.staging);
      }
  }

  void post(int64_t from, int64_t to, const Message &m) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queues_[{from, to}].push_back(m);
    }
    changed_.notify_all();
  }

  /// The next message from `from` to `to`; false (with `why`) on a
  /// timeout, an abort or a failed peer.
  bool take(int64_t from, int64_t to, Message &m, const Waiting &waiting, std::string &why) {
    std::unique_lock<std::mutex> lock(mutex_);
    std::deque<Message> &queue = queues_[{from, to}];
    if (!waitUntil(lock, waiting, [&] { return !queue.empty(); },
                   "a message from rank " + std::to_string(from), why))
      return false;
    m = queue.front();
    queue.pop_front();
    return true;
  }

  void giveBack(int64_t sender, const Returned &r) {
    std::lock_guard<std::mutex> lock(mutex_);
    returned_[sender].push_back(r);
  }
  std::vector<Returned> takeReturned(int64_t sender) {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::move(returned_[sender]);
  }

  /// Every rank's `values` summed in rank order (from +0), on every rank.
  bool allReduce(int64_t rank, std::vector<double> &values, const Waiting &waiting, std::string &why) {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t generation = generation_;
    contributions_[rank] = values;
    if (++arrived_ == ranks_) {
      sum_.assign(values.size(), 0.0);
      for (const std::vector<double> &c : contributions_)
        for (size_t i = 0; i < sum_.size() && i < c.size(); ++i)
          sum_[i] += c[i];
      arrived_ = 0;
      ++generation_;
      changed_.notify_all();
    } else if (!waitUntil(lock, waiting, [&] { return generation_ != generation; }, "the other ranks' statistics",
                          why)) {
      return false;
    }
    // sum_ stays until every rank arrives at the next all-reduce, which
    // this rank has not yet.
    values = sum_;
    return true;
  }

  void abort() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      aborted_ = true;
    }
    changed_.notify_all();
  }

private:
  template <typename Ready>
  bool waitUntil(std::unique_lock<std::mutex> &lock, const Waiting &waiting, Ready ready, const std::string &what,
                 std::string &why) {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + std::chrono::duration<double>(waiting.timeoutSeconds);
    while (!ready()) {
      if (aborted_ || (waiting.peerFailed && waiting.peerFailed->load())) {
        why = "stopped while waiting for " + what + ": another rank failed";
        return false;
      }
      if (Clock::now() > deadline) {
        char text[32];
        std::snprintf(text, sizeof text, "%g", waiting.timeoutSeconds);
        why = "waited " + std::string(text) + " s for " + what +
              ": that rank is stuck or lost (--recv-timeout sets the limit)";
        return false;
      }
      changed_.wait_for(lock, std::chrono::milliseconds(10));
    }
    return true;
  }

  const int64_t ranks_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool aborted_ = false;
  std::map<std::pair<int64_t, int64_t>, std::deque<Message>> queues_; // (from, to)
  std::vector<std::vector<Returned>> returned_;                      // by sender
  std::vector<std::vector<double>> contributions_;
  std::vector<double> sum_;
  int64_t arrived_ = 0, generation_ = 0;
};

namespace {

std::string what(cudaError_t status) { return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status); }

class SharedGpuLinks final : public RankLinks {
public:
  SharedGpuLinks(std::shared_ptr<SharedGpuPost> post, int64_t rank, double timeoutSeconds,
                 const std::atomic<bool> *peerFailed)
      : post_(std::move(post)), rank_(rank), waiting_{timeoutSeconds, peerFailed} {}
  ~SharedGpuLinks() override {
    for (Returned &r : post_->takeReturned(rank_)) {
      cudaEventSynchronize(r.consumed);
      cudaEventDestroy(r.consumed);
      cudaFree(r.staging);
    }
  }

  void groupStart() override { ops_.clear(); }
  void send(const void *data, int64_t count, Dtype dtype, int64_t peer, cudaStream_t stream) override {
    ops_.push_back({true, const_cast<void *>(data), count * dtypeBytes(dtype), peer, stream});
  }
  void recv(void *data, int64_t count, Dtype dtype, int64_t peer, cudaStream_t stream) override {
    ops_.push_back({false, data, count * dtypeBytes(dtype), peer, stream});
  }

  std::string groupEnd() override {
    std::vector<Op> ops = std::move(ops_);
    ops_.clear();
    if (!ops.empty())
      freeReturned(ops.front().stream);
    for (const Op &op : ops)
      if (op.send)
        if (std::string problem = post(op); !problem.empty())
          return problem;
    for (const Op &op : ops)
      if (!op.send)
        if (std::string problem = receive(op); !problem.empty())
          return problem;
    return "";
  }

  std::string allReduceSum(double *data, int64_t count, cudaStream_t stream) override {
    std::vector<double> values(count);
    cudaMemcpyAsync(values.data(), data, count * sizeof(double), cudaMemcpyDeviceToHost, stream);
    if (cudaError_t status = cudaStreamSynchronize(stream); status != cudaSuccess)
      return "reading the statistics to share: " + what(status);
    std::string why;
    if (!post_->allReduce(rank_, values, waiting_, why))
      return why;
    cudaMemcpyAsync(data, values.data(), count * sizeof(double), cudaMemcpyHostToDevice, stream);
    if (cudaError_t status = cudaStreamSynchronize(stream); status != cudaSuccess)
      return "writing the shared statistics: " + what(status);
    return "";
  }

  void abort() override { post_->abort(); }

private:
  struct Op {
    bool send;
    void *data;
    int64_t bytes, peer;
    cudaStream_t stream;
  };

  /// Staging buffers the receivers are done with, freed behind their copies.
  void freeReturned(cudaStream_t stream) {
    for (Returned &r : post_->takeReturned(rank_)) {
      cudaStreamWaitEvent(stream, r.consumed, 0);
      cudaEventDestroy(r.consumed);
      cudaFreeAsync(r.staging, stream);
    }
  }

  std::string post(const Op &op) {
    Message m;
    m.bytes = op.bytes;
    cudaGetDevice(&m.device);
    if (cudaError_t status = cudaMallocAsync(&m.staging, std::max<int64_t>(op.bytes, 4), op.stream);
        status != cudaSuccess)
      return "out of GPU memory staging a message of " + std::to_string(op.bytes) + " bytes to rank " +
             std::to_string(op.peer) + " (" + what(status) + ")";
    cudaMemcpyAsync(m.staging, op.data, op.bytes, cudaMemcpyDeviceToDevice, op.stream);
    cudaEventCreateWithFlags(&m.ready, cudaEventDisableTiming);
    cudaEventRecord(m.ready, op.stream);
    if (cudaError_t status = cudaGetLastError(); status != cudaSuccess)
      return "staging a message to rank " + std::to_string(op.peer) + ": " + what(status);
    post_->post(rank_, op.peer, m);
    return "";
  }

  std::string receive(const Op &op) {
    Message m;
    std::string why;
    if (!post_->take(op.peer, rank_, m, waiting_, why))
      return why;
    if (m.bytes != op.bytes) // the verified schedules never do this
      return "rank " + std::to_string(op.peer) + " sent " + std::to_string(m.bytes) + " bytes where rank " +
             std::to_string(rank_) + " expected " + std::to_string(op.bytes) +
             " (mismatched schedules: were both given the same artifact?)";
    cudaStreamWaitEvent(op.stream, m.ready, 0);
    cudaEventDestroy(m.ready);
    cudaMemcpyAsync(op.data, m.staging, op.bytes, cudaMemcpyDefault, op.stream);
    Returned r{m.staging, nullptr, m.device};
    cudaEventCreateWithFlags(&r.consumed, cudaEventDisableTiming);
    cudaEventRecord(r.consumed, op.stream);
    post_->giveBack(op.peer, r);
    if (cudaError_t status = cudaGetLastError(); status != cudaSuccess)
      return "receiving from rank " + std::to_string(op.peer) + ": " + what(status);
    return "";
  }

  std::shared_ptr<SharedGpuPost> post_;
  const int64_t rank_;
  const SharedGpuPost::Waiting waiting_;
  std::vector<Op> ops_;
};

} // namespace

std::unique_ptr<RankLinks> sharedGpuLinks(std::shared_ptr<SharedGpuPost> post, int64_t rank, double timeoutSeconds,
                                          const std::atomic<bool> *peerFailed) {
  return std::make_unique<SharedGpuLinks>(std::move(post), rank, timeoutSeconds, peerFailed);
}

std::shared_ptr<SharedGpuPost> makeSharedGpuPost(int64_t ranks) { return std::make_shared<SharedGpuPost>(ranks); }

} // namespace mhcc::runtime::cuda
