//===- DeviceKernels.h - CUDA kernels for stage programs ------------*- C++ -*-===//
//
// The GPU versions of runtime/cpu/Kernels.h, same math and conventions
// (row-major, backward adds into its outputs). Each is a template over the
// activation storage type A: float for fp32 models, bf16 for bf16 models
// (docs/precision.md: activations, their gradients and the weights the
// kernels read are A; mHC coefficients, statistics, losses and the weights'
// main gradients are fp32), and those touching the residual stream over its
// type R too (A, or float beside bf16: residual_dtype f32). Products go
// through Gemms (Gemm.h: cuBLAS SGEMM for fp32, cuBLASLt with fp32
// accumulation for bf16); the artifact's generated kernels (`k`,
// ModelKernels.h, compiled for the model's A and R) do the rest; fills, additions, conversions and the optimizer are here.
// Deterministic: no atomics; every reduction runs in a fixed order (weight
// gradients over tokens ascending, as on the CPU), products use algorithms
// fixed per shape. All pointers are device pointers; every launch is on `s`.
// `aux`, `stash` and `scratch` are raw float memory a call lays out itself.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CUDA_DEVICEKERNELS_H
#define MHCC_RUNTIME_CUDA_DEVICEKERNELS_H

#include "runtime/cuda/FlashAttention.h"

#include <cstdint>
#include <initializer_list>
#include <string>

typedef struct CUstream_st *cudaStream_t;
struct __nv_bfloat16;

namespace mhcc::runtime::cuda {

class Gemms;
class ModelKernels;
using bf16 = __nv_bfloat16;

/// Returns "" or the CUDA error of the last launches.
std::string lastError(const char *what);

// Row-major products; C is the output's storage type (fp32 for the weights'
// main gradients). c[M,N] (+)= a[M,K] b[K,N]
template <typename A, typename C>
void matmul(Gemms &g, const A *a, const A *b, C *c, int64_t M, int64_t K, int64_t N, bool accumulate);
// c[K,N] += a[M,K]^T b[M,N]
template <typename A, typename C>
void matmulTransAAcc(Gemms &g, const A *a, const A *b, C *c, int64_t M, int64_t K, int64_t N);
// c[M,K] += a[M,N] b[K,N]^T
template <typename A, typename C>
void matmulTransBAcc(Gemms &g, const A *a, const A *b, C *c, int64_t M, int64_t N, int64_t K);

void fill(float *p, int64_t count, float value, cudaStream_t s);
template <typename A> void addInto(A *dst, const A *src, int64_t count, cudaStream_t s);
/// dst = max(dst, src), element-wise.
void maxInto(float *dst, const float *src, int64_t count, cudaStream_t s);
/// Exact widening, and rounding to nearest even.
void toFloat(const bf16 *src, float *dst, int64_t count, cudaStream_t s);
void toBf16(const float *src, bf16 *dst, int64_t count, cudaStream_t s);

/// Context parallelism: each local row's microbatch row (device; null: row
/// t is microbatch row t) and the microbatch's row count, for the kernels
/// that read token ids and labels; a context rank's loss is its rows' share
/// of the microbatch's mean.
struct ContextRows {
  const int32_t *map = nullptr;
  int64_t microbatchRows = 0;
};

/// tokens are device ids; `positions` / `offsets` (device) list, per vocab
/// row, the rows t reading it in ascending t (CSR), for the deterministic
/// backward.
/// Under tensor parallelism `table` holds vocabulary rows [first, first +
/// share) and other tokens' rows come out zero (the group sums them).
template <typename A>
void embedForward(const ModelKernels &k, const int32_t *tokens, const A *table, A *out, int64_t rows, int64_t C,
                  int64_t shift, int64_t seq, cudaStream_t s, int64_t first = 0, int64_t share = INT64_MAX,
                  ContextRows context = {});
template <typename A>
void embedBackward(const ModelKernels &k, const int32_t *offsets, const int32_t *positions, int64_t vocab,
                   const A *dOut, float *dTable, int64_t C, cudaStream_t s);

// The residual stream (x, out, their gradients) is R: A, or float beside
// bf16 activations (residual_dtype f32; the image's res_t, ModelKernels.cu).
template <typename A, typename R>
void expandForward(const ModelKernels &k, const A *h, R *x, int64_t rows, int64_t C, int64_t n, cudaStream_t s);
template <typename A, typename R>
void expandBackward(const ModelKernels &k, const R *dx, A *dh, int64_t rows, int64_t C, int64_t n, cudaStream_t s);
template <typename A, typename R>
void contractForward(const ModelKernels &k, const R *x, A *h, int64_t rows, int64_t C, int64_t n, cudaStream_t s);
template <typename A, typename R>
void contractBackward(const ModelKernels &k, const A *dh, R *dx, int64_t rows, int64_t C, int64_t n, cudaStream_t s);

/// Which gradients a backward call computes. The zero-bubble split runs
/// `inputs` (B: the input gradients, leaving in `stash` what the weight
/// gradients need) and later `weights` (W: from the stash); one call with
/// both computes every output with the same operations in the same order,
/// so the bits equal B then W.
struct GradParts {
  bool inputs = true, weights = true;
};

/// Scratch each call needs for itself, and the stash B leaves for W, in
/// floats, for activations of `actBytes` bytes (4 or 2).
/// Floats the GPU keeps in the coefficients' aux beyond the CPU's: the
/// projection p = x W_map and the row sums of squares, for the backward.
int64_t mhcCoeffsAuxExtra(int64_t rows, int64_t n);
int64_t mhcCoeffsBackwardStash(int64_t rows, int64_t n);
int64_t mhcCoeffsBackwardScratch(int64_t rows, int64_t n);
/// With an fp32 stream beside bf16 activations the coefficient projection's
/// products run in fp32 (SGEMM) on the bf16 weights (and the backward's dp)
/// widened: the `wide` scratch of mhcCoeffsForward and mhcCoeffsBackward.
int64_t mhcCoeffsWideScratch(int64_t rows, int64_t C, int64_t n);
int64_t rmsNormBackwardScratch(int64_t rows, int64_t C);
/// The floats of the aux layouts below (for 4-byte activations, the
/// artifact's auxSize; bf16 pieces take half).
int64_t attentionAuxFloats(int64_t rows, int64_t C, int64_t heads, int actBytes);
int64_t swigluAuxFloats(int64_t rows, int64_t F, int actBytes);
int64_t attentionForwardScratch(int64_t rows, int64_t C, int64_t heads, int64_t seq, int actBytes);
int64_t attentionBackwardStash(int64_t rows, int64_t C);
int64_t attentionBackwardScratch(int64_t rows, int64_t C, int64_t heads, int64_t seq, int actBytes);
int64_t swigluBackwardStash(int64_t rows, int64_t F);
int64_t swigluBackwardScratch(int64_t rows, int64_t F);

/// The coefficients (Sinkhorn included) from the projection p [rows, K] and
/// the row squares [rows]: mhcCoeffsForward's last kernel, apart for the
/// tests that compare the fused entry with its parts.
template <typename A>
void mhcCoeffsFromProjection(const ModelKernels &k, const float *squares, const float *p, const A *bias,
                             const A *alpha, float *coef, float *aux, int64_t rows, int64_t C, int64_t n,
                             cudaStream_t s);
/// aux: [rows, K+1] (the logits h and 1/rms, as on the CPU), then
/// mhcCoeffsAuxExtra (p and the squares, which the backward reuses).
/// `wide`: mhcCoeffsWideScratch floats where R is wider than A, else unused.
template <typename A, typename R>
void mhcCoeffsForward(const ModelKernels &k, Gemms &g, const R *x, const A *wmap, const A *bias, const A *alpha,
                      float *coef, float *aux, int64_t rows, int64_t C, int64_t n, cudaStream_t s,
                      float *wide = nullptr);
/// The post/res and pre backwards' deferred terms of dx (pass C of the
/// backward's mixing in three passes, below): the coefficients, dOut, du.
/// With postDy, pass C also does pass A of the sublayer before, whose
/// output gradient dx is: that sublayer's coefficients and y, its dy
/// (fresh) and its post dots' partials (mhcPostPartialsCount floats, for
/// its pass B).
struct MixBackwardTerms {
  const float *coef = nullptr;
  const bf16 *dOut = nullptr, *du = nullptr;
  const float *postCoef = nullptr;
  const bf16 *postY = nullptr;
  bf16 *postDy = nullptr;
  float *postPartials = nullptr;
};
/// Floats of the post dots' partials pass C leaves for the pass B before it.
int64_t mhcPostPartialsCount(int64_t rows, int64_t C, int64_t n);
/// stash: mhcCoeffsBackwardStash (dh in fp32, dp in A); scratch:
/// mhcCoeffsBackwardScratch. With `mix` (bf16, mhcMixBackwardApplies), dx
/// is fresh and gets the three backwards' terms at once (pass C). `wide`:
/// as mhcCoeffsForward's.
template <typename A, typename R>
void mhcCoeffsBackward(const ModelKernels &k, Gemms &g, const R *x, const A *wmap, const A *alpha, const float *aux,
                       const float *dCoef, R *dx, float *dWmap, float *dBias, float *dAlpha, float *stash,
                       float *scratch, int64_t rows, int64_t C, int64_t n, GradParts parts, cudaStream_t s,
                       const MixBackwardTerms *mix = nullptr, float *wide = nullptr);
/// One sublayer's backward mixing in three passes (MhcBackwardKernels.cu),
/// the same bits as mhcPostResBackward, mhcPreBackward and mhcCoeffsBackward:
/// pass A (mhcPostBackward) where the post/res backward runs, pass B
/// (mhcMixBackwardDots) where the pre backward runs, pass C in
/// mhcCoeffsBackward (MixBackwardTerms); dx is written once. Taken by bf16
/// models with n <= 4 (kMixMaxStreams) and C a multiple of kMixColumns, every
/// array 16-byte aligned.
bool mhcMixBackwardApplies(int64_t C, int64_t n, std::initializer_list<const void *> arrays);
/// Pass A: dy and dCoef's post entries (`fresh` bits 2: dCoef, 4: dy, as
/// mhcPostResBackward's; the post dots summed in tile order where C is a
/// multiple of kMixColumns, as a joined pass C and pass B sum them); a
/// fresh dCoef's pre entries get +0.
void mhcPostBackward(const ModelKernels &k, const float *coef, const bf16 *y, const bf16 *dOut, float *dCoef,
                     bf16 *dy, int fresh, int64_t rows, int64_t C, cudaStream_t s);
/// Pass B: dCoef's res entries (written: dCoef was fresh at pass A) and pre
/// entries (added). With postPartials (pass A done by the next sublayer's
/// pass C), dCoef is fresh: its post entries from the partials too.
void mhcMixBackwardDots(const ModelKernels &k, const bf16 *x, const bf16 *dOut, const bf16 *du, float *dCoef,
                        const float *postPartials, int64_t rows, int64_t C, cudaStream_t s);
template <typename A, typename R>
void mhcPreForward(const ModelKernels &k, const R *x, const float *coef, A *u, int64_t rows, int64_t C, int64_t n,
                   cudaStream_t s);
/// Whether mhcCoeffsPreForward takes these shapes (bf16 models only): an
/// even n, n C a multiple of 64 and C of 8.
bool mhcFusedForwardApplies(int64_t C, int64_t n);
/// mhcCoeffsForward then mhcPreForward in one kernel (MhcFusedKernels.cu),
/// the same outputs and aux layout; its sums run in its own fixed order.
void mhcCoeffsPreForward(const ModelKernels &k, const bf16 *x, const bf16 *wmap, const bf16 *bias, const bf16 *alpha,
                         float *coef, float *aux, bf16 *u, int64_t rows, int64_t C, int64_t n, cudaStream_t s);
/// Whether the cluster form of mhcPostResCoeffsPreForward takes these
/// shapes: where mhcFusedForwardApplies, C a multiple of the walk's step
/// (32 fusedWarps(n) columns) and the block's x' tile within kClusterTileBytes.
bool mhcClusterForwardApplies(int64_t C, int64_t n);
/// The previous sublayer's post-res mix (xPrev, coefPrev, y into x: the
/// bits of mhcPostResForward) and then mhcCoeffsPreForward on x, in one
/// kernel (MhcFusedKernels.cu); where mhcFusedForwardApplies. `cluster`:
/// over clusters of kClusterBlocks blocks, the same bits, where
/// mhcClusterForwardApplies and the kernel got its shared memory at load
/// (ModelKernels::clusterForwardReady), else one block a tile.
void mhcPostResCoeffsPreForward(const ModelKernels &k, const bf16 *xPrev, const float *coefPrev, const bf16 *y,
                                bf16 *x, const bf16 *wmap, const bf16 *bias, const bf16 *alpha, float *coef,
                                float *aux, bf16 *u, int64_t rows, int64_t C, int64_t n, cudaStream_t s,
                                bool cluster = false);
template <typename A, typename R>
void mhcPreBackward(const ModelKernels &k, const R *x, const float *coef, const A *du, R *dx, float *dCoef,
                    int64_t rows, int64_t C, int64_t n, cudaStream_t s);
template <typename A, typename R>
void mhcPostResForward(const ModelKernels &k, const R *x, const float *coef, const A *y, R *out, int64_t rows,
                       int64_t C, int64_t n, cudaStream_t s);
/// `fresh` bits (1: dx, 2: dCoef, 4: dy): gradients whose contents are
/// undefined and taken as zero (written, not added to: the same bits).
template <typename A, typename R>
void mhcPostResBackward(const ModelKernels &k, const R *x, const float *coef, const A *y, const R *dOut, R *dx,
                        float *dCoef, A *dy, int fresh, int64_t rows, int64_t C, int64_t n, cudaStream_t s);
/// The n = 1 residual add (x and out the stream, y the sublayer's output).
template <typename A, typename R>
void residualForward(const ModelKernels &k, const R *x, const A *y, R *out, int64_t count, cudaStream_t s);
template <typename A, typename R>
void residualBackward(const ModelKernels &k, const R *dOut, R *dx, A *dy, int64_t count, cudaStream_t s);

template <typename A>
void rmsNormForward(const ModelKernels &k, const A *u, const A *gain, A *y, float *aux, int64_t rows, int64_t C,
                    double eps, cudaStream_t s);
/// scratch: rmsNormBackwardScratch (partial column sums of dGain). du is
/// added into, or with freshDu written (unread: the bits of an add into zeros).
template <typename A>
void rmsNormBackward(const ModelKernels &k, const A *u, const A *gain, const float *aux, const A *dy, A *du,
                     float *dGain, float *scratch, int64_t rows, int64_t C, GradParts parts, cudaStream_t s,
                     bool freshDu = false);

/// aux layout: [rows, 3C] rotated q, k, v and [rows, C] output o (in A),
/// then [rows, heads] fp32 log-sum-exp. bf16 models with head dim 64 or 128
/// run flash attention (FlashAttention.h: no seq^2 memory); otherwise the
/// scores and probabilities of one sequence live in fp32 scratch (all heads:
/// heads * seq^2 floats, twice in the backward), products through cuBLAS
/// strided-batched GEMMs, the causal softmax one block per row. scratch:
/// attention{Forward,Backward}Scratch; stash (backward):
/// attentionBackwardStash, the gradient of q, k, v (in A).
/// Both return "" or flash attention's launch error. `freshInput` (bf16):
/// dx holds nothing yet and is written, not added into (see swigluBackward).
/// Packed documents (runtime/cpu/AttentionKernels.h's Documents, on the
/// device): per token of the microbatch, its RoPE position and its
/// document's start in its sequence; null: one document per sequence.
struct DeviceDocuments {
  const int32_t *positions = nullptr, *firstKeys = nullptr;
};
/// `inner`: the width of q, k, v and o, C without tensor parallelism, C /
/// tp with it (`heads` this rank's heads; the scratch, stash and aux sizes
/// above take inner for C).
template <typename A>
std::string attentionForward(const ModelKernels &k, Gemms &g, const A *x, const A *wqkv, const A *wo, A *y,
                             float *aux, float *scratch, int64_t rows, int64_t C, int64_t inner, int64_t heads,
                             int64_t seq, DeviceDocuments docs, cudaStream_t s);
template <typename A>
std::string attentionBackward(const ModelKernels &k, Gemms &g, const A *x, const A *wqkv, const A *wo,
                              const float *aux, const A *dy, A *dx, float *dWqkv, float *dWo, float *stash,
                              float *scratch, int64_t rows, int64_t C, int64_t inner, int64_t heads, int64_t seq,
                              GradParts parts, DeviceDocuments docs, cudaStream_t s, bool freshInput = false);
/// The core between the projections, over every row of the microbatch, for
/// context parallelism (CudaContextParallel.cpp gathers around it; the
/// functions above run it too): q, k, v (`D` wide each, RoPE applied here in
/// place) into o and lse (scratch: attentionForwardScratch); and back from
/// the rotated q, k, v, o, lse and dO into dQkv (overwritten, RoPE undone;
/// scratch: attentionCoreBackwardScratch). rowDot: flash attention's D =
/// rowsum(dO * O) per (row, head) as attentionRowDot wrote it (o then
/// unread), or null to compute it from o; the reference core forms its own.
/// `needed` (flash attention): the rows of each sequence whose results are
/// kept (FlashRowRanges: a context rank's chunks); the reference core runs
/// every row.
template <typename A>
std::string attentionCoreForward(const ModelKernels &k, Gemms &g, A *qkv, A *o, float *lse, float *scratch,
                                 int64_t rows, int64_t D, int64_t heads, int64_t seq, DeviceDocuments docs,
                                 cudaStream_t s, FlashRowRanges needed = {});
int64_t attentionCoreBackwardScratch(int64_t rows, int64_t D, int64_t heads, int64_t seq, int actBytes);
template <typename A>
std::string attentionCoreBackward(const ModelKernels &k, Gemms &g, const A *qkv, const A *o, const float *lse,
                                  const float *rowDot, const A *dO, A *dQkv, float *scratch, int64_t rows, int64_t D,
                                  int64_t heads, int64_t seq, DeviceDocuments docs, cudaStream_t s,
                                  FlashRowRanges needed = {});
/// The projections' gradients around the core: dO = dy Wo^T (written), and
/// dx (+)= dQkv Wqkv^T (written when `fresh`, as attentionBackward's freshInput).
template <typename A>
void attentionOutputGradient(Gemms &g, const A *dy, const A *wo, A *dO, int64_t rows, int64_t C, int64_t D,
                             cudaStream_t s);
template <typename A>
void attentionInputGradient(Gemms &g, const A *dQkv, const A *wqkv, A *dx, int64_t rows, int64_t C, int64_t D,
                            bool fresh, cudaStream_t s);
/// Flash attention's rowDot ([rows, heads]) of these rows; zeros where the
/// reference core runs (which does not read it).
template <typename A>
std::string attentionRowDot(const A *o, const A *dO, float *rowDot, int64_t rows, int64_t D, int64_t heads,
                            int64_t seq, cudaStream_t s);

/// Gated DeltaNet (runtime/cpu/GdnKernels.h's math and fp32 aux layout, its
/// bf16 rounding points; GdnKernels.cu, GdnWy.cu): the recurrence runs in the
/// chunked WY form over chunks of 64 tokens (GdnWy.cu), for head dims 16, 32, 64 and 128.
/// The aux holds the CPU's layout (gdnAuxPerRow floats a row) and then
/// what the forward's scans keep for the backward: gdnAuxFloats in all.
/// Forward scratch: gdnForwardScratch; backward: stash gdnBackwardStash
/// (what B leaves for W), scratch gdnBackwardScratch (for B, W or both).
/// Both return "" or a one-line error (an unsupported head dim, a launch).
inline constexpr int64_t kGdnConvWidth = 4; // as kernels::kGdnConvWidth (cuda_kernels_test checks)
inline constexpr double kGdnL2Eps = 1e-6;
template <typename A> struct GdnWeights {
  const A *wqkv, *conv, *wab, *aLog, *dtBias, *outNorm, *wgate, *wo;
};
struct GdnWeightGrads {
  float *wqkv = nullptr, *conv = nullptr, *wab = nullptr, *aLog = nullptr, *dtBias = nullptr, *outNorm = nullptr,
        *wgate = nullptr, *wo = nullptr;
};
bool gdnHeadDimSupported(int64_t d);
std::string gdnHeadDimError(int64_t d);
int64_t gdnAuxFloats(int64_t rows, int64_t C, int64_t heads, int64_t seq);
int64_t gdnForwardScratch(int64_t rows, int64_t C, int64_t heads, int64_t seq, int actBytes);
int64_t gdnBackwardStash(int64_t rows, int64_t C, int64_t heads, int actBytes);
int64_t gdnBackwardScratch(int64_t rows, int64_t C, int64_t heads, int64_t seq, int actBytes);
/// `inner`: the width of q, k, v, the gate and o (C, or C / tp with
/// `heads` this rank's heads; the sizes above take inner for C).
template <typename A>
std::string gdnForward(Gemms &g, const A *x, const GdnWeights<A> &w, A *y, float *aux, float *scratch, int64_t rows,
                       int64_t C, int64_t inner, int64_t heads, int64_t seq, double eps, DeviceDocuments docs,
                       cudaStream_t s);
template <typename A>
std::string gdnBackward(Gemms &g, const A *x, const GdnWeights<A> &w, const float *aux, const A *dy, A *dx,
                        const GdnWeightGrads &dw, float *stash, float *scratch, int64_t rows, int64_t C, int64_t inner,
                        int64_t heads, int64_t seq, GradParts parts, DeviceDocuments docs, cudaStream_t s);

/// aux: the gate and up projections and silu(a) b, each [rows, F] in A.
/// Backward: `freshInput` (bf16): dx holds nothing yet, so its first
/// product writes it (beta = 0) instead of adding into zeros: the same
/// algorithm, so the same bits (a sum of exactly -0 aside, which +0 would
/// have made +0); fp32 keeps its add into zeros, as overwriteTransB does.
/// Stash swigluBackwardStash (the gate and up gradients),
/// scratch swigluBackwardScratch.
template <typename A>
void swigluForward(const ModelKernels &k, Gemms &g, const A *x, const A *wg, const A *wu, const A *wd, A *y,
                   float *aux, int64_t rows, int64_t C, int64_t F, cudaStream_t s);
template <typename A>
void swigluBackward(const ModelKernels &k, Gemms &g, const A *x, const A *wg, const A *wu, const A *wd,
                    const float *aux, const A *dy, A *dx, float *dWg, float *dWu, float *dWd, float *stash,
                    float *scratch, int64_t rows, int64_t C, int64_t F, GradParts parts, cudaStream_t s,
                    bool freshInput = false);

template <typename A>
void concatProjForward(Gemms &g, const A *a, const A *b, const A *w, A *z, int64_t rows, int64_t C, int64_t N);
template <typename A>
void concatProjBackward(Gemms &g, const A *a, const A *b, const A *w, const A *dz, A *da, A *db, float *dW,
                        int64_t rows, int64_t C, int64_t N, GradParts parts);

/// loss: one device float (mean over unmasked rows).
template <typename A>
void crossEntropyForward(const ModelKernels &k, const A *logits, const int32_t *labels, float *aux, float *loss,
                         int64_t rows, int64_t V, int64_t shift, int64_t seq, cudaStream_t s,
                         ContextRows context = {});
/// Under tensor parallelism `logits` are vocabulary columns [first, first
/// + V) and aux the whole rows' log-sum-exp (the share kernels below).
template <typename A>
void crossEntropyBackward(const ModelKernels &k, const A *logits, const int32_t *labels, const float *aux,
                          float scale, A *dLogits, int64_t rows, int64_t V, int64_t shift, int64_t seq,
                          cudaStream_t s, int64_t first = 0, ContextRows context = {});
/// The vocabulary-parallel forward (TensorParallelKernels.cu), in three
/// launches with the tensor-parallel group's all-reduces between them: each
/// row's maximum over the share (then the group's max), the share's sums of
/// exponentials and the label's logit where the share holds it (then the
/// group's sums of both), and the rows' log-sum-exp (aux) and mean loss.
template <typename A>
void shareRowMax(const ModelKernels &k, const A *logits, float *maxima, int64_t rows, int64_t V, cudaStream_t s);
template <typename A>
void shareRowSumExp(const ModelKernels &k, const A *logits, const float *maxima, const int32_t *labels, float *sums,
                    float *targets, int64_t rows, int64_t V, int64_t shift, int64_t seq, int64_t first,
                    cudaStream_t s, ContextRows context = {});
void shareLoss(const ModelKernels &k, const float *maxima, const float *sums, const float *targets, float *aux,
               float *loss, int64_t rows, int64_t shift, int64_t seq, cudaStream_t s, ContextRows context = {});

// ---- optimizer (the math of runtime/train/Optimizer.cpp, on the device) ----

/// A gradient range whose statistics go to out, one pair per chunk of
/// `chunk` elements (Artifact::gradientChunk of the whole tensor; the
/// range starts at a chunk boundary, its last chunk may be short):
/// out[2 (firstChunk + c)] the sum of squares (double) of chunk c,
/// out[2 (firstChunk + c) + 1] its number of zeros.
struct StatsTensor {
  const float *gradient;
  int64_t count, chunk, firstChunk;
};
/// The chunk statistics of `count` ranges (a device array) in one launch
/// of up to kMaxStatChunks blocks a range: each chunk summed in one fixed
/// order, whatever range holds it, so a tensor's chunks add up alike
/// whether one rank or the distributed optimizer's parts computed them.
void squaresAndZeros(const StatsTensor *tensors, int64_t count, double *out, cudaStream_t s);
/// `low` (may be null): the bf16 copy of w, rounded from the updated value.
void adamW(float *w, const float *g, float *m, float *v, int64_t count, float lr, float clip, float beta1,
           float beta2, float eps, float correction1, float correction2, float decay, bf16 *low, cudaStream_t s);
void sgd(float *w, const float *g, int64_t count, float lr, float clip, bf16 *low, cudaStream_t s);
/// The same updates of masters kept as their bf16 copy `low` and low 16
/// bits `rem` (runtime/train/ParamRemainders.h): each master joined, updated
/// by the arithmetic above, settled off bf16 ties, split again.
void adamWRemainders(uint16_t *rem, bf16 *low, const float *g, float *m, float *v, int64_t count, float lr,
                     float clip, float beta1, float beta2, float eps, float correction1, float correction2,
                     float decay, cudaStream_t s);
void sgdRemainders(uint16_t *rem, bf16 *low, const float *g, int64_t count, float lr, float clip, cudaStream_t s);

} // namespace mhcc::runtime::cuda

#endif // MHCC_RUNTIME_CUDA_DEVICEKERNELS_H
