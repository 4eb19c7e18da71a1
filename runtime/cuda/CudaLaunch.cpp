//===- CudaLaunch.cpp - one stage instruction on a GPU: the launch table ----===//
//
// The CUDA twin of runtime/cpu/StageExecutor.h: one forward instruction, or
// one backward instruction's B half, W half or both, as kernels on the
// compute stream (DeviceKernels.h). B leaves in the state's stash what the
// W half needs beyond the kept values (e.g. attention's gradient of q, k,
// v), so W computes only weight gradients, with the operations BWD would.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/CudaRank.h"
#include "runtime/cuda/DeviceKernels.h"

#include <algorithm>
#include <type_traits>

namespace mhcc::runtime::cuda {

Buffer CudaRank::scratch(int64_t count) {
  scratch_.push_back(allocate(count, Dtype::F32, Queue::compute(), false));
  return scratch_.back();
}

void CudaRank::releaseScratch() {
  // Scratch lives for one primitive (stream-ordered: the next may reuse it).
  for (Buffer &b : scratch_)
    release(b, Queue::compute());
  scratch_.clear();
}

template <typename A> const A *CudaRank::param(int64_t s, const ForwardInstr &f, size_t k) {
  const int p = a_.stages[s].params[f.params[k]].param;
  if constexpr (std::is_same_v<A, float>)
    return weights_.at(p);
  else
    return lowWeights_.at(p);
}

float *CudaRank::paramGrad(int64_t s, const ForwardInstr &f, size_t k) { return slotGrads_[{s, f.params[k]}]; }

bool CudaRank::forward(int64_t s, int64_t mb, size_t index, StageState &st) {
  timeline_.work(compute_);
  if (!bf16_)
    return forwardAs<float, float>(s, mb, index, st);
  return wideResidual_ ? forwardAs<bf16, float>(s, mb, index, st) : forwardAs<bf16, bf16>(s, mb, index, st);
}

bool CudaRank::backward(int64_t s, int64_t mb, size_t index, BackwardPart part, StageState &st,
                        const std::vector<int> &fresh) {
  timeline_.work(compute_);
  const size_t span = part == BackwardPart::Weight ? 1 : backwardSpan(s, index);
  const std::vector<std::vector<int>> own = freshByInstruction(a_.stages[s], index, span, fresh);
  const MixGroup *joined = nullptr; // the post/res backward after it, its three gradients starting here
  if (span == 2) {
    const MixGroup *before = groupBefore(s, index);
    auto starts = [&](int id) { return std::count(own[1].begin(), own[1].end(), id) > 0; };
    if (before && starts(before->dx) && starts(before->dCoef) && starts(before->dy))
      joined = before;
  }
  for (size_t j = 0; j < span; ++j) {
    const size_t i = index + j;
    const MixGroup *before = j == 0 ? joined : nullptr;
    const bool ok = !bf16_         ? backwardAs<float, float>(s, mb, i, part, st, own[j], before)
                    : wideResidual_ ? backwardAs<bf16, float>(s, mb, i, part, st, own[j], before)
                                    : backwardAs<bf16, bf16>(s, mb, i, part, st, own[j], before);
    if (!ok)
      return false;
  }
  return true;
}

size_t CudaRank::backwardSpan(int64_t s, size_t index) const {
  return passAInPassC_ && groupBefore(s, index) ? 2 : 1;
}

const MixGroup *CudaRank::groupBefore(int64_t s, size_t index) const {
  return mixGroupBefore(mixGroups_[s], index);
}

std::vector<int> CudaRank::backwardReads(int64_t s, size_t index) const {
  return mixGroupReads(mixGroups_[s], index);
}

size_t CudaRank::forwardSpan(int64_t s, size_t index) const {
  const std::vector<ForwardInstr> &list = a_.stages[s].forward;
  if (!bf16_ || mhcForwardFusion_ == MhcForwardFusion::Unfused)
    return 1;
  // An entry: the coefficients of x and the pre-mix of x by them.
  auto entryAt = [&](size_t i) {
    if (i + 1 >= list.size())
      return false;
    const ForwardInstr &coeffs = list[i], &pre = list[i + 1];
    return coeffs.op == Prim::MhcCoeffs && pre.op == Prim::MhcPre && pre.inputs.size() == 2 &&
           pre.inputs[0] == coeffs.inputs[0] && pre.inputs[1] == coeffs.output &&
           mhcFusedForwardApplies(a_.model.hidden, coeffs.streams);
  };
  if (entryAt(index))
    return 2;
  // The post-res mix writing the x of the entry after it.
  const ForwardInstr &post = list[index];
  const bool postRes = post.op == Prim::MhcPostRes && post.inputs.size() == 3 && entryAt(index + 1) &&
                       list[index + 1].inputs[0] == post.output && list[index + 1].streams == post.streams;
  const bool fusesPostRes = mhcForwardFusion_ == MhcForwardFusion::PostResAndEntry ||
                            mhcForwardFusion_ == MhcForwardFusion::PostResAndEntryInClusters;
  return postRes && fusesPostRes ? 3 : 1;
}

void CudaRank::fusedMixForward(int64_t s, size_t index, StageState &st) {
  const StageProgram &p = a_.stages[s];
  const int64_t T = rows_, C = a_.model.hidden;
  auto value = [&](int id) { return st.values[id].as<bf16>(); };
  const ForwardInstr &first = p.forward[index];
  if (first.op == Prim::MhcCoeffs) { // the entry: coefficients of x, then its pre-mix
    mhcCoeffsPreForward(*kernels_, value(first.inputs[0]), param<bf16>(s, first, 0), param<bf16>(s, first, 1),
                        param<bf16>(s, first, 2), st.values[first.output].data, st.aux[index].data,
                        value(p.forward[index + 1].output), T, C, first.streams, compute_);
    return;
  }
  // The post-res mix writing x, then the entry.
  const ForwardInstr &coeffs = p.forward[index + 1];
  mhcPostResCoeffsPreForward(*kernels_, value(first.inputs[0]), st.values[first.inputs[1]].data,
                             value(first.inputs[2]), value(first.output), param<bf16>(s, coeffs, 0),
                             param<bf16>(s, coeffs, 1), param<bf16>(s, coeffs, 2), st.values[coeffs.output].data,
                             st.aux[index + 1].data, value(p.forward[index + 2].output), T, C, first.streams, compute_,
                             mhcForwardFusion_ == MhcForwardFusion::PostResAndEntryInClusters);
}

template <typename A>
void CudaRank::crossEntropyAs(const ForwardInstr &f, int64_t mb, const A *logits, float *aux, float *loss) {
  const int64_t G = gemmRows_, V = a_.model.vocab / a_.tp, first = tensor_ * V;
  const ModelKernels &k = *kernels_;
  if (a_.tp == 1) {
    crossEntropyForward(k, logits, labels_[mb], aux, loss, G, V, f.shift, f.seqLen, compute_, contextRowMap());
    return;
  }
  // Megatron's vocabulary-parallel form: the group's max, then its sums.
  float *maxima = scratch(3 * G).data, *sums = maxima + G, *targets = sums + G;
  shareRowMax(k, logits, maxima, G, V, compute_);
  if (!tensorAllReduce(maxima, G, Dtype::F32, true))
    return;
  shareRowSumExp(k, logits, maxima, labels_[mb], sums, targets, G, V, f.shift, f.seqLen, first, compute_,
                 contextRowMap());
  if (tensorAllReduce(sums, G, Dtype::F32) && tensorAllReduce(targets, G, Dtype::F32))
    shareLoss(k, maxima, sums, targets, aux, loss, G, f.shift, f.seqLen, compute_, contextRowMap());
}

template <typename A, typename R>
bool CudaRank::forwardAs(int64_t s, int64_t mb, size_t index, StageState &st) {
  const StageProgram &p = a_.stages[s];
  const ModelInfo &m = a_.model;
  // Under tensor parallelism V is this rank's vocabulary share from `first`
  // and `inner` the width of its attention heads (TensorSplit.h's blocks);
  // the GEMM primitives run on every row of the microbatch (G; a context
  // rank's share under context parallelism), the others on this rank's
  // (T: fewer under sequence parallelism).
  const int64_t T = rows_, G = gemmRows_, C = m.hidden, V = m.vocab / a_.tp, first = tensor_ * V, inner = C / a_.tp;
  const ForwardInstr &f = p.forward[index];
  const Buffer &output = st.values[f.output];
  // Values are A but for the mHC coefficients and losses (fp32) and the
  // residual stream (R: what expand, post-res and the residual add write).
  A *out = output.as<A>();
  R *outR = output.as<R>();
  float *out32 = output.data, *aux = st.aux[index].data;
  // Null for an input the primitive does not have (the embedding has none).
  auto input = [&](size_t j) { return j < f.inputs.size() ? &st.values[f.inputs[j]] : nullptr; };
  auto in = [&](size_t j) { return input(j) ? input(j)->template as<A>() : nullptr; };
  auto inR = [&](size_t j) { return input(j) ? input(j)->template as<R>() : nullptr; };
  auto in32 = [&](size_t j) { return input(j) ? input(j)->data : nullptr; };
  auto w = [&](size_t j) { return param<A>(s, f, j); };
  const int64_t n = f.streams;
  Gemms &g = *gemms_;
  cudaStream_t stream = compute_;
  const ModelKernels &k = *kernels_;
  std::string error, label;
  cudaEvent_t started = nullptr;
  markStart(started);
  // Tensor parallelism: the rows a column-parallel GEMM reads (gathered
  // under sequence parallelism) and where the row-parallel partial sums go
  // (the output itself, summed in place, unless it holds fewer rows).
  const bool mixer = f.op == Prim::Attention || f.op == Prim::GatedDeltaNet;
  const bool reduces = a_.tp > 1 && (f.op == Prim::Embed || mixer || f.op == Prim::SwiGlu);
  const bool gathers = mixer || f.op == Prim::SwiGlu || f.op == Prim::LmHead;
  const A *x = gathers ? allRows(in(0), C) : nullptr;
  A *y = reduces && a_.sequenceParallel ? scratchOf<A>(G * C) : out; // every row of a row-parallel product
  if (gathers && !x)
    return false;
  switch (f.op) {
  case Prim::Identity:
    cudaMemcpyAsync(out, in(0), output.bytes(), cudaMemcpyDeviceToDevice, stream);
    break;
  case Prim::Embed:
    embedForward(k, tokens_[mb], w(0), y, G, C, f.shift, f.seqLen, stream, first, V, contextRowMap());
    break;
  case Prim::Expand:
    expandForward(k, in(0), outR, T, C, n, stream);
    break;
  case Prim::MhcCoeffs:
    if (std::is_same_v<A, bf16> && std::is_same_v<R, bf16> && forwardSpan(s, index) == 2) {
      fusedMixForward(s, index, st); // and the pre-mix after it
      label = "fwd mhc_coeffs+pre";
      break;
    }
    mhcCoeffsForward(k, g, inR(0), w(0), w(1), w(2), out32, aux, T, C, n, stream,
                     std::is_same_v<A, R> ? nullptr : scratch(mhcCoeffsWideScratch(T, C, n)).data);
    break;
  case Prim::MhcPre:
    mhcPreForward(k, inR(0), in32(1), out, T, C, n, stream);
    break;
  case Prim::RmsNorm:
    rmsNormForward(k, in(0), w(0), out, aux, T, C, f.eps, stream);
    break;
  case Prim::Attention:
    if (a_.cp > 1) {
      error = contextAttentionForward(f, mb, x, w(0), w(1), y, aux);
      break;
    }
    error = attentionForward(k, g, x, w(0), w(1), y, aux,
                             scratch(attentionForwardScratch(G, inner, f.heads, f.seqLen, sizeof(A))).data, G, C,
                             inner, f.heads, f.seqLen, documents(mb), stream);
    break;
  case Prim::SwiGlu:
    swigluForward(k, g, x, w(0), w(1), w(2), y, aux, G, C, f.ffn, stream);
    break;
  case Prim::MhcPostRes:
    if (std::is_same_v<A, bf16> && std::is_same_v<R, bf16> && forwardSpan(s, index) == 3) {
      fusedMixForward(s, index, st); // and the entry after it
      label = "fwd mhc_post_res+coeffs+pre";
      break;
    }
    mhcPostResForward(k, inR(0), in32(1), in(2), outR, T, C, n, stream);
    break;
  case Prim::Residual:
    residualForward(k, inR(0), in(1), outR, T * C, stream);
    break;
  case Prim::Contract:
    contractForward(k, inR(0), out, T, C, n, stream);
    break;
  case Prim::LmHead:
    matmul(g, x, w(0), out, G, C, V, false);
    break;
  case Prim::ConcatProj:
    concatProjForward(g, in(0), in(1), w(0), out, T, C, C);
    break;
  case Prim::CrossEntropy:
    crossEntropyAs(f, mb, in(0), aux, out32);
    break;
  case Prim::GatedDeltaNet:
    if (a_.cp > 1) {
      error = contextGdnForward(f, mb, x, GdnWeights<A>{w(0), w(1), w(2), w(3), w(4), w(5), w(6), w(7)}, y, aux);
      break;
    }
    error = gdnForward<A>(g, x, GdnWeights<A>{w(0), w(1), w(2), w(3), w(4), w(5), w(6), w(7)},
                          y, aux,
                          scratch(gdnForwardScratch(G, inner, f.heads, f.seqLen, sizeof(A))).data, G, C, inner,
                          f.heads, f.seqLen, f.eps, documents(mb), stream);
    break;
  }
  // The row-parallel outputs (and the vocabulary-parallel embedding) are
  // this rank's partial sums: the group's sum (its rows of it) is the value.
  if (reduces && error.empty() && error_.empty())
    reducePartial(y, out, C, false);
  markEnd(label.empty() ? std::string("fwd ") + primName(f.op) : label, started);
  releaseScratch();
  if (!error.empty())
    return fail(error);
  return error_.empty() && check(primName(f.op));
}

/// One backward instruction's operands as backwardAs resolves them, for the
/// two halves of its launch table (backwardMixing, backwardLayer).
template <typename A, typename R> struct CudaRank::BackwardCall {
  int64_t s, mb;
  BackwardPart part;
  const ForwardInstr &f;
  const BackwardInstr &b;
  StageState &st;
  GradParts parts;
  // Null for an input the primitive does not have (the embedding has none),
  // or an input gradient this part does not compute.
  const Buffer *input(size_t j) const { return j < f.inputs.size() ? &st.values[f.inputs[j]] : nullptr; }
  const Buffer *gradInput(size_t j) const {
    return parts.inputs && j < b.gradInputs.size() ? &st.values[b.gradInputs[j]] : nullptr;
  }
  const A *in(size_t j) const { return input(j) ? input(j)->template as<A>() : nullptr; }
  const R *inR(size_t j) const { return input(j) ? input(j)->template as<R>() : nullptr; } // the residual stream
  float *in32(size_t j) const { return input(j) ? input(j)->data : nullptr; }
  A *din(size_t j) const { return gradInput(j) ? gradInput(j)->template as<A>() : nullptr; }
  R *dinR(size_t j) const { return gradInput(j) ? gradInput(j)->template as<R>() : nullptr; }
  float *din32(size_t j) const { return gradInput(j) ? gradInput(j)->data : nullptr; }
  const Buffer *gradOut = nullptr;
  const A *dOut = nullptr;
  const R *dOutR = nullptr; // of the residual stream
  const float *dOut32 = nullptr;
  const float *aux = nullptr; // the forward's
  /// A row-parallel product's input rows and output gradient rows
  /// (gathered under sequence parallelism).
  const A *x = nullptr, *dy = nullptr;
  /// Under tensor parallelism, where a row-parallel product's input
  /// gradient goes (this rank's partial sum), and whether its first product
  /// writes it (else it holds zeros, or dx's rows).
  A *partial = nullptr;
  bool partialWritten = false;
  int freshMask = 0; // the input gradients the kernel writes instead of adding to
  MixStep mixing;
  A *dx0() const { return partial ? partial : din(0); } // where the first input's gradient goes
};

template <typename A, typename R> float *CudaRank::stashFor(BackwardCall<A, R> &c, int64_t count) {
  // What B leaves for W: allocated by B (or by BWD for itself), released by
  // the executor after W (or by backwardAs after BWD).
  Buffer &kept = c.st.stash[c.b.forward];
  if (!kept && c.part != BackwardPart::Weight)
    kept = allocate(count, Dtype::F32, Queue::compute(), false);
  return kept.data;
}

int CudaRank::freshGradients(const ForwardInstr &f, const BackwardInstr &b, GradParts parts, StageState &st,
                             const std::vector<int> &fresh, bool firstProductWrites) {
  // The post/res backward writes its three (its kernel's `fresh` bits: dx,
  // dCoef, dy; where its pass A ran in the pass C before, passes B and C
  // write them), the RMSNorm backward its input's, and in bf16 attention's
  // and SwiGLU's first input-gradient product its own (beta = 0); every
  // other one is zero-filled here.
  int freshMask = 0;
  const int written = f.op == Prim::MhcPostRes ? 3 : f.op == Prim::RmsNorm || firstProductWrites ? 1 : 0;
  for (int id : fresh) {
    int bit = 0;
    for (int j = 0; parts.inputs && j < written; ++j)
      if (b.gradInputs[j] == id)
        bit = 1 << j;
    if (bit)
      freshMask |= bit;
    else
      cudaMemsetAsync(st.values[id].data, 0, st.values[id].bytes(), compute_);
  }
  return freshMask;
}

template <typename A, typename R>
bool CudaRank::backwardAs(int64_t s, int64_t mb, size_t index, BackwardPart part, StageState &st,
                          const std::vector<int> &fresh, const MixGroup *joinedBefore) {
  const StageProgram &p = a_.stages[s];
  const int64_t G = gemmRows_, C = a_.model.hidden; // as forwardAs
  const BackwardInstr &b = p.backward[index];
  const ForwardInstr &f = p.forward[b.forward];
  BackwardCall<A, R> c{s, mb, part, f, b, st, {part != BackwardPart::Weight, part != BackwardPart::Input}};
  const GradParts parts = c.parts;
  c.gradOut = b.gradOutput >= 0 ? &st.values[b.gradOutput] : nullptr;
  c.dOut = c.gradOut ? c.gradOut->template as<A>() : nullptr;
  c.dOutR = c.gradOut ? c.gradOut->template as<R>() : nullptr;
  c.dOut32 = c.gradOut ? c.gradOut->data : nullptr;
  c.aux = st.aux[b.forward].data;
  const bool firstProductWrites = std::is_same_v<A, bf16> && (f.op == Prim::Attention || f.op == Prim::SwiGlu);
  c.freshMask = freshGradients(f, b, parts, st, fresh, firstProductWrites);
  // Tensor parallelism (as TensorParallel.h's tensorParallelBackward): the
  // input rows a weight gradient reads and the output gradient's rows,
  // gathered under sequence parallelism (in the CPU's order: x, then dy);
  // a row-parallel product's input gradient is this rank's partial sum,
  // which the group sums before it joins dx: it goes to dx itself where dx
  // held nothing and has every row, else to scratch (zero, or written).
  const bool mixer = f.op == Prim::Attention || f.op == Prim::GatedDeltaNet;
  const bool rowParallel = mixer || f.op == Prim::SwiGlu || f.op == Prim::LmHead;
  const bool gathersDy = mixer || f.op == Prim::SwiGlu || (f.op == Prim::Embed && parts.weights);
  // (A mixer under context parallelism recomputes from its input in either half.)
  const bool gathersX = parts.weights || (mixer && a_.cp > 1);
  c.x = !rowParallel ? nullptr : gathersX ? allRows(c.in(0), C) : c.in(0);
  c.dy = gathersDy ? allRows(c.dOut, C) : c.dOut;
  if ((rowParallel && gathersX && !c.x) || (gathersDy && !c.dy))
    return false;
  c.partialWritten = c.freshMask & 1;
  const bool dxHeldNothing = parts.inputs && rowParallel && std::count(fresh.begin(), fresh.end(), b.gradInputs[0]);
  if (a_.tp > 1 && parts.inputs && rowParallel) {
    if (dxHeldNothing && !a_.sequenceParallel) {
      c.partial = c.din(0);
    } else {
      c.partial = scratchOf<A>(G * C);
      c.partialWritten = firstProductWrites;
      if (!c.partialWritten)
        cudaMemsetAsync(c.partial, 0, G * C * sizeof(A), compute_);
    }
  }
  if (parts.inputs && !planMixing(s, mb, index, st, c.freshMask, joinedBefore, c.mixing))
    return false;
  cudaEvent_t started = nullptr;
  markStart(started);
  const bool layer = f.op == Prim::Embed || f.op == Prim::RmsNorm || f.op == Prim::Attention || f.op == Prim::SwiGlu ||
                     f.op == Prim::LmHead || f.op == Prim::ConcatProj || f.op == Prim::CrossEntropy ||
                     f.op == Prim::GatedDeltaNet;
  const std::string error = layer ? backwardLayer(c) : backwardMixing(c);
  if (c.partial && error.empty() && error_.empty())
    reducePartial(c.partial, c.din(0), C, !dxHeldNothing);
  markEnd(std::string(part == BackwardPart::Weight ? "bwd-weight " : "bwd ") + primName(f.op) +
              (c.mixing.terms.postDy ? "+post_res" : ""), // pass A of the sublayer before inside
          started);
  releaseScratch();
  if (part != BackwardPart::Input)
    release(st.stash[b.forward], Queue::compute()); // W, or BWD, was its last reader
  if (!error.empty())
    return fail(error);
  return error_.empty() && check(primName(f.op));
}

template <typename A, typename R> std::string CudaRank::backwardMixing(BackwardCall<A, R> &c) {
  const ForwardInstr &f = c.f;
  const int64_t T = rows_, C = a_.model.hidden, n = f.streams;
  const GradParts parts = c.parts;
  const ModelKernels &k = *kernels_;
  cudaStream_t stream = compute_;
  auto w = [&](size_t j) { return param<A>(c.s, f, j); };
  auto dw = [&](size_t j) { return parts.weights ? paramGrad(c.s, f, j) : nullptr; };
  const MixGroup *group = c.mixing.group;
  const bool deferred = c.mixing.deferred;
  const MixBackwardTerms &mix = c.mixing.terms;
  switch (f.op) {
  case Prim::Identity:
    if (c.gradOut && c.gradOut->dtype == Dtype::F32)
      addInto(c.din32(0), c.dOut32, c.gradOut->count, stream);
    else
      addInto(c.din(0), c.dOut, a_.stages[c.s].values[f.output].rows * a_.stages[c.s].values[f.output].cols, stream);
    break;
  case Prim::Expand:
    expandBackward(k, c.dOutR, c.din(0), T, C, n, stream);
    break;
  case Prim::MhcCoeffs:
    mhcCoeffsBackward(k, *gemms_, c.inR(0), w(0), w(2), c.aux, c.dOut32, c.dinR(0), dw(0), dw(1), dw(2),
                      stashFor(c, mhcCoeffsBackwardStash(T, n)), scratch(mhcCoeffsBackwardScratch(T, n)).data, T, C,
                      n, parts, stream, deferred ? &mix : nullptr,
                      std::is_same_v<A, R> ? nullptr : scratch(mhcCoeffsWideScratch(T, C, n)).data);
    break;
  case Prim::MhcPre:
    if constexpr (std::is_same_v<A, bf16> && std::is_same_v<R, bf16>) {
      if (deferred) { // pass B (with the partials of a pass A done by the next pass C)
        auto partials = postPartials_.find({c.s, c.mb, group->postRes});
        const bool joined = partials != postPartials_.end();
        mhcMixBackwardDots(k, c.in(0), mix.dOut, mix.du, c.din32(1), joined ? partials->second.data : nullptr, T, C,
                           stream);
        if (joined) {
          release(partials->second, Queue::compute());
          postPartials_.erase(partials);
        }
        break;
      }
    }
    mhcPreBackward(k, c.inR(0), c.in32(1), c.dOut, c.dinR(0), c.din32(1), T, C, n, stream);
    break;
  case Prim::MhcPostRes:
    if constexpr (std::is_same_v<A, bf16> && std::is_same_v<R, bf16>) {
      if (c.mixing.passADone) // in the pass C before
        break;
      if (deferred) { // pass A
        mhcPostBackward(k, c.in32(1), c.in(2), c.dOut, c.din32(1), c.din(2), c.freshMask, T, C, stream);
        break;
      }
    }
    mhcPostResBackward(k, c.inR(0), c.in32(1), c.in(2), c.dOutR, c.dinR(0), c.din32(1), c.din(2), c.freshMask, T, C,
                       n, stream);
    break;
  case Prim::Residual:
    residualBackward(k, c.dOutR, c.dinR(0), c.din(1), T * C, stream);
    break;
  case Prim::Contract:
    contractBackward(k, c.dOut, c.dinR(0), T, C, n, stream);
    break;
  default:
    return std::string("internal: ") + primName(f.op) + " is not an mHC or residual primitive";
  }
  return "";
}

template <typename A, typename R> std::string CudaRank::backwardLayer(BackwardCall<A, R> &c) {
  const ForwardInstr &f = c.f;
  const int64_t T = rows_, G = gemmRows_, C = a_.model.hidden, V = a_.model.vocab / a_.tp, first = tensor_ * V,
                inner = C / a_.tp; // as forwardAs
  const GradParts parts = c.parts;
  const ModelKernels &k = *kernels_;
  Gemms &g = *gemms_;
  cudaStream_t stream = compute_;
  auto w = [&](size_t j) { return param<A>(c.s, f, j); };
  auto dw = [&](size_t j) { return parts.weights ? paramGrad(c.s, f, j) : nullptr; };
  switch (f.op) {
  case Prim::Embed:
    if (parts.weights) {
      auto [offsets, positions] = csrs_.at({c.mb, f.shift}); // by token id: this share's from `first`
      embedBackward(k, offsets + first, positions, V, c.dy, paramGrad(c.s, f, 0), C, stream);
    }
    return "";
  case Prim::RmsNorm:
    rmsNormBackward(k, c.in(0), w(0), c.aux, c.dOut, c.din(0), dw(0), scratch(rmsNormBackwardScratch(T, C)).data, T,
                    C, parts, stream, c.freshMask & 1);
    return "";
  case Prim::Attention:
    if (a_.cp > 1)
      return contextAttentionBackward(f, c.mb,
                                      AttentionGrads<A>{c.x, w(0), w(1), c.aux, c.dy, c.dx0(),
                                                        reinterpret_cast<A *>(stashFor(c, attentionBackwardStash(G, inner))),
                                                        dw(0), dw(1)},
                                      parts, c.partialWritten);
    return attentionBackward(
        k, g, c.x, w(0), w(1), c.aux, c.dy, c.dx0(), dw(0), dw(1), stashFor(c, attentionBackwardStash(G, inner)),
        scratch(parts.inputs ? attentionBackwardScratch(G, inner, f.heads, f.seqLen, sizeof(A)) : 0).data, G, C,
        inner, f.heads, f.seqLen, parts, documents(c.mb), stream, c.partialWritten);
  case Prim::SwiGlu:
    swigluBackward(k, g, c.x, w(0), w(1), w(2), c.aux, c.dy, c.dx0(), dw(0), dw(1), dw(2),
                   stashFor(c, swigluBackwardStash(G, f.ffn)),
                   scratch(parts.inputs ? swigluBackwardScratch(G, f.ffn) : 0).data, G, C, f.ffn, parts, stream,
                   c.partialWritten);
    return "";
  case Prim::LmHead:
    if (parts.weights)
      matmulTransAAcc(g, c.x, c.dOut, paramGrad(c.s, f, 0), G, C, V);
    if (parts.inputs)
      matmulTransBAcc(g, c.dOut, w(0), c.dx0(), G, V, C);
    return "";
  case Prim::ConcatProj:
    concatProjBackward(g, c.in(0), c.in(1), w(0), c.dOut, c.din(0), c.din(1), dw(0), T, C, C, parts);
    return "";
  case Prim::CrossEntropy: {
    const StageProgram &p = a_.stages[c.s];
    const float scale = static_cast<float>(p.losses[f.loss].weight / double(a_.microbatches * a_.dp));
    crossEntropyBackward(k, c.in(0), labels_[c.mb], c.aux, scale, c.din(0), G, V, f.shift, f.seqLen, stream, first,
                         contextRowMap());
    return "";
  }
  case Prim::GatedDeltaNet: {
    GdnWeightGrads grads;
    if (parts.weights)
      grads = {dw(0), dw(1), dw(2), dw(3), dw(4), dw(5), dw(6), dw(7)};
    const GdnWeights<A> weights{w(0), w(1), w(2), w(3), w(4), w(5), w(6), w(7)};
    if (a_.cp > 1) { // over every row of the microbatch (auxCount)
      const int64_t all = a_.model.tokens();
      return contextGdnBackward<A>(f, c.mb, c.x, weights, c.aux, c.dy, c.dx0(), grads,
                                   stashFor(c, gdnBackwardStash(all, inner, f.heads, sizeof(A))), parts);
    }
    return gdnBackward<A>(g, c.x, weights, c.aux, c.dy, c.dx0(), grads,
                          stashFor(c, gdnBackwardStash(G, inner, f.heads, sizeof(A))),
                          scratch(gdnBackwardScratch(G, inner, f.heads, f.seqLen, sizeof(A))).data, G, C, inner,
                          f.heads, f.seqLen, parts, documents(c.mb), stream);
  }
  default:
    return std::string("internal: ") + primName(f.op) + " has no layer backward";
  }
}

bool CudaRank::planMixing(int64_t s, int64_t mb, size_t index, StageState &st, int freshMask,
                          const MixGroup *joinedBefore, MixStep &step) {
  const StageProgram &p = a_.stages[s];
  const BackwardInstr &b = p.backward[index];
  const ForwardInstr &f = p.forward[b.forward];
  const int64_t T = a_.model.tokens(), C = a_.model.hidden, n = f.streams;
  const MixGroup *group = step.group = mixGroup(s, index);
  if (!group)
    return true;
  auto data = [&](int id) -> const void * { return st.values[id].data; };
  // Pass A of this post/res backward already ran inside the pass C before it.
  step.passADone = index == group->postRes && postPartials_.count({s, mb, index}) > 0;
  if (index == group->postRes && !step.passADone) {
    const ForwardInstr &coeffs = p.forward[p.backward[group->coeffs].forward];
    step.deferred = mixBackward_ && (freshMask & 3) == 3 && // dx and dCoef start here
                    mhcMixBackwardApplies(C, n, {data(group->x), data(group->y), data(group->dOut),
                                                 data(group->dx), data(group->dy), param<bf16>(s, coeffs, 0)});
    if (step.deferred)
      deferredMix_.insert({s, mb, group->postRes});
  } else {
    step.deferred = deferredMix_.count({s, mb, group->postRes}) > 0;
  }
  if (!step.deferred || index == group->postRes)
    return true;
  step.terms = {st.values[group->coef].data, st.values[group->dOut].as<bf16>(), st.values[group->du].as<bf16>()};
  if (!mhcMixBackwardApplies(C, n, {step.terms.du})) // every buffer here is 256-byte aligned
    return fail("internal: the pre-mix's output gradient is not 16-byte aligned");
  if (index != group->coeffs)
    return true;
  deferredMix_.erase({s, mb, group->postRes});
  const MixGroup *before = joinedBefore;
  if (!before)
    return true;
  // Pass A of the sublayer before, in this pass C: its dy and post partials.
  const ForwardInstr &coeffsBefore = p.forward[p.backward[before->coeffs].forward];
  if (!mhcMixBackwardApplies(C, n, {data(before->x), data(before->y), data(before->dOut), data(before->dx),
                                    data(before->dy), param<bf16>(s, coeffsBefore, 0)}))
    return true;
  Buffer partials = allocate(mhcPostPartialsCount(T, C, n), Dtype::F32, Queue::compute(), false);
  if (!partials)
    return false; // allocate set the error
  step.terms.postCoef = st.values[before->coef].data;
  step.terms.postY = st.values[before->y].as<bf16>();
  step.terms.postDy = st.values[before->dy].as<bf16>();
  step.terms.postPartials = partials.data;
  postPartials_[{s, mb, before->postRes}] = partials;
  deferredMix_.insert({s, mb, before->postRes});
  return true;
}

const MixGroup *CudaRank::mixGroup(int64_t s, size_t index) const { return mixGroupAt(mixGroups_[s], index); }

} // namespace mhcc::runtime::cuda
