//===- CudaRank.cpp - setup, memory and step boundaries of a GPU rank -------===//
#include "runtime/cuda/CudaRank.h"

#include "runtime/cpu/Bf16.h"
#include "runtime/cpu/Kernels.h"
#include "runtime/cuda/DeviceKernels.h"
#include "runtime/cuda/Gpus.h"
#include "runtime/train/ParamRemainders.h"
#include "runtime/train/Parameters.h"

#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <set>
#include <thread>

namespace mhcc::runtime::cuda {
namespace {

/// MHCC_MHC_FORWARD: "unfused", "entry", "cluster" (opt-in until measured
/// on a GPU), else (unset) both fusions.
MhcForwardFusion mhcForwardFusionFromEnvironment() {
  const char *value = std::getenv("MHCC_MHC_FORWARD");
  const std::string mode = value ? value : "";
  return mode == "unfused"   ? MhcForwardFusion::Unfused
         : mode == "entry"   ? MhcForwardFusion::Entry
         : mode == "cluster" ? MhcForwardFusion::PostResAndEntryInClusters
                             : MhcForwardFusion::PostResAndEntry;
}

/// MHCC_MHC_BACKWARD: "kernels", "passes" or "" (unset: the default).
std::string mhcBackwardMode() {
  const char *value = std::getenv("MHCC_MHC_BACKWARD");
  return value ? value : "";
}

/// MHCC_POISON_ALLOCATIONS=1 (a debugging aid): every buffer a step
/// allocates without zeros starts as all-ones bytes (NaN in fp32 and bf16,
/// -1 in int32), so a kernel that reads an element before anything wrote it
/// shows as NaN in the losses at once, instead of as bits that depend on
/// what an earlier buffer (or another rank sharing the GPU) left there.
bool poisonFromEnvironment() {
  const char *value = std::getenv("MHCC_POISON_ALLOCATIONS");
  return value && std::string(value) == "1";
}

} // namespace

std::string cudaWhat(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}

CudaRank::CudaRank(const Artifact &artifact, const TrainOptions &options, int64_t rank, int gpu,
                   const std::atomic<bool> *peerFailed)
    : a_(artifact), options_(options), rank_(rank), pipe_(artifact.pipelineRankOf(rank)),
      replica_(artifact.replicaOf(rank)), context_(artifact.contextRankOf(rank)), tensor_(artifact.tensorRankOf(rank)),
      rows_(artifact.rowsPerRank()), gemmRows_(artifact.model.tokens() / artifact.cp),
      contextRows_(artifact.contextRows(context_)), sharded_(artifact.optimizerParts() > 1),
      member_(artifact.reduceMemberOf(rank)),
      partMasters_(sharded_ && artifact.model.dtype == "bf16"),
      keepRemainders_(options.storeParamRemainders && artifact.model.dtype == "bf16"),
      gpu_(gpu),
      peerFailed_(peerFailed),
      plans_(planParameters(artifact)), pairs_(communicatingPairs(artifact, plans_)),
      bf16_(artifact.model.dtype == "bf16"),
      wideResidual_(artifact.model.residualStorage() != artifact.model.dtype),
      mhcForwardFusion_(wideResidual_ ? MhcForwardFusion::Unfused : mhcForwardFusionFromEnvironment()),
      mixBackward_(bf16_ && !wideResidual_ && mhcBackwardMode() != "kernels"),
      passAInPassC_(mixBackward_ && mhcBackwardMode() != "passes"), poison_(poisonFromEnvironment()) {
  for (const StageProgram &p : artifact.stages)
    mixGroups_.push_back(mixBackward_ ? findMixGroups(p) : std::vector<MixGroup>{});
}

CudaRank::~CudaRank() {
  cudaSetDevice(gpu_);
  links_.reset();
  for (auto *group : {&weights_, &adamM_, &adamV_, &reduced_})
    for (auto &[p, ptr] : *group)
      cudaFree(ptr);
  for (auto &[k, ptr] : slotGrads_)
    cudaFree(ptr);
  for (auto &[k, ptr] : lowWeights_)
    cudaFree(ptr);
  for (auto &[k, ptr] : remainders_)
    cudaFree(ptr);
  cudaFree(rowMap_);
  for (int32_t *p : tokens_)
    cudaFree(p);
  for (int32_t *p : labels_)
    cudaFree(p);
  for (auto *group : {&positions_, &firstKeys_})
    for (int32_t *p : *group)
      cudaFree(p);
  cudaFree(stats_);
  cudaFree(statTensors_);
  cudaFree(sharedStats_);
  cudaFree(arena_);
  for (auto &[key, pointers] : csrs_) {
    cudaFree(pointers.first);
    cudaFree(pointers.second);
  }
  for (cudaEvent_t event : freeEvents_)
    if (event)
      cudaEventDestroy(event);
  for (auto &[stream, marks] : progressMarks_)
    for (cudaEvent_t event : marks)
      cudaEventDestroy(event);
  for (cudaEvent_t event : spareMarks_)
    cudaEventDestroy(event);
  gemms_.reset();
}

bool CudaRank::fail(const std::string &message) {
  if (error_.empty())
    error_ = message;
  return false;
}

bool CudaRank::check(const char *what) {
  std::string e = kernels_ ? kernels_->takeError() : std::string();
  if (e.empty() && gemms_)
    e = gemms_->takeError();
  if (e.empty())
    e = lastError(what);
  return e.empty() || fail(e);
}

void CudaRank::upload(void *device, const void *host, size_t bytes) {
  // Not cudaMemcpy: from pageable memory it may return before its DMA has
  // landed (on the legacy stream, which the non-blocking compute stream does
  // not wait for), so a kernel right after it could read old bytes: session
  // 30's one odd run (docs/gpu_results.md) fits. Here the host bytes are
  // staged before the call returns, and the DMA is ordered on the stream.
  cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, compute_);
}

float *CudaRank::deviceBuffer(size_t bytes, const std::string &what) {
  void *ptr = nullptr;
  if (cudaMalloc(&ptr, std::max<size_t>(bytes, 4)) != cudaSuccess) {
    fail("out of GPU memory for " + what);
    return nullptr;
  }
  staticBytes_ += static_cast<int64_t>(bytes);
  // On the compute stream, as the uploads after it: a cudaMemset runs on the
  // legacy stream, which the compute stream does not wait for (it could
  // land after an upload and zero the weights).
  cudaMemsetAsync(ptr, 0, bytes, compute_);
  return static_cast<float *>(ptr);
}

bool CudaRank::setupDevice() {
  for (const StageProgram &p : a_.stages)
    for (const ForwardInstr &f : p.forward) // f.heads: this rank's heads, of C / tp
      if (f.op == Prim::GatedDeltaNet && !gdnHeadDimSupported(a_.model.hidden / a_.tp / f.heads))
        return fail(gdnHeadDimError(a_.model.hidden / a_.tp / f.heads));
  std::string problem = gpuSelfTest(gpu_);
  if (!problem.empty())
    return fail(problem);
  cudaSetDevice(gpu_);
  cudaMemPool_t pool;
  cudaDeviceGetDefaultMemPool(&pool, gpu_);
  uint64_t keep = UINT64_MAX; // the pool keeps what it has, for the next steps to reuse
  cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  if (cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking) != cudaSuccess)
    return fail("cannot create a stream on GPU " + std::to_string(gpu_));
  gemms_ = std::make_unique<Gemms>();
  if (std::string problem = gemms_->init(compute_); !problem.empty())
    return fail(problem + " on GPU " + std::to_string(gpu_));
  if (!a_.deviceCode)
    return fail("the artifact carries no CUDA kernels (compiled with --cuda-arch none, or where nvcc was not "
                "found); recompile it with 'mhcc --cuda-arch sm_90', or run it with --backend cpu");
  std::string loadError;
  if (!(kernels_ = ModelKernels::load(*a_.deviceCode, gpu_, int(a_.model.dtypeBytes()),
                                            int(a_.model.residualBytes()), loadError)))
    return fail(loadError);
  for (size_t param = 0; param < a_.params.size(); ++param) {
    const ParamPlan &plan = plans_[param];
    if (!std::binary_search(plan.holders.begin(), plan.holders.end(), pipe_))
      continue;
    const ParamInfo &info = a_.params[param];
    const size_t bytes = held(param) * sizeof(float);
    const auto [masterBegin, masterEnd] = masterRange(param);
    if (masterEnd > masterBegin && keepRemainders_ &&
        !(remainders_[int(param)] = reinterpret_cast<uint16_t *>(
              deviceBuffer((masterEnd - masterBegin) * sizeof(uint16_t), "parameter " + info.name))))
      return false;
    if (masterEnd > masterBegin && !keepRemainders_ &&
        !(weights_[int(param)] = deviceBuffer((masterEnd - masterBegin) * sizeof(float), "parameter " + info.name)))
      return false;
    if (bf16_ && !(lowWeights_[int(param)] = reinterpret_cast<bf16 *>(deviceBuffer(held(param) * 2, info.name))))
      return false;
    const std::vector<float> initial = initialParameter(info, a_.model.seed);
    std::vector<float> block(held(param));
    gatherShard(info, a_.tp, tensor_, initial.data(), block.data());
    if (!uploadWeights(param, block))
      return false;
    const std::string gradient = "the gradient of " + info.name;
    if (plan.owner == pipe_) {
      const auto [begin, end] = ownShard(param);
      const size_t partBytes = (end - begin) * sizeof(float); // what this member updates
      if (options_.optimizer != "sgd" &&
          (!(adamM_[int(param)] = deviceBuffer(partBytes, "the Adam state of " + info.name)) ||
           !(adamV_[int(param)] = deviceBuffer(partBytes, "the Adam state of " + info.name))))
        return false;
      if (plan.uses.size() > 1 &&
          !(reduced_[int(param)] = deviceBuffer(std::max(partBytes, sizeof(float)), gradient)))
        return false;
    }
    for (const ParamUse &use : plan.uses)
      if (use.rank == pipe_ && !(slotGrads_[{use.stage, use.slot}] = deviceBuffer(bytes, gradient)))
        return false;
  }
  tokens_.assign(a_.microbatches, nullptr);
  labels_.assign(a_.microbatches, nullptr);
  for (int64_t mb = 0; mb < a_.microbatches; ++mb)
    if (cudaMalloc(&tokens_[mb], a_.model.tokens() * sizeof(int32_t)) != cudaSuccess ||
        cudaMalloc(&labels_[mb], a_.model.tokens() * sizeof(int32_t)) != cudaSuccess)
      return fail("out of GPU memory for the token ids");
  staticBytes_ += 2 * a_.microbatches * a_.model.tokens() * int64_t(sizeof(int32_t));
  if (!contextRows_.empty()) { // the kernels that read token ids or labels find each row's through it
    const std::vector<int32_t> rowMap(contextRows_.begin(), contextRows_.end());
    if (cudaMalloc(&rowMap_, rowMap.size() * sizeof(int32_t)) != cudaSuccess)
      return fail("out of GPU memory for the context-parallel row map");
    upload(rowMap_, rowMap.data(), rowMap.size() * sizeof(int32_t));
    staticBytes_ += int64_t(rowMap.size() * sizeof(int32_t));
  }
  for (auto [wanted, group] : {std::pair{options_.resetPositionIds, &positions_},
                               std::pair{options_.resetAttentionMask, &firstKeys_}}) {
    if (!wanted)
      continue;
    group->assign(a_.microbatches, nullptr);
    for (int32_t *&p : *group)
      if (cudaMalloc(&p, a_.model.tokens() * sizeof(int32_t)) != cudaSuccess)
        return fail("out of GPU memory for the packed documents' positions");
    staticBytes_ += a_.microbatches * a_.model.tokens() * int64_t(sizeof(int32_t));
  }
  for (size_t p = 0; p < a_.params.size(); ++p) {
    const int64_t chunk = Artifact::gradientChunk(held(p));
    firstChunk_.push_back(firstChunk_.back() + (held(p) + chunk - 1) / chunk);
  }
  // shareStatistics' all-reduce: squares and zeros per chunk and tensor rank, losses,
  // then peak bytes, reserved bytes and stop signal per rank.
  const size_t sharedCount = 2 * statChunks() * a_.tp +
                             a_.dp * a_.microbatches * a_.stages.back().losses.size() * a_.cp + 3 * a_.worldSize();
  if (cudaMalloc(&stats_, (2 * statChunks() + 1) * sizeof(double)) != cudaSuccess ||
      cudaMalloc(&statTensors_, a_.params.size() * sizeof(StatsTensor)) != cudaSuccess ||
      cudaMalloc(&sharedStats_, sharedCount * sizeof(double)) != cudaSuccess)
    return fail("out of GPU memory for the gradient statistics");
  refreshLowWeights();
  cudaDeviceSynchronize(); // setup's work lands before any step's, on any stream
  return check("setup");
}

std::pair<int64_t, int64_t> CudaRank::masterRange(size_t p) const {
  if (!copiesLead())
    return {0, held(p)};
  return plans_[p].owner == pipe_ ? ownShard(p) : std::pair<int64_t, int64_t>{0, 0};
}

bool CudaRank::uploadWeights(size_t p, const std::vector<float> &block) {
  const auto [begin, end] = masterRange(p);
  if (keepRemainders_) { // the copy and the remainders split on the host from the settled masters
    std::vector<uint16_t> copy(block.size()), low(end - begin);
    for (size_t e = 0; e < block.size(); ++e) {
      uint32_t bits;
      std::memcpy(&bits, &block[e], sizeof bits);
      bits = settleOffBf16Tie(bits);
      copy[e] = bf16BitsOf(bits);
      if (int64_t(e) >= begin && int64_t(e) < end)
        low[e - begin] = uint16_t(bits & 0xFFFFu);
    }
    upload(lowWeights_.at(int(p)), copy.data(), copy.size() * sizeof(uint16_t));
    if (end > begin)
      upload(remainders_.at(int(p)), low.data(), low.size() * sizeof(uint16_t));
    return check("uploading a parameter");
  }
  if (end > begin)
    upload(weights_.at(int(p)), block.data() + begin, (end - begin) * sizeof(float));
  if (partMasters_) { // no whole master to round the kernels' copy from (refreshLowWeights): round the block
    float *staged = nullptr;
    if (cudaMalloc(&staged, block.size() * sizeof(float)) != cudaSuccess)
      return fail("out of GPU memory staging parameter " + a_.params[p].name);
    upload(staged, block.data(), block.size() * sizeof(float));
    toBf16(staged, lowWeights_.at(int(p)), int64_t(block.size()), compute_);
    cudaStreamSynchronize(compute_);
    cudaFree(staged);
  }
  return check("uploading a parameter");
}

RankLinks::ReplicaShards CudaRank::partsOf(size_t p, void *data, Dtype dtype) const {
  RankLinks::ReplicaShards parts{data, dtype, {}};
  for (int64_t m = 0; m < a_.optimizerParts(); ++m)
    parts.shards.push_back(a_.shardOf(held(p), m));
  return parts;
}

std::pair<int64_t, int64_t> CudaRank::ownShard(size_t p) const {
  const int64_t count = held(p);
  return sharded_ ? a_.shardOf(count, member_) : std::pair<int64_t, int64_t>{0, count};
}

// ---- streams ---------------------------------------------------------------------

cudaStream_t CudaRank::stream(Queue queue) {
  switch (queue.kind) {
  case Queue::Send: return sendStream_.at(queue.peer);
  case Queue::Recv: return recvStream_.at(queue.peer);
  case Queue::Compute: break;
  }
  return compute_;
}

std::vector<cudaStream_t> CudaRank::allStreams() {
  std::vector<cudaStream_t> streams = {compute_};
  for (auto &[peer, st] : sendStream_)
    streams.push_back(st);
  for (auto &[peer, st] : recvStream_)
    streams.push_back(st);
  if (replicaStream_)
    streams.push_back(replicaStream_);
  return streams;
}

void CudaRank::markProgress(cudaStream_t stream) {
  cudaEvent_t event;
  if (!spareMarks_.empty()) {
    event = spareMarks_.back();
    spareMarks_.pop_back();
  } else if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) {
    return; // a mark fewer only makes the wait less patient
  }
  cudaEventRecord(event, stream);
  progressMarks_[stream].push_back(event);
}

bool CudaRank::progressed() {
  bool any = false;
  for (auto &[stream, marks] : progressMarks_) // a stream's marks complete in order
    while (!marks.empty() && cudaEventQuery(marks.front()) == cudaSuccess) {
      spareMarks_.push_back(marks.front());
      marks.pop_front();
      any = true;
    }
  return any;
}

bool CudaRank::waitStreams(const std::vector<cudaStream_t> &streams, const std::string &what, double limitSeconds) {
  using Clock = std::chrono::steady_clock;
  const std::chrono::duration<double> limit(limitSeconds > 0 ? limitSeconds : options_.recvTimeoutSeconds);
  auto lastProgress = Clock::now(), lastLook = lastProgress;
  for (cudaStream_t st : streams) {
    cudaError_t status;
    while ((status = cudaStreamQuery(st)) == cudaErrorNotReady) {
      if (peerFailed_ && peerFailed_->load())
        return fail("stopped while waiting for " + what + ": another rank failed");
      const auto now = Clock::now();
      if (now - lastLook > std::chrono::milliseconds(10)) { // progress marks, 100 times a second
        lastLook = now;
        if (progressed())
          lastProgress = now;
        else if (now - lastProgress > limit) {
          char text[32];
          std::snprintf(text, sizeof text, "%g", limit.count());
          return fail(what + " made no progress for " + text +
                      " s: a peer is stuck or lost (nothing arrived that this GPU waits on), or a collective hangs "
                      "(--recv-timeout sets the limit)");
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (status != cudaSuccess)
      return fail(what + ": " + cudaWhat(status));
    lastProgress = Clock::now(); // a queue drained is progress too
  }
  return true;
}

void CudaRank::follow(cudaStream_t waiter, cudaStream_t producer) {
  cudaEvent_t event;
  cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  cudaEventRecord(event, producer);
  cudaStreamWaitEvent(waiter, event, 0);
  cudaEventDestroy(event);
}

// ---- memory ----------------------------------------------------------------------

int CudaRank::streamId(cudaStream_t stream) {
  auto [it, added] = streamIds_.try_emplace(stream, static_cast<int>(streamById_.size()));
  if (added)
    streamById_.push_back(stream);
  return it->second;
}

PlannedAllocator::Hooks CudaRank::planHooks() {
  return {[this](int buffer, int stream) { cudaEventRecord(freeEvents_[buffer], streamById_[stream]); },
          [this](int stream, int buffer) { cudaStreamWaitEvent(streamById_[stream], freeEvents_[buffer], 0); }};
}

Buffer CudaRank::allocate(int64_t count, Dtype dtype, Queue queue, bool zeroed) {
  cudaStream_t st = stream(queue);
  const Buffer sized{nullptr, count, dtype};
  const int64_t bytes = std::max<int64_t>(4, sized.bytes());
  void *p = nullptr;
  if (planner_.planned()) {
    std::string problem;
    const int64_t offset = planner_.alloc(bytes, streamId(st), planHooks(), problem);
    if (offset < 0) {
      fail(problem);
      return {};
    }
    p = arena_ + offset;
  } else {
    cudaError_t status = cudaMallocAsync(&p, bytes, st);
    if (status != cudaSuccess) {
      fail("out of GPU memory allocating " + std::to_string(bytes) + " bytes (" + cudaWhat(status) + ")");
      return {};
    }
    if (recording_)
      planner_.recordAlloc(bytes, streamId(st), reinterpret_cast<uintptr_t>(p));
  }
  if (zeroed || poison_)
    cudaMemsetAsync(p, zeroed ? 0 : 0xff, sized.bytes(), st);
  live_ += sized.bytes();
  peak_ = std::max(peak_, live_);
  return {static_cast<float *>(p), count, dtype};
}

int64_t CudaRank::auxCount(int64_t stage, size_t index) const {
  const ForwardInstr &f = a_.stages[stage].forward[index];
  // The GEMM primitives keep the rows they see (gemmRows_: the microbatch's,
  // a context rank's share under cp), the others this rank's (rows_: fewer
  // under sequence parallelism); Gated DeltaNet under cp every row's.
  const int64_t T = rows_, G = gemmRows_, C = a_.model.hidden;
  if (f.op == Prim::MhcCoeffs) // the projection and row norms, kept for the backward
    return f.auxSize + mhcCoeffsAuxExtra(T, f.streams);
  if (f.op == Prim::GatedDeltaNet) // and the scans' chunk states, which the backward would otherwise rebuild
    return gdnAuxFloats(a_.cp > 1 ? a_.model.tokens() : G, C / a_.tp, f.heads, f.seqLen); // cp: every row's
  const int actBytes = bf16_ ? 2 : 4; // fp32 models: the artifact's auxSize
  switch (f.op) {
  case Prim::Attention:
    return attentionAuxFloats(G, C / a_.tp, f.heads, actBytes); // this rank's heads
  case Prim::SwiGlu:
    return swigluAuxFloats(G, f.ffn, actBytes);
  default:
    return f.auxSize;
  }
}

void CudaRank::release(Buffer &buffer, Queue queue) {
  if (!buffer)
    return;
  cudaStream_t st = stream(queue);
  if (poison_) // a read after the release shows as NaN, not as the old bits
    cudaMemsetAsync(buffer.data, 0xff, buffer.bytes(), st);
  std::string problem;
  if (planner_.planned()) {
    if (!planner_.free(reinterpret_cast<char *>(buffer.data) - arena_, streamId(st), planHooks(), problem))
      fail(problem);
  } else {
    cudaFreeAsync(buffer.data, st);
    if (recording_ && !planner_.recordFree(reinterpret_cast<uintptr_t>(buffer.data), streamId(st), problem))
      fail(problem);
  }
  live_ -= buffer.bytes();
  buffer = {};
}

void CudaRank::copy(Buffer dst, const Buffer &src) {
  timeline_.work(compute_);
  cudaMemcpyAsync(dst.data, src.data, std::min(dst.bytes(), src.bytes()), cudaMemcpyDeviceToDevice, compute_);
}

bool CudaRank::download(const Buffer &buffer, float *host) {
  std::vector<uint16_t> halves(buffer.dtype == Dtype::BF16 ? buffer.count : 0);
  void *target = halves.empty() ? static_cast<void *>(host) : halves.data();
  cudaError_t status = cudaMemcpy(target, buffer.data, buffer.bytes(), cudaMemcpyDeviceToHost);
  for (size_t i = 0; i < halves.size(); ++i) { // bf16 is the upper half of a float
    const uint32_t bits = uint32_t(halves[i]) << 16;
    std::memcpy(&host[i], &bits, 4);
  }
  return status == cudaSuccess || fail("reading back a result: " + cudaWhat(status));
}

/// After the recorded first step: plan, hand the pool's memory back, and
/// take one arena for every later step.
bool CudaRank::adoptMemoryPlan() {
  std::string problem;
  if (!planner_.finishRecording(256, problem))
    return fail(problem);
  cudaDeviceSynchronize();
  cudaMemPool_t pool;
  cudaDeviceGetDefaultMemPool(&pool, gpu_);
  cudaMemPoolTrimTo(pool, 0);
  const MemoryPlan &plan = planner_.plan();
  if (cudaMalloc(&arena_, std::max<int64_t>(plan.arenaBytes, 256)) != cudaSuccess)
    return fail("out of GPU memory for the planned arena of " + std::to_string(plan.arenaBytes) + " bytes");
  freeEvents_.assign(plan.freeIsWaitedOn.size(), nullptr);
  for (size_t b = 0; b < freeEvents_.size(); ++b)
    if (plan.freeIsWaitedOn[b])
      cudaEventCreateWithFlags(&freeEvents_[b], cudaEventDisableTiming);
  return check("memory plan");
}

// ---- step boundaries -------------------------------------------------------------

/// Rows reading each vocabulary entry, ascending, for the embedding
/// backward without atomics; built and uploaded before the step starts.
void CudaRank::prepareCsrs(const StepInputs &inputs) {
  const ModelInfo &m = a_.model;
  std::set<std::pair<int64_t, int64_t>> uploaded;
  for (size_t s = pipe_; s < a_.stages.size(); s += a_.pp)
    for (const ForwardInstr &f : a_.stages[s].forward) {
      if (f.op != Prim::Embed)
        continue;
      for (int64_t mb = 0; mb < a_.microbatches; ++mb) {
        if (!uploaded.insert({mb, f.shift}).second)
          continue;
        // The embedding's rows: this rank's (gemmRows_: a context-parallel
        // rank's share of the microbatch, contextRows_ naming each one's row).
        const std::vector<int32_t> &tokens = inputs.tokens[mb];
        auto tokenOf = [&](int64_t t) {
          const int64_t row = contextRows_.empty() ? t : contextRows_[t];
          return tokens[kernels::shiftedRow(row, f.shift, m.seqLen)];
        };
        std::vector<int32_t> offsets(m.vocab + 1, 0), positions(gemmRows_);
        for (int64_t t = 0; t < gemmRows_; ++t)
          ++offsets[tokenOf(t) + 1];
        for (int64_t v = 0; v < m.vocab; ++v)
          offsets[v + 1] += offsets[v];
        std::vector<int32_t> cursor(offsets.begin(), offsets.end() - 1);
        for (int64_t t = 0; t < gemmRows_; ++t)
          positions[cursor[tokenOf(t)]++] = int32_t(t);
        // Device buffers of a fixed size, taken at the first step and kept.
        auto &[dOffsets, dPositions] = csrs_[{mb, f.shift}];
        if (!dOffsets) {
          cudaMalloc(&dOffsets, offsets.size() * 4);
          cudaMalloc(&dPositions, positions.size() * 4);
        }
        upload(dOffsets, offsets.data(), offsets.size() * 4);
        upload(dPositions, positions.data(), positions.size() * 4);
      }
    }
}

bool CudaRank::beginStep(const StepInputs &inputs) {
  cudaSetDevice(gpu_);
  ++stepsRun_;
  exchanged_ = false;
  evaluating_ = inputs.evaluateOnly;
  deferredMix_.clear(); // a failed step's leftovers
  for (auto &[key, partials] : postPartials_)
    release(partials, Queue::compute());
  postPartials_.clear();
  live_ = peak_ = staticBytes_;
  for (int64_t mb = 0; mb < a_.microbatches; ++mb) {
    upload(tokens_[mb], inputs.tokens[mb].data(), a_.model.tokens() * 4);
    upload(labels_[mb], inputs.labels[mb].data(), a_.model.tokens() * 4);
    if (!positions_.empty())
      upload(positions_[mb], inputs.positions[mb].data(), a_.model.tokens() * 4);
    if (!firstKeys_.empty())
      upload(firstKeys_[mb], inputs.firstKeys[mb].data(), a_.model.tokens() * 4);
  }
  for (auto &[key, g] : slotGrads_)
    cudaMemsetAsync(g, 0, held(a_.stages[key.first].params[key.second].param) * 4, compute_);
  prepareCsrs(inputs);
  recording_ = options_.staticMemoryPlan && !planner_.planned();
  if (options_.trace && !timeline_.startStep(compute_))
    return check("the trace's clock event");
  return check("start of step");
}

bool CudaRank::finishPipeline() {
  if (!waitStreams(allStreams(), "the pipeline"))
    return false;
  for (auto &[name, start, end] : timings_) {
    float ms = 0;
    cudaEventElapsedTime(&ms, start, end);
    profileMs_[name] += ms;
    cudaEventDestroy(start);
    cudaEventDestroy(end);
  }
  timings_.clear();
  return check("end of the pipeline");
}

void CudaRank::markStart(cudaEvent_t &start) {
  if (!options_.profile)
    return;
  cudaEventCreate(&start);
  cudaEventRecord(start, compute_);
}

void CudaRank::markEnd(const std::string &name, cudaEvent_t start) {
  if (!options_.profile)
    return;
  cudaEvent_t end;
  cudaEventCreate(&end);
  cudaEventRecord(end, compute_);
  timings_.emplace_back("rank " + std::to_string(rank_) + " " + name, start, end);
}

void CudaRank::beginInstruction(const std::string &name) {
  nvtxRangePushA(name.c_str());
  if (options_.trace)
    timeline_.openBracket();
}

void CudaRank::endInstruction() {
  if (options_.trace)
    timeline_.closeBracket(compute_);
  nvtxRangePop();
}

bool CudaRank::instructionTimes(std::vector<DeviceInterval> &intervals) {
  std::string why;
  return timeline_.read(intervals, why) || fail(why);
}

void CudaRank::takeProfile(std::map<std::string, double> &profileMs) {
  for (auto &[name, ms] : profileMs_)
    profileMs[name] += ms;
  profileMs_.clear();
}

void CudaRank::abort() {
  if (links_)
    links_->abort();
}

} // namespace mhcc::runtime::cuda
