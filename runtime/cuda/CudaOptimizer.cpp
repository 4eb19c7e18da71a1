//===- CudaOptimizer.cpp - the optimizer step on the GPUs -------------------===//
//
// The math of runtime/train/Optimizer.cpp, distributed: each parameter's
// gradient is reduced on its owner in use order, squares and zeros and the
// losses are shared by one all-reduce (each entry non-zero on one rank only,
// so the sum is exact), the owner updates the weights and sends them to the
// other holders. The all-reduce also carries each rank's stop signal, so
// every rank stops after the same iteration.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/CudaRank.h"
#include "runtime/cuda/DeviceKernels.h"
#include "runtime/dist/StopSignal.h"
#include "runtime/train/Optimizer.h"

#include <algorithm>
#include <cmath>

namespace mhcc::runtime::cuda {

/// Gradients of uses on other ranks travel to the owner, which adds them up
/// in use order; `gradient[p]` is the reduced gradient of an owned
/// parameter's part this rank updates (ownShard: all of it without the
/// distributed optimizer, whose REDUCESCATTERs left the group's sum in that
/// part alone), at that part's first element.
bool CudaRank::reduceGradients(std::vector<float *> &gradient, std::map<std::pair<size_t, size_t>, Buffer> &remote) {
  const size_t P = a_.params.size();
  auto useGradient = [&](const ParamUse &use) { return slotGrads_[{use.stage, use.slot}]; };
  if (replicaStream_) // the data-parallel ALLREDUCEs summed the slots over the replicas
    follow(compute_, replicaStream_);
  for (auto &[peer, stream] : sendStream_)
    follow(stream, compute_);
  links_->groupStart();
  for (size_t p = 0; p < P; ++p) {
    const ParamPlan &plan = plans_[p];
    const auto [begin, end] = ownShard(p);
    for (size_t u = 0; u < plan.uses.size() && end > begin; ++u) {
      const ParamUse &use = plan.uses[u];
      if (use.rank == plan.owner)
        continue;
      if (use.rank == pipe_) {
        links_->send(useGradient(use) + begin, end - begin, Dtype::F32, globalPeer(plan.owner),
                     sendStream_[plan.owner]);
      } else if (plan.owner == pipe_) {
        Buffer t = allocate(end - begin, Dtype::F32, Queue::recvFrom(use.rank), false);
        if (!t) {
          links_->groupEnd();
          return false;
        }
        links_->recv(t.data, end - begin, Dtype::F32, globalPeer(use.rank), recvStream_[use.rank]);
        remote[{p, u}] = t;
      }
    }
  }
  if (std::string problem = links_->groupEnd(); !problem.empty())
    return fail("sending gradients to their owners: " + problem);
  for (auto &[peer, stream] : recvStream_)
    follow(compute_, stream);
  cudaMemsetAsync(stats_, 0, 2 * statChunks() * sizeof(double), compute_);
  gradient.assign(P, nullptr);
  std::vector<StatsTensor> tensors;
  for (size_t p = 0; p < P; ++p) {
    const ParamPlan &plan = plans_[p];
    if (plan.owner != pipe_ || plan.uses.empty())
      continue;
    const auto [begin, end] = ownShard(p);
    const int64_t count = end - begin;
    if (count == 0) // a part too small for a chunk of this parameter: none on this member
      continue;
    auto useData = [&](size_t u) {
      return plan.uses[u].rank == pipe_ ? useGradient(plan.uses[u]) + begin : remote[{p, u}].data;
    };
    if (plan.uses.size() == 1) {
      gradient[p] = useData(0);
    } else {
      gradient[p] = reduced_[int(p)]; // the part's sum
      cudaMemcpyAsync(gradient[p], useData(0), count * 4, cudaMemcpyDeviceToDevice, compute_);
      for (size_t u = 1; u < plan.uses.size(); ++u)
        addInto(gradient[p], useData(u), count, compute_);
    }
    // Sequence parallelism: a replicated parameter's gradient on a tensor
    // rank covers that rank's rows; a "partial" one's (Gated DeltaNet's
    // out_norm) the rank's heads: the group's sum is the gradient.
    if ((a_.sequenceParallel && a_.params[p].tpSplit.empty()) || (a_.tp > 1 && isPartial(a_.params[p])))
      if (std::string problem = links_->allReduceTensor(gradient[p], count, Dtype::F32, false, compute_);
          !problem.empty())
        return fail("summing a replicated gradient over the tensor-parallel group: " + problem);
    const int64_t chunk = Artifact::gradientChunk(held(p));
    tensors.push_back({gradient[p], count, chunk, firstChunk_[p] + begin / chunk});
  }
  // Every owned part's chunk statistics in one launch (the upload is staged
  // from pageable memory before cudaMemcpyAsync returns).
  cudaMemcpyAsync(statTensors_, tensors.data(), tensors.size() * sizeof(StatsTensor), cudaMemcpyHostToDevice,
                  compute_);
  squaresAndZeros(statTensors_, int64_t(tensors.size()), stats_, compute_);
  return check("gradient reduction");
}

/// One all-reduce: [squares, zeros] per statistics chunk of each parameter
/// and tensor rank (each chunk's from the one member of the gradient group
/// that reduced it: member 0 without the distributed optimizer, the part's
/// member with it; of a replicated parameter tensor rank 0's, see
/// speaksFor), the global batch's losses in its order (tensor rank 0's;
/// each context rank's share apart, added in context-rank order here), peak
/// and reserved bytes and the stop signal seen (SIGTERM / SIGINT, 0: none)
/// per rank; fills `result` from it, with the largest signal as the one
/// every rank acts on. Each parameter's chunks are added in order, so its
/// sum is the same whichever members computed them.
bool CudaRank::shareStatistics(const std::vector<std::vector<double>> &losses, StepResult &result) {
  const size_t P = a_.params.size(), L = a_.stages.back().losses.size(), world = a_.worldSize();
  const size_t globalMicrobatches = a_.dp * a_.microbatches, chunks = size_t(statChunks());
  const size_t cp = a_.cp, lossAt = 2 * chunks * a_.tp, peakAt = lossAt + globalMicrobatches * L * cp,
               reservedAt = peakAt + world;
  const size_t stopAt = reservedAt + world;
  std::vector<double> stats(stopAt + world, 0.0); // sharedStats_ holds as many (CudaRank.cpp)
  if (!waitStreams({compute_}, "the gradient statistics"))
    return false;
  if (member_ == 0 || sharded_) {
    double *mine = stats.data() + 2 * chunks * tensor_;
    cudaMemcpy(mine, stats_, 2 * chunks * sizeof(double), cudaMemcpyDeviceToHost);
    for (size_t p = 0; p < P; ++p)
      if (!speaksFor(p))
        std::fill(mine + 2 * firstChunk_[p], mine + 2 * firstChunk_[p + 1], 0.0);
  }
  for (int64_t mb = 0; mb < a_.microbatches && tensor_ == 0; ++mb) // every tensor rank has the same losses
    for (size_t l = 0; l < L; ++l)
      stats[lossAt + (a_.globalMicrobatch(mb, replica_) * L + l) * cp + context_] = losses[mb][l];
  stats[peakAt + rank_] = double(peak_);
  // What the pool holds once the pipeline ran: constant from the second
  // step on when no step needs a new device allocation (the GPU suite checks).
  cudaMemPool_t pool;
  uint64_t reserved = 0;
  cudaDeviceGetDefaultMemPool(&pool, gpu_);
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
  if (planner_.planned())
    reserved += uint64_t(planner_.plan().arenaBytes);
  stats[reservedAt + rank_] = double(reserved);
  // Read once the pipeline is done: a signal arriving later counts at the
  // next step, on every rank alike.
  stats[stopAt + rank_] = double(stopSignal());
  cudaMemcpyAsync(sharedStats_, stats.data(), stats.size() * sizeof(double), cudaMemcpyHostToDevice, compute_);
  if (std::string problem = links_->allReduceSum(sharedStats_, int64_t(stats.size()), compute_); !problem.empty())
    return fail("the all-reduce of the step statistics: " + problem);
  if (!waitStreams({compute_}, "the all-reduce of the step statistics"))
    return false;
  cudaMemcpy(stats.data(), sharedStats_, stats.size() * sizeof(double), cudaMemcpyDeviceToHost);
  double squares = 0;
  int64_t zeros = 0;
  for (size_t p = 0; p < P; ++p)
    for (int64_t t = 0; t < a_.tp; ++t) { // each entry from one rank: the all-reduce's sum is exact
      double tensorSquares = 0, tensorZeros = 0;
      for (int64_t c = firstChunk_[p]; c < firstChunk_[p + 1]; ++c) {
        tensorSquares += stats[2 * (chunks * t + c)];
        tensorZeros += stats[2 * (chunks * t + c) + 1];
      }
      squares += tensorSquares;
      zeros += int64_t(tensorZeros);
    }
  std::vector<std::vector<double>> allLosses(globalMicrobatches, std::vector<double>(L));
  for (size_t mb = 0; mb < globalMicrobatches; ++mb)
    for (size_t l = 0; l < L; ++l)
      for (size_t c = 0; c < cp; ++c) // as the CPU backend adds the context ranks' shares
        allLosses[mb][l] = c == 0 ? stats[lossAt + (mb * L + l) * cp] : allLosses[mb][l] + stats[lossAt + (mb * L + l) * cp + c];
  summarizeLosses(a_.stages.back(), allLosses, result);
  result.gradNorm = std::sqrt(squares);
  result.numZeros = zeros;
  for (size_t k = 0; k < world; ++k) {
    result.peakBytes.push_back(int64_t(stats[peakAt + k]));
    result.deviceReservedBytes.push_back(int64_t(stats[reservedAt + k]));
    result.stopSignal = std::max(result.stopSignal, int(stats[stopAt + k]));
  }
  return true;
}

/// AdamW or SGD on the owned weights, then the updated weights to the other holders.
bool CudaRank::updateWeights(int64_t step, const std::vector<float *> &gradient, StepResult &result) {
  const size_t P = a_.params.size();
  const OptimizerScalars k = optimizerScalars(options_, step, result.gradNorm);
  result.learningRate = k.lr;
  std::vector<RankLinks::ReplicaShards> gathered; // the distributed optimizer's parts
  for (size_t p = 0; p < P; ++p) {
    if (plans_[p].owner != pipe_ || plans_[p].uses.empty())
      continue;
    // This member's part (all of it without sharding): each element's
    // update is the same arithmetic either way, so the same bits.
    const auto [begin, end] = ownShard(p);
    bf16 *low = bf16_ ? lowWeights_.at(int(p)) + begin : nullptr; // the kernels' copy, rounded in the same pass
    const int64_t offset = begin - masterRange(p).first, count = end - begin;
    const float *g = gradient[p]; // the part's first element
    const float decay = a_.params[p].decay ? float(options_.weightDecay) : 0.0f;
    if (keepRemainders_) {
      uint16_t *rem = count > 0 ? remainders_.at(int(p)) + offset : nullptr; // none held for an empty part
      if (k.sgd)
        sgdRemainders(rem, low, g, count, float(k.lr), k.clip, compute_);
      else
        adamWRemainders(rem, low, g, adamM_[int(p)], adamV_[int(p)], count, float(k.lr), k.clip, k.beta1,
                        k.beta2, k.eps, k.correction1, k.correction2, decay, compute_);
    } else {
      float *w = count > 0 ? weights_.at(int(p)) + offset : nullptr;
      if (k.sgd)
        sgd(w, g, count, float(k.lr), k.clip, low, compute_);
      else
        adamW(w, g, adamM_[int(p)], adamV_[int(p)], count, float(k.lr), k.clip, k.beta1, k.beta2, k.eps,
              k.correction1, k.correction2, decay, low, compute_);
    }
    if (sharded_) { // the others' parts: the kernels' copies (bf16), or the fp32 weights they read
      gathered.push_back(copiesLead() ? partsOf(p, lowWeights_.at(int(p)), Dtype::BF16)
                                      : partsOf(p, weights_.at(int(p)), Dtype::F32));
    }
  }
  if (!check("optimizer update"))
    return false;
  if (!gathered.empty())
    if (std::string problem = links_->allGatherReplicas(gathered, compute_); !problem.empty())
      return fail("gathering the updated weights' parts: " + problem);
  for (auto &[peer, stream] : sendStream_)
    follow(stream, compute_);
  // Other holders (a tied embedding's other pipeline ranks) get the whole
  // updated weights: fp32, rounded there as the owner rounds, or under
  // copiesLead() the bf16 copies themselves (the same bits).
  links_->groupStart();
  for (size_t p = 0; p < P; ++p) {
    const ParamPlan &plan = plans_[p];
    const int64_t count = held(p);
    const Dtype dtype = copiesLead() ? Dtype::BF16 : Dtype::F32;
    for (int64_t holder : plan.holders) {
      if (holder == plan.owner || (plan.owner != pipe_ && holder != pipe_))
        continue;
      void *data = copiesLead() ? static_cast<void *>(lowWeights_.at(int(p))) : weights_.at(int(p));
      if (plan.owner == pipe_)
        links_->send(data, count, dtype, globalPeer(holder), sendStream_[holder]);
      else if (holder == pipe_)
        links_->recv(data, count, dtype, globalPeer(plan.owner), recvStream_[plan.owner]);
    }
  }
  if (std::string problem = links_->groupEnd(); !problem.empty())
    return fail("sending updated weights: " + problem);
  if (!waitStreams(allStreams(), "the weight exchange"))
    return false;
  refreshLowWeights(true);
  return check("optimizer");
}

/// A stage's gradient ALLREDUCE, or under the distributed optimizer its
/// REDUCESCATTER: each member keeps the group's sum of its part alone.
bool CudaRank::allReduceGradients(const Instr &instr) {
  const std::string what = instr.describe();
  if (!replicaStream_)
    return fail(what + " in a schedule without data-parallel replicas");
  if ((instr.collective == CollectiveOp::ReduceScatter) != sharded_)
    return fail(what + (sharded_ ? ": the distributed optimizer's members need a REDUCESCATTER"
                                 : ": a REDUCESCATTER without the distributed optimizer"));
  std::vector<RankLinks::ReplicaShards> buffers;
  for (size_t k = 0; k < a_.stages[instr.stage].params.size(); ++k) {
    auto it = slotGrads_.find({instr.stage, int(k)});
    if (it == slotGrads_.end())
      return fail(what + ": stage " + std::to_string(instr.stage) + ", which pipeline rank " +
                  std::to_string(pipe_) + " does not hold");
    buffers.push_back(partsOf(a_.stages[instr.stage].params[k].param, it->second, Dtype::F32));
  }
  // Behind the stage's last backward; the compute stream goes on with the
  // other chunks' backwards while the replicas' sums run (the optimizer's
  // reduceGradients waits for this stream).
  follow(replicaStream_, compute_);
  timeline_.work(replicaStream_);
  std::string problem;
  if (sharded_) {
    problem = links_->reduceScatterReplicas(buffers, replicaStream_);
  } else {
    std::vector<std::pair<float *, int64_t>> whole;
    for (const RankLinks::ReplicaShards &b : buffers)
      whole.push_back({static_cast<float *>(b.data), b.shards.back().second});
    problem = links_->allReduceReplicas(whole, replicaStream_);
  }
  if (!problem.empty())
    return fail("the gradient " + what + ": " + problem);
  markProgress(replicaStream_);
  return check(what.c_str());
}

/// Whole reduced gradients for the taps (tests): a tensor rank's block
/// placed among zeros (the trainer adds the tensor ranks' parts), from
/// member 0 of the gradient group; under the distributed optimizer the
/// members' parts gathered first (every member takes part).
bool CudaRank::recordGradientTaps(const std::vector<float *> &gradient, StepResult &result) {
  std::vector<RankLinks::ReplicaShards> parts;
  std::map<size_t, Buffer> gathered; // by parameter, sharded only
  for (size_t p = 0; p < a_.params.size() && sharded_; ++p) {
    if (plans_[p].owner != pipe_ || plans_[p].uses.empty())
      continue;
    Buffer whole = allocate(held(p), Dtype::F32, Queue::compute(), false);
    if (!whole)
      return false;
    const auto [begin, end] = ownShard(p);
    if (end > begin)
      cudaMemcpyAsync(whole.data + begin, gradient[p], (end - begin) * 4, cudaMemcpyDeviceToDevice, compute_);
    parts.push_back(partsOf(p, whole.data, Dtype::F32));
    gathered[p] = whole;
  }
  if (!parts.empty())
    if (std::string problem = links_->allGatherReplicas(parts, compute_); !problem.empty())
      return fail("gathering the gradients' parts for the taps: " + problem);
  if (!waitStreams({compute_}, "the gradient taps"))
    return false;
  for (size_t p = 0; p < a_.params.size() && member_ == 0; ++p)
    if (plans_[p].owner == pipe_ && !plans_[p].uses.empty() && speaksFor(p)) {
      std::vector<float> block(held(p)), whole(a_.params[p].count(), 0.0f);
      const float *reduced = sharded_ ? gathered.at(p).data : gradient[p];
      cudaMemcpy(block.data(), reduced, block.size() * 4, cudaMemcpyDeviceToHost);
      scatterShard(a_.params[p], a_.tp, tensor_, block.data(), whole.data());
      result.paramGrads[a_.params[p].name] = std::move(whole);
    }
  for (auto &[p, buffer] : gathered)
    release(buffer, Queue::compute());
  return check("the gradient taps");
}

bool CudaRank::optimizerStep(int64_t step, const std::vector<std::vector<double>> &losses, StepResult &result) {
  cudaSetDevice(gpu_);
  std::vector<float *> gradient;
  std::map<std::pair<size_t, size_t>, Buffer> remote; // (param, use index) -> received
  if (!reduceGradients(gradient, remote) || !shareStatistics(losses, result))
    return false;
  if (options_.recordTaps && !recordGradientTaps(gradient, result))
    return false;
  if (!evaluating_ && !updateWeights(step, gradient, result))
    return false;
  for (auto &[key, t] : remote)
    release(t, Queue::compute());
  // The first step under the static plan was recorded: plan it now. Later
  // steps must have freed everything they took.
  if (recording_ && !adoptMemoryPlan())
    return false;
  std::string problem;
  if (planner_.planned() && !recording_ && !planner_.endStep(problem))
    return fail(problem);
  recording_ = false;
  return true;
}

} // namespace mhcc::runtime::cuda
