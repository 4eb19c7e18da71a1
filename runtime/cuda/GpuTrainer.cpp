//===- GpuTrainer.cpp - training steps on the CUDA backend -------------------===//
#include "runtime/cuda/GpuTrainer.h"

#include "runtime/cpu/Kernels.h"
#include "runtime/cuda/DeviceKernels.h"
#include "runtime/cuda/ModelKernels.h"
#include "runtime/gpu/Gpus.h"
#include "runtime/memory/MemoryPlan.h"
#include "runtime/train/Optimizer.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <tuple>

namespace mhcc::runtime {
namespace {

using Key = std::pair<int64_t, int64_t>; // (stage, microbatch)
using Pair = std::pair<int64_t, int64_t>; // (sending rank, receiving rank)

struct DeviceTensor {
  float *ptr = nullptr;
  int64_t count = 0;
};

struct Received {
  DeviceTensor tensor;
  cudaEvent_t ready = nullptr;
};

struct StageState {
  std::vector<DeviceTensor> values;
  std::vector<DeviceTensor> aux;
  std::vector<float *> losses; // device scalars, by loss index
};

std::string cudaWhat(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}

/// One use of a parameter: its gradient slot (stage, slot) on `rank`.
struct ParamUse {
  int64_t useOrder = 0, rank = 0, stage = 0;
  int slot = 0;
};

/// Where a parameter's gradient is reduced and its update computed: the
/// owner, the rank of its first use. Other ranks holding it send their uses'
/// gradients there and receive the updated weights back. The reduction runs
/// in use order whatever the layout, so the bits do not depend on it.
struct ParamPlan {
  int64_t owner = 0;
  std::vector<ParamUse> uses;   // by useOrder
  std::vector<int64_t> holders; // ranks with a copy, ascending
};

std::vector<ParamPlan> planParameters(const Artifact &a) {
  std::vector<ParamPlan> plans(a.params.size());
  for (size_t s = 0; s < a.stages.size(); ++s)
    for (size_t k = 0; k < a.stages[s].params.size(); ++k) {
      const ParamSlot &slot = a.stages[s].params[k];
      plans[slot.param].uses.push_back({slot.useOrder, a.rankOf(s), int64_t(s), int(k)});
    }
  for (ParamPlan &plan : plans) {
    std::sort(plan.uses.begin(), plan.uses.end(),
              [](const ParamUse &x, const ParamUse &y) { return x.useOrder < y.useOrder; });
    if (!plan.uses.empty())
      plan.owner = plan.uses.front().rank;
    std::set<int64_t> holders;
    for (const ParamUse &use : plan.uses)
      holders.insert(use.rank);
    plan.holders.assign(holders.begin(), holders.end());
  }
  return plans;
}

/// Every directed rank pair that exchanges messages: pipeline sends, and
/// gradients / weights of parameters held on several ranks.
std::vector<Pair> communicatingPairs(const Artifact &a, const std::vector<ParamPlan> &plans) {
  std::set<Pair> pairs;
  for (int64_t r = 0; r < a.pp; ++r)
    for (const Instr &i : a.ranks[r])
      if (i.kind == OpKind::Send)
        pairs.insert({r, i.peer});
  for (const ParamPlan &plan : plans)
    for (int64_t holder : plan.holders)
      if (holder != plan.owner) {
        pairs.insert({holder, plan.owner});
        pairs.insert({plan.owner, holder});
      }
  return {pairs.begin(), pairs.end()};
}

/// The NCCL unique ids of a run: the world, then each pair in order.
struct CommIds {
  ncclUniqueId world;
  std::vector<ncclUniqueId> pairs;

  std::string serialize() const {
    std::string bytes(reinterpret_cast<const char *>(&world), sizeof world);
    for (const ncclUniqueId &id : pairs)
      bytes.append(reinterpret_cast<const char *>(&id), sizeof id);
    return bytes;
  }
  static bool parse(const std::string &bytes, size_t pairCount, CommIds &ids) {
    if (bytes.size() != (pairCount + 1) * sizeof(ncclUniqueId))
      return false;
    std::memcpy(&ids.world, bytes.data(), sizeof ids.world);
    ids.pairs.resize(pairCount);
    for (size_t k = 0; k < pairCount; ++k)
      std::memcpy(&ids.pairs[k], bytes.data() + (k + 1) * sizeof(ncclUniqueId), sizeof(ncclUniqueId));
    return true;
  }
};

std::string makeCommIds(size_t pairCount, CommIds &ids) {
  ncclResult_t status = ncclGetUniqueId(&ids.world);
  ids.pairs.resize(pairCount);
  for (size_t k = 0; status == ncclSuccess && k < pairCount; ++k)
    status = ncclGetUniqueId(&ids.pairs[k]);
  return status == ncclSuccess ? "" : std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(status);
}

} // namespace

/// One pipeline rank on one GPU: its weights, gradients, optimizer state,
/// streams and communicators, and the code that runs its instruction list
/// and its share of the optimizer step. The same code serves one process
/// per GPU and the in-process mode (one host thread per rank) the tests use.
class RankWorker {
public:
  RankWorker(const Artifact &artifact, const TrainOptions &options, int64_t rank, int device,
             const std::atomic<bool> *peerFailed)
      : a(artifact), options(options), r(rank), peerFailed(peerFailed), plans(planParameters(artifact)),
        pairs(communicatingPairs(artifact, plans)) {
    dev.device = device;
  }

  ~RankWorker() {
    cudaSetDevice(dev.device);
    for (ncclComm_t comm : comms)
      aborted ? ncclCommAbort(comm) : ncclCommDestroy(comm);
    for (auto *group : {&dev.weights, &dev.adamM, &dev.adamV, &dev.reduced})
      for (auto &[p, ptr] : *group)
        cudaFree(ptr);
    for (auto &[k, ptr] : dev.slotGrads)
      cudaFree(ptr);
    for (int32_t *p : dev.tokens)
      cudaFree(p);
    for (int32_t *p : dev.labels)
      cudaFree(p);
    cudaFree(dev.stats);
    cudaFree(dev.statPartials);
    cudaFree(dev.sharedStats);
    cudaFree(arena);
    for (auto &[key, pointers] : csrs) {
      cudaFree(pointers.first);
      cudaFree(pointers.second);
    }
    for (cudaEvent_t event : freeEvents)
      if (event)
        cudaEventDestroy(event);
    if (dev.blas)
      cublasDestroy(dev.blas);
  }

  const std::vector<Pair> &communicating() const { return pairs; }

  /// Device, memory, initial weights; no communication yet.
  bool setupDevice() {
    where = "setup";
    std::string problem = gpuSelfTest(dev.device);
    if (!problem.empty())
      return fail(problem);
    cudaSetDevice(dev.device);
    cudaMemPool_t pool;
    cudaDeviceGetDefaultMemPool(&pool, dev.device);
    uint64_t keep = UINT64_MAX; // the pool keeps what it has, for the next steps to reuse
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    if (cudaStreamCreateWithFlags(&dev.compute, cudaStreamNonBlocking) != cudaSuccess ||
        cublasCreate(&dev.blas) != CUBLAS_STATUS_SUCCESS)
      return fail("cannot create a stream or a cuBLAS handle on GPU " + std::to_string(dev.device));
    cublasSetStream(dev.blas, dev.compute);
    cublasSetMathMode(dev.blas, CUBLAS_PEDANTIC_MATH); // fp32, no TF32
    if (!a.deviceCode)
      return fail("the artifact carries no CUDA kernels (compiled with --cuda-arch none, or where nvcc was not "
                  "found); recompile it with 'mhcc --cuda-arch sm_90', or run it with --backend cpu");
    std::string loadError;
    if (!(dev.kernels = cuda::ModelKernels::load(*a.deviceCode, dev.device, loadError)))
      return fail(loadError);
    auto deviceBuffer = [&](size_t bytes, const std::string &what) -> float * {
      void *ptr = nullptr;
      if (cudaMalloc(&ptr, std::max<size_t>(bytes, 4)) != cudaSuccess) {
        fail("out of GPU memory for " + what);
        return nullptr;
      }
      dev.staticBytes += static_cast<int64_t>(bytes);
      cudaMemset(ptr, 0, bytes);
      return static_cast<float *>(ptr);
    };
    for (size_t param = 0; param < a.params.size(); ++param) {
      const ParamPlan &plan = plans[param];
      if (!std::binary_search(plan.holders.begin(), plan.holders.end(), r))
        continue;
      const ParamInfo &info = a.params[param];
      size_t bytes = info.count() * sizeof(float);
      float *w = deviceBuffer(bytes, "parameter " + info.name);
      if (!w)
        return false;
      dev.weights[int(param)] = w;
      std::vector<float> initial = initialParameter(info, a.model.seed);
      cudaMemcpy(w, initial.data(), bytes, cudaMemcpyHostToDevice);
      if (plan.owner == r) {
        if (options.optimizer != "sgd") {
          if (!(dev.adamM[int(param)] = deviceBuffer(bytes, "the Adam state of " + info.name)) ||
              !(dev.adamV[int(param)] = deviceBuffer(bytes, "the Adam state of " + info.name)))
            return false;
        }
        if (plan.uses.size() > 1 && !(dev.reduced[int(param)] = deviceBuffer(bytes, "the gradient of " + info.name)))
          return false;
      }
      for (const ParamUse &use : plan.uses)
        if (use.rank == r && !(dev.slotGrads[{use.stage, use.slot}] = deviceBuffer(bytes, "the gradient of " + info.name)))
          return false;
    }
    dev.tokens.assign(a.microbatches, nullptr);
    dev.labels.assign(a.microbatches, nullptr);
    for (int64_t mb = 0; mb < a.microbatches; ++mb)
      if (cudaMalloc(&dev.tokens[mb], a.model.tokens() * sizeof(int32_t)) != cudaSuccess ||
          cudaMalloc(&dev.labels[mb], a.model.tokens() * sizeof(int32_t)) != cudaSuccess)
        return fail("out of GPU memory for the token ids");
    dev.staticBytes += 2 * a.microbatches * a.model.tokens() * int64_t(sizeof(int32_t));
    const size_t sharedCount = 2 * a.params.size() + a.microbatches * a.stages.back().losses.size() + 2 * a.pp;
    if (cudaMalloc(&dev.stats, 2 * a.params.size() * sizeof(double) + sizeof(double)) != cudaSuccess ||
        cudaMalloc(&dev.statPartials, cuda::squaresAndZerosScratch() * sizeof(double)) != cudaSuccess ||
        cudaMalloc(&dev.sharedStats, sharedCount * sizeof(double)) != cudaSuccess)
      return fail("out of GPU memory for the gradient statistics");
    return check("setup");
  }

  /// Joins the world communicator and one communicator per directed pair
  /// this rank belongs to (pairs in the same global order on every rank, so
  /// the blocking joins cannot wait on each other in a cycle), then connects
  /// each pair with one message, so that no lazy connection blocks a step.
  bool setupComms(const CommIds &ids) {
    where = "NCCL setup";
    cudaSetDevice(dev.device);
    ncclResult_t status = ncclCommInitRank(&world, int(a.pp), ids.world, int(r));
    if (status != ncclSuccess)
      return fail(std::string("ncclCommInitRank (world of ") + std::to_string(a.pp) + "): " + ncclGetErrorString(status));
    comms.push_back(world);
    for (size_t k = 0; k < pairs.size(); ++k) {
      auto [from, to] = pairs[k];
      if (from != r && to != r)
        continue;
      ncclComm_t comm;
      status = ncclCommInitRank(&comm, 2, ids.pairs[k], from == r ? 0 : 1);
      if (status != ncclSuccess)
        return fail("ncclCommInitRank (ranks " + std::to_string(from) + " -> " + std::to_string(to) +
                    "): " + ncclGetErrorString(status));
      comms.push_back(comm);
      cudaStream_t stream;
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      if (from == r) {
        dev.sendComm[to] = comm;
        dev.sendStream[to] = stream;
      } else {
        dev.recvComm[from] = comm;
        dev.recvStream[from] = stream;
      }
    }
    float *probe = nullptr;
    cudaMalloc(&probe, 2 * sizeof(float));
    ncclGroupStart();
    for (auto &[peer, comm] : dev.sendComm)
      ncclSend(probe, 1, ncclFloat, 1, comm, dev.sendStream[peer]);
    for (auto &[peer, comm] : dev.recvComm)
      ncclRecv(probe + 1, 1, ncclFloat, 0, comm, dev.recvStream[peer]);
    status = ncclGroupEnd();
    bool connected = status == ncclSuccess && waitStreams(allStreams(), "the connection probes");
    cudaFree(probe);
    if (status != ncclSuccess)
      return fail(std::string("connecting the pair communicators: ") + ncclGetErrorString(status));
    return connected && check("NCCL setup");
  }

  /// One training step of this rank: the pipeline, then the optimizer.
  bool step(int64_t stepNumber, const std::vector<std::vector<int32_t>> &tokens,
            const std::vector<std::vector<int32_t>> &labels, StepResult &result) {
    cudaSetDevice(dev.device);
    const ModelInfo &m = a.model;
    dev.live = dev.peak = dev.staticBytes;
    where = "start of step";
    for (int64_t mb = 0; mb < a.microbatches; ++mb) {
      cudaMemcpy(dev.tokens[mb], tokens[mb].data(), m.tokens() * 4, cudaMemcpyHostToDevice);
      cudaMemcpy(dev.labels[mb], labels[mb].data(), m.tokens() * 4, cudaMemcpyHostToDevice);
    }
    for (auto &[key, g] : dev.slotGrads)
      cudaMemsetAsync(g, 0, a.params[a.stages[key.first].params[key.second].param].count() * 4, dev.compute);
    losses.assign(a.microbatches, std::vector<double>(a.stages.back().losses.size(), 0.0));
    taps.clear();
    profileMs.clear();
    recording = options.staticMemoryPlan && !planner.planned();
    auto start = std::chrono::steady_clock::now();
    if (!runPipeline(tokens))
      return false;
    auto pipelineDone = std::chrono::steady_clock::now();
    if (!optimizerStep(stepNumber, result))
      return false;
    if (recording && !adoptMemoryPlan())
      return false;
    if (planner.planned() && !recording) {
      std::string problem;
      if (!planner.endStep(problem))
        return fail(problem);
    }
    recording = false;
    if (options.profile) {
      result.profileMs = profileMs;
      result.profileMs["host: rank " + std::to_string(r) + " pipeline"] =
          std::chrono::duration<double, std::milli>(pipelineDone - start).count();
      result.profileMs["host: rank " + std::to_string(r) + " optimizer (reduce, norm, update, weights)"] =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - pipelineDone).count();
    }
    if (options.recordTaps)
      result.taps = std::move(taps);
    return true;
  }

  /// The weights of the parameters this rank owns (tests, checkpoints).
  void downloadOwned(std::vector<std::vector<float>> &weights) {
    cudaSetDevice(dev.device);
    for (size_t p = 0; p < a.params.size(); ++p)
      if (plans[p].owner == r && dev.weights.count(int(p))) {
        weights[p].resize(a.params[p].count());
        cudaMemcpy(weights[p].data(), dev.weights[int(p)], weights[p].size() * 4, cudaMemcpyDeviceToHost);
      }
  }

  /// After a failure: abort the communicators so that peers waiting on this
  /// rank fail at their deadline instead of hanging, and nothing blocks here.
  void abort() {
    for (ncclComm_t comm : comms)
      ncclCommAbort(comm);
    comms.clear();
    aborted = true;
  }

  std::string error;

private:
  struct DeviceRank {
    int device = 0;
    cudaStream_t compute = nullptr;
    cublasHandle_t blas = nullptr;
    std::unique_ptr<cuda::ModelKernels> kernels; // the artifact's generated kernels, loaded on this device
    std::map<int, float *> weights, adamM, adamV, reduced; // by parameter
    std::map<std::pair<int64_t, int>, float *> slotGrads; // (stage, slot)
    std::map<int64_t, ncclComm_t> sendComm, recvComm;     // by peer
    std::map<int64_t, cudaStream_t> sendStream, recvStream;
    std::vector<int32_t *> tokens, labels; // by microbatch
    double *stats = nullptr, *statPartials = nullptr, *sharedStats = nullptr;
    int64_t staticBytes = 0; // weights, gradients, optimizer state, token ids
    int64_t live = 0, peak = 0; // staticBytes plus what the step allocates
  };

  const Artifact &a;
  const TrainOptions &options;
  const int64_t r;
  const std::atomic<bool> *peerFailed;
  std::vector<ParamPlan> plans;
  std::vector<Pair> pairs;
  DeviceRank dev;
  // --memory-plan static: the first step is recorded through the pool, then
  // every step's buffers live at fixed offsets of one arena.
  PlannedAllocator planner;
  bool recording = false;
  char *arena = nullptr;
  std::vector<cudaEvent_t> freeEvents; // by recorded buffer, where a later one waits for its free
  std::map<cudaStream_t, int> streamIds;
  std::vector<cudaStream_t> streamById;
  ncclComm_t world = nullptr;
  std::vector<ncclComm_t> comms;
  bool aborted = false;

  // Per step.
  std::map<Key, StageState> states;
  std::map<Key, Received> actIn, gradIn;
  std::map<Key, int64_t> outputPeer; // where each sent output went (its FREE follows that stream)
  std::vector<DeviceTensor> scratchToFree;
  std::string where;
  std::vector<std::vector<double>> losses;    // [mb][loss], last rank only
  std::map<std::string, std::vector<float>> taps;
  std::map<std::string, double> profileMs;
  /// Loss scalars stay on the device until the step ends: (mb, loss index).
  std::vector<std::pair<std::pair<int64_t, size_t>, DeviceTensor>> lossBuffers;
  std::vector<std::pair<std::string, DeviceTensor>> tapBuffers;
  /// With profiling: events around each primitive, read after the step.
  std::vector<std::tuple<std::string, cudaEvent_t, cudaEvent_t>> timings;
  /// Embedding-backward CSRs, uploaded before each step into buffers kept
  /// from the first: (mb, shift) -> device offsets, positions.
  std::map<std::pair<int64_t, int64_t>, std::pair<int32_t *, int32_t *>> csrs;

  const StageProgram &program(int64_t s) { return a.stages[s]; }

  void markStart(cudaEvent_t &startEvent) {
    if (!options.profile)
      return;
    cudaEventCreate(&startEvent);
    cudaEventRecord(startEvent, dev.compute);
  }
  void markEnd(const std::string &name, cudaEvent_t startEvent) {
    if (!options.profile)
      return;
    cudaEvent_t endEvent;
    cudaEventCreate(&endEvent);
    cudaEventRecord(endEvent, dev.compute);
    timings.emplace_back("rank " + std::to_string(r) + " " + name, startEvent, endEvent);
  }

  std::vector<cudaStream_t> allStreams() {
    std::vector<cudaStream_t> streams = {dev.compute};
    for (auto &[peer, st] : dev.sendStream)
      streams.push_back(st);
    for (auto &[peer, st] : dev.recvStream)
      streams.push_back(st);
    return streams;
  }

  /// Waits for `streams` with the receive deadline instead of hanging; a
  /// failed peer (in-process mode) ends the wait at once.
  bool waitStreams(const std::vector<cudaStream_t> &streams, const std::string &what) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(options.recvTimeoutSeconds);
    for (cudaStream_t st : streams) {
      cudaError_t status;
      while ((status = cudaStreamQuery(st)) == cudaErrorNotReady) {
        if (peerFailed && peerFailed->load())
          return fail("stopped while waiting for " + what + ": another rank failed");
        if (std::chrono::steady_clock::now() > deadline)
          return fail(what + " did not finish within " + std::to_string(int(options.recvTimeoutSeconds)) +
                      " s (a peer never sent, or a collective hangs; raise --recv-timeout if the step is "
                      "just slow)");
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      if (status != cudaSuccess)
        return fail(what + ": " + cudaWhat(status));
    }
    return true;
  }

  /// Makes `waiter` wait for the work queued so far on `producer`.
  static void follow(cudaStream_t waiter, cudaStream_t producer) {
    cudaEvent_t event;
    cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    cudaEventRecord(event, producer);
    cudaStreamWaitEvent(waiter, event, 0);
    cudaEventDestroy(event);
  }

  float *useGradient(const ParamUse &use) { return dev.slotGrads[{use.stage, use.slot}]; }

  /// Reduces each parameter's gradient on its owner (uses in model order),
  /// sums the squares and zeros, shares them and the losses with every rank
  /// (one all-reduce, each entry non-zero on one rank only, so the sum is
  /// exact), then updates the owned weights and sends them to the holders.
  bool optimizerStep(int64_t stepNumber, StepResult &result) {
    where = "optimizer";
    const size_t P = a.params.size();
    // 1. Gradients of uses on other ranks travel to the owner.
    std::map<std::pair<size_t, size_t>, DeviceTensor> remote; // (param, use index) -> received
    for (auto &[peer, stream] : dev.sendStream)
      follow(stream, dev.compute);
    ncclGroupStart();
    for (size_t p = 0; p < P; ++p) {
      const ParamPlan &plan = plans[p];
      const int64_t count = a.params[p].count();
      for (size_t u = 0; u < plan.uses.size(); ++u) {
        const ParamUse &use = plan.uses[u];
        if (use.rank == plan.owner)
          continue;
        if (use.rank == r)
          ncclSend(useGradient(use), count, ncclFloat, 1, dev.sendComm[plan.owner], dev.sendStream[plan.owner]);
        else if (plan.owner == r) {
          DeviceTensor t{allocate(count, dev.recvStream[use.rank], false), count};
          if (!t.ptr) {
            ncclGroupEnd();
            return false;
          }
          ncclRecv(t.ptr, count, ncclFloat, 0, dev.recvComm[use.rank], dev.recvStream[use.rank]);
          remote[{p, u}] = t;
        }
      }
    }
    if (ncclResult_t status = ncclGroupEnd(); status != ncclSuccess)
      return fail(std::string("sending gradients to their owners: ") + ncclGetErrorString(status));
    for (auto &[peer, stream] : dev.recvStream)
      follow(dev.compute, stream);
    // 2. Reduce in use order; squares and zeros of every owned gradient.
    cudaMemsetAsync(dev.stats, 0, 2 * P * sizeof(double), dev.compute);
    std::vector<float *> gradient(P, nullptr);
    for (size_t p = 0; p < P; ++p) {
      const ParamPlan &plan = plans[p];
      if (plan.owner != r || plan.uses.empty())
        continue;
      const int64_t count = a.params[p].count();
      auto useData = [&](size_t u) { return plan.uses[u].rank == r ? useGradient(plan.uses[u]) : remote[{p, u}].ptr; };
      if (plan.uses.size() == 1) {
        gradient[p] = useData(0);
      } else {
        gradient[p] = dev.reduced[int(p)];
        cudaMemcpyAsync(gradient[p], useData(0), count * 4, cudaMemcpyDeviceToDevice, dev.compute);
        for (size_t u = 1; u < plan.uses.size(); ++u)
          cuda::addInto(gradient[p], useData(u), count, dev.compute);
      }
      cuda::squaresAndZeros(gradient[p], count, dev.stats + 2 * p, dev.statPartials, dev.compute);
    }
    if (!check("gradient reduction"))
      return false;
    // 3. One all-reduce: [squares, zeros] per parameter, losses, peak bytes per rank.
    const size_t L = a.stages.back().losses.size();
    std::vector<double> stats(2 * P + a.microbatches * L + 2 * a.pp, 0.0);
    if (!waitStreams({dev.compute}, "the gradient statistics"))
      return false;
    cudaMemcpy(stats.data(), dev.stats, 2 * P * sizeof(double), cudaMemcpyDeviceToHost);
    for (int64_t mb = 0; mb < a.microbatches; ++mb)
      for (size_t l = 0; l < L; ++l)
        stats[2 * P + mb * L + l] = losses[mb][l];
    stats[2 * P + a.microbatches * L + r] = double(dev.peak);
    // What the pool holds once the pipeline ran: constant from the second
    // step on when no step needs a new device allocation (the GPU suite checks).
    cudaMemPool_t pool;
    uint64_t reserved = 0;
    cudaDeviceGetDefaultMemPool(&pool, dev.device);
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
    if (planner.planned())
      reserved += uint64_t(planner.plan().arenaBytes);
    stats[2 * P + a.microbatches * L + a.pp + r] = double(reserved);
    double *shared = dev.sharedStats;
    cudaMemcpyAsync(shared, stats.data(), stats.size() * sizeof(double), cudaMemcpyHostToDevice, dev.compute);
    if (ncclResult_t status = ncclAllReduce(shared, shared, stats.size(), ncclDouble, ncclSum, world, dev.compute);
        status != ncclSuccess)
      return fail(std::string("ncclAllReduce of the step statistics: ") + ncclGetErrorString(status));
    if (!waitStreams({dev.compute}, "the all-reduce of the step statistics"))
      return false;
    cudaMemcpy(stats.data(), shared, stats.size() * sizeof(double), cudaMemcpyDeviceToHost);
    double squares = 0;
    int64_t zeros = 0;
    for (size_t p = 0; p < P; ++p) {
      squares += stats[2 * p];
      zeros += int64_t(stats[2 * p + 1]);
    }
    std::vector<std::vector<double>> allLosses(a.microbatches, std::vector<double>(L));
    for (int64_t mb = 0; mb < a.microbatches; ++mb)
      for (size_t l = 0; l < L; ++l)
        allLosses[mb][l] = stats[2 * P + mb * L + l];
    summarizeLosses(a.stages.back(), allLosses, result);
    result.gradNorm = std::sqrt(squares);
    result.numZeros = zeros;
    for (int64_t k = 0; k < a.pp; ++k)
      result.peakBytes.push_back(int64_t(stats[2 * P + a.microbatches * L + k]));
    for (int64_t k = 0; k < a.pp; ++k)
      result.deviceReservedBytes.push_back(int64_t(stats[2 * P + a.microbatches * L + a.pp + k]));
    if (options.recordTaps)
      for (size_t p = 0; p < P; ++p)
        if (gradient[p]) {
          std::vector<float> host(a.params[p].count());
          cudaMemcpy(host.data(), gradient[p], host.size() * 4, cudaMemcpyDeviceToHost);
          result.paramGrads[a.params[p].name] = std::move(host);
        }
    // 4. Update the owned weights.
    const OptimizerScalars k = optimizerScalars(options, stepNumber, result.gradNorm);
    result.learningRate = k.lr;
    for (size_t p = 0; p < P; ++p) {
      if (!gradient[p])
        continue;
      const int64_t count = a.params[p].count();
      if (k.sgd)
        cuda::sgd(dev.weights[int(p)], gradient[p], count, float(k.lr), k.clip, dev.compute);
      else
        cuda::adamW(dev.weights[int(p)], gradient[p], dev.adamM[int(p)], dev.adamV[int(p)], count, float(k.lr), k.clip,
                    k.beta1, k.beta2, k.eps, k.correction1, k.correction2,
                    a.params[p].decay ? float(options.weightDecay) : 0.0f, dev.compute);
    }
    if (!check("optimizer update"))
      return false;
    for (auto &[key, t] : remote)
      release(t, dev.compute);
    // 5. Updated weights to the other holders.
    for (auto &[peer, stream] : dev.sendStream)
      follow(stream, dev.compute);
    ncclGroupStart();
    for (size_t p = 0; p < P; ++p) {
      const ParamPlan &plan = plans[p];
      const int64_t count = a.params[p].count();
      for (int64_t holder : plan.holders) {
        if (holder == plan.owner)
          continue;
        if (plan.owner == r)
          ncclSend(dev.weights[int(p)], count, ncclFloat, 1, dev.sendComm[holder], dev.sendStream[holder]);
        else if (holder == r)
          ncclRecv(dev.weights[int(p)], count, ncclFloat, 0, dev.recvComm[plan.owner], dev.recvStream[plan.owner]);
      }
    }
    if (ncclResult_t status = ncclGroupEnd(); status != ncclSuccess)
      return fail(std::string("sending updated weights: ") + ncclGetErrorString(status));
    return waitStreams(allStreams(), "the weight exchange") && check("optimizer");
  }

  bool fail(const std::string &message) {
    if (error.empty())
      error = "rank " + std::to_string(r) + " " + where + ": " + message;
    return false;
  }
  bool check(const char *what) {
    std::string e = dev.kernels ? dev.kernels->takeError() : std::string();
    if (e.empty())
      e = cuda::lastError(what);
    return e.empty() || fail(e);
  }

  int streamId(cudaStream_t stream) {
    auto [it, added] = streamIds.try_emplace(stream, static_cast<int>(streamById.size()));
    if (added)
      streamById.push_back(stream);
    return it->second;
  }
  PlannedAllocator::Hooks planHooks() {
    return {[this](int buffer, int stream) { cudaEventRecord(freeEvents[buffer], streamById[stream]); },
            [this](int stream, int buffer) { cudaStreamWaitEvent(streamById[stream], freeEvents[buffer], 0); }};
  }

  float *allocate(int64_t count, cudaStream_t stream, bool zero = true) {
    const int64_t bytes = std::max<int64_t>(1, count) * int64_t(sizeof(float));
    void *p = nullptr;
    if (planner.planned()) {
      std::string problem;
      int64_t offset = planner.alloc(bytes, streamId(stream), planHooks(), problem);
      if (offset < 0) {
        fail(problem);
        return nullptr;
      }
      p = arena + offset;
    } else {
      cudaError_t status = cudaMallocAsync(&p, bytes, stream);
      if (status != cudaSuccess) {
        fail("out of GPU memory allocating " + std::to_string(count * 4) + " bytes (" + cudaWhat(status) + ")");
        return nullptr;
      }
      if (recording)
        planner.recordAlloc(bytes, streamId(stream), reinterpret_cast<uintptr_t>(p));
    }
    if (zero)
      cudaMemsetAsync(p, 0, count * sizeof(float), stream);
    dev.live += count * 4;
    dev.peak = std::max(dev.peak, dev.live);
    return static_cast<float *>(p);
  }
  void release(DeviceTensor &t, cudaStream_t stream) {
    if (!t.ptr)
      return;
    std::string problem;
    if (planner.planned()) {
      if (!planner.free(reinterpret_cast<char *>(t.ptr) - arena, streamId(stream), planHooks(), problem))
        fail(problem);
    } else {
      cudaFreeAsync(t.ptr, stream);
      if (recording && !planner.recordFree(reinterpret_cast<uintptr_t>(t.ptr), streamId(stream), problem))
        fail(problem);
    }
    dev.live -= t.count * 4;
    t = {};
  }

  /// After the recorded first step: plan, hand the pool's memory back, and
  /// take one arena for every later step.
  bool adoptMemoryPlan() {
    where = "memory plan";
    std::string problem;
    if (!planner.finishRecording(256, problem))
      return fail(problem);
    cudaDeviceSynchronize();
    cudaMemPool_t pool;
    cudaDeviceGetDefaultMemPool(&pool, dev.device);
    cudaMemPoolTrimTo(pool, 0);
    const MemoryPlan &plan = planner.plan();
    if (cudaMalloc(&arena, std::max<int64_t>(plan.arenaBytes, 256)) != cudaSuccess)
      return fail("out of GPU memory for the planned arena of " + std::to_string(plan.arenaBytes) + " bytes");
    freeEvents.assign(plan.freeIsWaitedOn.size(), nullptr);
    for (size_t b = 0; b < freeEvents.size(); ++b)
      if (plan.freeIsWaitedOn[b])
        cudaEventCreateWithFlags(&freeEvents[b], cudaEventDisableTiming);
    return check("memory plan");
  }

  /// Copies a tapped tensor aside on the device; nothing here may block
  /// the host (a blocked host can deadlock the pipeline), so the copies
  /// are downloaded after the step.
  void tap(const ValueInfo &info, const DeviceTensor &t, int64_t mb) {
    if (!options.recordTaps || info.tap.empty())
      return;
    DeviceTensor copy{allocate(t.count, dev.compute, false), t.count};
    cudaMemcpyAsync(copy.ptr, t.ptr, t.count * sizeof(float), cudaMemcpyDeviceToDevice, dev.compute);
    tapBuffers.push_back({info.tap + "@mb" + std::to_string(mb), copy});
  }

  float *param(int64_t s, const ForwardInstr &f, size_t k) {
    return dev.weights[program(s).params[f.params[k]].param];
  }
  float *paramGrad(int64_t s, const ForwardInstr &f, size_t k) {
    return dev.slotGrads[{s, f.params[k]}];
  }

  /// Rows reading each vocabulary entry, ascending, for the embedding
  /// backward without atomics; built and uploaded before the step starts.
  void prepareCsrs(const std::vector<std::vector<int32_t>> &tokens) {
    const ModelInfo &m = a.model;
    std::set<std::pair<int64_t, int64_t>> uploaded;
    for (size_t s = r; s < a.stages.size(); s += a.pp)
      for (const ForwardInstr &f : a.stages[s].forward) {
        if (f.op != Prim::Embed)
          continue;
        for (int64_t mb = 0; mb < a.microbatches; ++mb) {
          if (!uploaded.insert({mb, f.shift}).second)
            continue;
          std::vector<int32_t> offsets(m.vocab + 1, 0), positions(m.tokens());
          for (int64_t t = 0; t < m.tokens(); ++t)
            ++offsets[tokens[mb][kernels::shiftedRow(t, f.shift, m.seqLen)] + 1];
          for (int64_t v = 0; v < m.vocab; ++v)
            offsets[v + 1] += offsets[v];
          std::vector<int32_t> cursor(offsets.begin(), offsets.end() - 1);
          for (int64_t t = 0; t < m.tokens(); ++t)
            positions[cursor[tokens[mb][kernels::shiftedRow(t, f.shift, m.seqLen)]]++] = int32_t(t);
          // Device buffers of a fixed size, taken at the first step and kept.
          auto &[dOffsets, dPositions] = csrs[{mb, f.shift}];
          if (!dOffsets) {
            cudaMalloc(&dOffsets, offsets.size() * 4);
            cudaMalloc(&dPositions, positions.size() * 4);
          }
          cudaMemcpy(dOffsets, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice);
          cudaMemcpy(dPositions, positions.data(), positions.size() * 4, cudaMemcpyHostToDevice);
        }
      }
  }

  bool forward(int64_t s, int64_t mb) {
    const StageProgram &p = program(s);
    const ModelInfo &m = a.model;
    const int64_t T = m.tokens(), C = m.hidden, V = m.vocab;
    cudaStream_t stream = dev.compute;
    Key key{s, mb};
    StageState &st = states[key];
    st.values.assign(p.values.size(), {});
    st.aux.assign(p.forward.size(), {});
    st.losses.assign(p.losses.size(), nullptr);
    if (p.input >= 0) {
      if (a.rankOf(s - 1) == r) {
        StageState &prev = states[{s - 1, mb}];
        DeviceTensor &out = prev.values[program(s - 1).output];
        if (!out.ptr)
          return fail("FWD(s" + std::to_string(s) + ") finds no output of stage " + std::to_string(s - 1));
        st.values[p.input] = out; // moved: the previous chunk's backward never reads it
        out = {};
      } else {
        auto in = actIn.find(key);
        if (in == actIn.end())
          return fail("FWD(s" + std::to_string(s) + ",mb" + std::to_string(mb) + ") before its activation arrived");
        cudaStreamWaitEvent(stream, in->second.ready, 0);
        cudaEventDestroy(in->second.ready);
        st.values[p.input] = in->second.tensor;
        actIn.erase(in);
      }
    }
    const int32_t *tok = dev.tokens[mb], *lab = dev.labels[mb];
    for (size_t i = 0; i < p.forward.size(); ++i) {
      const ForwardInstr &f = p.forward[i];
      int64_t count = p.values[f.output].rows * p.values[f.output].cols;
      DeviceTensor &out = st.values[f.output];
      out = {allocate(count, stream, false), count};
      if (f.auxSize)
        st.aux[i] = {allocate(f.auxSize, stream, false), f.auxSize};
      if (!out.ptr || (f.auxSize && !st.aux[i].ptr))
        return false;
      auto in = [&](size_t j) { return st.values[f.inputs[j]].ptr; };
      float *aux = st.aux[i].ptr;
      const int64_t n = f.streams;
      cublasHandle_t h = dev.blas;
      cudaEvent_t started = nullptr;
      markStart(started);
      switch (f.op) {
      case Prim::Identity:
        cudaMemcpyAsync(out.ptr, in(0), count * 4, cudaMemcpyDeviceToDevice, stream);
        break;
      case Prim::Embed:
        cuda::embedForward(*dev.kernels, tok, param(s, f, 0), out.ptr, T, C, f.shift, f.seqLen, stream);
        break;
      case Prim::Expand:
        cuda::expandForward(*dev.kernels, in(0), out.ptr, T, C, n, stream);
        break;
      case Prim::MhcCoeffs: {
        DeviceTensor scratch{allocate(cuda::mhcCoeffsForwardScratch(T, n), stream, false),
                             cuda::mhcCoeffsForwardScratch(T, n)};
        cuda::mhcCoeffsForward(*dev.kernels, h, in(0), param(s, f, 0), param(s, f, 1), param(s, f, 2), out.ptr, aux,
                               scratch.ptr, T, C, n, stream);
        release(scratch, stream);
        break;
      }
      case Prim::MhcPre:
        cuda::mhcPreForward(*dev.kernels, in(0), in(1), out.ptr, T, C, n, stream);
        break;
      case Prim::RmsNorm:
        cuda::rmsNormForward(*dev.kernels, in(0), param(s, f, 0), out.ptr, aux, T, C, f.eps, stream);
        break;
      case Prim::Attention: {
        int64_t size = cuda::attentionForwardScratch(f.heads, f.seqLen);
        DeviceTensor scratch{allocate(size, stream, false), size};
        cuda::attentionForward(*dev.kernels, h, in(0), param(s, f, 0), param(s, f, 1), out.ptr, aux, scratch.ptr, T, C, f.heads,
                               f.seqLen, stream);
        release(scratch, stream);
        break;
      }
      case Prim::SwiGlu:
        cuda::swigluForward(*dev.kernels, h, in(0), param(s, f, 0), param(s, f, 1), param(s, f, 2), out.ptr, aux, T, C, f.ffn,
                            stream);
        break;
      case Prim::MhcPostRes:
        cuda::mhcPostResForward(*dev.kernels, in(0), in(1), in(2), out.ptr, T, C, n, stream);
        break;
      case Prim::Residual:
        cuda::residualForward(*dev.kernels, in(0), in(1), out.ptr, T * C, stream);
        break;
      case Prim::Contract:
        cuda::contractForward(*dev.kernels, in(0), out.ptr, T, C, n, stream);
        break;
      case Prim::LmHead:
        cuda::matmul(h, in(0), param(s, f, 0), out.ptr, T, C, V, false);
        break;
      case Prim::ConcatProj:
        cuda::concatProjForward(h, in(0), in(1), param(s, f, 0), out.ptr, T, C, C);
        break;
      case Prim::CrossEntropy:
        cuda::crossEntropyForward(*dev.kernels, in(0), lab, aux, out.ptr, T, V, f.shift, f.seqLen, stream);
        st.losses[f.loss] = out.ptr;
        break;
      }
      markEnd(std::string("fwd ") + primName(f.op), started);
      if (!check(primName(f.op)))
        return false;
      tap(p.values[f.output], out, mb);
    }
    return true;
  }

  bool backward(int64_t s, int64_t mb) {
    const StageProgram &p = program(s);
    const ModelInfo &m = a.model;
    const int64_t T = m.tokens(), C = m.hidden, V = m.vocab;
    cudaStream_t stream = dev.compute;
    auto found = states.find({s, mb});
    if (found == states.end())
      return fail("BWD(s" + std::to_string(s) + ",mb" + std::to_string(mb) + ") before its FWD");
    StageState &st = found->second;
    if (p.gradOutput >= 0) {
      if (a.rankOf(s + 1) == r) {
        auto next = states.find({s + 1, mb});
        if (next == states.end() || !next->second.values[program(s + 1).gradInput].ptr)
          return fail("BWD(s" + std::to_string(s) + ") finds no input gradient of stage " + std::to_string(s + 1));
        st.values[p.gradOutput] = next->second.values[program(s + 1).gradInput];
        next->second.values[program(s + 1).gradInput] = {};
        releaseState({s + 1, mb});
      } else {
        auto in = gradIn.find({s, mb});
        if (in == gradIn.end())
          return fail("BWD(s" + std::to_string(s) + ",mb" + std::to_string(mb) + ") before its gradient arrived");
        cudaStreamWaitEvent(stream, in->second.ready, 0);
        cudaEventDestroy(in->second.ready);
        st.values[p.gradOutput] = in->second.tensor;
        gradIn.erase(in);
      }
      tap(p.values[p.gradOutput], st.values[p.gradOutput], mb);
    }
    auto grad = [&](int id) -> float * {
      DeviceTensor &g = st.values[id];
      if (!g.ptr) {
        int64_t count = p.values[id].rows * p.values[id].cols;
        g = {allocate(count, stream, true), count};
      }
      return g.ptr;
    };
    cublasHandle_t h = dev.blas;
    for (const BackwardInstr &b : p.backward) {
      const ForwardInstr &f = p.forward[b.forward];
      for (int input : f.inputs)
        if (!st.values[input].ptr)
          return fail(std::string("the backward of ") + primName(f.op) + " reads a freed value");
      auto in = [&](size_t j) { return st.values[f.inputs[j]].ptr; };
      auto din = [&](size_t j) { return grad(b.gradInputs[j]); };
      const float *dOut = b.gradOutput >= 0 ? grad(b.gradOutput) : nullptr;
      const float *aux = st.aux[b.forward].ptr;
      const int64_t n = f.streams;
      auto scratch = [&](int64_t count) {
        scratchToFree.push_back({allocate(count, stream, false), count});
        return scratchToFree.back().ptr;
      };
      cudaEvent_t started = nullptr;
      markStart(started);
      switch (f.op) {
      case Prim::Identity:
        cuda::addInto(din(0), dOut, p.values[f.output].rows * p.values[f.output].cols, stream);
        break;
      case Prim::Embed: {
        auto [offsets, positions] = csrs.at({mb, f.shift});
        cuda::embedBackward(*dev.kernels, offsets, positions, V, dOut, paramGrad(s, f, 0), C, stream);
        break;
      }
      case Prim::Expand:
        cuda::expandBackward(*dev.kernels, dOut, din(0), T, C, n, stream);
        break;
      case Prim::MhcCoeffs:
        cuda::mhcCoeffsBackward(*dev.kernels, h, in(0), param(s, f, 0), param(s, f, 2), aux, dOut, din(0), paramGrad(s, f, 0),
                                paramGrad(s, f, 1), paramGrad(s, f, 2), scratch(cuda::mhcCoeffsBackwardScratch(T, n)), T, C, n,
                                stream);
        break;
      case Prim::MhcPre:
        cuda::mhcPreBackward(*dev.kernels, in(0), in(1), dOut, din(0), din(1), T, C, n, stream);
        break;
      case Prim::RmsNorm:
        cuda::rmsNormBackward(*dev.kernels, in(0), param(s, f, 0), aux, dOut, din(0), paramGrad(s, f, 0),
                              scratch(cuda::rmsNormBackwardScratch(T, C)), T, C, stream);
        break;
      case Prim::Attention:
        cuda::attentionBackward(*dev.kernels, h, in(0), param(s, f, 0), param(s, f, 1), aux, dOut, din(0), paramGrad(s, f, 0),
                                paramGrad(s, f, 1), scratch(cuda::attentionBackwardScratch(T, C, f.heads, f.seqLen)), T, C, f.heads, f.seqLen,
                                stream);
        break;
      case Prim::SwiGlu:
        cuda::swigluBackward(*dev.kernels, h, in(0), param(s, f, 0), param(s, f, 1), param(s, f, 2), aux, dOut, din(0),
                             paramGrad(s, f, 0), paramGrad(s, f, 1), paramGrad(s, f, 2), scratch(3 * T * f.ffn), T,
                             C, f.ffn, stream);
        break;
      case Prim::MhcPostRes:
        cuda::mhcPostResBackward(*dev.kernels, in(0), in(1), in(2), dOut, din(0), din(1), din(2), T, C, n, stream);
        break;
      case Prim::Residual:
        cuda::residualBackward(*dev.kernels, dOut, din(0), din(1), T * C, stream);
        break;
      case Prim::Contract:
        cuda::contractBackward(*dev.kernels, dOut, din(0), T, C, n, stream);
        break;
      case Prim::LmHead:
        cuda::matmulTransAAcc(h, in(0), dOut, paramGrad(s, f, 0), T, C, V);
        cuda::matmulTransBAcc(h, dOut, param(s, f, 0), din(0), T, V, C);
        break;
      case Prim::ConcatProj:
        cuda::concatProjBackward(h, in(0), in(1), param(s, f, 0), dOut, din(0), din(1), paramGrad(s, f, 0), T, C, C);
        break;
      case Prim::CrossEntropy: {
        float scale = static_cast<float>(p.losses[f.loss].weight / double(a.microbatches));
        cuda::crossEntropyBackward(*dev.kernels, in(0), dev.labels[mb], aux, scale, din(0), T, V, f.shift, f.seqLen, stream);
        break;
      }
      }
      markEnd(std::string("bwd ") + primName(f.op), started);
      // Scratch lives for one primitive (stream-ordered: the next may reuse it).
      for (DeviceTensor &t : scratchToFree)
        release(t, stream);
      scratchToFree.clear();
      if (!check(primName(f.op)))
        return false;
    }
    // Keep only the input gradient; record the tapped gradients first.
    for (size_t v = 0; v < st.values.size(); ++v) {
      if (static_cast<int>(v) == p.gradInput)
        continue;
      const ValueInfo &info = p.values[v];
      if (st.values[v].ptr && info.tap.rfind("grad:", 0) == 0 && static_cast<int>(v) != p.gradOutput)
        tap(info, st.values[v], mb);
    }
    // Losses are read after the step; their buffers move aside until then.
    for (size_t l = 0; l < st.losses.size(); ++l)
      for (DeviceTensor &t : st.values)
        if (st.losses[l] && t.ptr == st.losses[l]) {
          lossBuffers.push_back({{mb, l}, t});
          t = {};
        }
    st.losses.clear();
    for (size_t v = 0; v < st.values.size(); ++v)
      if (static_cast<int>(v) != p.gradInput)
        release(st.values[v], stream);
    for (DeviceTensor &t : st.aux)
      release(t, stream);
    return true;
  }

  void releaseState(Key key) {
    auto it = states.find(key);
    if (it == states.end())
      return;
    for (DeviceTensor &t : it->second.values)
      release(t, dev.compute);
    for (DeviceTensor &t : it->second.aux)
      release(t, dev.compute);
    states.erase(it);
  }

  /// A group of SEND / RECV instructions, issued together.
  bool communicate(const std::vector<const Instr *> &group) {
    cudaEvent_t produced;
    cudaEventCreateWithFlags(&produced, cudaEventDisableTiming);
    cudaEventRecord(produced, dev.compute);
    for (const Instr *i : group)
      if (i->kind == OpKind::Send)
        cudaStreamWaitEvent(dev.sendStream[i->peer], produced, 0);
    cudaEventDestroy(produced);
    ncclGroupStart();
    std::vector<std::pair<const Instr *, Received>> posted;
    for (const Instr *i : group) {
      int64_t count = i->tokens * i->width;
      if (i->kind == OpKind::Send) {
        Key key{i->srcStage, i->mb};
        auto it = states.find(key);
        const StageProgram &p = program(i->srcStage);
        int value = i->payload == Payload::Activation ? p.output : p.gradInput;
        if (it == states.end() || !it->second.values[value].ptr) {
          ncclGroupEnd();
          return fail(i->describe() + ": nothing to send (computed? freed?)");
        }
        ncclSend(it->second.values[value].ptr, count, ncclFloat, 1, dev.sendComm[i->peer],
                 dev.sendStream[i->peer]);
        if (i->payload == Payload::Activation)
          outputPeer[key] = i->peer;
      } else {
        cudaStream_t stream = dev.recvStream[i->peer];
        Received received;
        received.tensor = {allocate(count, stream, false), count};
        if (!received.tensor.ptr) {
          ncclGroupEnd();
          return false;
        }
        ncclRecv(received.tensor.ptr, count, ncclFloat, 0, dev.recvComm[i->peer], stream);
        posted.push_back({i, received});
      }
    }
    ncclResult_t status = ncclGroupEnd();
    if (status != ncclSuccess)
      return fail("NCCL group: " + std::string(ncclGetErrorString(status)));
    for (auto &[i, received] : posted) {
      cudaEventCreateWithFlags(&received.ready, cudaEventDisableTiming);
      cudaEventRecord(received.ready, dev.recvStream[i->peer]);
      (i->payload == Payload::Activation ? actIn : gradIn)[{i->dstStage, i->mb}] = received;
    }
    // A sent input gradient is all that was left of its (stage, mb).
    for (const Instr *i : group)
      if (i->kind == OpKind::Send && i->payload == Payload::Gradient) {
        Key key{i->srcStage, i->mb};
        StageState &st = states[key];
        release(st.values[program(i->srcStage).gradInput], dev.sendStream[i->peer]);
        releaseState(key);
      }
    return check("communication");
  }

  /// Executes this rank's instruction list for one step.
  bool runPipeline(const std::vector<std::vector<int32_t>> &hostTokens) {
    prepareCsrs(hostTokens);
    const auto &list = a.ranks[r];
    for (size_t index = 0; index < list.size() && error.empty(); ++index) {
      const Instr &i = list[index];
      where = "instruction #" + std::to_string(index) + " " + i.describe();
      switch (i.kind) {
      case OpKind::Forward:
        forward(i.stage, i.mb);
        break;
      case OpKind::Backward:
      case OpKind::BackwardInput:
        backward(i.stage, i.mb);
        break;
      case OpKind::BackwardWeight:
        break; // computed inside B, as on the CPU backend
      case OpKind::Send:
      case OpKind::Recv: {
        std::vector<const Instr *> group;
        size_t end = index;
        while (end < list.size() && list[end].isComm() && list[end].group == i.group)
          group.push_back(&list[end++]);
        communicate(group);
        index = end - 1;
        break;
      }
      case OpKind::Free: {
        Key key{i.stage, i.mb};
        auto it = states.find(key);
        auto peer = outputPeer.find(key);
        if (it == states.end() || peer == outputPeer.end()) {
          fail("FREE of an output that was not sent");
          break;
        }
        // Stream-ordered behind the send: the memory returns to the pool
        // once the send has completed, without blocking the host.
        release(it->second.values[program(i.stage).output], dev.sendStream[peer->second]);
        outputPeer.erase(peer);
        break;
      }
      case OpKind::Optimizer:
        break;
      }
    }
    where = "end of step";
    if (!error.empty())
      return false;
    if (!waitStreams(allStreams(), "the pipeline"))
      return false;
    // Read the losses of this rank's last-stage microbatches.
    for (auto &[at, tensor] : lossBuffers) {
      float value = 0;
      cudaMemcpy(&value, tensor.ptr, sizeof value, cudaMemcpyDeviceToHost);
      losses[at.first][at.second] = value;
      release(tensor, dev.compute);
    }
    lossBuffers.clear();
    for (auto &[key, tensor] : tapBuffers) {
      std::vector<float> host(tensor.count);
      cudaMemcpy(host.data(), tensor.ptr, tensor.count * sizeof(float), cudaMemcpyDeviceToHost);
      release(tensor, dev.compute);
      taps[key] = std::move(host);
    }
    tapBuffers.clear();
    for (auto &[name, startEvent, endEvent] : timings) {
      float ms = 0;
      cudaEventElapsedTime(&ms, startEvent, endEvent);
      profileMs[name] += ms;
      cudaEventDestroy(startEvent);
      cudaEventDestroy(endEvent);
    }
    timings.clear();
    for (auto it = states.begin(); it != states.end();)
      releaseState((it++)->first);
    return check("end of the pipeline");
  }
};

struct GpuTrainer::Impl {
  Artifact a;
  const TokenDataset &data;
  TrainOptions options;
  std::vector<std::unique_ptr<RankWorker>> workers; // every rank in-process, or this process's one
  std::atomic<bool> failed{false};
  std::vector<std::vector<float>> weights; // parameters(), downloaded on request
  int64_t stepsDone = 0;
  bool broken = false;

  Impl(Artifact artifact, const TokenDataset &d, TrainOptions o)
      : a(std::move(artifact)), data(d), options(std::move(o)) {}

  ~Impl() {
    if (broken)
      for (auto &worker : workers)
        worker->abort();
  }

  /// Runs `body(worker, index)` for every worker, each on its own thread when there
  /// are several (the ranks block on each other inside NCCL).
  template <typename Body> bool forEachWorker(Body body) {
    if (workers.size() == 1)
      return body(*workers[0], 0) || (failed = true, false);
    std::vector<std::thread> threads;
    std::vector<char> ok(workers.size(), 0);
    for (size_t k = 0; k < workers.size(); ++k)
      threads.emplace_back([&, k] {
        ok[k] = body(*workers[k], k);
        if (!ok[k])
          failed = true;
      });
    for (std::thread &t : threads)
      t.join();
    return std::all_of(ok.begin(), ok.end(), [](char v) { return v != 0; });
  }

  /// The first error that is not just "another rank failed".
  std::string firstError() {
    std::string fallback;
    for (auto &worker : workers) {
      if (worker->error.empty())
        continue;
      if (worker->error.find("another rank failed") == std::string::npos)
        return worker->error;
      if (fallback.empty())
        fallback = worker->error;
    }
    return fallback.empty() ? "unknown failure" : fallback;
  }

  std::string fail() {
    broken = true;
    for (auto &worker : workers)
      worker->abort();
    return firstError();
  }

  std::optional<StepResult> step(std::string &error) {
    if (broken) {
      error = "the trainer failed before and cannot continue";
      return std::nullopt;
    }
    auto start = std::chrono::steady_clock::now();
    const ModelInfo &m = a.model;
    std::vector<std::vector<int32_t>> tokens(a.microbatches, std::vector<int32_t>(m.tokens())),
        labels(a.microbatches, std::vector<int32_t>(m.tokens()));
    for (int64_t mb = 0; mb < a.microbatches; ++mb)
      data.sample(options.dataSeed, stepsDone, mb, m.seqLen, m.microBatch, tokens[mb].data(), labels[mb].data());
    const int64_t stepNumber = stepsDone + 1;
    std::vector<StepResult> results(workers.size());
    bool ok = forEachWorker([&](RankWorker &worker, size_t k) {
      return worker.step(stepNumber, tokens, labels, results[k]);
    });
    if (!ok) {
      error = fail();
      return std::nullopt;
    }
    StepResult result = std::move(results[0]);
    for (size_t k = 1; k < results.size(); ++k) {
      result.taps.merge(results[k].taps);
      result.paramGrads.merge(results[k].paramGrads);
      for (auto &[name, ms] : results[k].profileMs)
        result.profileMs[name] += ms;
    }
    result.step = ++stepsDone;
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    result.tokens = a.microbatches * m.tokens();
    return result;
  }
};

void prepareCudaEnvironment() {
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1", /*overwrite=*/0);
  setenv("NCCL_LAUNCH_MODE", "GROUP", /*overwrite=*/0);
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
}

GpuTrainer::GpuTrainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuTrainer::~GpuTrainer() = default;

std::unique_ptr<GpuTrainer> GpuTrainer::create(Artifact artifact, const TokenDataset &data, TrainOptions options,
                                               std::string &error) {
  auto impl = std::make_unique<Impl>(std::move(artifact), data, std::move(options));
  const Artifact &a = impl->a;
  error = missingGpus(queryGpus(), a.pp);
  if (!error.empty())
    return nullptr;
  for (int64_t r = 0; r < a.pp; ++r)
    impl->workers.push_back(
        std::make_unique<RankWorker>(a, impl->options, r, static_cast<int>(r), &impl->failed));
  for (auto &worker : impl->workers)
    if (!worker->setupDevice()) {
      error = impl->fail();
      return nullptr;
    }
  CommIds ids;
  error = makeCommIds(impl->workers[0]->communicating().size(), ids);
  if (!error.empty())
    return nullptr;
  if (!impl->forEachWorker([&](RankWorker &worker, size_t) { return worker.setupComms(ids); })) {
    error = impl->fail();
    return nullptr;
  }
  return std::unique_ptr<GpuTrainer>(new GpuTrainer(std::move(impl)));
}

std::unique_ptr<GpuTrainer> GpuTrainer::createRank(Artifact artifact, const TokenDataset &data, TrainOptions options,
                                                   const ProcessPlacement &placement, Bootstrap &bootstrap,
                                                   std::string &error) {
  auto impl = std::make_unique<Impl>(std::move(artifact), data, std::move(options));
  const Artifact &a = impl->a;
  const std::string who = "rank " + std::to_string(placement.rank) + ": ";
  if (placement.size != a.pp) {
    error = who + placement.launcher + " started " + std::to_string(placement.size) +
            " processes, but the artifact has pp = " + std::to_string(a.pp) +
            " pipeline ranks; start exactly one process per rank";
    return nullptr;
  }
  GpuInventory gpus = queryGpus();
  if (gpus.gpus.empty()) {
    error = who + "no GPU is visible (" + gpus.unavailableReason + ")";
    return nullptr;
  }
  int device = deviceForRank(placement, static_cast<int>(gpus.gpus.size()), error);
  if (device < 0)
    return nullptr;
  impl->workers.push_back(std::make_unique<RankWorker>(a, impl->options, placement.rank, device, nullptr));
  RankWorker &worker = *impl->workers[0];
  if (!worker.setupDevice()) {
    error = impl->fail();
    return nullptr;
  }
  std::string bytes;
  if (placement.rank == 0) {
    CommIds ids;
    error = makeCommIds(worker.communicating().size(), ids);
    if (!error.empty()) {
      error = who + error;
      return nullptr;
    }
    bytes = ids.serialize();
  }
  if (!bootstrap.broadcast(bytes, error)) {
    error = who + error;
    return nullptr;
  }
  CommIds ids;
  if (!CommIds::parse(bytes, worker.communicating().size(), ids)) {
    error = who + "the NCCL ids from rank 0 do not fit this artifact (was every rank given the same artifact?)";
    return nullptr;
  }
  if (!worker.setupComms(ids)) {
    error = impl->fail();
    return nullptr;
  }
  return std::unique_ptr<GpuTrainer>(new GpuTrainer(std::move(impl)));
}

std::optional<StepResult> GpuTrainer::step(std::string &error) { return impl_->step(error); }

const std::vector<std::vector<float>> &GpuTrainer::parameters() const {
  impl_->weights.assign(impl_->a.params.size(), {});
  for (auto &worker : impl_->workers)
    worker->downloadOwned(impl_->weights);
  return impl_->weights;
}

} // namespace mhcc::runtime
