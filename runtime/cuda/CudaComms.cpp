//===- CudaComms.cpp - NCCL communicators, messages, and the factories ------===//
#include "runtime/cuda/CudaRank.h"
#include "runtime/cuda/Gpus.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

namespace mhcc::runtime {

void prepareCudaEnvironment() {
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1", /*overwrite=*/0);
  // Not GROUP: it makes ncclGroupEnd a host barrier between the ranks of one
  // process on each communicator, so in-process ranks whose groups are not
  // mirror images (ZB-H1: a lone gradient send on one rank, a send and a
  // receive together on the other) wait on each other forever (seen on
  // H200s, 2026-11-30). PARALLEL is NCCL's default; launches never block.
  setenv("NCCL_LAUNCH_MODE", "PARALLEL", /*overwrite=*/0);
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
}

namespace cuda {

std::string CommIds::serialize() const {
  std::string bytes(reinterpret_cast<const char *>(&world), sizeof world);
  for (const std::vector<ncclUniqueId> *list : {&pairs, &groups})
    for (const ncclUniqueId &id : *list)
      bytes.append(reinterpret_cast<const char *>(&id), sizeof id);
  return bytes;
}

bool CommIds::parse(const std::string &bytes, size_t pairCount, size_t groupCount, CommIds &ids) {
  if (bytes.size() != (pairCount + groupCount + 1) * sizeof(ncclUniqueId))
    return false;
  std::memcpy(&ids.world, bytes.data(), sizeof ids.world);
  ids.pairs.resize(pairCount);
  ids.groups.resize(groupCount);
  size_t at = sizeof(ncclUniqueId);
  for (std::vector<ncclUniqueId> *list : {&ids.pairs, &ids.groups})
    for (ncclUniqueId &id : *list) {
      std::memcpy(&id, bytes.data() + at, sizeof id);
      at += sizeof id;
    }
  return true;
}

std::string CommIds::make(size_t pairCount, size_t groupCount, CommIds &ids) {
  ncclResult_t status = ncclGetUniqueId(&ids.world);
  ids.pairs.resize(pairCount);
  ids.groups.resize(groupCount);
  for (std::vector<ncclUniqueId> *list : {&ids.pairs, &ids.groups})
    for (ncclUniqueId &id : *list)
      if (status == ncclSuccess)
        status = ncclGetUniqueId(&id);
  return status == ncclSuccess ? "" : std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(status);
}

namespace {

ncclDataType_t ncclType(Dtype dtype) { return dtype == Dtype::BF16 ? ncclBfloat16 : ncclFloat; }

/// "" for success, else `operation` (ending in ": ") and NCCL's message.
std::string outcome(ncclResult_t status, const char *operation) {
  return status == ncclSuccess ? "" : std::string(operation) + ncclGetErrorString(status);
}

/// RankLinks over NCCL: the world's communicator and one per directed pair
/// this rank is in.
class NcclLinks final : public RankLinks {
public:
  ~NcclLinks() override {
    for (ncclComm_t comm : comms_)
      ncclCommDestroy(comm);
  }

  /// The world, then (dp x cp > 1) the rank's gradient group (its
  /// replicas and their context ranks), then (tp > 1) its tensor-parallel
  /// group, then (cp > 1) its context-parallel group, then the pairs. Every rank joins in this
  /// order and the pairs in the same global order, so the blocking joins
  /// cannot wait on each other in a cycle.
  std::string join(const CommIds &ids, const std::vector<Pair> &pairs, int64_t rank, const Artifact &a) {
    ncclResult_t status = ncclCommInitRank(&world_, int(a.worldSize()), ids.world, int(rank));
    if (status != ncclSuccess)
      return std::string("ncclCommInitRank (world of ") + std::to_string(a.worldSize()) +
             "): " + ncclGetErrorString(status);
    comms_.push_back(world_);
    if (a.reduceGroupSize() > 1) {
      status = ncclCommInitRank(&replicas_, int(a.reduceGroupSize()), ids.groups[replicaGroupOf(a, rank)],
                                int(a.reduceMemberOf(rank)));
      if (status != ncclSuccess)
        return "ncclCommInitRank (the replicas of rank " + std::to_string(rank) + "): " + ncclGetErrorString(status);
      comms_.push_back(replicas_);
    }
    if (a.tp > 1) {
      status = ncclCommInitRank(&tensor_, int(a.tp), ids.groups[tensorGroupOf(a, rank)], int(a.tensorRankOf(rank)));
      if (status != ncclSuccess)
        return "ncclCommInitRank (the tensor-parallel group of rank " + std::to_string(rank) +
               "): " + ncclGetErrorString(status);
      comms_.push_back(tensor_);
    }
    if (a.cp > 1) {
      status = ncclCommInitRank(&context_, int(a.cp), ids.groups[contextGroupOf(a, rank)], int(a.contextRankOf(rank)));
      if (status != ncclSuccess)
        return "ncclCommInitRank (the context-parallel group of rank " + std::to_string(rank) +
               "): " + ncclGetErrorString(status);
      comms_.push_back(context_);
    }
    for (size_t k = 0; k < pairs.size(); ++k) {
      auto [from, to] = pairs[k];
      if (from != rank && to != rank)
        continue;
      ncclComm_t comm;
      status = ncclCommInitRank(&comm, 2, ids.pairs[k], from == rank ? 0 : 1);
      if (status != ncclSuccess)
        return "ncclCommInitRank (ranks " + std::to_string(from) + " -> " + std::to_string(to) +
               "): " + ncclGetErrorString(status);
      comms_.push_back(comm);
      (from == rank ? sendComm_[to] : recvComm_[from]) = comm;
    }
    return "";
  }

  void groupStart() override { ncclGroupStart(); }
  void send(const void *data, int64_t count, Dtype dtype, int64_t peer, cudaStream_t stream) override {
    ncclSend(data, count, ncclType(dtype), 1, sendComm_.at(peer), stream);
  }
  void recv(void *data, int64_t count, Dtype dtype, int64_t peer, cudaStream_t stream) override {
    ncclRecv(data, count, ncclType(dtype), 0, recvComm_.at(peer), stream);
  }
  std::string groupEnd() override {
    return outcome(ncclGroupEnd(), "NCCL group: ");
  }
  std::string allReduceSum(double *data, int64_t count, cudaStream_t stream) override {
    return outcome(ncclAllReduce(data, data, count, ncclDouble, ncclSum, world_, stream), "ncclAllReduce: ");
  }
  std::string allReduceReplicas(const std::vector<std::pair<float *, int64_t>> &buffers,
                                cudaStream_t stream) override {
    ncclGroupStart();
    for (const auto &[data, count] : buffers)
      ncclAllReduce(data, data, count, ncclFloat, ncclSum, replicas_, stream);
    return outcome(ncclGroupEnd(), "ncclAllReduce over the replicas: ");
  }
  /// A reduce of each part to its member (parts differ in size, which
  /// ncclReduceScatter does not allow).
  std::string reduceScatterReplicas(const std::vector<ReplicaShards> &buffers, cudaStream_t stream) override {
    ncclGroupStart();
    for (const ReplicaShards &b : buffers)
      for (size_t m = 0; m < b.shards.size(); ++m) {
        const auto [begin, end] = b.shards[m];
        if (end > begin)
          ncclReduce(b.at(begin), b.at(begin), end - begin, ncclType(b.dtype), ncclSum, int(m), replicas_, stream);
      }
    return outcome(ncclGroupEnd(), "ncclReduce of the gradients' parts: ");
  }
  /// A broadcast of each part from its member (as above, not an all-gather).
  std::string allGatherReplicas(const std::vector<ReplicaShards> &buffers, cudaStream_t stream) override {
    ncclGroupStart();
    for (const ReplicaShards &b : buffers)
      for (size_t m = 0; m < b.shards.size(); ++m) {
        const auto [begin, end] = b.shards[m];
        if (end > begin)
          ncclBroadcast(b.at(begin), b.at(begin), end - begin, ncclType(b.dtype), int(m), replicas_, stream);
      }
    return outcome(ncclGroupEnd(), "ncclBroadcast over the replicas: ");
  }
  std::string allReduceTensor(void *data, int64_t count, Dtype dtype, bool max, cudaStream_t stream) override {
    return outcome(ncclAllReduce(data, data, count, ncclType(dtype), max ? ncclMax : ncclSum, tensor_, stream),
                   "ncclAllReduce over the tensor-parallel group: ");
  }
  std::string allGatherTensor(const void *local, void *all, int64_t count, Dtype dtype,
                              cudaStream_t stream) override {
    return outcome(ncclAllGather(local, all, count, ncclType(dtype), tensor_, stream),
                   "ncclAllGather over the tensor-parallel group: ");
  }
  std::string reduceScatterTensor(const void *all, void *local, int64_t count, Dtype dtype,
                                  cudaStream_t stream) override {
    return outcome(ncclReduceScatter(all, local, count, ncclType(dtype), ncclSum, tensor_, stream),
                   "ncclReduceScatter over the tensor-parallel group: ");
  }
  std::string allGatherContext(const void *local, void *all, int64_t count, Dtype dtype,
                               cudaStream_t stream) override {
    return outcome(ncclAllGather(local, all, count, ncclType(dtype), context_, stream),
                   "ncclAllGather over the context-parallel group: ");
  }
  void abort() override {
    for (ncclComm_t comm : comms_)
      ncclCommAbort(comm);
    comms_.clear();
  }

private:
  ncclComm_t world_ = nullptr, replicas_ = nullptr, tensor_ = nullptr, context_ = nullptr;
  std::vector<ncclComm_t> comms_;
  std::map<int64_t, ncclComm_t> sendComm_, recvComm_; // by peer
};

} // namespace

void CudaRank::createPairStreams() {
  // Keyed by the peer's pipeline rank, as the schedules name it.
  for (auto [from, to] : pairs_) {
    if (from != rank_ && to != rank_)
      continue;
    cudaStream_t stream;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    (from == rank_ ? sendStream_[a_.pipelineRankOf(to)] : recvStream_[a_.pipelineRankOf(from)]) = stream;
  }
  if (a_.reduceGroupSize() > 1)
    cudaStreamCreateWithFlags(&replicaStream_, cudaStreamNonBlocking);
}

bool CudaRank::setupComms(const CommIds &ids) {
  cudaSetDevice(gpu_);
  auto links = std::make_unique<NcclLinks>();
  std::string problem = links->join(ids, pairs_, rank_, a_);
  links_ = std::move(links);
  if (!problem.empty())
    return fail(problem);
  createPairStreams();
  return connectPairs();
}

bool CudaRank::setupSharedLinks(std::shared_ptr<SharedGpuPost> post) {
  cudaSetDevice(gpu_);
  links_ = sharedGpuLinks(std::move(post), rank_, options_.recvTimeoutSeconds, peerFailed_);
  createPairStreams();
  return connectPairs();
}

/// Each pair connected with one message, so that no lazy connection
/// blocks a step.
bool CudaRank::connectPairs() {
  float *probe = nullptr;
  cudaMalloc(&probe, 2 * sizeof(float));
  links_->groupStart();
  for (auto &[peer, stream] : sendStream_)
    links_->send(probe, 1, Dtype::F32, globalPeer(peer), stream);
  for (auto &[peer, stream] : recvStream_)
    links_->recv(probe + 1, 1, Dtype::F32, globalPeer(peer), stream);
  std::string problem = links_->groupEnd();
  // Start-up, not a step: the ranks join at their own pace.
  bool connected = problem.empty() &&
                   waitStreams(allStreams(), "the connection probes", std::max(120.0, options_.recvTimeoutSeconds));
  cudaFree(probe);
  if (!problem.empty())
    return fail("connecting the pairs: " + problem);
  return connected && check("communication setup");
}

bool CudaRank::exchange(std::vector<Transfer> &group) {
  if (!exchanged_) { // a rank lost or stuck mid-step, for the fault tests
    exchanged_ = true;
    faults_.atExchange(stepsRun_);
  }
  // Progress marks: the compute issued so far, then each message's stream
  // (waitStreams counts each that completes as progress).
  markProgress(compute_);
  // Sends follow the compute that produced their data.
  for (const Transfer &t : group)
    if (t.instr->kind == OpKind::Send)
      follow(sendStream_.at(t.instr->peer), compute_);
  // --trace: each message's stream starts its slice after that wait.
  for (const Transfer &t : group)
    timeline_.work(t.instr->kind == OpKind::Send ? sendStream_.at(t.instr->peer) : recvStream_.at(t.instr->peer));
  links_->groupStart();
  for (Transfer &t : group) {
    const Instr &i = *t.instr;
    const int64_t count = i.tokens * i.width;
    const Dtype dtype = messageDtype(a_, i); // bf16 models send half the bytes
    if (i.kind == OpKind::Send) {
      links_->send(t.buffer.data, count, dtype, globalPeer(i.peer), sendStream_.at(i.peer));
    } else {
      t.buffer = allocate(count, dtype, Queue::recvFrom(i.peer), false);
      if (!t.buffer) {
        links_->groupEnd();
        return false;
      }
      links_->recv(t.buffer.data, count, dtype, globalPeer(i.peer), recvStream_.at(i.peer));
    }
  }
  if (std::string problem = links_->groupEnd(); !problem.empty())
    return fail(problem);
  std::set<cudaStream_t> marked;
  for (const Transfer &t : group) {
    cudaStream_t st = stream(t.instr->kind == OpKind::Send ? Queue::sendTo(t.instr->peer) : Queue::recvFrom(t.instr->peer));
    if (marked.insert(st).second)
      markProgress(st);
  }
  for (Transfer &t : group)
    if (t.instr->kind == OpKind::Recv) {
      cudaEvent_t ready;
      cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
      cudaEventRecord(ready, recvStream_.at(t.instr->peer));
      t.ready = ready;
    }
  return check("communication");
}

void CudaRank::waitFor(Transfer &arrival) {
  if (!arrival.ready)
    return;
  cudaStreamWaitEvent(compute_, static_cast<cudaEvent_t>(arrival.ready), 0);
  cudaEventDestroy(static_cast<cudaEvent_t>(arrival.ready));
  arrival.ready = nullptr;
}

} // namespace cuda

DeviceFactory cudaDevices(int ranksPerGpu) {
  return [ranksPerGpu](const Artifact &a, const TrainOptions &options, std::atomic<bool> &failed, std::string &error) {
    std::vector<std::unique_ptr<Device>> devices;
    const int64_t perGpu = std::max(ranksPerGpu, 1);
    error = missingGpus(queryGpus(), a.worldSize(), perGpu, a.worldSize() > a.pp ? a.meshDescription() : "");
    if (!error.empty())
      return devices;
    std::vector<cuda::CudaRank *> ranks;
    for (int64_t r = 0; r < a.worldSize(); ++r) {
      auto rank = std::make_unique<cuda::CudaRank>(a, options, r, static_cast<int>(r / perGpu), &failed);
      ranks.push_back(rank.get());
      devices.push_back(std::move(rank));
    }
    auto failAll = [&](const std::string &message) {
      error = message;
      for (auto &device : devices)
        device->abort();
      devices.clear();
      return std::move(devices);
    };
    for (cuda::CudaRank *rank : ranks)
      if (!rank->setupDevice())
        return failAll("rank " + std::to_string(rank->rank()) + " setup: " + rank->error());
    cuda::CommIds ids;
    std::shared_ptr<cuda::SharedGpuPost> post;
    if (perGpu > 1)
      post = cuda::makeSharedGpuPost(a);
    else if (std::string problem = cuda::CommIds::make(ranks[0]->communicating().size(), cuda::groupCount(a), ids);
             !problem.empty())
      return failAll(problem);
    // The joins (and the connection probes) block until every rank joined: one thread each.
    std::vector<std::thread> threads;
    std::vector<char> ok(ranks.size(), 0);
    for (size_t k = 0; k < ranks.size(); ++k)
      threads.emplace_back([&, k] {
        if (!(ok[k] = post ? ranks[k]->setupSharedLinks(post) : ranks[k]->setupComms(ids)))
          failed = true;
      });
    for (std::thread &t : threads)
      t.join();
    for (size_t k = 0; k < ranks.size(); ++k)
      if (!ok[k])
        return failAll("rank " + std::to_string(k) + (post ? " links: " : " NCCL setup: ") + ranks[k]->error());
    return devices;
  };
}

DeviceFactory cudaRankDevice(const ProcessPlacement &placement, Bootstrap &bootstrap) {
  return [&placement, &bootstrap](const Artifact &a, const TrainOptions &options, std::atomic<bool> &,
                                  std::string &error) {
    std::vector<std::unique_ptr<Device>> devices;
    const std::string who = "rank " + std::to_string(placement.rank) + ": ";
    if (placement.size != a.worldSize()) {
      error = who + placement.launcher + " started " + std::to_string(placement.size) +
              " processes, but the artifact has " + a.meshDescription() + " ranks; start exactly one process per rank";
      return devices;
    }
    GpuInventory gpus = queryGpus();
    if (gpus.gpus.empty()) {
      error = who + "no GPU is visible (" + gpus.unavailableReason + ")";
      return devices;
    }
    const int gpu = deviceForRank(placement, static_cast<int>(gpus.gpus.size()), error);
    if (gpu < 0)
      return devices;
    auto rank = std::make_unique<cuda::CudaRank>(a, options, placement.rank, gpu, nullptr);
    if (!rank->setupDevice()) {
      error = who + "setup: " + rank->error();
      return devices;
    }
    std::string bytes;
    cuda::CommIds ids;
    if (placement.rank == 0) {
      if (std::string problem = cuda::CommIds::make(rank->communicating().size(), cuda::groupCount(a), ids);
          !problem.empty()) {
        error = who + problem;
        return devices;
      }
      bytes = ids.serialize();
    }
    if (!bootstrap.broadcast(bytes, error)) {
      error = who + error;
      return devices;
    }
    if (!cuda::CommIds::parse(bytes, rank->communicating().size(), cuda::groupCount(a), ids)) {
      error = who + "the NCCL ids from rank 0 do not fit this artifact (was every rank given the same artifact?)";
      return devices;
    }
    if (!rank->setupComms(ids)) {
      error = who + "NCCL setup: " + rank->error();
      rank->abort();
      return devices;
    }
    devices.push_back(std::move(rank));
    return devices;
  };
}

} // namespace mhcc::runtime
