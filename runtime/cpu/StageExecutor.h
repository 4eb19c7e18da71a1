//===- StageExecutor.h - run one stage program's forward / backward -*- C++ -*-===//
//
// One stage-program instruction's forward or backward with the CPU kernels:
// the CPU device's launch table. Templated on the scalar: training runs it in
// float; the end-to-end gradient check runs whole compiled models in double
// against finite differences (runForward / runBackward below).
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CPU_STAGEEXECUTOR_H
#define MHCC_RUNTIME_CPU_STAGEEXECUTOR_H

#include "runtime/artifact/Artifact.h"
#include "runtime/cpu/ContextParallelAttention.h"
#include "runtime/cpu/Kernels.h"
#include "runtime/cpu/TensorParallel.h"

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace mhcc::runtime {

template <typename T> struct StageContext {
  const StageProgram &program;
  const ModelInfo &model;
  int64_t microbatches = 1;               // losses are averaged over them (the global batch's)
  const int32_t *tokens = nullptr, *labels = nullptr; // the whole microbatch's
  kernels::Documents documents; // packed documents' positions and masks (none: one per sequence)
  /// Context parallelism (mhcc --cp): this rank's rows of the microbatch
  /// (0: all of them), which row of the microbatch each is (Kernels.h,
  /// microbatchRow), and the gather of every context-parallel rank's rows
  /// into microbatch order (a collective: the group's ranks call it in the
  /// same order; false when another rank failed). Attention exchanges its
  /// rows' q, k, v (contextParallelAttention); Gated DeltaNet runs on the
  /// gathered rows, as the whole microbatch would, and keeps this rank's;
  /// its weight gradients, then whole, are added by context rank 0 alone.
  /// Under sequence parallelism `rows` is the tensor rank's share of the
  /// context-parallel rows (`contextRows`, rowMap's length).
  int64_t rows = 0, contextRows = 0;
  const int64_t *rowMap = nullptr;
  std::function<bool(const T *local, int64_t cols, T *all)> gatherRows;
  bool addsMixerWeightGrads = true;
  /// Tensor parallelism (mhcc --tp; TensorParallel.h): the parameters are
  /// this rank's blocks, and the GEMM primitives run on every row of the
  /// microbatch (`rows` is this rank's share under sequence parallelism).
  TensorGroup<T> tensor;
  std::function<T *(int slot)> param;     // the stage's parameter slots
  std::function<T *(int slot)> paramGrad; // accumulated into
  /// Rounds what composite kernels keep in memory to the storage type
  /// (Kernels.h, Store); null: full precision.
  kernels::Store<T> store = nullptr;
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

/// A token mixer's (attention's, Gated DeltaNet's) forward over all
/// `rows` rows of x, its aux `mixerAuxPerRow` floats a row (`inner`: the
/// rank's heads' width, C / tp; f.heads are the rank's).
inline int64_t mixerAuxPerRow(const ForwardInstr &f, int64_t inner) {
  return f.op == Prim::GatedDeltaNet ? kernels::gdnAuxPerRow(inner, f.heads) : 4 * inner + f.heads;
}
template <typename T>
void mixerForward(const StageContext<T> &c, const ForwardInstr &f, const T *x, T *y, T *aux, int64_t rows) {
  namespace k = kernels;
  auto w = [&](size_t j) { return c.param(f.params[j]); };
  const int64_t C = c.model.hidden;
  if (f.op == Prim::GatedDeltaNet)
    k::gdnForward<T>(x, w(0), w(1), w(2), w(3), w(4), w(5), w(6), w(7), y, aux, rows, C, f.heads, f.seqLen, f.eps,
                     c.store, c.documents, C / c.tensor.size);
  else
    k::attentionForward<T>(x, w(0), w(1), y, aux, rows, C, f.heads, f.seqLen, c.store, c.documents,
                           C / c.tensor.size);
}
/// Its backward: dx (null: none) and, with `weights`, the weight gradients.
template <typename T>
void mixerBackward(const StageContext<T> &c, const ForwardInstr &f, const T *x, const T *aux, const T *dy, T *dx,
                   bool weights, int64_t rows) {
  namespace k = kernels;
  auto w = [&](size_t j) { return c.param(f.params[j]); };
  auto dw = [&](size_t j) { return weights ? c.paramGrad(f.params[j]) : nullptr; };
  const int64_t C = c.model.hidden;
  if (f.op == Prim::GatedDeltaNet)
    k::gdnBackward<T>(x, w(0), w(1), w(2), w(3), w(4), w(5), w(6), w(7), aux, dy,
                      k::GdnGrads<T>{dx, dw(0), dw(1), dw(2), dw(3), dw(4), dw(5), dw(6), dw(7)}, rows, C, f.heads,
                      f.seqLen, c.store, c.documents, C / c.tensor.size);
  else
    k::attentionBackward<T>(x, w(0), w(1), aux, dy, dx, dw(0), dw(1), rows, C, f.heads, f.seqLen, c.store,
                            c.documents, C / c.tensor.size);
}

/// Attention under context parallelism: this rank's queries against the
/// group's keys and values (ContextParallelAttention.h), its rows' aux kept
/// from the forward for the backward. Arguments as contextParallelMixer's.
template <typename T>
bool contextParallelAttention(const StageContext<T> &c, const ForwardInstr &f, const T *x, const T *dy, T *out,
                              bool weightHalf, T *aux) {
  namespace k = kernels;
  auto w = [&](size_t j) { return c.param(f.params[j]); };
  auto dw = [&](size_t j) { return weightHalf ? c.paramGrad(f.params[j]) : nullptr; };
  const int64_t C = c.model.hidden, all = c.model.tokens(), inner = C / c.tensor.size;
  if (!dy)
    return k::contextParallelAttentionForward<T>(x, w(0), w(1), out, aux, c.contextRows, c.rowMap, all, C, f.heads,
                                                 f.seqLen, c.store, c.documents, inner, c.gatherRows);
  return k::contextParallelAttentionBackward<T>(x, w(0), w(1), aux, dy, out, dw(0), dw(1), c.contextRows, c.rowMap,
                                                all, C,
                                                f.heads, f.seqLen, c.store, c.documents, inner, c.gatherRows);
}

/// A token mixer under context parallelism. Without dy this keeps the
/// forward's output rows of this rank in `out`; with dy it adds this rank's
/// input gradient rows into `out` (null for a W half) and, for a W half
/// (`weightHalf`), the weight gradients. Attention splits the work
/// (contextParallelAttention). Gated DeltaNet's recurrence runs over the
/// group's gathered rows (StageContext gatherRows) on the whole microbatch,
/// on every rank, keeping this rank's rows: each row gets the bits it gets
/// without context parallelism, and its weight gradients, then whole, are
/// added by context rank 0 alone. False when a gather failed.
template <typename T>
bool contextParallelMixer(const StageContext<T> &c, const ForwardInstr &f, const T *x, const T *dy, T *out,
                          bool weightHalf, T *aux) {
  if (f.op == Prim::Attention)
    return contextParallelAttention(c, f, x, dy, out, weightHalf, aux);
  const int64_t rows = c.contextRows, all = c.model.tokens(), C = c.model.hidden;
  std::vector<T> xAll(all * C), yAll(all * C), auxAll(all * mixerAuxPerRow(f, C / c.tensor.size));
  if (!c.gatherRows(x, C, xAll.data()))
    return false;
  mixerForward(c, f, xAll.data(), yAll.data(), auxAll.data(), all);
  if (!dy) {
    for (int64_t t = 0; t < rows; ++t)
      std::copy_n(yAll.data() + c.rowMap[t] * C, C, out + t * C);
    return true;
  }
  std::vector<T> dyAll(all * C), dxAll(out ? all * C : 0, T(0));
  if (!c.gatherRows(dy, C, dyAll.data()))
    return false;
  // dx starts from what this rank's rows hold, so they sum as they would unsplit.
  for (int64_t t = 0; out && t < rows; ++t)
    std::copy_n(out + t * C, C, dxAll.data() + c.rowMap[t] * C);
  const bool addWeights = weightHalf && c.addsMixerWeightGrads;
  if (!out && !addWeights)
    return true; // a W half on a rank that adds no mixer weight gradients: only the gathers
  mixerBackward(c, f, xAll.data(), auxAll.data(), dyAll.data(), out ? dxAll.data() : nullptr, addWeights, all);
  for (int64_t t = 0; out && t < rows; ++t)
    std::copy_n(dxAll.data() + c.rowMap[t] * C, C, out + t * C);
  return true;
}

/// This rank's rows of a microbatch (all of them without context parallelism).
template <typename T> int64_t rowsOf(const StageContext<T> &c) { return c.rows > 0 ? c.rows : c.model.tokens(); }

/// The primitives that hold weight blocks under tensor parallelism (or read
/// the vocabulary-split logits); the others run as without it, on this
/// rank's rows.
inline bool holdsWeightBlocks(Prim op) {
  return op == Prim::Embed || op == Prim::Attention || op == Prim::GatedDeltaNet || op == Prim::SwiGlu ||
         op == Prim::LmHead || op == Prim::CrossEntropy;
}

/// The rows the tensor-parallel GEMMs see: a context-parallel rank's share
/// of the microbatch, or the whole microbatch (either gathered over the
/// tensor-parallel ranks under sequence parallelism).
template <typename T> int64_t gemmRowsOf(const StageContext<T> &c) {
  if (c.rowMap)
    return c.contextRows;
  return c.tensor.sequenceParallel || c.rows == 0 ? c.model.tokens() : c.rows;
}

/// Under tensor parallelism, a primitive that holdsWeightBlocks on the rows
/// of gemmRowsOf (TensorParallel.h); a token mixer under context parallelism
/// runs on the group's gathered rows (contextParallelMixer) with this rank's
/// heads. The loss of a CrossEntropy (else 0; NaN when a collective failed).
template <typename T>
double tensorParallelForwardInstr(const StageContext<T> &c, T *const *values, T *const *aux, size_t i) {
  namespace k = kernels;
  const ForwardInstr &f = c.program.forward[i];
  const TensorGroup<T> &g = c.tensor;
  const int64_t all = gemmRowsOf(c), C = c.model.hidden, share = c.model.vocab / g.size;
  T *out = values[f.output];
  const T *x = f.inputs.empty() ? nullptr : values[f.inputs[0]];
  auto w = [&](size_t j) { return c.param(f.params[j]); };
  bool ok = true;
  switch (f.op) {
  case Prim::Embed:
    ok = k::tensorParallelEmbedForward(g, c.tokens, w(0), out, all, C, share, f.shift, f.seqLen, c.rowMap);
    break;
  case Prim::Attention:
  case Prim::GatedDeltaNet:
    ok = k::tensorParallelForward(g, x, out, all, C, [&](const T *in, T *partial) {
      if (c.rowMap)
        contextParallelMixer<T>(c, f, in, nullptr, partial, false, aux[i]);
      else
        mixerForward(c, f, in, partial, aux[i], all);
    });
    break;
  case Prim::SwiGlu:
    ok = k::tensorParallelForward(g, x, out, all, C, [&](const T *in, T *partial) {
      k::swigluForward(in, w(0), w(1), w(2), partial, aux[i], all, C, f.ffn, c.store);
    });
    break;
  case Prim::LmHead: {
    std::vector<T> xAll;
    const T *in = k::allRows(g, x, all, C, xAll, ok);
    if (ok)
      k::matmul(in, w(0), out, all, C, share);
    break;
  }
  case Prim::CrossEntropy: {
    T loss = 0;
    ok = k::tensorParallelCrossEntropyForward(g, x, c.labels, aux[i], all, share, f.shift, f.seqLen, loss, c.rowMap,
                                              c.model.tokens());
    out[0] = loss;
    return ok ? double(loss) : std::nan("");
  }
  default:
    break;
  }
  return ok ? 0 : std::nan("");
}

/// Forward instruction `i` of c.program: values[id] and aux[i] point at
/// allocated buffers (every kernel writes its whole output). Returns the
/// loss of a CrossEntropy (else 0; NaN when a context-parallel gather failed).
template <typename T>
double forwardInstr(const StageContext<T> &c, T *const *values, T *const *aux, size_t i) {
  namespace k = kernels;
  const StageProgram &p = c.program;
  const int64_t T_ = rowsOf(c), C = c.model.hidden, V = c.model.vocab;
  const ForwardInstr &f = p.forward[i];
  T *out = values[f.output];
  auto in = [&](size_t j) { return values[f.inputs[j]]; };
  auto w = [&](size_t j) { return c.param(f.params[j]); };
  const int64_t n = f.streams;
  PrimitiveTimer<T> timer(c, "fwd", f.op);
  if (c.tensor.active() && holdsWeightBlocks(f.op))
    return tensorParallelForwardInstr(c, values, aux, i);
  switch (f.op) {
  case Prim::Identity:
    std::copy(in(0), in(0) + p.values[f.output].rows * p.values[f.output].cols, out);
    break;
  case Prim::Embed:
    k::embedForward(c.tokens, w(0), out, T_, C, f.shift, f.seqLen, c.rowMap);
    break;
  case Prim::Expand:
    k::expandForward(in(0), out, T_, C, n);
    break;
  case Prim::MhcCoeffs:
    k::mhcCoeffsForward(in(0), w(0), w(1), w(2), out, aux[i], T_, C, n, f.sinkhornIterations);
    break;
  case Prim::MhcPre:
    k::mhcPreForward(in(0), in(1), out, T_, C, n);
    break;
  case Prim::RmsNorm:
    k::rmsNormForward(in(0), w(0), out, aux[i], T_, C, f.eps);
    break;
  case Prim::Attention:
  case Prim::GatedDeltaNet:
    if (!c.rowMap)
      mixerForward(c, f, in(0), out, aux[i], T_);
    else if (!contextParallelMixer<T>(c, f, in(0), nullptr, out, false, aux[i]))
      return std::nan("");
    break;
  case Prim::SwiGlu:
    k::swigluForward(in(0), w(0), w(1), w(2), out, aux[i], T_, C, f.ffn, c.store);
    break;
  case Prim::MhcPostRes:
    k::mhcPostResForward(in(0), in(1), in(2), out, T_, C, n);
    break;
  case Prim::Residual:
    k::residualForward(in(0), in(1), out, T_ * C);
    break;
  case Prim::Contract:
    k::contractForward(in(0), out, T_, C, n);
    break;
  case Prim::LmHead:
    k::matmul(in(0), w(0), out, T_, C, V);
    break;
  case Prim::ConcatProj:
    k::concatProjForward(in(0), in(1), w(0), out, T_, C, C);
    break;
  case Prim::CrossEntropy:
    out[0] = k::crossEntropyForward(in(0), c.labels, aux[i], T_, V, f.shift, f.seqLen, c.rowMap, c.model.tokens());
    return out[0];
  }
  return 0;
}

/// Under tensor parallelism (as tensorParallelForwardInstr): the backward
/// of a primitive that holdsWeightBlocks; false when a collective failed.
template <typename T>
bool tensorParallelBackwardInstr(const StageContext<T> &c, T *const *values, T *const *aux,
                                                const BackwardInstr &b, BackwardPart part) {
  namespace k = kernels;
  const bool wantInput = part != BackwardPart::Weight, wantWeight = part != BackwardPart::Input;
  const ForwardInstr &f = c.program.forward[b.forward];
  const TensorGroup<T> &g = c.tensor;
  const int64_t all = gemmRowsOf(c), C = c.model.hidden, share = c.model.vocab / g.size;
  const T *x = f.inputs.empty() ? nullptr : values[f.inputs[0]];
  T *dx = wantInput && !b.gradInputs.empty() ? values[b.gradInputs[0]] : nullptr;
  auto w = [&](size_t j) { return c.param(f.params[j]); };
  auto dw = [&](size_t j) { return wantWeight ? c.paramGrad(f.params[j]) : nullptr; };
  const T *dOut = b.gradOutput >= 0 ? values[b.gradOutput] : nullptr;
  const T *auxIn = aux[b.forward];
  switch (f.op) {
  case Prim::Embed:
    return !wantWeight ||
           k::tensorParallelEmbedBackward(g, c.tokens, dOut, dw(0), all, C, share, f.shift, f.seqLen, c.rowMap);
  case Prim::Attention:
  case Prim::GatedDeltaNet:
    return k::tensorParallelBackward(g, x, dOut, dx, all, C, wantWeight || c.rowMap,
                                     [&](const T *in, const T *dy, T *partial) {
                                       if (c.rowMap)
                                         contextParallelMixer<T>(c, f, in, dy, partial, wantWeight, aux[b.forward]);
                                       else
                                         mixerBackward(c, f, in, auxIn, dy, partial, wantWeight, all);
                                     });
  case Prim::SwiGlu:
    return k::tensorParallelBackward(g, x, dOut, dx, all, C, wantWeight, [&](const T *in, const T *dy, T *partial) {
      k::swigluBackward(in, w(0), w(1), w(2), auxIn, dy, partial, dw(0), dw(1), dw(2), all, C, f.ffn, c.store);
    });
  case Prim::LmHead: {
    bool ok = true;
    if (wantWeight) {
      std::vector<T> xAll;
      const T *in = k::allRows(g, x, all, C, xAll, ok);
      if (ok)
        k::matmulTransAAcc(in, dOut, dw(0), all, C, share);
    }
    if (ok && dx) {
      std::vector<T> partial(all * C, T(0));
      k::matmulTransBAcc(dOut, w(0), partial.data(), all, share, C);
      ok = k::addReduced(g, partial.data(), dx, all, C);
    }
    return ok;
  }
  case Prim::CrossEntropy:
    if (dx)
      k::crossEntropyBackward(x, c.labels, auxIn,
                              static_cast<T>(c.program.losses[f.loss].weight / double(c.microbatches)), dx, all,
                              share, f.shift, f.seqLen, c.rowMap, c.model.tokens(), g.rank * share);
    return true;
  default:
    return true;
  }
}

/// Backward instruction `b` of c.program, `part` of it (BackwardPart): the
/// gradients it adds into are allocated and zero-filled in `values`; B
/// passes no weight gradients to the kernels, W no input gradients, and the
/// kernels skip what they are not given. False when a context-parallel
/// gather failed.
template <typename T>
bool backwardInstr(const StageContext<T> &c, T *const *values, T *const *aux, const BackwardInstr &b,
                   BackwardPart part) {
  const bool wantInput = part != BackwardPart::Weight, wantWeight = part != BackwardPart::Input;
  namespace k = kernels;
  const StageProgram &p = c.program;
  const int64_t T_ = rowsOf(c), C = c.model.hidden, V = c.model.vocab;
  const ForwardInstr &f = p.forward[b.forward];
  auto in = [&](size_t j) { return values[f.inputs[j]]; };
  auto din = [&](size_t j) { return wantInput ? values[b.gradInputs[j]] : nullptr; };
  auto w = [&](size_t j) { return c.param(f.params[j]); };
  auto dw = [&](size_t j) { return wantWeight ? c.paramGrad(f.params[j]) : nullptr; };
  const T *dOut = b.gradOutput >= 0 ? values[b.gradOutput] : nullptr;
  const T *auxIn = aux[b.forward];
  const int64_t n = f.streams;
  PrimitiveTimer<T> timer(c, part == BackwardPart::Weight ? "bwd-weight" : "bwd", f.op);
  if (c.tensor.active() && holdsWeightBlocks(f.op))
    return tensorParallelBackwardInstr(c, values, aux, b, part);
  switch (f.op) {
  case Prim::Identity: {
    T *d = din(0);
    for (int64_t e = 0; e < p.values[f.output].rows * p.values[f.output].cols; ++e)
      d[e] += dOut[e];
    break;
  }
  case Prim::Embed:
    if (wantWeight)
      k::embedBackward(c.tokens, dOut, dw(0), T_, C, f.shift, f.seqLen, c.rowMap);
    break;
  case Prim::Expand:
    k::expandBackward(dOut, din(0), T_, C, n);
    break;
  case Prim::MhcCoeffs:
    k::mhcCoeffsBackward(in(0), w(0), w(2), auxIn, dOut, din(0), dw(0), dw(1),
                         dw(2), T_, C, n, f.sinkhornIterations);
    break;
  case Prim::MhcPre:
    k::mhcPreBackward(in(0), in(1), dOut, din(0), din(1), T_, C, n);
    break;
  case Prim::RmsNorm:
    k::rmsNormBackward(in(0), w(0), auxIn, dOut, din(0), dw(0), T_, C);
    break;
  case Prim::Attention:
  case Prim::GatedDeltaNet:
    if (c.rowMap)
      return contextParallelMixer<T>(c, f, in(0), dOut, din(0), wantWeight, aux[b.forward]);
    mixerBackward(c, f, in(0), auxIn, dOut, din(0), wantWeight, T_);
    break;
  case Prim::SwiGlu:
    k::swigluBackward(in(0), w(0), w(1), w(2), auxIn, dOut, din(0), dw(0), dw(1),
                      dw(2), T_, C, f.ffn, c.store);
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
    k::crossEntropyBackward(in(0), c.labels, auxIn, scale, din(0), T_, V, f.shift, f.seqLen, c.rowMap,
                            c.model.tokens());
    break;
  }
  }
  return true;
}

/// Owning buffers for running whole stage programs (the gradient checks).
template <typename T> struct StageBuffers {
  std::vector<std::vector<T>> values; // by value id
  std::vector<std::vector<T>> aux;    // by forward instruction
};

template <typename T> std::vector<T *> pointersOf(std::vector<std::vector<T>> &list) {
  std::vector<T *> out;
  for (std::vector<T> &v : list)
    out.push_back(v.empty() ? nullptr : v.data());
  return out;
}

/// The whole forward list; `losses[k]` receives loss k of the stage.
template <typename T> void runForward(StageContext<T> &c, StageBuffers<T> &st, std::vector<double> &losses) {
  const StageProgram &p = c.program;
  st.values.resize(p.values.size());
  st.aux.resize(p.forward.size());
  losses.assign(p.losses.size(), 0.0);
  for (size_t i = 0; i < p.forward.size(); ++i) {
    const ForwardInstr &f = p.forward[i];
    st.values[f.output].assign(p.values[f.output].rows * p.values[f.output].cols, T(0));
    st.aux[i].assign(f.auxSize, T(0));
    double loss = forwardInstr(c, pointersOf(st.values).data(), pointersOf(st.aux).data(), i);
    if (f.op == Prim::CrossEntropy)
      losses[f.loss] = loss;
  }
}

/// The whole backward list (BWD); the output gradient, if the stage has an
/// output, must be in st.values[program.gradOutput].
template <typename T> void runBackward(StageContext<T> &c, StageBuffers<T> &st) {
  const StageProgram &p = c.program;
  for (const BackwardInstr &b : p.backward) {
    std::vector<int> written = b.gradInputs;
    written.push_back(b.gradOutput);
    for (int id : written)
      if (id >= 0 && st.values[id].empty())
        st.values[id].assign(p.values[id].rows * p.values[id].cols, T(0));
    backwardInstr(c, pointersOf(st.values).data(), pointersOf(st.aux).data(), b, BackwardPart::Both);
  }
}

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CPU_STAGEEXECUTOR_H
