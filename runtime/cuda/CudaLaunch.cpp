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

namespace mhcc::runtime::cuda {

Buffer CudaRank::scratch(int64_t count) {
  scratch_.push_back(allocate(count, Queue::compute(), false));
  return scratch_.back();
}

void CudaRank::releaseScratch() {
  // Scratch lives for one primitive (stream-ordered: the next may reuse it).
  for (Buffer &b : scratch_)
    release(b, Queue::compute());
  scratch_.clear();
}

float *CudaRank::param(int64_t s, const ForwardInstr &f, size_t k) {
  return weights_[a_.stages[s].params[f.params[k]].param];
}

float *CudaRank::paramGrad(int64_t s, const ForwardInstr &f, size_t k) { return slotGrads_[{s, f.params[k]}]; }

bool CudaRank::forward(int64_t s, int64_t mb, size_t index, StageState &st) {
  const StageProgram &p = a_.stages[s];
  const ModelInfo &m = a_.model;
  const int64_t T = m.tokens(), C = m.hidden, V = m.vocab;
  const ForwardInstr &f = p.forward[index];
  const int64_t count = p.values[f.output].rows * p.values[f.output].cols;
  float *out = st.values[f.output].data, *aux = st.aux[index].data;
  auto in = [&](size_t j) { return st.values[f.inputs[j]].data; };
  const int64_t n = f.streams;
  cublasHandle_t h = blas_;
  cudaStream_t stream = compute_;
  const ModelKernels &k = *kernels_;
  cudaEvent_t started = nullptr;
  markStart(started);
  switch (f.op) {
  case Prim::Identity:
    cudaMemcpyAsync(out, in(0), count * 4, cudaMemcpyDeviceToDevice, stream);
    break;
  case Prim::Embed:
    embedForward(k, tokens_[mb], param(s, f, 0), out, T, C, f.shift, f.seqLen, stream);
    break;
  case Prim::Expand:
    expandForward(k, in(0), out, T, C, n, stream);
    break;
  case Prim::MhcCoeffs:
    mhcCoeffsForward(k, h, in(0), param(s, f, 0), param(s, f, 1), param(s, f, 2), out, aux,
                     scratch(mhcCoeffsForwardScratch(T, n)).data, T, C, n, stream);
    break;
  case Prim::MhcPre:
    mhcPreForward(k, in(0), in(1), out, T, C, n, stream);
    break;
  case Prim::RmsNorm:
    rmsNormForward(k, in(0), param(s, f, 0), out, aux, T, C, f.eps, stream);
    break;
  case Prim::Attention:
    attentionForward(k, h, in(0), param(s, f, 0), param(s, f, 1), out, aux,
                     scratch(attentionForwardScratch(f.heads, f.seqLen)).data, T, C, f.heads, f.seqLen, stream);
    break;
  case Prim::SwiGlu:
    swigluForward(k, h, in(0), param(s, f, 0), param(s, f, 1), param(s, f, 2), out, aux, T, C, f.ffn, stream);
    break;
  case Prim::MhcPostRes:
    mhcPostResForward(k, in(0), in(1), in(2), out, T, C, n, stream);
    break;
  case Prim::Residual:
    residualForward(k, in(0), in(1), out, T * C, stream);
    break;
  case Prim::Contract:
    contractForward(k, in(0), out, T, C, n, stream);
    break;
  case Prim::LmHead:
    matmul(h, in(0), param(s, f, 0), out, T, C, V, false);
    break;
  case Prim::ConcatProj:
    concatProjForward(h, in(0), in(1), param(s, f, 0), out, T, C, C);
    break;
  case Prim::CrossEntropy:
    crossEntropyForward(k, in(0), labels_[mb], aux, out, T, V, f.shift, f.seqLen, stream);
    break;
  }
  markEnd(std::string("fwd ") + primName(f.op), started);
  releaseScratch();
  return error_.empty() && check(primName(f.op));
}

bool CudaRank::backward(int64_t s, int64_t mb, size_t index, BackwardPart part, StageState &st) {
  const StageProgram &p = a_.stages[s];
  const ModelInfo &m = a_.model;
  const int64_t T = m.tokens(), C = m.hidden, V = m.vocab;
  const BackwardInstr &b = p.backward[index];
  const ForwardInstr &f = p.forward[b.forward];
  const GradParts parts{part != BackwardPart::Weight, part != BackwardPart::Input};
  auto in = [&](size_t j) { return st.values[f.inputs[j]].data; };
  auto din = [&](size_t j) { return parts.inputs ? st.values[b.gradInputs[j]].data : nullptr; };
  auto dw = [&](size_t j) { return parts.weights ? paramGrad(s, f, j) : nullptr; };
  const float *dOut = b.gradOutput >= 0 ? st.values[b.gradOutput].data : nullptr;
  const float *aux = st.aux[b.forward].data;
  // What B leaves for W: allocated by B (or by BWD for itself), released by
  // the executor after W (or here after BWD).
  Buffer &kept = st.stash[b.forward];
  auto stash = [&](int64_t count) {
    if (!kept && part != BackwardPart::Weight)
      kept = allocate(count, Queue::compute(), false);
    return kept.data;
  };
  const int64_t n = f.streams;
  cublasHandle_t h = blas_;
  cudaStream_t stream = compute_;
  const ModelKernels &k = *kernels_;
  cudaEvent_t started = nullptr;
  markStart(started);
  switch (f.op) {
  case Prim::Identity:
    addInto(din(0), dOut, p.values[f.output].rows * p.values[f.output].cols, stream);
    break;
  case Prim::Embed:
    if (parts.weights) {
      auto [offsets, positions] = csrs_.at({mb, f.shift});
      embedBackward(k, offsets, positions, V, dOut, paramGrad(s, f, 0), C, stream);
    }
    break;
  case Prim::Expand:
    expandBackward(k, dOut, din(0), T, C, n, stream);
    break;
  case Prim::MhcCoeffs:
    mhcCoeffsBackward(k, h, in(0), param(s, f, 0), param(s, f, 2), aux, dOut, din(0), dw(0), dw(1), dw(2),
                      stash(mhcCoeffsBackwardStash(T, n)), scratch(mhcCoeffsBackwardScratch(T, n)).data, T, C, n,
                      parts, stream);
    break;
  case Prim::MhcPre:
    mhcPreBackward(k, in(0), in(1), dOut, din(0), din(1), T, C, n, stream);
    break;
  case Prim::RmsNorm:
    rmsNormBackward(k, in(0), param(s, f, 0), aux, dOut, din(0), dw(0), scratch(rmsNormBackwardScratch(T, C)).data,
                    T, C, parts, stream);
    break;
  case Prim::Attention:
    attentionBackward(k, h, in(0), param(s, f, 0), param(s, f, 1), aux, dOut, din(0), dw(0), dw(1),
                      stash(attentionBackwardStash(T, C)),
                      scratch(parts.inputs ? attentionBackwardScratch(T, C, f.heads, f.seqLen) : 0).data, T, C,
                      f.heads, f.seqLen, parts, stream);
    break;
  case Prim::SwiGlu:
    swigluBackward(k, h, in(0), param(s, f, 0), param(s, f, 1), param(s, f, 2), aux, dOut, din(0), dw(0), dw(1),
                   dw(2), stash(swigluBackwardStash(T, f.ffn)),
                   scratch(parts.inputs ? swigluBackwardScratch(T, f.ffn) : 0).data, T, C, f.ffn, parts, stream);
    break;
  case Prim::MhcPostRes:
    mhcPostResBackward(k, in(0), in(1), in(2), dOut, din(0), din(1), din(2), T, C, n, stream);
    break;
  case Prim::Residual:
    residualBackward(k, dOut, din(0), din(1), T * C, stream);
    break;
  case Prim::Contract:
    contractBackward(k, dOut, din(0), T, C, n, stream);
    break;
  case Prim::LmHead:
    if (parts.weights)
      matmulTransAAcc(h, in(0), dOut, paramGrad(s, f, 0), T, C, V);
    if (parts.inputs)
      matmulTransBAcc(h, dOut, param(s, f, 0), din(0), T, V, C);
    break;
  case Prim::ConcatProj:
    concatProjBackward(h, in(0), in(1), param(s, f, 0), dOut, din(0), din(1), dw(0), T, C, C, parts);
    break;
  case Prim::CrossEntropy: {
    float scale = static_cast<float>(p.losses[f.loss].weight / double(a_.microbatches));
    crossEntropyBackward(k, in(0), labels_[mb], aux, scale, din(0), T, V, f.shift, f.seqLen, stream);
    break;
  }
  }
  markEnd(std::string(part == BackwardPart::Weight ? "bwd-weight " : "bwd ") + primName(f.op), started);
  releaseScratch();
  if (part != BackwardPart::Input)
    release(kept, Queue::compute()); // W, or BWD, was its last reader
  return error_.empty() && check(primName(f.op));
}

} // namespace mhcc::runtime::cuda
