//===- StageExecutor.h - run one stage program's forward / backward -*- C++ -*-===//
//
// Interprets a compiled stage program for one microbatch with the CPU
// kernels. Templated on the scalar: the trainer runs it in float; the
// end-to-end gradient check runs whole compiled models in double against
// finite differences.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CPU_STAGEEXECUTOR_H
#define MHCC_RUNTIME_CPU_STAGEEXECUTOR_H

#include "runtime/artifact/Artifact.h"
#include "runtime/cpu/Kernels.h"

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace mhcc::runtime {

template <typename T> struct StageBuffers {
  std::vector<std::vector<T>> values; // by value id (activations and gradients)
  std::vector<std::vector<T>> aux;    // by forward instruction
};

template <typename T> struct StageContext {
  const StageProgram &program;
  const ModelInfo &model;
  int64_t microbatches = 1;               // losses are averaged over them
  const int32_t *tokens = nullptr, *labels = nullptr;
  std::function<T *(int slot)> param;     // the stage's parameter slots
  std::function<T *(int slot)> paramGrad; // accumulated into
  std::function<void(std::vector<T> &, int64_t)> allocate; // zero-filled
  /// When set, seconds per "<profilePrefix>fwd|bwd <primitive>" are added here.
  std::map<std::string, double> *profile = nullptr;
  std::string profilePrefix;
};

/// Times one primitive into c.profile (a no-op without one).
template <typename T> class PrimitiveTimer {
public:
  PrimitiveTimer(const StageContext<T> &c, const char *phase, Prim op) : c_(c), phase_(phase), op_(op) {
    if (c_.profile)
      start_ = std::chrono::steady_clock::now();
  }
  ~PrimitiveTimer() {
    if (c_.profile)
      (*c_.profile)[c_.profilePrefix + phase_ + " " + primName(op_)] +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  }

private:
  const StageContext<T> &c_;
  const char *phase_;
  Prim op_;
  std::chrono::steady_clock::time_point start_;
};

/// Runs the forward list; `losses[k]` receives loss k of the stage.
/// `onValue(id)` is called after each value is written.
template <typename T>
void runForward(StageContext<T> &c, StageBuffers<T> &st, std::vector<double> &losses,
                const std::function<void(int)> &onValue = {}) {
  namespace k = kernels;
  const StageProgram &p = c.program;
  const int64_t T_ = c.model.tokens(), C = c.model.hidden, V = c.model.vocab;
  st.values.resize(p.values.size());
  st.aux.resize(p.forward.size());
  losses.resize(p.losses.size());
  for (size_t i = 0; i < p.forward.size(); ++i) {
    const ForwardInstr &f = p.forward[i];
    std::vector<T> &out = st.values[f.output];
    c.allocate(out, p.values[f.output].rows * p.values[f.output].cols);
    if (f.auxSize)
      c.allocate(st.aux[i], f.auxSize);
    auto in = [&](size_t j) { return st.values[f.inputs[j]].data(); };
    auto w = [&](size_t j) { return c.param(f.params[j]); };
    T *aux = st.aux[i].data();
    const int64_t n = f.streams;
    PrimitiveTimer<T> timer(c, "fwd", f.op);
    switch (f.op) {
    case Prim::Identity:
      std::copy(st.values[f.inputs[0]].begin(), st.values[f.inputs[0]].end(), out.begin());
      break;
    case Prim::Embed:
      k::embedForward(c.tokens, w(0), out.data(), T_, C, f.shift, f.seqLen);
      break;
    case Prim::Expand:
      k::expandForward(in(0), out.data(), T_, C, n);
      break;
    case Prim::MhcCoeffs:
      k::mhcCoeffsForward(in(0), w(0), w(1), w(2), out.data(), aux, T_, C, n, f.sinkhornIterations);
      break;
    case Prim::MhcPre:
      k::mhcPreForward(in(0), in(1), out.data(), T_, C, n);
      break;
    case Prim::RmsNorm:
      k::rmsNormForward(in(0), w(0), out.data(), aux, T_, C, f.eps);
      break;
    case Prim::Attention:
      k::attentionForward(in(0), w(0), w(1), out.data(), aux, T_, C, f.heads, f.seqLen);
      break;
    case Prim::SwiGlu:
      k::swigluForward(in(0), w(0), w(1), w(2), out.data(), aux, T_, C, f.ffn);
      break;
    case Prim::MhcPostRes:
      k::mhcPostResForward(in(0), in(1), in(2), out.data(), T_, C, n);
      break;
    case Prim::Residual:
      k::residualForward(in(0), in(1), out.data(), T_ * C);
      break;
    case Prim::Contract:
      k::contractForward(in(0), out.data(), T_, C, n);
      break;
    case Prim::LmHead:
      k::matmul(in(0), w(0), out.data(), T_, C, V);
      break;
    case Prim::ConcatProj:
      k::concatProjForward(in(0), in(1), w(0), out.data(), T_, C, C);
      break;
    case Prim::CrossEntropy:
      out[0] = k::crossEntropyForward(in(0), c.labels, aux, T_, V, f.shift, f.seqLen);
      losses[f.loss] = out[0];
      break;
    }
    if (onValue)
      onValue(f.output);
  }
}

/// Which half of the backward to run: both (BWD), the input gradients only
/// (the zero-bubble B) or the weight gradients only (W, after B, from the
/// output gradients B left in place).
enum class BackwardPart { Both, Input, Weight };

/// Runs the backward list. The output gradient (if the stage has an output)
/// must already be in st.values[program.gradOutput]. Returns an error, or "".
template <typename T>
std::string runBackward(StageContext<T> &c, StageBuffers<T> &st, BackwardPart part = BackwardPart::Both) {
  const bool wantInput = part != BackwardPart::Weight, wantWeight = part != BackwardPart::Input;
  namespace k = kernels;
  const StageProgram &p = c.program;
  const int64_t T_ = c.model.tokens(), C = c.model.hidden, V = c.model.vocab;
  auto grad = [&](int id) -> T * {
    std::vector<T> &g = st.values[id];
    if (g.empty())
      c.allocate(g, p.values[id].rows * p.values[id].cols);
    return g.data();
  };
  for (const BackwardInstr &b : p.backward) {
    const ForwardInstr &f = p.forward[b.forward];
    if (!wantInput && f.params.empty())
      continue; // W: only instructions with weights
    for (int input : f.inputs)
      if (st.values[input].empty())
        return std::string("the backward of ") + primName(f.op) + " reads a freed value";
    auto in = [&](size_t j) { return st.values[f.inputs[j]].data(); };
    auto din = [&](size_t j) { return wantInput ? grad(b.gradInputs[j]) : nullptr; };
    auto w = [&](size_t j) { return c.param(f.params[j]); };
    auto dw = [&](size_t j) { return wantWeight ? c.paramGrad(f.params[j]) : nullptr; };
    const T *dOut = b.gradOutput >= 0 ? grad(b.gradOutput) : nullptr;
    const T *aux = st.aux[b.forward].data();
    const int64_t n = f.streams;
    PrimitiveTimer<T> timer(c, part == BackwardPart::Weight ? "bwd-weight" : "bwd", f.op);
    switch (f.op) {
    case Prim::Identity: {
      T *d = din(0);
      for (int64_t e = 0; e < p.values[f.output].rows * p.values[f.output].cols; ++e)
        d[e] += dOut[e];
      break;
    }
    case Prim::Embed:
      if (wantWeight)
        k::embedBackward(c.tokens, dOut, dw(0), T_, C, f.shift, f.seqLen);
      break;
    case Prim::Expand:
      k::expandBackward(dOut, din(0), T_, C, n);
      break;
    case Prim::MhcCoeffs:
      k::mhcCoeffsBackward(in(0), w(0), w(2), aux, dOut, din(0), dw(0), dw(1),
                           dw(2), T_, C, n, f.sinkhornIterations);
      break;
    case Prim::MhcPre:
      k::mhcPreBackward(in(0), in(1), dOut, din(0), din(1), T_, C, n);
      break;
    case Prim::RmsNorm:
      k::rmsNormBackward(in(0), w(0), aux, dOut, din(0), dw(0), T_, C);
      break;
    case Prim::Attention:
      k::attentionBackward(in(0), w(0), w(1), aux, dOut, din(0), dw(0), dw(1), T_, C,
                           f.heads, f.seqLen);
      break;
    case Prim::SwiGlu:
      k::swigluBackward(in(0), w(0), w(1), w(2), aux, dOut, din(0), dw(0), dw(1),
                        dw(2), T_, C, f.ffn);
      break;
    case Prim::MhcPostRes:
      k::mhcPostResBackward(in(0), in(1), in(2), dOut, din(0), din(1), din(2), T_, C, n);
      break;
    case Prim::Residual:
      k::residualBackward(dOut, din(0), din(1), T_ * C);
      break;
    case Prim::Contract:
      k::contractBackward(dOut, din(0), T_, C, n);
      break;
    case Prim::LmHead:
      if (wantWeight)
        k::matmulTransAAcc(in(0), dOut, dw(0), T_, C, V);
      if (wantInput)
        k::matmulTransBAcc(dOut, w(0), din(0), T_, V, C);
      break;
    case Prim::ConcatProj:
      k::concatProjBackward(in(0), in(1), w(0), dOut, din(0), din(1), dw(0), T_, C, C);
      break;
    case Prim::CrossEntropy: {
      // Loss normalized by token count: each microbatch's mean, averaged over
      // the microbatches, weighted per loss.
      T scale = static_cast<T>(p.losses[f.loss].weight / double(c.microbatches));
      k::crossEntropyBackward(in(0), c.labels, aux, scale, din(0), T_, V, f.shift, f.seqLen);
      break;
    }
    }
  }
  return "";
}

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CPU_STAGEEXECUTOR_H
