//===- DeviceKernels.cu - CUDA kernels for stage programs ---------------------===//
#include "runtime/cuda/DeviceKernels.h"
#include "runtime/cuda/DependentLaunch.h"
#include "runtime/cuda/DeviceKernelsImpl.h"
#include "runtime/train/ParamRemainders.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <cmath>

namespace mhcc::runtime::cuda {
namespace {

__global__ void fillKernel(float *p, int64_t count, float value) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < count)
    p[i] = value;
}

template <typename A> __global__ void addKernel(A *dst, const A *src, int64_t count) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < count)
    dst[i] = A(float(dst[i]) + float(src[i])); // fp32 sum, rounded once (exact for float)
}

__global__ void maxKernel(float *dst, const float *src, int64_t count) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < count)
    dst[i] = fmaxf(dst[i], src[i]);
}

__global__ void toFloatKernel(const bf16 *src, float *dst, int64_t count) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < count)
    dst[i] = __bfloat162float(src[i]);
}

__global__ void toBf16Kernel(const float *src, bf16 *dst, int64_t count) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < count)
    dst[i] = __float2bfloat16_rn(src[i]);
}

// ---- optimizer ------------------------------------------------------------------------------

constexpr int kMaxStatChunks = 256; // Artifact::gradientChunk gives a tensor at most this many

/// Block (x, y): chunk x of range y, if it has one. Each thread adds every
/// kThreads-th element of the chunk in order, then a fixed tree.
__global__ void squaresAndZerosKernel(const StatsTensor *tensors, double *out) {
  const StatsTensor t = tensors[blockIdx.y];
  const int64_t begin = blockIdx.x * t.chunk;
  if (begin >= t.count)
    return;
  const int64_t end = begin + t.chunk < t.count ? begin + t.chunk : t.count;
  __shared__ double squares[kThreads], zeros[kThreads];
  double sq = 0, z = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    double v = t.gradient[i];
    sq += v * v;
    z += t.gradient[i] == 0.0f;
  }
  squares[threadIdx.x] = sq;
  zeros[threadIdx.x] = z;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      squares[threadIdx.x] += squares[threadIdx.x + stride];
      zeros[threadIdx.x] += zeros[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out[2 * (t.firstChunk + blockIdx.x)] = squares[0];
    out[2 * (t.firstChunk + blockIdx.x) + 1] = zeros[0];
  }
}

struct AdamWScalars {
  float lr, clip, b1, b2, eps, c1, c2, decay;
};

/// One element's AdamW step: every element's arithmetic, whatever loads
/// brought it.
__device__ __forceinline__ void adamWElement(float &w, float g, float &m, float &v, const AdamWScalars &k) {
  float grad = g * k.clip;
  float mm = k.b1 * m + (1.0f - k.b1) * grad;
  float vv = k.b2 * v + (1.0f - k.b2) * grad * grad;
  m = mm;
  v = vv;
  float update = (mm / k.c1) / (sqrtf(vv / k.c2) + k.eps);
  w -= k.lr * (update + k.decay * w);
}

/// Four elements a thread (16-byte loads and stores; the bf16 copy in 8)
/// when every array allows it, else one: AdamW streams 30 bytes a
/// parameter and is bound by them.
__global__ void adamWKernel(float *__restrict__ w, const float *__restrict__ g, float *__restrict__ m,
                            float *__restrict__ v, int64_t count, AdamWScalars k, bf16 *__restrict__ low, int quads) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (!quads) {
    if (i >= count)
      return;
    float wi = w[i], mi = m[i], vi = v[i];
    adamWElement(wi, g[i], mi, vi, k);
    m[i] = mi;
    v[i] = vi;
    w[i] = wi;
    if (low)
      low[i] = __float2bfloat16_rn(wi);
    return;
  }
  if (4 * i >= count)
    return;
  if (4 * i + 4 > count) { // the tail, element by element
    for (int64_t e = 4 * i; e < count; ++e) {
      float we = w[e], me = m[e], ve = v[e];
      adamWElement(we, g[e], me, ve, k);
      m[e] = me;
      v[e] = ve;
      w[e] = we;
      if (low)
        low[e] = __float2bfloat16_rn(we);
    }
    return;
  }
  float4 wq = reinterpret_cast<const float4 *>(w)[i], gq = reinterpret_cast<const float4 *>(g)[i];
  float4 mq = reinterpret_cast<const float4 *>(m)[i], vq = reinterpret_cast<const float4 *>(v)[i];
  adamWElement(wq.x, gq.x, mq.x, vq.x, k);
  adamWElement(wq.y, gq.y, mq.y, vq.y, k);
  adamWElement(wq.z, gq.z, mq.z, vq.z, k);
  adamWElement(wq.w, gq.w, mq.w, vq.w, k);
  reinterpret_cast<float4 *>(m)[i] = mq;
  reinterpret_cast<float4 *>(v)[i] = vq;
  reinterpret_cast<float4 *>(w)[i] = wq;
  if (low) {
    __nv_bfloat162 lo = __floats2bfloat162_rn(wq.x, wq.y), hi = __floats2bfloat162_rn(wq.z, wq.w);
    uint2 packed;
    memcpy(&packed.x, &lo, 4);
    memcpy(&packed.y, &hi, 4);
    reinterpret_cast<uint2 *>(low)[i] = packed;
  }
}

__global__ void sgdKernel(float *w, const float *g, int64_t count, float lr, float clip, bf16 *low) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= count)
    return;
  w[i] -= lr * (g[i] * clip);
  if (low)
    low[i] = __float2bfloat16_rn(w[i]);
}

/// Masters as their bf16 copy and low 16 bits: AdamW's element arithmetic.
struct AdamWUpdate {
  float *m, *v;
  AdamWScalars k;
  __device__ void operator()(float &w, float g, int64_t i) const {
    float mi = m[i], vi = v[i];
    adamWElement(w, g, mi, vi, k);
    m[i] = mi;
    v[i] = vi;
  }
};
/// sgdKernel's.
struct SgdUpdate {
  float lr, clip;
  __device__ void operator()(float &w, float g, int64_t) const { w -= lr * (g * clip); }
};

/// One element a thread: the two 2-byte arrays' loads coalesce a warp's
/// 64 bytes; the update's arithmetic is Update's.
template <class Update>
__global__ void remaindersKernel(uint16_t *__restrict__ rem, bf16 *__restrict__ low, const float *__restrict__ g,
                                 int64_t count, Update update) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= count)
    return;
  float w = __uint_as_float(joinMaster(__bfloat16_as_ushort(low[i]), rem[i]));
  update(w, g[i], i);
  const uint32_t bits = settleOffBf16Tie(__float_as_uint(w));
  low[i] = __float2bfloat16_rn(__uint_as_float(bits));
  rem[i] = uint16_t(bits & 0xFFFFu);
}

} // namespace

void squaresAndZeros(const StatsTensor *tensors, int64_t count, double *out, cudaStream_t s) {
  if (!count)
    return;
  squaresAndZerosKernel<<<dim3(kMaxStatChunks, unsigned(count)), kThreads, 0, s>>>(tensors, out);
}

void adamW(float *w, const float *g, float *m, float *v, int64_t count, float lr, float clip, float beta1,
           float beta2, float eps, float correction1, float correction2, float decay, bf16 *low, cudaStream_t s) {
  if (!count)
    return;
  auto aligned = [](const void *p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  const int quads = aligned(w, 16) && aligned(g, 16) && aligned(m, 16) && aligned(v, 16) && (!low || aligned(low, 8));
  const AdamWScalars k{lr, clip, beta1, beta2, eps, correction1, correction2, decay};
  adamWKernel<<<blocks(quads ? (count + 3) / 4 : count), kThreads, 0, s>>>(w, g, m, v, count, k, low, quads);
}

void sgd(float *w, const float *g, int64_t count, float lr, float clip, bf16 *low, cudaStream_t s) {
  if (count)
    sgdKernel<<<blocks(count), kThreads, 0, s>>>(w, g, count, lr, clip, low);
}

void adamWRemainders(uint16_t *rem, bf16 *low, const float *g, float *m, float *v, int64_t count, float lr,
                     float clip, float beta1, float beta2, float eps, float correction1, float correction2,
                     float decay, cudaStream_t s) {
  if (count)
    remaindersKernel<<<blocks(count), kThreads, 0, s>>>(
        rem, low, g, count, AdamWUpdate{m, v, {lr, clip, beta1, beta2, eps, correction1, correction2, decay}});
}

void sgdRemainders(uint16_t *rem, bf16 *low, const float *g, int64_t count, float lr, float clip, cudaStream_t s) {
  if (count)
    remaindersKernel<<<blocks(count), kThreads, 0, s>>>(rem, low, g, count, SgdUpdate{lr, clip});
}

std::string lastError(const char *what) {
  cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess)
    return "";
  return std::string(what) + ": " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")";
}

template <typename A, typename C>
void matmul(Gemms &g, const A *a, const A *b, C *c, int64_t M, int64_t K, int64_t N, bool accumulate) {
  g.run({false, false, M, N, K, K, N, N, dtypeFor<A>(), dtypeFor<C>()}, a, b, c, 1.0f, accumulate ? 1.0f : 0.0f);
}

template <typename A, typename C>
void matmulTransAAcc(Gemms &g, const A *a, const A *b, C *c, int64_t M, int64_t K, int64_t N) {
  g.run({true, false, K, N, M, K, N, N, dtypeFor<A>(), dtypeFor<C>()}, a, b, c, 1.0f, 1.0f);
}

template <typename A, typename C>
void matmulTransBAcc(Gemms &g, const A *a, const A *b, C *c, int64_t M, int64_t N, int64_t K) {
  g.run({false, true, M, K, N, N, N, K, dtypeFor<A>(), dtypeFor<C>()}, a, b, c, 1.0f, 1.0f);
}

void fill(float *p, int64_t count, float value, cudaStream_t s) {
  if (count)
    fillKernel<<<blocks(count), kThreads, 0, s>>>(p, count, value);
}

template <typename A> void addInto(A *dst, const A *src, int64_t count, cudaStream_t s) {
  if (count)
    addKernel<<<blocks(count), kThreads, 0, s>>>(dst, src, count);
}

void maxInto(float *dst, const float *src, int64_t count, cudaStream_t s) {
  if (count)
    maxKernel<<<blocks(count), kThreads, 0, s>>>(dst, src, count);
}

void toFloat(const bf16 *src, float *dst, int64_t count, cudaStream_t s) {
  if (count)
    toFloatKernel<<<blocks(count), kThreads, 0, s>>>(src, dst, count);
}

void toBf16(const float *src, bf16 *dst, int64_t count, cudaStream_t s) {
  if (count)
    toBf16Kernel<<<blocks(count), kThreads, 0, s>>>(src, dst, count);
}

namespace {
/// Blocks for one thread per 16 bytes of `count` activations: the grid of the
/// model kernels that take kVec elements a thread (any grid is correct: they
/// loop grid-stride, and fall back to one element a step where unaligned).
template <typename A> int vecBlocks(int64_t count) {
  constexpr int64_t perThread = 16 / sizeof(A);
  return blocks((count + perThread - 1) / perThread);
}
/// The grid of a kernel over the residual stream (R): vecBlocks where it
/// takes the 16-byte paths (R = A), one thread a quad of four elements
/// otherwise (an fp32 stream beside bf16 activations, ModelKernels.cu).
template <typename A, typename R> int streamBlocks(int64_t count) {
  return std::is_same_v<A, R> ? vecBlocks<A>(count) : blocks((count + 3) / 4);
}
} // namespace

template <typename A>
void embedForward(const ModelKernels &k, const int32_t *tokens, const A *table, A *out, int64_t rows, int64_t C,
                  int64_t shift, int64_t seq, cudaStream_t s, int64_t first, int64_t share, ContextRows context) {
  k.launch(ModelKernel::EmbedForward, blocks(rows * C), 1, kThreads, s, tokens, table, out, rows, C, shift, seq, first,
           share, context.map);
}

template <typename A>
void embedBackward(const ModelKernels &k, const int32_t *offsets, const int32_t *positions, int64_t vocab,
                   const A *dOut, float *dTable, int64_t C, cudaStream_t s) {
  k.launch(ModelKernel::EmbedBackward, blocks(vocab * C), 1, kThreads, s, offsets, positions, vocab, dOut, dTable, C);
}

template <typename A, typename R>
void expandForward(const ModelKernels &k, const A *h, R *x, int64_t rows, int64_t C, int64_t n, cudaStream_t s) {
  k.launch(ModelKernel::ExpandForward, streamBlocks<A, R>(rows * C), 1, kThreads, s, h, x, rows, C);
}

template <typename A, typename R>
void expandBackward(const ModelKernels &k, const R *dx, A *dh, int64_t rows, int64_t C, int64_t n, cudaStream_t s) {
  k.launch(ModelKernel::ExpandBackward, streamBlocks<A, R>(rows * C), 1, kThreads, s, dx, dh, rows, C);
}

template <typename A, typename R>
void contractForward(const ModelKernels &k, const R *x, A *h, int64_t rows, int64_t C, int64_t n, cudaStream_t s) {
  k.launch(ModelKernel::ContractForward, streamBlocks<A, R>(rows * C), 1, kThreads, s, x, h, rows, C);
}

template <typename A, typename R>
void contractBackward(const ModelKernels &k, const A *dh, R *dx, int64_t rows, int64_t C, int64_t n, cudaStream_t s) {
  k.launch(ModelKernel::ContractBackward, streamBlocks<A, R>(rows * C), 1, kThreads, s, dh, dx, rows, C);
}

/// The coefficient kernels spread a token's n x n matrix over a group of
/// lanes (n * n, or the largest multiple of n within a warp), in blocks of
/// kCoeffBlockThreads (ModelKernels.cu: kCoeffLanes, mhcc_abi_coeff_tokens_per_block).
constexpr int kCoeffBlockThreads = 64;
inline unsigned coeffBlocks(int64_t rows, int64_t n) {
  const int64_t lanes = n * n <= 32 ? n * n : 32 / n * n;
  const int64_t tokensPerBlock = kCoeffBlockThreads / 32 * (32 / lanes);
  return unsigned((rows + tokensPerBlock - 1) / tokensPerBlock);
}

template <typename A>
void mhcCoeffsFromProjection(const ModelKernels &k, const float *squares, const float *p, const A *bias,
                             const A *alpha, float *coef, float *aux, int64_t rows, int64_t C, int64_t n,
                             cudaStream_t s) {
  k.launch(ModelKernel::MhcCoeffsForward, coeffBlocks(rows, n), 1, kCoeffBlockThreads, s, squares, p, bias, alpha,
           coef, aux, rows, C);
}

template <typename A, typename R>
void mhcCoeffsForward(const ModelKernels &k, Gemms &g, const R *x, const A *wmap, const A *bias, const A *alpha,
                      float *coef, float *aux, int64_t rows, int64_t C, int64_t n, cudaStream_t s, float *wide) {
  const int64_t K = n * n + 2 * n, width = n * C;
  float *p = aux + rows * (K + 1), *squares = p + rows * K; // kept for the backward
  if constexpr (std::is_same_v<A, R>) {
    matmul(g, x, wmap, p, rows, width, K, false);
  } else { // an fp32 stream: the product in fp32 of it and the bf16 weights, as the CPU computes it
    toFloat(wmap, wide, width * K, s);
    matmul(g, x, static_cast<const float *>(wide), p, rows, width, K, false);
  }
  k.launch(ModelKernel::RowSquares, warpBlocks(rows), 1, kThreads, s, x, squares, rows, width);
  mhcCoeffsFromProjection(k, static_cast<const float *>(squares), static_cast<const float *>(p), bias, alpha, coef,
                          aux, rows, C, n, s);
}

template <typename A, typename R>
void mhcCoeffsBackward(const ModelKernels &k, Gemms &g, const R *x, const A *wmap, const A *alpha, const float *aux,
                       const float *dCoef, R *dx, float *dWmap, float *dBias, float *dAlpha, float *stash,
                       float *scratch, int64_t rows, int64_t C, int64_t n, GradParts parts, cudaStream_t s,
                       const MixBackwardTerms *mix, float *wide) {
  const int64_t K = n * n + 2 * n, width = n * C;
  const float *p = aux + rows * (K + 1), *squares = p + rows * K; // the forward's
  float *dh = stash;
  A *dp = reinterpret_cast<A *>(stash + rows * K);
  float *rScale = scratch, *partial = scratch + rows;
  // An fp32 stream: dp (stored as A by the Sinkhorn backward) and, for the
  // input gradient, the weights widened, for the products with the stream
  // in fp32 (dp once a call: B widens it, W alone from the stash).
  constexpr bool kWide = !std::is_same_v<A, R>;
  float *wideWmap = wide, *wideDp = wide + width * K;
  if (parts.inputs) {
    k.launch(ModelKernel::MhcCoeffsBackward, coeffBlocks(rows, n), 1, kCoeffBlockThreads, s, squares, p, alpha, aux,
             dCoef, dh, dp, rScale, rows, C, earlyLoads());
    if constexpr (kWide) {
      toFloat(dp, wideDp, rows * K, s);
      toFloat(wmap, wideWmap, width * K, s);
      matmulTransBAcc(g, static_cast<const float *>(wideDp), static_cast<const float *>(wideWmap), dx, rows, K,
                      width);
      k.launch(ModelKernel::RowScaleAdd, streamBlocks<A, R>(rows * width), 1, kThreads, s, x, rScale, dx, rows,
               width);
    } else if (mix) {
      // Pass C (bf16 only: the caller checked mhcMixBackwardApplies): the
      // post/res and pre backwards' terms too, into a fresh dx.
      const unsigned columnTiles = unsigned(C / kMixColumns);
      const unsigned tokenTiles = unsigned((rows + kMixTokens - 1) / kMixTokens);
      if (mix->postDy)
        k.launch(ModelKernel::MhcMixBackwardInputPost, columnTiles, tokenTiles, kMixThreads, s, x, wmap,
                 static_cast<const A *>(dp), static_cast<const float *>(rScale), mix->coef, mix->dOut, mix->du, dx,
                 mix->postCoef, mix->postY, mix->postDy, mix->postPartials, rows, C, earlyLoads());
      else
        k.launch(ModelKernel::MhcMixBackwardInput, columnTiles, tokenTiles, kMixThreads, s, x, wmap,
                 static_cast<const A *>(dp), static_cast<const float *>(rScale), mix->coef, mix->dOut, mix->du, dx,
                 rows, C, earlyLoads());
    } else if (std::is_same_v<A, bf16> && n <= 8) { // (R = A here)
      // The product and the RMS term in one pass, on tensor cores (MhcBackwardKernels.cu;
      // its shared memory holds wmap's slice up to n = 8).
      const unsigned columnTiles = unsigned((width + kInputGradColumns - 1) / kInputGradColumns);
      const unsigned tokenTiles = unsigned((rows + kInputGradTokens - 1) / kInputGradTokens);
      k.launch(ModelKernel::MhcCoeffsBackwardInput, columnTiles, tokenTiles, kInputGradThreads, s, x, wmap, dp,
               rScale, dx, rows, width);
    } else {
      matmulTransBAcc(g, dp, wmap, dx, rows, K, width);
      k.launch(ModelKernel::RowScaleAdd, vecBlocks<A>(rows * width), 1, kThreads, s, x, rScale, dx, rows, width);
    }
  }
  if (parts.weights) {
    if (K <= 128) { // one launch each for both gate gradients' partials and sums (the same bits)
      k.launch(ModelKernel::MhcGateGradPartials, unsigned(columnChunks(rows)), 1, kThreads, s, dh, p, aux, rows,
               partial, earlyLoads());
      addColumnPartials(partial, columnChunks(rows), K + 3, dBias, s, K, dAlpha);
    } else {
      addColumnSums(k, ModelKernel::MhcBiasGradPartials, rows, K, partial, dBias, s, dh, rows);
      addColumnSums(k, ModelKernel::MhcAlphaGradPartials, rows, 3, partial, dAlpha, s, dh, p, aux, rows);
    }
    if constexpr (kWide) {
      if (!parts.inputs) // W apart from B
        toFloat(dp, wideDp, rows * K, s);
      matmulTransAAcc(g, x, static_cast<const float *>(wideDp), dWmap, rows, width, K);
    } else {
      matmulTransAAcc(g, x, dp, dWmap, rows, width, K);
    }
  }
}

bool mhcMixBackwardApplies(int64_t C, int64_t n, std::initializer_list<const void *> arrays) {
  for (const void *array : arrays)
    if (reinterpret_cast<uintptr_t>(array) % 16 != 0)
      return false;
  return n <= kMixMaxStreams && C % kMixColumns == 0;
}

void mhcPostBackward(const ModelKernels &k, const float *coef, const bf16 *y, const bf16 *dOut, float *dCoef,
                     bf16 *dy, int fresh, int64_t rows, int64_t C, cudaStream_t s) {
  k.launch(ModelKernel::MhcPostBackward, warpBlocks(rows), 1, kThreads, s, coef, y, dOut, dCoef, dy, fresh, rows, C);
}

int64_t mhcPostPartialsCount(int64_t rows, int64_t C, int64_t n) { return rows * (C / kMixColumns) * n; }

void mhcMixBackwardDots(const ModelKernels &k, const bf16 *x, const bf16 *dOut, const bf16 *du, float *dCoef,
                        const float *postPartials, int64_t rows, int64_t C, cudaStream_t s) {
  k.launch(ModelKernel::MhcMixBackwardDots, warpBlocks(rows), 1, kThreads, s, x, dOut, du, dCoef, postPartials,
           int64_t(C / kMixColumns), rows, C, earlyLoads());
}

template <typename A, typename R>
void mhcPreForward(const ModelKernels &k, const R *x, const float *coef, A *u, int64_t rows, int64_t C, int64_t n,
                   cudaStream_t s) {
  k.launch(ModelKernel::MhcPreForward, streamBlocks<A, R>(rows * C), 1, kThreads, s, x, coef, u, rows, C);
}

bool mhcFusedForwardApplies(int64_t C, int64_t n) { return n % 2 == 0 && n <= 8 && (n * C) % 64 == 0 && C % 8 == 0; }

void mhcCoeffsPreForward(const ModelKernels &k, const bf16 *x, const bf16 *wmap, const bf16 *bias, const bf16 *alpha,
                         float *coef, float *aux, bf16 *u, int64_t rows, int64_t C, int64_t n, cudaStream_t s) {
  k.launch(ModelKernel::MhcCoeffsPreForward, unsigned((rows + kFusedTokens - 1) / kFusedTokens), 1,
           unsigned(32 * fusedWarps(n)), s,
           x, wmap, bias, alpha, coef, aux, u, rows, C);
}

namespace {
/// Bytes of the cluster kernel's x' tile: kFusedTokens rows of a quarter of
/// the n C bf16 stream and the pad.
int64_t clusterTileBytes(int64_t C, int64_t n) { return kFusedTokens * (n * C / kClusterBlocks * 2 + kClusterTilePad); }
} // namespace

bool mhcClusterForwardApplies(int64_t C, int64_t n) {
  return mhcFusedForwardApplies(C, n) && C % (32 * fusedWarps(n)) == 0 && clusterTileBytes(C, n) <= kClusterTileBytes;
}

void mhcPostResCoeffsPreForward(const ModelKernels &k, const bf16 *xPrev, const float *coefPrev, const bf16 *y,
                                bf16 *x, const bf16 *wmap, const bf16 *bias, const bf16 *alpha, float *coef,
                                float *aux, bf16 *u, int64_t rows, int64_t C, int64_t n, cudaStream_t s,
                                bool cluster) {
  const unsigned tiles = unsigned((rows + kFusedTokens - 1) / kFusedTokens);
  if (cluster && k.clusterForwardReady() && mhcClusterForwardApplies(C, n))
    k.launchShared(ModelKernel::MhcPostResCoeffsPreForwardCluster, tiles * kClusterBlocks,
                   unsigned(32 * fusedWarps(n) / kClusterBlocks), unsigned(clusterTileBytes(C, n)), s, xPrev, coefPrev,
                   y, x, wmap, bias, alpha, coef, aux, u, rows, C);
  else
    k.launch(ModelKernel::MhcPostResCoeffsPreForward, tiles, 1, unsigned(32 * fusedWarps(n)), s, xPrev, coefPrev, y,
             x, wmap, bias, alpha, coef, aux, u, rows, C);
}

template <typename A, typename R>
void mhcPreBackward(const ModelKernels &k, const R *x, const float *coef, const A *du, R *dx, float *dCoef,
                    int64_t rows, int64_t C, int64_t n, cudaStream_t s) {
  k.launch(ModelKernel::MhcPreBackward, warpBlocks(rows), 1, kThreads, s, x, coef, du, dx, dCoef, rows, C);
}

template <typename A, typename R>
void mhcPostResForward(const ModelKernels &k, const R *x, const float *coef, const A *y, R *out, int64_t rows,
                       int64_t C, int64_t n, cudaStream_t s) {
  k.launch(ModelKernel::MhcPostResForward, streamBlocks<A, R>(rows * C), 1, kThreads, s, x, coef, y, out, rows, C);
}

template <typename A, typename R>
void mhcPostResBackward(const ModelKernels &k, const R *x, const float *coef, const A *y, const R *dOut, R *dx,
                        float *dCoef, A *dy, int fresh, int64_t rows, int64_t C, int64_t n, cudaStream_t s) {
  k.launch(ModelKernel::MhcPostResBackward, warpBlocks(rows), 1, kThreads, s, x, coef, y, dOut, dx, dCoef, dy, fresh,
           rows, C);
}

template <typename A, typename R>
void residualForward(const ModelKernels &k, const R *x, const A *y, R *out, int64_t count, cudaStream_t s) {
  k.launch(ModelKernel::ResidualForward, streamBlocks<A, R>(count), 1, kThreads, s, x, y, out, count);
}

template <typename A, typename R>
void residualBackward(const ModelKernels &k, const R *dOut, R *dx, A *dy, int64_t count, cudaStream_t s) {
  k.launch(ModelKernel::ResidualBackward, streamBlocks<A, R>(count), 1, kThreads, s, dOut, dx, dy, count);
}

template <typename A>
void rmsNormForward(const ModelKernels &k, const A *u, const A *gain, A *y, float *aux, int64_t rows, int64_t C,
                    double eps, cudaStream_t s) {
  k.launch(ModelKernel::RmsNormForward, warpBlocks(rows), 1, kThreads, s, u, gain, aux, y, rows, C, float(eps));
}

template <typename A>
void rmsNormBackward(const ModelKernels &k, const A *u, const A *gain, const float *aux, const A *dy, A *du,
                     float *dGain, float *scratch, int64_t rows, int64_t C, GradParts parts, cudaStream_t s,
                     bool freshDu) {
  if (parts.weights)
    addColumnSums(k, ModelKernel::RmsNormGainGradPartials, rows, C, scratch, dGain, s, u, aux, dy, rows, C);
  if (parts.inputs)
    k.launch(ModelKernel::RmsNormBackwardRow, warpBlocks(rows), 1, kThreads, s, u, gain, aux, dy, du,
             int(freshDu), rows, C);
}

template <typename A>
void swigluForward(const ModelKernels &k, Gemms &g, const A *x, const A *wg, const A *wu, const A *wd, A *y,
                   float *aux, int64_t rows, int64_t C, int64_t F, cudaStream_t s) {
  const int64_t count = rows * F;
  A *a = reinterpret_cast<A *>(aux), *b = a + count, *hsw = b + count;
  matmul(g, x, wg, a, rows, C, F, false);
  matmul(g, x, wu, b, rows, C, F, false);
  k.launch(ModelKernel::SwigluGate, vecBlocks<A>(count), 1, kThreads, s, a, b, hsw, count);
  matmul(g, hsw, wd, y, rows, F, C, false);
}

template <typename A>
void swigluBackward(const ModelKernels &k, Gemms &g, const A *x, const A *wg, const A *wu, const A *wd,
                    const float *aux, const A *dy, A *dx, float *dWg, float *dWu, float *dWd, float *stash,
                    float *scratch, int64_t rows, int64_t C, int64_t F, GradParts parts, cudaStream_t s,
                    bool freshInput) {
  const int64_t count = rows * F;
  const A *a = reinterpret_cast<const A *>(aux), *b = a + count, *hsw = b + count;
  A *dh = reinterpret_cast<A *>(scratch), *da = reinterpret_cast<A *>(stash), *db = da + count;
  if (parts.inputs) {
    overwriteTransB(g, dy, wd, dh, rows, C, F, s); // dh = dy Wd^T
    k.launch(ModelKernel::SwigluBackwardGate, vecBlocks<A>(count), 1, kThreads, s, a, b, dh, da, db, count);
    intoTransB(g, da, wg, dx, rows, F, C, freshInput, s);
    matmulTransBAcc(g, db, wu, dx, rows, F, C);
  }
  if (parts.weights) {
    matmulTransAAcc(g, hsw, dy, dWd, rows, F, C);
    matmulTransAAcc(g, x, da, dWg, rows, C, F);
    matmulTransAAcc(g, x, db, dWu, rows, C, F);
  }
}

template <typename A>
void concatProjForward(Gemms &g, const A *a, const A *b, const A *w, A *z, int64_t rows, int64_t C, int64_t N) {
  matmul(g, a, w, z, rows, C, N, false);
  matmul(g, b, w + C * N, z, rows, C, N, true);
}

template <typename A>
void concatProjBackward(Gemms &g, const A *a, const A *b, const A *w, const A *dz, A *da, A *db, float *dW,
                        int64_t rows, int64_t C, int64_t N, GradParts parts) {
  if (parts.weights) {
    matmulTransAAcc(g, a, dz, dW, rows, C, N);
    matmulTransAAcc(g, b, dz, dW + C * N, rows, C, N);
  }
  if (parts.inputs) {
    matmulTransBAcc(g, dz, w, da, rows, N, C);
    matmulTransBAcc(g, dz, w + C * N, db, rows, N, C);
  }
}

template <typename A>
void crossEntropyForward(const ModelKernels &k, const A *logits, const int32_t *labels, float *aux, float *loss,
                         int64_t rows, int64_t V, int64_t shift, int64_t seq, cudaStream_t s, ContextRows context) {
  k.launch(ModelKernel::LogSumExp, unsigned(rows), 1, kThreads, s, logits, aux, rows, V);
  // One block: its threads gather the rows' terms, one adds them in row order.
  k.launch(ModelKernel::Loss, 1, 1, kThreads, s, logits, labels, aux, loss, rows, V, shift, seq, context.map,
           context.microbatchRows);
}

template <typename A>
void crossEntropyBackward(const ModelKernels &k, const A *logits, const int32_t *labels, const float *aux,
                          float scale, A *dLogits, int64_t rows, int64_t V, int64_t shift, int64_t seq,
                          cudaStream_t s, int64_t first, ContextRows context) {
  int64_t counted = 0; // the mean's rows: the microbatch's under context parallelism
  if (context.map)
    counted = (context.microbatchRows / seq) * std::max<int64_t>(0, seq - shift);
  else
    for (int64_t t = 0; t < rows; ++t)
      counted += (t % seq) + shift < seq;
  if (!counted)
    return;
  k.launch(ModelKernel::CrossEntropyBackward, vecBlocks<A>(rows * V), 1, kThreads, s, logits, labels, aux,
           scale / float(counted), dLogits, rows, V, shift, seq, first, context.map);
}

template <typename A>
void shareRowMax(const ModelKernels &k, const A *logits, float *maxima, int64_t rows, int64_t V, cudaStream_t s) {
  k.launch(ModelKernel::ShareRowMax, unsigned(rows), 1, kThreads, s, logits, maxima, rows, V);
}

template <typename A>
void shareRowSumExp(const ModelKernels &k, const A *logits, const float *maxima, const int32_t *labels, float *sums,
                    float *targets, int64_t rows, int64_t V, int64_t shift, int64_t seq, int64_t first,
                    cudaStream_t s, ContextRows context) {
  k.launch(ModelKernel::ShareRowSumExp, unsigned(rows), 1, kThreads, s, logits, maxima, labels, sums, targets, rows, V,
           shift, seq, first, context.map);
}

void shareLoss(const ModelKernels &k, const float *maxima, const float *sums, const float *targets, float *aux,
               float *loss, int64_t rows, int64_t shift, int64_t seq, cudaStream_t s, ContextRows context) {
  k.launch(ModelKernel::ShareLoss, 1, 1, kThreads, s, maxima, sums, targets, aux, loss, rows, shift, seq, context.map,
           context.microbatchRows);
}

int64_t mhcCoeffsAuxExtra(int64_t rows, int64_t n) { return rows * (n * n + 2 * n) + rows; }
int64_t mhcCoeffsBackwardStash(int64_t rows, int64_t n) { return 2 * rows * (n * n + 2 * n); }
int64_t mhcCoeffsBackwardScratch(int64_t rows, int64_t n) { return rows + columnChunks(rows) * (n * n + 2 * n + 3); }
int64_t mhcCoeffsWideScratch(int64_t rows, int64_t C, int64_t n) { return (n * C + rows) * (n * n + 2 * n); }
int64_t rmsNormBackwardScratch(int64_t rows, int64_t C) { return columnChunks(rows) * C; }
int64_t swigluAuxFloats(int64_t rows, int64_t F, int actBytes) { return (3 * rows * F * actBytes + 3) / 4; }
int64_t swigluBackwardStash(int64_t rows, int64_t F) { return 2 * rows * F; }
int64_t swigluBackwardScratch(int64_t rows, int64_t F) { return rows * F; }

// Every template above, for fp32 and bf16 models (DeviceKernels.h declares them).
#define INSTANTIATE(...) template decltype(__VA_ARGS__) __VA_ARGS__;
#define INSTANTIATE_FOR(A)                                                                                       \
  INSTANTIATE(matmul<A, A>)                                                                                    \
  INSTANTIATE(matmulTransAAcc<A, float>)                                                                       \
  INSTANTIATE(matmulTransBAcc<A, A>)                                                                           \
  INSTANTIATE(addInto<A>)                                                                                      \
  INSTANTIATE(embedForward<A>)                                                                                 \
  INSTANTIATE(embedBackward<A>)                                                                                \
  INSTANTIATE(expandForward<A, A>)                                                                                \
  INSTANTIATE(expandBackward<A, A>)                                                                               \
  INSTANTIATE(contractForward<A, A>)                                                                              \
  INSTANTIATE(contractBackward<A, A>)                                                                             \
  INSTANTIATE(mhcCoeffsFromProjection<A>)                                                                         \
  INSTANTIATE(mhcCoeffsForward<A, A>)                                                                             \
  INSTANTIATE(mhcCoeffsBackward<A, A>)                                                                            \
  INSTANTIATE(mhcPreForward<A, A>)                                                                                \
  INSTANTIATE(mhcPreBackward<A, A>)                                                                               \
  INSTANTIATE(mhcPostResForward<A, A>)                                                                            \
  INSTANTIATE(mhcPostResBackward<A, A>)                                                                           \
  INSTANTIATE(residualForward<A, A>)                                                                              \
  INSTANTIATE(residualBackward<A, A>)                                                                             \
  INSTANTIATE(rmsNormForward<A>)                                                                               \
  INSTANTIATE(rmsNormBackward<A>)                                                                              \
  INSTANTIATE(swigluForward<A>)                                                                                \
  INSTANTIATE(swigluBackward<A>)                                                                               \
  INSTANTIATE(concatProjForward<A>)                                                                            \
  INSTANTIATE(concatProjBackward<A>)                                                                           \
  INSTANTIATE(crossEntropyForward<A>)                                                                          \
  INSTANTIATE(crossEntropyBackward<A>)                                                                         \
  INSTANTIATE(shareRowMax<A>)                                                                                  \
  INSTANTIATE(shareRowSumExp<A>)
INSTANTIATE_FOR(float)
INSTANTIATE_FOR(bf16)
// An fp32 residual stream beside bf16 activations (residual_dtype f32).
INSTANTIATE(expandForward<bf16, float>)
INSTANTIATE(expandBackward<bf16, float>)
INSTANTIATE(contractForward<bf16, float>)
INSTANTIATE(contractBackward<bf16, float>)
INSTANTIATE(mhcCoeffsForward<bf16, float>)
INSTANTIATE(mhcCoeffsBackward<bf16, float>)
INSTANTIATE(mhcPreForward<bf16, float>)
INSTANTIATE(mhcPreBackward<bf16, float>)
INSTANTIATE(mhcPostResForward<bf16, float>)
INSTANTIATE(mhcPostResBackward<bf16, float>)
INSTANTIATE(residualForward<bf16, float>)
INSTANTIATE(residualBackward<bf16, float>)
INSTANTIATE(matmul<bf16, float>)
INSTANTIATE(matmulTransBAcc<bf16, float>) // Gated DeltaNet: an fp32 gradient from bf16 operands

} // namespace mhcc::runtime::cuda
