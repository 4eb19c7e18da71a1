//===- GpuTrainer.cpp - training steps on the CUDA backend -------------------===//
#include "runtime/cuda/GpuTrainer.h"

#include "runtime/cpu/Kernels.h"
#include "runtime/cuda/DeviceKernels.h"
#include "runtime/gpu/Gpus.h"
#include "runtime/train/Optimizer.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

namespace mhcc::runtime {
namespace {

using Key = std::pair<int64_t, int64_t>; // (stage, microbatch)

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

} // namespace

struct GpuTrainer::Impl {
  Artifact a;
  const TokenDataset &data;
  TrainOptions options;
  std::vector<std::vector<float>> weights, adamM, adamV;
  int64_t stepsDone = 0;

  struct Rank {
    int device = 0;
    cudaStream_t compute = nullptr;
    cublasHandle_t blas = nullptr;
    std::map<int, float *> weights;                 // parameter -> device copy
    std::map<std::pair<int64_t, int>, float *> slotGrads; // (stage, slot) -> device buffer
    std::map<int64_t, ncclComm_t> sendComm, recvComm;     // by peer
    std::map<int64_t, cudaStream_t> sendStream, recvStream;
    std::vector<int32_t *> tokens, labels;          // device, by microbatch
    int64_t live = 0, peak = 0;
  };
  std::vector<Rank> ranks;
  std::vector<ncclComm_t> allComms;

  Impl(Artifact artifact, const TokenDataset &d, TrainOptions o)
      : a(std::move(artifact)), data(d), options(std::move(o)) {}

  ~Impl() {
    for (ncclComm_t comm : allComms)
      ncclCommDestroy(comm);
    for (Rank &r : ranks) {
      cudaSetDevice(r.device);
      for (auto &[p, ptr] : r.weights)
        cudaFree(ptr);
      for (auto &[k, ptr] : r.slotGrads)
        cudaFree(ptr);
      for (int32_t *p : r.tokens)
        cudaFree(p);
      for (int32_t *p : r.labels)
        cudaFree(p);
      if (r.blas)
        cublasDestroy(r.blas);
    }
  }

  std::string setup() {
    GpuInventory gpus = queryGpus();
    if (static_cast<int64_t>(gpus.gpus.size()) < a.pp)
      return "the artifact has pp = " + std::to_string(a.pp) + " pipeline ranks and needs one GPU each, but " +
             std::to_string(gpus.gpus.size()) + " GPU(s) are visible" +
             (gpus.gpus.empty() ? " (" + gpus.unavailableReason + ")" : "") +
             "; recompile with a smaller --pp or run on more GPUs";
    for (const ParamInfo &info : a.params) {
      weights.push_back(initialParameter(info, a.model.seed));
      adamM.emplace_back(info.count(), 0.0f);
      adamV.emplace_back(info.count(), 0.0f);
    }
    ranks.resize(a.pp);
    for (int64_t r = 0; r < a.pp; ++r) {
      Rank &rank = ranks[r];
      rank.device = static_cast<int>(r);
      std::string problem = gpuSelfTest(rank.device);
      if (!problem.empty())
        return "rank " + std::to_string(r) + ": " + problem;
      cudaSetDevice(rank.device);
      cudaMemPool_t pool;
      cudaDeviceGetDefaultMemPool(&pool, rank.device);
      uint64_t keep = UINT64_MAX; // the pool keeps what it has: no cudaMalloc after warm-up
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
      if (cudaStreamCreateWithFlags(&rank.compute, cudaStreamNonBlocking) != cudaSuccess ||
          cublasCreate(&rank.blas) != CUBLAS_STATUS_SUCCESS)
        return "rank " + std::to_string(r) + ": cannot create a stream or a cuBLAS handle";
      cublasSetStream(rank.blas, rank.compute);
      cublasSetMathMode(rank.blas, CUBLAS_PEDANTIC_MATH); // fp32, no TF32
      for (size_t s = r; s < a.stages.size(); s += a.pp)
        for (size_t k = 0; k < a.stages[s].params.size(); ++k) {
          int param = a.stages[s].params[k].param;
          size_t bytes = a.params[param].count() * sizeof(float);
          if (!rank.weights.count(param)) {
            float *w = nullptr;
            if (cudaMalloc(&w, bytes) != cudaSuccess)
              return "rank " + std::to_string(r) + ": out of GPU memory for parameter " + a.params[param].name;
            rank.weights[param] = w;
          }
          float *g = nullptr;
          if (cudaMalloc(&g, bytes) != cudaSuccess)
            return "rank " + std::to_string(r) + ": out of GPU memory for the gradient of " + a.params[param].name;
          rank.slotGrads[{int64_t(s), int(k)}] = g;
        }
      rank.tokens.assign(a.microbatches, nullptr);
      rank.labels.assign(a.microbatches, nullptr);
      for (int64_t mb = 0; mb < a.microbatches; ++mb) {
        cudaMalloc(&rank.tokens[mb], a.model.tokens() * sizeof(int32_t));
        cudaMalloc(&rank.labels[mb], a.model.tokens() * sizeof(int32_t));
      }
    }
    // One communicator and one stream per directed pair that exchanges messages.
    std::map<std::pair<int64_t, int64_t>, bool> pairs;
    for (int64_t r = 0; r < a.pp; ++r)
      for (const Instr &i : a.ranks[r])
        if (i.kind == OpKind::Send)
          pairs[{r, i.peer}] = true;
    for (const auto &[pair, unused] : pairs) {
      ncclComm_t comms[2];
      int devices[2] = {ranks[pair.first].device, ranks[pair.second].device};
      ncclResult_t status = ncclCommInitAll(comms, 2, devices);
      if (status != ncclSuccess)
        return "NCCL setup between ranks " + std::to_string(pair.first) + " and " + std::to_string(pair.second) +
               " failed: " + ncclGetErrorString(status);
      allComms.push_back(comms[0]);
      allComms.push_back(comms[1]);
      ranks[pair.first].sendComm[pair.second] = comms[0];
      ranks[pair.second].recvComm[pair.first] = comms[1];
      cudaSetDevice(ranks[pair.first].device);
      cudaStreamCreateWithFlags(&ranks[pair.first].sendStream[pair.second], cudaStreamNonBlocking);
      cudaSetDevice(ranks[pair.second].device);
      cudaStreamCreateWithFlags(&ranks[pair.second].recvStream[pair.first], cudaStreamNonBlocking);
      // Connect now: NCCL otherwise connects peers lazily at their first
      // message, a host-side handshake that would block a rank thread.
      float *probe[2] = {nullptr, nullptr};
      for (int k = 0; k < 2; ++k) {
        cudaSetDevice(devices[k]);
        cudaMalloc(&probe[k], sizeof(float));
      }
      ncclGroupStart();
      ncclSend(probe[0], 1, ncclFloat, 1, comms[0], ranks[pair.first].sendStream[pair.second]);
      ncclRecv(probe[1], 1, ncclFloat, 0, comms[1], ranks[pair.second].recvStream[pair.first]);
      status = ncclGroupEnd();
      for (int k = 0; k < 2; ++k) {
        cudaSetDevice(devices[k]);
        cudaDeviceSynchronize();
        cudaFree(probe[k]);
      }
      if (status != ncclSuccess)
        return "NCCL connection between ranks " + std::to_string(pair.first) + " and " +
               std::to_string(pair.second) + " failed: " + ncclGetErrorString(status);
    }
    return uploadWeights();
  }

  std::string uploadWeights() {
    for (Rank &rank : ranks) {
      cudaSetDevice(rank.device);
      for (auto &[param, ptr] : rank.weights)
        if (cudaMemcpy(ptr, weights[param].data(), weights[param].size() * sizeof(float),
                       cudaMemcpyHostToDevice) != cudaSuccess)
          return "cannot upload parameter " + a.params[param].name;
    }
    return "";
  }

  // ---- one rank's step ------------------------------------------------------------
  struct Runner {
    Impl &impl;
    int64_t r;
    std::map<Key, StageState> states;
    std::map<Key, Received> actIn, gradIn;
    std::map<Key, int64_t> outputPeer; // where each sent output went (its FREE follows that stream)
    std::map<Key, std::pair<std::vector<int32_t>, std::vector<int32_t>>> embedCsr;
    std::vector<float *> scratchToFree;
    std::string error;
    std::string where;
    std::map<std::string, std::vector<float>> *taps = nullptr;
    std::mutex *tapMutex = nullptr;
    std::vector<std::vector<double>> *losses = nullptr;
    std::map<std::string, double> profileMs;
    /// Loss scalars stay on the device until the step ends: (mb, loss index).
    std::vector<std::pair<std::pair<int64_t, size_t>, DeviceTensor>> lossBuffers;
    std::vector<std::pair<std::string, DeviceTensor>> tapBuffers;
    /// With profiling: events around each primitive, read after the step.
    std::vector<std::tuple<std::string, cudaEvent_t, cudaEvent_t>> timings;
    void markStart(cudaEvent_t &startEvent) {
      if (!impl.options.profile)
        return;
      cudaEventCreate(&startEvent);
      cudaEventRecord(startEvent, rank().compute);
    }
    void markEnd(const std::string &name, cudaEvent_t startEvent) {
      if (!impl.options.profile)
        return;
      cudaEvent_t endEvent;
      cudaEventCreate(&endEvent);
      cudaEventRecord(endEvent, rank().compute);
      timings.emplace_back("rank " + std::to_string(r) + " " + name, startEvent, endEvent);
    }
    /// Embedding-backward CSRs, uploaded before the step: (mb, shift) -> device.
    std::map<std::pair<int64_t, int64_t>, std::pair<int32_t *, int32_t *>> csrs;

    Rank &rank() { return impl.ranks[r]; }
    const StageProgram &program(int64_t s) { return impl.a.stages[s]; }

    bool fail(const std::string &message) {
      if (error.empty())
        error = "rank " + std::to_string(r) + " " + where + ": " + message;
      return false;
    }
    bool check(const char *what) {
      std::string e = cuda::lastError(what);
      return e.empty() || fail(e);
    }

    float *allocate(int64_t count, cudaStream_t stream, bool zero = true) {
      void *p = nullptr;
      cudaError_t status = cudaMallocAsync(&p, std::max<int64_t>(1, count) * sizeof(float), stream);
      if (status != cudaSuccess) {
        fail("out of GPU memory allocating " + std::to_string(count * 4) + " bytes (" + cudaWhat(status) + ")");
        return nullptr;
      }
      if (zero)
        cudaMemsetAsync(p, 0, count * sizeof(float), stream);
      rank().live += count * 4;
      rank().peak = std::max(rank().peak, rank().live);
      return static_cast<float *>(p);
    }
    void release(DeviceTensor &t, cudaStream_t stream) {
      if (!t.ptr)
        return;
      cudaFreeAsync(t.ptr, stream);
      rank().live -= t.count * 4;
      t = {};
    }

    /// Copies a tapped tensor aside on the device; nothing here may block
    /// the host (a blocked host can deadlock the pipeline), so the copies
    /// are downloaded after the step.
    void tap(const ValueInfo &info, const DeviceTensor &t, int64_t mb) {
      if (!taps || info.tap.empty())
        return;
      DeviceTensor copy{allocate(t.count, rank().compute, false), t.count};
      cudaMemcpyAsync(copy.ptr, t.ptr, t.count * sizeof(float), cudaMemcpyDeviceToDevice, rank().compute);
      tapBuffers.push_back({info.tap + "@mb" + std::to_string(mb), copy});
    }

    float *param(int64_t s, const ForwardInstr &f, size_t k) {
      return rank().weights[program(s).params[f.params[k]].param];
    }
    float *paramGrad(int64_t s, const ForwardInstr &f, size_t k) {
      return rank().slotGrads[{s, f.params[k]}];
    }

    /// Rows reading each vocabulary entry, ascending, for the embedding
    /// backward without atomics; built and uploaded before the step starts.
    void prepareCsrs(const std::vector<std::vector<int32_t>> &tokens) {
      const ModelInfo &m = impl.a.model;
      for (size_t s = r; s < impl.a.stages.size(); s += impl.a.pp)
        for (const ForwardInstr &f : impl.a.stages[s].forward) {
          if (f.op != Prim::Embed)
            continue;
          for (int64_t mb = 0; mb < impl.a.microbatches; ++mb) {
            if (csrs.count({mb, f.shift}))
              continue;
            std::vector<int32_t> offsets(m.vocab + 1, 0), positions(m.tokens());
            for (int64_t t = 0; t < m.tokens(); ++t)
              ++offsets[tokens[mb][kernels::shiftedRow(t, f.shift, m.seqLen)] + 1];
            for (int64_t v = 0; v < m.vocab; ++v)
              offsets[v + 1] += offsets[v];
            std::vector<int32_t> cursor(offsets.begin(), offsets.end() - 1);
            for (int64_t t = 0; t < m.tokens(); ++t)
              positions[cursor[tokens[mb][kernels::shiftedRow(t, f.shift, m.seqLen)]]++] = int32_t(t);
            int32_t *dOffsets = nullptr, *dPositions = nullptr;
            cudaMalloc(&dOffsets, offsets.size() * 4);
            cudaMalloc(&dPositions, positions.size() * 4);
            cudaMemcpy(dOffsets, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice);
            cudaMemcpy(dPositions, positions.data(), positions.size() * 4, cudaMemcpyHostToDevice);
            csrs[{mb, f.shift}] = {dOffsets, dPositions};
          }
        }
    }

    bool forward(int64_t s, int64_t mb) {
      const StageProgram &p = program(s);
      const ModelInfo &m = impl.a.model;
      const int64_t T = m.tokens(), C = m.hidden, V = m.vocab;
      cudaStream_t stream = rank().compute;
      Key key{s, mb};
      StageState &st = states[key];
      st.values.assign(p.values.size(), {});
      st.aux.assign(p.forward.size(), {});
      st.losses.assign(p.losses.size(), nullptr);
      if (p.input >= 0) {
        if (impl.a.rankOf(s - 1) == r) {
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
      const int32_t *tok = rank().tokens[mb], *lab = rank().labels[mb];
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
        cublasHandle_t h = rank().blas;
        cudaEvent_t started = nullptr;
        markStart(started);
        switch (f.op) {
        case Prim::Identity:
          cudaMemcpyAsync(out.ptr, in(0), count * 4, cudaMemcpyDeviceToDevice, stream);
          break;
        case Prim::Embed:
          cuda::embedForward(tok, param(s, f, 0), out.ptr, T, C, f.shift, f.seqLen, stream);
          break;
        case Prim::Expand:
          cuda::expandForward(in(0), out.ptr, T, C, n, stream);
          break;
        case Prim::MhcCoeffs: {
          float *scratch = allocate(T * (n * n + 2 * n), stream, false);
          cuda::mhcCoeffsForward(h, in(0), param(s, f, 0), param(s, f, 1), param(s, f, 2), out.ptr, aux, scratch,
                                 T, C, n, f.sinkhornIterations, stream);
          DeviceTensor t{scratch, T * (n * n + 2 * n)};
          release(t, stream);
          break;
        }
        case Prim::MhcPre:
          cuda::mhcPreForward(in(0), in(1), out.ptr, T, C, n, stream);
          break;
        case Prim::RmsNorm:
          cuda::rmsNormForward(in(0), param(s, f, 0), out.ptr, aux, T, C, f.eps, stream);
          break;
        case Prim::Attention:
          cuda::attentionForward(h, in(0), param(s, f, 0), param(s, f, 1), out.ptr, aux, T, C, f.heads, f.seqLen,
                                 stream);
          break;
        case Prim::SwiGlu:
          cuda::swigluForward(h, in(0), param(s, f, 0), param(s, f, 1), param(s, f, 2), out.ptr, aux, T, C, f.ffn,
                              stream);
          break;
        case Prim::MhcPostRes:
          cuda::mhcPostResForward(in(0), in(1), in(2), out.ptr, T, C, n, stream);
          break;
        case Prim::Residual:
          cuda::residualForward(in(0), in(1), out.ptr, T * C, stream);
          break;
        case Prim::Contract:
          cuda::contractForward(in(0), out.ptr, T, C, n, stream);
          break;
        case Prim::LmHead:
          cuda::matmul(h, in(0), param(s, f, 0), out.ptr, T, C, V, false);
          break;
        case Prim::ConcatProj:
          cuda::concatProjForward(h, in(0), in(1), param(s, f, 0), out.ptr, T, C, C);
          break;
        case Prim::CrossEntropy:
          cuda::crossEntropyForward(in(0), lab, aux, out.ptr, T, V, f.shift, f.seqLen, stream);
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
      const ModelInfo &m = impl.a.model;
      const int64_t T = m.tokens(), C = m.hidden, V = m.vocab;
      cudaStream_t stream = rank().compute;
      auto found = states.find({s, mb});
      if (found == states.end())
        return fail("BWD(s" + std::to_string(s) + ",mb" + std::to_string(mb) + ") before its FWD");
      StageState &st = found->second;
      if (p.gradOutput >= 0) {
        if (impl.a.rankOf(s + 1) == r) {
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
      cublasHandle_t h = rank().blas;
      for (const BackwardInstr &b : p.backward) {
        const ForwardInstr &f = p.forward[b.forward];
        for (int input : f.inputs)
          if (!st.values[input].ptr)
            return fail(std::string("the backward of ") + primName(f.op) + " reads a freed value");
        auto in = [&](size_t j) { return st.values[f.inputs[j]].ptr; };
        auto din = [&](size_t j) { return grad(b.gradInputs[j]); };
        const float *dOut = b.gradOutput >= 0 ? grad(b.gradOutput) : nullptr;
        const float *aux = st.aux[b.forward].ptr;
        const int64_t n = f.streams, K = n * n + 2 * n;
        auto scratch = [&](int64_t count) {
          float *ptr = allocate(count, stream, false);
          scratchToFree.push_back(ptr);
          return ptr;
        };
        cudaEvent_t started = nullptr;
        markStart(started);
        switch (f.op) {
        case Prim::Identity:
          cuda::addInto(din(0), dOut, p.values[f.output].rows * p.values[f.output].cols, stream);
          break;
        case Prim::Embed: {
          auto [offsets, positions] = csrs.at({mb, f.shift});
          cuda::embedBackward(offsets, positions, V, dOut, paramGrad(s, f, 0), C, stream);
          break;
        }
        case Prim::Expand:
          cuda::expandBackward(dOut, din(0), T, C, n, stream);
          break;
        case Prim::MhcCoeffs:
          cuda::mhcCoeffsBackward(h, in(0), param(s, f, 0), param(s, f, 2), aux, dOut, din(0), paramGrad(s, f, 0),
                                  paramGrad(s, f, 1), paramGrad(s, f, 2), scratch(3 * T * K + T), T, C, n,
                                  f.sinkhornIterations, stream);
          break;
        case Prim::MhcPre:
          cuda::mhcPreBackward(in(0), in(1), dOut, din(0), din(1), T, C, n, stream);
          break;
        case Prim::RmsNorm:
          cuda::rmsNormBackward(in(0), param(s, f, 0), aux, dOut, din(0), paramGrad(s, f, 0), T, C, stream);
          break;
        case Prim::Attention:
          cuda::attentionBackward(h, in(0), param(s, f, 0), param(s, f, 1), aux, dOut, din(0), paramGrad(s, f, 0),
                                  paramGrad(s, f, 1), scratch(4 * T * C + T * f.heads), T, C, f.heads, f.seqLen,
                                  stream);
          break;
        case Prim::SwiGlu:
          cuda::swigluBackward(h, in(0), param(s, f, 0), param(s, f, 1), param(s, f, 2), aux, dOut, din(0),
                               paramGrad(s, f, 0), paramGrad(s, f, 1), paramGrad(s, f, 2), scratch(3 * T * f.ffn), T,
                               C, f.ffn, stream);
          break;
        case Prim::MhcPostRes:
          cuda::mhcPostResBackward(in(0), in(1), in(2), dOut, din(0), din(1), din(2), T, C, n, stream);
          break;
        case Prim::Residual:
          cuda::residualBackward(dOut, din(0), din(1), T * C, stream);
          break;
        case Prim::Contract:
          cuda::contractBackward(dOut, din(0), T, C, n, stream);
          break;
        case Prim::LmHead:
          cuda::matmulTransAAcc(h, in(0), dOut, paramGrad(s, f, 0), T, C, V);
          cuda::matmulTransBAcc(h, dOut, param(s, f, 0), din(0), T, V, C);
          break;
        case Prim::ConcatProj:
          cuda::concatProjBackward(h, in(0), in(1), param(s, f, 0), dOut, din(0), din(1), paramGrad(s, f, 0), T, C, C);
          break;
        case Prim::CrossEntropy: {
          float scale = static_cast<float>(p.losses[f.loss].weight / double(impl.a.microbatches));
          cuda::crossEntropyBackward(in(0), rank().labels[mb], aux, scale, din(0), T, V, f.shift, f.seqLen, stream);
          break;
        }
        }
        markEnd(std::string("bwd ") + primName(f.op), started);
        if (!check(primName(f.op)))
          return false;
      }
      for (float *ptr : scratchToFree)
        cudaFreeAsync(ptr, stream);
      scratchToFree.clear();
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
        release(t, rank().compute);
      for (DeviceTensor &t : it->second.aux)
        release(t, rank().compute);
      states.erase(it);
    }

    /// A group of SEND / RECV instructions, issued together.
    bool communicate(const std::vector<const Instr *> &group) {
      cudaEvent_t produced;
      cudaEventCreateWithFlags(&produced, cudaEventDisableTiming);
      cudaEventRecord(produced, rank().compute);
      for (const Instr *i : group)
        if (i->kind == OpKind::Send)
          cudaStreamWaitEvent(rank().sendStream[i->peer], produced, 0);
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
          ncclSend(it->second.values[value].ptr, count, ncclFloat, 1, rank().sendComm[i->peer],
                   rank().sendStream[i->peer]);
          if (i->payload == Payload::Activation)
            outputPeer[key] = i->peer;
        } else {
          cudaStream_t stream = rank().recvStream[i->peer];
          Received received;
          received.tensor = {allocate(count, stream, false), count};
          if (!received.tensor.ptr) {
            ncclGroupEnd();
            return false;
          }
          ncclRecv(received.tensor.ptr, count, ncclFloat, 0, rank().recvComm[i->peer], stream);
          posted.push_back({i, received});
        }
      }
      ncclResult_t status = ncclGroupEnd();
      if (status != ncclSuccess)
        return fail("NCCL group: " + std::string(ncclGetErrorString(status)));
      for (auto &[i, received] : posted) {
        cudaEventCreateWithFlags(&received.ready, cudaEventDisableTiming);
        cudaEventRecord(received.ready, rank().recvStream[i->peer]);
        (i->payload == Payload::Activation ? actIn : gradIn)[{i->dstStage, i->mb}] = received;
      }
      // A sent input gradient is all that was left of its (stage, mb).
      for (const Instr *i : group)
        if (i->kind == OpKind::Send && i->payload == Payload::Gradient) {
          Key key{i->srcStage, i->mb};
          StageState &st = states[key];
          release(st.values[program(i->srcStage).gradInput], rank().sendStream[i->peer]);
          releaseState(key);
        }
      return check("communication");
    }

    void run(const std::vector<std::vector<int32_t>> &hostTokens) {
      cudaSetDevice(rank().device);
      prepareCsrs(hostTokens);
      const auto &list = impl.a.ranks[r];
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
          release(it->second.values[program(i.stage).output], rank().sendStream[peer->second]);
          outputPeer.erase(peer);
          break;
        }
        case OpKind::Optimizer:
          break;
        }
      }
      where = "end of step";
      if (!error.empty())
        return;
      // Wait for every stream with a deadline instead of hanging.
      auto deadline = std::chrono::steady_clock::now() +
                      std::chrono::duration<double>(impl.options.recvTimeoutSeconds);
      std::vector<cudaStream_t> streams = {rank().compute};
      for (auto &[peer, st] : rank().sendStream)
        streams.push_back(st);
      for (auto &[peer, st] : rank().recvStream)
        streams.push_back(st);
      for (cudaStream_t st : streams) {
        cudaError_t status;
        while ((status = cudaStreamQuery(st)) == cudaErrorNotReady) {
          if (std::chrono::steady_clock::now() > deadline) {
            fail("a stream did not finish within " + std::to_string(int(impl.options.recvTimeoutSeconds)) +
                 " s (a peer never sent, or a collective hangs)");
            return;
          }
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
        if (status != cudaSuccess) {
          fail(cudaWhat(status));
          return;
        }
      }
      // Read the losses of this rank's last-stage microbatches.
      for (auto &[where, tensor] : lossBuffers) {
        float value = 0;
        cudaMemcpy(&value, tensor.ptr, sizeof value, cudaMemcpyDeviceToHost);
        (*losses)[where.first][where.second] = value;
        release(tensor, rank().compute);
      }
      lossBuffers.clear();
      for (auto &[key, tensor] : tapBuffers) {
        std::vector<float> host(tensor.count);
        cudaMemcpy(host.data(), tensor.ptr, tensor.count * sizeof(float), cudaMemcpyDeviceToHost);
        release(tensor, rank().compute);
        std::lock_guard<std::mutex> lock(*tapMutex);
        (*taps)[key] = std::move(host);
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
      for (auto &[key, pointers] : csrs) {
        cudaFree(pointers.first);
        cudaFree(pointers.second);
      }
      csrs.clear();
      for (auto it = states.begin(); it != states.end();)
        releaseState((it++)->first);
      cudaStreamSynchronize(rank().compute);
    }
  };

  std::optional<StepResult> step(std::string &error) {
    auto start = std::chrono::steady_clock::now();
    const ModelInfo &m = a.model;
    std::vector<std::vector<int32_t>> tokens(a.microbatches, std::vector<int32_t>(m.tokens())),
        labels(a.microbatches, std::vector<int32_t>(m.tokens()));
    for (int64_t mb = 0; mb < a.microbatches; ++mb)
      data.sample(options.dataSeed, stepsDone, mb, m.seqLen, m.microBatch, tokens[mb].data(), labels[mb].data());
    for (Rank &rank : ranks) {
      cudaSetDevice(rank.device);
      rank.live = rank.peak = 0;
      for (int64_t mb = 0; mb < a.microbatches; ++mb) {
        cudaMemcpy(rank.tokens[mb], tokens[mb].data(), m.tokens() * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(rank.labels[mb], labels[mb].data(), m.tokens() * 4, cudaMemcpyHostToDevice);
      }
      for (auto &[key, g] : rank.slotGrads)
        cudaMemset(g, 0, a.params[a.stages[key.first].params[key.second].param].count() * 4);
      cudaDeviceSynchronize();
    }
    const StageProgram &last = a.stages.back();
    std::vector<std::vector<double>> losses(a.microbatches, std::vector<double>(last.losses.size(), 0.0));
    std::map<std::string, std::vector<float>> taps;
    std::mutex tapMutex;
    std::vector<Runner> runners;
    for (int64_t r = 0; r < a.pp; ++r) {
      runners.push_back(Runner{*this, r});
      runners.back().losses = &losses;
      if (options.recordTaps) {
        runners.back().taps = &taps;
        runners.back().tapMutex = &tapMutex;
      }
    }
    std::vector<std::thread> threads;
    for (int64_t r = 0; r < a.pp; ++r)
      threads.emplace_back([&runners, &tokens, r] { runners[r].run(tokens); });
    for (std::thread &t : threads)
      t.join();
    auto pipelineDone = std::chrono::steady_clock::now();
    for (Runner &runner : runners)
      if (!runner.error.empty()) {
        error = runner.error;
        for (ncclComm_t comm : allComms)
          ncclCommAbort(comm);
        allComms.clear();
        return std::nullopt;
      }

    StepResult result;
    result.step = ++stepsDone;
    // Gradients to the host, reduced and applied as on the CPU backend.
    std::vector<std::vector<std::vector<float>>> hostGrads(a.stages.size());
    std::vector<std::vector<const float *>> slotGrads(a.stages.size());
    for (size_t s = 0; s < a.stages.size(); ++s) {
      Rank &rank = ranks[a.rankOf(s)];
      cudaSetDevice(rank.device);
      for (size_t k = 0; k < a.stages[s].params.size(); ++k) {
        std::vector<float> &host = hostGrads[s].emplace_back(a.params[a.stages[s].params[k].param].count());
        cudaMemcpy(host.data(), rank.slotGrads[{int64_t(s), int(k)}], host.size() * 4, cudaMemcpyDeviceToHost);
      }
      for (auto &g : hostGrads[s])
        slotGrads[s].push_back(g.data());
    }
    completeStep(a, options, losses, slotGrads, weights, adamM, adamV, result);
    std::string problem = uploadWeights();
    if (!problem.empty()) {
      error = problem;
      return std::nullopt;
    }
    auto end = std::chrono::steady_clock::now();
    result.seconds = std::chrono::duration<double>(end - start).count();
    if (options.profile) {
      for (Runner &runner : runners)
        for (auto &[name, ms] : runner.profileMs)
          result.profileMs[name] += ms;
      result.profileMs["host: pipeline (all ranks, wall)"] =
          std::chrono::duration<double, std::milli>(pipelineDone - start).count();
      result.profileMs["host: gradients, optimizer, upload"] =
          std::chrono::duration<double, std::milli>(end - pipelineDone).count();
    }
    result.tokens = a.microbatches * m.tokens();
    for (Rank &rank : ranks)
      result.peakBytes.push_back(rank.peak);
    if (options.recordTaps)
      result.taps = std::move(taps);
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
  error = impl->setup();
  if (!error.empty())
    return nullptr;
  return std::unique_ptr<GpuTrainer>(new GpuTrainer(std::move(impl)));
}

std::optional<StepResult> GpuTrainer::step(std::string &error) { return impl_->step(error); }

const std::vector<std::vector<float>> &GpuTrainer::parameters() const { return impl_->weights; }

} // namespace mhcc::runtime
