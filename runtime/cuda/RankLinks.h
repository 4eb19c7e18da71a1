//===- RankLinks.h - how a GPU rank's messages travel (internal) ---*- C++ -*-===//
//
// The CUDA backend's communication below CudaRank: point-to-point messages
// in groups (pipeline boundaries, gradients to their owners, updated weights
// back), one all-reduce of the step's statistics, and the collectives of the
// data- and tensor-parallel groups. Two transports:
//
// - NCCL (CudaComms.cpp): one communicator per directed rank pair and one
//   for the world, one GPU per rank (NCCL refuses two ranks on one GPU).
// - Shared-GPU links (SharedGpuLinks.cpp): ranks of this process that may
//   share a GPU (mhcrun --ranks-per-gpu N): a send stages a device copy of
//   its data and posts it to an in-process mailbox; the receive's stream
//   waits for that copy and copies it into place. Copies are exact, so a
//   layout's bits are those of the same kernels over NCCL: the pipeline
//   layouts compare on one GPU, but NCCL itself is not exercised.
//
// Semantics both keep: messages between two ranks match in order; a group's
// sends are posted before any of its receives is waited on (so a group may
// hold a rank's send and receive to one peer); a send's data is read after
// the work queued on its stream, and the received data is ready after the
// work queued on the receive's stream.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CUDA_RANKLINKS_H
#define MHCC_RUNTIME_CUDA_RANKLINKS_H

#include "runtime/artifact/Artifact.h"
#include "runtime/program/Dtype.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace mhcc::runtime::cuda {

class RankLinks {
public:
  virtual ~RankLinks() = default;
  virtual void groupStart() = 0;
  virtual void send(const void *data, int64_t count, Dtype dtype, int64_t peer, cudaStream_t stream) = 0;
  virtual void recv(void *data, int64_t count, Dtype dtype, int64_t peer, cudaStream_t stream) = 0;
  /// Issues the group: "" or what failed.
  virtual std::string groupEnd() = 0;
  /// Sums `count` doubles at `data` (device) over every rank, in place,
  /// ordered after the work queued on `stream`: "" or what failed.
  virtual std::string allReduceSum(double *data, int64_t count, cudaStream_t stream) = 0;
  /// Sums each buffer over this rank's gradient group (the replicas of its
  /// pipeline and tensor rank and their context ranks, dp x cp members),
  /// in place, ordered after the work queued on `stream` and before the
  /// work queued on it later. Shared-GPU links add the members in member
  /// order (replica x cp + context rank); NCCL in its own order, which at
  /// two members is the same sum (a + b = b + a) and at more may differ
  /// from it in the last bits (a multi-GPU dp x cp > 2 run is then not the
  /// bits of the same mesh on one GPU or the CPU).
  virtual std::string allReduceReplicas(const std::vector<std::pair<float *, int64_t>> &buffers,
                                        cudaStream_t stream) = 0;
  /// A buffer every member of the gradient group holds, member m's part of
  /// it [shards[m].first, shards[m].second) (the distributed optimizer's
  /// parts, Artifact::shardOf).
  struct ReplicaShards {
    void *data = nullptr;
    Dtype dtype = Dtype::F32; // reduceScatterReplicas: F32 only
    std::vector<std::pair<int64_t, int64_t>> shards;
    char *at(int64_t element) const { return static_cast<char *>(data) + element * dtypeBytes(dtype); }
  };
  /// The distributed optimizer's reduce-scatter: each member's part of
  /// each buffer summed over the group into that part, in place (the rest
  /// of its buffer left as it was), ordered as allReduceReplicas.
  /// Shared-GPU links add as allReduceReplicas does (the same bits in the
  /// part); NCCL reduces each part to its member in its own order, the same
  /// sum at two members, at more possibly not allReduceReplicas' bits.
  virtual std::string reduceScatterReplicas(const std::vector<ReplicaShards> &buffers, cudaStream_t stream) = 0;
  /// Gives every member the other members' parts of each buffer, in place,
  /// ordered as allReduceReplicas: part m from member m.
  virtual std::string allGatherReplicas(const std::vector<ReplicaShards> &buffers, cudaStream_t stream) = 0;
  /// Tensor parallelism: `count` elements of `dtype` at `data` summed
  /// (with `max`: their maximum) over this rank's tensor-parallel group, in
  /// place, ordered on `stream` as allReduceReplicas. Shared-GPU links
  /// combine the ranks in tensor-rank order (bf16 in fp32, rounded once);
  /// NCCL in its own order, the same result at tp = 2.
  virtual std::string allReduceTensor(void *data, int64_t count, Dtype dtype, bool max, cudaStream_t stream) = 0;
  /// Sequence parallelism: every tensor rank's `count` elements at `local`
  /// into `all` (tp x count, in tensor-rank order), ordered as above.
  virtual std::string allGatherTensor(const void *local, void *all, int64_t count, Dtype dtype,
                                      cudaStream_t stream) = 0;
  /// Sequence parallelism: this rank's part (the t-th `count` elements) of
  /// the group's sum of `all` (tp x count) into `local`; shared-GPU links
  /// add in tensor-rank order (bf16 in fp32, rounded once), as above.
  virtual std::string reduceScatterTensor(const void *all, void *local, int64_t count, Dtype dtype,
                                          cudaStream_t stream) = 0;
  /// Context parallelism: every context rank's `count` elements at `local`
  /// into `all` (cp x count, in context-rank order), ordered as above.
  virtual std::string allGatherContext(const void *local, void *all, int64_t count, Dtype dtype,
                                       cudaStream_t stream) = 0;
  /// Stops every wait of this rank's links (a failed run).
  virtual void abort() = 0;
};

/// The mailboxes of one process's ranks that share GPUs; one per run, held
/// by every rank's links.
class SharedGpuPost;

/// Links of global rank `rank` through `post`, which its peers in this
/// process hold too. A receive or an all-reduce waits for a peer's host
/// thread at most `timeoutSeconds` (--recv-timeout) and stops once
/// `peerFailed` is set.
std::unique_ptr<RankLinks> sharedGpuLinks(std::shared_ptr<SharedGpuPost> post, int64_t rank,
                                          double timeoutSeconds, const std::atomic<bool> *peerFailed);
/// The mailboxes for the ranks of `artifact`'s mesh (Artifact::globalRank).
std::shared_ptr<SharedGpuPost> makeSharedGpuPost(const Artifact &artifact);

} // namespace mhcc::runtime::cuda

#endif // MHCC_RUNTIME_CUDA_RANKLINKS_H
