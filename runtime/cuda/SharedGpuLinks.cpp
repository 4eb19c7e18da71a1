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
#include "runtime/cuda/RankPlan.h"

#include "runtime/cuda/DeviceKernels.h"

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

/// The groups whose members meet for a collective.
enum class GroupAxis { Replicas, Tensor, Context };

class SharedGpuPost {
public:
  /// How long a rank waits for its peers' host threads, and when it stops.
  struct Waiting {
    double timeoutSeconds;
    const std::atomic<bool> *peerFailed;
  };

  /// `mesh`: the run's artifact; only its mesh sizes are kept.
  explicit SharedGpuPost(const Artifact &mesh)
      : ranks_(mesh.worldSize()), returned_(ranks_), contributions_(ranks_) {
    mesh_.pp = mesh.pp;
    mesh_.dp = mesh.dp;
    mesh_.cp = mesh.cp;
    mesh_.tp = mesh.tp;
  }
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

  /// A rank's group of one axis (its index among the axis's groups) and
  /// its place in it (Artifact::globalRank's order).
  struct Membership {
    size_t group = 0;
    int64_t member = 0, size = 1;
  };
  const Artifact &mesh() const { return mesh_; }
  /// The groups are RankPlan.h's: the gradient group (a pipeline and
  /// tensor rank's replicas and their context ranks), the tensor-parallel
  /// and the context-parallel ones.
  Membership membership(GroupAxis axis, int64_t rank) const {
    const Artifact &a = mesh_;
    if (axis == GroupAxis::Tensor)
      return {tensorGroupOf(a, rank), a.tensorRankOf(rank), a.tp};
    if (axis == GroupAxis::Context)
      return {contextGroupOf(a, rank), a.contextRankOf(rank), a.cp};
    return {replicaGroupOf(a, rank), a.reduceMemberOf(rank), a.reduceGroupSize()};
  }

  /// What one rank brings to its group's collective.
  struct Contribution {
    std::vector<std::pair<float *, int64_t>> buffers;
    cudaEvent_t ready = nullptr; // its buffers final
  };
  /// Phase 1: every member posts its buffers and their event; returns
  /// every member's, in member order.
  bool meetGroup(GroupAxis axis, int64_t rank, const Contribution &mine, std::vector<Contribution> &all,
                 const Waiting &waiting, std::string &why) {
    std::unique_lock<std::mutex> lock(mutex_);
    const Membership m = membership(axis, rank);
    Group &g = group(axis, m);
    g.sources[m.member] = mine.buffers;
    g.ready[m.member] = mine.ready;
    if (!meet(lock, g.posted, m.size, "the other " + axisMembers(axis) + "' buffers", waiting, why))
      return false;
    all.resize(m.size);
    for (int64_t d = 0; d < m.size; ++d)
      all[d] = {g.sources[d], g.ready[d]};
    return true;
  }
  /// Phase 2: every member posts the event after its reads of the others'
  /// buffers; `stream` waits for all of them (before a member overwrites
  /// its buffers).
  bool groupDone(GroupAxis axis, int64_t rank, cudaEvent_t done, cudaStream_t stream, const Waiting &waiting,
                 std::string &why) {
    std::unique_lock<std::mutex> lock(mutex_);
    const Membership m = membership(axis, rank);
    Group &g = group(axis, m);
    g.done[m.member] = done;
    if (!meet(lock, g.read, m.size, "the other " + axisMembers(axis) + "' reads", waiting, why))
      return false;
    for (cudaEvent_t event : g.done)
      cudaStreamWaitEvent(stream, event, 0);
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
  /// A barrier that can be met again: the last to arrive starts the next round.
  struct Rendezvous {
    int64_t generation = 0, arrived = 0;
  };
  /// The members of one group (membership: the gradient group, a tensor-
  /// or a context-parallel group). Each phase's posts
  /// are read after its rendezvous and not overwritten before the next
  /// phase's, which every member reaches only after reading them; the
  /// events are each rank's own, recorded anew each time (a wait takes the
  /// record it sees).
  struct Group {
    std::vector<std::vector<std::pair<float *, int64_t>>> sources;
    std::vector<cudaEvent_t> ready, done;
    Rendezvous posted, read;
  };
  Group &group(GroupAxis axis, const Membership &m) { // under mutex_
    Group &g = groups_[{int(axis), m.group}];
    if (g.sources.empty()) {
      g.sources.resize(m.size);
      g.ready.resize(m.size);
      g.done.resize(m.size);
    }
    return g;
  }
  static std::string axisMembers(GroupAxis axis) {
    return axis == GroupAxis::Tensor ? "tensor ranks" : axis == GroupAxis::Context ? "context ranks" : "replicas";
  }

  bool meet(std::unique_lock<std::mutex> &lock, Rendezvous &r, int64_t members, const std::string &what,
            const Waiting &waiting, std::string &why) {
    const int64_t generation = r.generation;
    if (++r.arrived == members) {
      r.arrived = 0;
      ++r.generation;
      changed_.notify_all();
      return true;
    }
    return waitUntil(lock, waiting, [&] { return r.generation != generation; }, what, why);
  }

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
  Artifact mesh_; // its sizes only
  std::mutex mutex_;
  std::condition_variable changed_;
  bool aborted_ = false;
  std::map<std::pair<int64_t, int64_t>, std::deque<Message>> queues_; // (from, to)
  std::vector<std::vector<Returned>> returned_;                      // by sender
  std::vector<std::vector<double>> contributions_;
  std::vector<double> sum_;
  int64_t arrived_ = 0, generation_ = 0;
  std::map<std::pair<int, size_t>, Group> groups_; // by (axis, group)
};

namespace {

std::string what(cudaError_t status) { return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status); }

class SharedGpuLinks final : public RankLinks {
public:
  SharedGpuLinks(std::shared_ptr<SharedGpuPost> post, int64_t rank, double timeoutSeconds,
                 const std::atomic<bool> *peerFailed)
      : post_(std::move(post)), rank_(rank), waiting_{timeoutSeconds, peerFailed} {}
  ~SharedGpuLinks() override {
    for (cudaEvent_t event : {ready_, done_})
      if (event)
        cudaEventDestroy(event);
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

  /// Each member of the gradient group (replica x cp + context rank) sums
  /// every member's buffers in member order (combine).
  std::string allReduceReplicas(const std::vector<std::pair<float *, int64_t>> &buffers,
                                cudaStream_t stream) override {
    std::vector<Part> parts;
    for (const auto &[data, count] : buffers)
      parts.push_back({data, data, 0, count});
    return combine(GroupAxis::Replicas, parts, Dtype::F32, false, stream, "the gradient all-reduce");
  }

  /// Each member combines every member's part m of each buffer into its
  /// own (combine), in member order: allReduceReplicas' sum, part by part.
  std::string reduceScatterReplicas(const std::vector<ReplicaShards> &buffers, cudaStream_t stream) override {
    const size_t self = size_t(post_->membership(GroupAxis::Replicas, rank_).member);
    std::vector<Part> parts;
    for (const ReplicaShards &b : buffers) {
      if (b.dtype != Dtype::F32)
        return "the gradient reduce-scatter sums fp32 buffers only";
      const auto [begin, end] = self < b.shards.size() ? b.shards[self] : std::pair<int64_t, int64_t>{0, 0};
      parts.push_back({b.data, b.at(begin), begin, end - begin});
    }
    return combine(GroupAxis::Replicas, parts, Dtype::F32, false, stream, "the gradient reduce-scatter");
  }

  /// Each member copies the others' parts out of their buffers (behind
  /// their events) into its own, whose part it alone writes; as in
  /// allReduceReplicas, none writes its buffers again before every member
  /// has read them.
  std::string allGatherReplicas(const std::vector<ReplicaShards> &buffers, cudaStream_t stream) override {
    std::vector<std::pair<float *, int64_t>> posted;
    for (const ReplicaShards &b : buffers)
      posted.push_back({static_cast<float *>(b.data), b.shards.empty() ? 0 : b.shards.back().second});
    std::vector<SharedGpuPost::Contribution> all;
    std::string why;
    if (!meet(GroupAxis::Replicas, posted, stream, all, why))
      return why;
    const size_t self = size_t(post_->membership(GroupAxis::Replicas, rank_).member);
    for (size_t k = 0; k < buffers.size(); ++k)
      for (size_t m = 0; m < buffers[k].shards.size() && m < all.size(); ++m) {
        const auto [begin, end] = buffers[k].shards[m];
        const int64_t bytes = dtypeBytes(buffers[k].dtype);
        if (m != self && end > begin)
          cudaMemcpyAsync(buffers[k].at(begin), reinterpret_cast<const char *>(all[m].buffers[k].first) + begin * bytes,
                          (end - begin) * bytes, cudaMemcpyDefault, stream);
      }
    return finish(GroupAxis::Replicas, stream, "the weights' all-gather");
  }

  /// Each tensor rank combines every rank's buffer in tensor-rank order (combine).
  std::string allReduceTensor(void *data, int64_t count, Dtype dtype, bool max, cudaStream_t stream) override {
    return combine(GroupAxis::Tensor, {{data, data, 0, count}}, dtype, max, stream, "a tensor-parallel all-reduce");
  }

  /// Each tensor rank copies every rank's part into place.
  std::string allGatherTensor(const void *local, void *all, int64_t count, Dtype dtype,
                              cudaStream_t stream) override {
    return gather(GroupAxis::Tensor, local, all, count, dtype, stream, "a tensor-parallel all-gather");
  }

  /// Each context rank copies every rank's part into place.
  std::string allGatherContext(const void *local, void *all, int64_t count, Dtype dtype,
                               cudaStream_t stream) override {
    return gather(GroupAxis::Context, local, all, count, dtype, stream, "a context-parallel all-gather");
  }

  /// Each tensor rank adds its part of every rank's buffer, as allReduceTensor.
  std::string reduceScatterTensor(const void *all, void *local, int64_t count, Dtype dtype,
                                  cudaStream_t stream) override {
    const int64_t self = post_->membership(GroupAxis::Tensor, rank_).member;
    return combine(GroupAxis::Tensor, {{all, local, self * count, count}}, dtype, false, stream,
                   "a tensor-parallel reduce-scatter");
  }

  void abort() override { post_->abort(); }

private:
  /// Each member of `axis`'s group copies every member's `count` elements
  /// into `all`, in member order.
  std::string gather(GroupAxis axis, const void *local, void *all, int64_t count, Dtype dtype, cudaStream_t stream,
                     const std::string &operation) {
    std::vector<SharedGpuPost::Contribution> posted;
    std::string why;
    if (!meet(axis, {{static_cast<float *>(const_cast<void *>(local)), count}}, stream, posted, why))
      return why;
    const int64_t bytes = count * dtypeBytes(dtype);
    for (size_t t = 0; t < posted.size(); ++t)
      cudaMemcpyAsync(static_cast<char *>(all) + t * bytes, posted[t].buffers[0].first, bytes, cudaMemcpyDefault,
                      stream);
    return finish(axis, stream, operation);
  }

  /// One buffer of a group combine: elements [offset, offset + count) of
  /// every member's `source` (posted whole), combined into `target`.
  struct Part {
    const void *source;
    void *target;
    int64_t offset, count;
  };
  /// Each member combines every member's part in member order in fp32
  /// scratch of its own (bf16 widened; the first member's copied, the
  /// others added, or maximized, in turn), reading the others' buffers
  /// behind their events (copied here first: they may be on another GPU,
  /// which a kernel could not read without peer access); waits until every
  /// member has read its buffers; then writes each result over its target
  /// (rounded once for bf16), which may be its source.
  std::string combine(GroupAxis axis, const std::vector<Part> &parts, Dtype dtype, bool max, cudaStream_t stream,
                      const std::string &operation) {
    std::vector<std::pair<float *, int64_t>> posted;
    for (const Part &part : parts)
      posted.push_back({static_cast<float *>(const_cast<void *>(part.source)), part.offset + part.count});
    std::vector<SharedGpuPost::Contribution> all;
    std::string why;
    if (!meet(axis, posted, stream, all, why))
      return why;
    const int64_t elementBytes = dtypeBytes(dtype);
    std::vector<float *> results(parts.size(), nullptr);
    for (size_t k = 0; k < parts.size(); ++k) {
      const int64_t count = parts[k].count, bytes = count * elementBytes;
      const int64_t floats = std::max<int64_t>(count, 1) * int64_t(sizeof(float));
      float *widened = nullptr;
      void *term = nullptr;
      if (cudaMallocAsync(&results[k], floats, stream) != cudaSuccess ||
          cudaMallocAsync(&term, std::max<int64_t>(bytes, 4), stream) != cudaSuccess ||
          (dtype == Dtype::BF16 && cudaMallocAsync(&widened, floats, stream) != cudaSuccess))
        return "out of GPU memory for " + operation + " (" + what(cudaGetLastError()) + ")";
      for (size_t m = 0; m < all.size(); ++m) {
        const char *from = reinterpret_cast<const char *>(all[m].buffers[k].first) + parts[k].offset * elementBytes;
        cudaMemcpyAsync(term, from, bytes, cudaMemcpyDefault, stream);
        const float *value = static_cast<const float *>(term);
        if (dtype == Dtype::BF16) {
          toFloat(static_cast<const bf16 *>(term), widened, count, stream);
          value = widened;
        }
        if (m == 0)
          cudaMemcpyAsync(results[k], value, count * sizeof(float), cudaMemcpyDeviceToDevice, stream);
        else if (max)
          maxInto(results[k], value, count, stream);
        else
          addInto(results[k], value, count, stream);
      }
      cudaFreeAsync(term, stream);
      if (widened)
        cudaFreeAsync(widened, stream);
    }
    if (std::string problem = finish(axis, stream, operation); !problem.empty())
      return problem;
    for (size_t k = 0; k < parts.size(); ++k) {
      if (dtype == Dtype::BF16)
        toBf16(results[k], static_cast<bf16 *>(parts[k].target), parts[k].count, stream);
      else
        cudaMemcpyAsync(parts[k].target, results[k], parts[k].count * sizeof(float), cudaMemcpyDeviceToDevice, stream);
      cudaFreeAsync(results[k], stream);
    }
    if (cudaError_t status = cudaGetLastError(); status != cudaSuccess)
      return operation + ": " + what(status);
    return "";
  }

  /// A group's first rendezvous: `stream`'s work so far is what the
  /// others read; their buffers come back in `all` and `stream` waits for them.
  bool meet(GroupAxis axis, const std::vector<std::pair<float *, int64_t>> &buffers, cudaStream_t stream,
            std::vector<SharedGpuPost::Contribution> &all, std::string &why) {
    for (cudaEvent_t *event : {&ready_, &done_})
      if (!*event && cudaEventCreateWithFlags(event, cudaEventDisableTiming) != cudaSuccess) {
        why = "creating the group collectives' events";
        return false;
      }
    cudaEventRecord(ready_, stream);
    if (!post_->meetGroup(axis, rank_, {buffers, ready_}, all, waiting_, why))
      return false;
    for (const SharedGpuPost::Contribution &c : all)
      if (c.ready != ready_)
        cudaStreamWaitEvent(stream, c.ready, 0);
    return true;
  }
  /// The second: every replica's reads queued; `stream` waits for them.
  std::string finish(GroupAxis axis, cudaStream_t stream, const std::string &operation) {
    cudaEventRecord(done_, stream);
    std::string why;
    if (!post_->groupDone(axis, rank_, done_, stream, waiting_, why))
      return why;
    if (cudaError_t status = cudaGetLastError(); status != cudaSuccess)
      return operation + ": " + what(status);
    return "";
  }

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
  cudaEvent_t ready_ = nullptr, done_ = nullptr; // the group collectives' (SharedGpuPost::Group)
};

} // namespace

std::unique_ptr<RankLinks> sharedGpuLinks(std::shared_ptr<SharedGpuPost> post, int64_t rank, double timeoutSeconds,
                                          const std::atomic<bool> *peerFailed) {
  return std::make_unique<SharedGpuLinks>(std::move(post), rank, timeoutSeconds, peerFailed);
}

std::shared_ptr<SharedGpuPost> makeSharedGpuPost(const Artifact &artifact) {
  return std::make_shared<SharedGpuPost>(artifact);
}

} // namespace mhcc::runtime::cuda
