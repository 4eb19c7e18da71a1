//===- ModelKernels.cu - the model's CUDA kernels, specialized by mhcc ------===//
//
// mhcc prepends the model's constants (kStreams, kSinkhornIterations) and
// compiles this file with nvcc into the artifact; the runtime loads the image
// through the CUDA driver API and launches these extern "C" kernels by name
// (runtime/cuda/ModelKernels.h lists them with their parameters). Every
// non-GEMM piece of the model's forward and backward is here; cuBLAS does
// the matrix products, the runtime keeps only model-independent kernels
// (fills, the optimizer, the second stage of column sums).
//
// Same math, conventions and summation orders as runtime/cpu/Kernels.h, in
// fp32, without atomics: every reduction runs in an order fixed by the
// shapes alone, so results are bit-identical run to run and across layouts.
//
// The mhcc_abi_* globals let the runtime check that an image matches the
// launch conventions it was built for.
//
//===----------------------------------------------------------------------===//
#include <cstdint>

constexpr int kThreads = 256;           // block size of every block-wide kernel
constexpr int64_t kChunkRows = 64;      // rows per partial in two-stage column sums
constexpr double kRopeBase = 10000.0;
constexpr float kMhcRmsEps = 1e-6f;
constexpr float kSinkhornClamp = 1e-6f;
// Sinkhorn steps (2 per iteration) of a 4x4 matrix the backward keeps per
// token instead of recomputing them: 40 iterations at n = 4, 10 at n = 8.
constexpr int kCachedSinkhornSteps = 80;
constexpr int kCoefficients = kStreams * kStreams + 2 * kStreams; // pre, post, res

extern "C" __device__ const int mhcc_abi_version = 1;
extern "C" __device__ const int mhcc_abi_streams = kStreams;
extern "C" __device__ const int mhcc_abi_sinkhorn_iterations = kSinkhornIterations;
extern "C" __device__ const int mhcc_abi_block_threads = kThreads;
extern "C" __device__ const int mhcc_abi_chunk_rows = int(kChunkRows);

__device__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// ---- deterministic reductions -------------------------------------------------------
// Butterfly sums: every lane ends with the same bits (fp addition commutes),
// and the association order is fixed by the block shape alone.

__device__ float warpSum(float v) {
  for (int offset = 16; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ float warpMax(float v) {
  for (int offset = 16; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

/// Sum over a block of kThreads threads; every thread gets the result.
__device__ float blockSum(float v) {
  __shared__ float partial[kThreads / 32];
  __syncthreads(); // the previous call's readers are done with `partial`
  v = warpSum(v);
  if (threadIdx.x % 32 == 0)
    partial[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < kThreads / 32; ++w)
    total += partial[w];
  return total;
}

__device__ float blockMax(float v) {
  __shared__ float partial[kThreads / 32];
  __syncthreads();
  v = warpMax(v);
  if (threadIdx.x % 32 == 0)
    partial[threadIdx.x / 32] = v;
  __syncthreads();
  float m = partial[0];
  for (int w = 1; w < kThreads / 32; ++w)
    m = fmaxf(m, partial[w]);
  return m;
}

/// One warp per row: out[t] = sum of squares of row t.
extern "C" __global__ void mhcc_row_squares(const float *x, float *out, int64_t rows, int64_t width) {
  int64_t t = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (t >= rows)
    return;
  const float *row = x + t * width;
  float sq = 0;
  for (int64_t k = lane; k < width; k += 32)
    sq += row[k] * row[k];
  sq = warpSum(sq);
  if (lane == 0)
    out[t] = sq;
}

/// First stage of a column sum: partial[chunk, c] = sum over the chunk's
/// kChunkRows rows (ascending) of value(t, c); the runtime adds the chunks
/// in order.
template <typename Value>
__device__ void columnPartials(Value value, int64_t rows, int64_t cols, float *partial) {
  int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  int64_t chunk = blockIdx.y;
  if (c >= cols)
    return;
  float acc = 0;
  for (int64_t t = chunk * kChunkRows; t < min(rows, (chunk + 1) * kChunkRows); ++t)
    acc += value(t, c);
  partial[chunk * cols + c] = acc;
}

// ---- elementwise, embedding, stream expand / contract -------------------------------

extern "C" __global__ void mhcc_embed_forward(const int32_t *tokens, const float *table, float *out, int64_t rows,
                                              int64_t C, int64_t shift, int64_t seq) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * C)
    return;
  int64_t t = i / C, c = i % C;
  int64_t src = (t % seq) + shift < seq ? t + shift : t;
  out[i] = table[int64_t(tokens[src]) * C + c];
}

extern "C" __global__ void mhcc_embed_backward(const int32_t *offsets, const int32_t *positions, int64_t vocab,
                                               const float *dOut, float *dTable, int64_t C) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= vocab * C)
    return;
  int64_t v = i / C, c = i % C;
  float acc = dTable[i];
  for (int32_t p = offsets[v]; p < offsets[v + 1]; ++p)
    acc += dOut[int64_t(positions[p]) * C + c];
  dTable[i] = acc;
}

extern "C" __global__ void mhcc_expand_forward(const float *h, float *x, int64_t rows, int64_t C) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * kStreams * C)
    return;
  int64_t t = i / (kStreams * C), c = i % C;
  x[i] = h[t * C + c];
}

extern "C" __global__ void mhcc_expand_backward(const float *dx, float *dh, int64_t rows, int64_t C) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * C)
    return;
  int64_t t = i / C, c = i % C;
  float acc = dh[i];
  for (int64_t s = 0; s < kStreams; ++s)
    acc += dx[(t * kStreams + s) * C + c];
  dh[i] = acc;
}

extern "C" __global__ void mhcc_contract_forward(const float *x, float *h, int64_t rows, int64_t C) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * C)
    return;
  int64_t t = i / C, c = i % C;
  float sum = 0;
  for (int64_t s = 0; s < kStreams; ++s)
    sum += x[(t * kStreams + s) * C + c];
  h[i] = sum / float(kStreams);
}

extern "C" __global__ void mhcc_contract_backward(const float *dh, float *dx, int64_t rows, int64_t C) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * kStreams * C)
    return;
  int64_t t = i / (kStreams * C), c = i % C;
  dx[i] += dh[t * C + c] / float(kStreams);
}

// ---- mHC ------------------------------------------------------------------------------

/// m = exp(logits - row max): the positive matrix Sinkhorn starts from.
__device__ void sinkhornStart(const float *logits, float *m) {
  for (int i = 0; i < kStreams; ++i) {
    float rowMax = logits[i * kStreams];
    for (int j = 1; j < kStreams; ++j)
      rowMax = fmaxf(rowMax, logits[i * kStreams + j]);
    for (int j = 0; j < kStreams; ++j)
      m[i * kStreams + j] = expf(logits[i * kStreams + j] - rowMax);
  }
}

/// One Sinkhorn step (even steps normalize rows, odd steps columns), each
/// line summed in index order: the forward and the backward's replay share it.
__device__ void sinkhornStep(float *mat, int step) {
  const bool rowStep = step % 2 == 0;
  for (int a = 0; a < kStreams; ++a) {
    float sum = 0;
    for (int b = 0; b < kStreams; ++b)
      sum += rowStep ? mat[a * kStreams + b] : mat[b * kStreams + a];
    sum = fmaxf(sum, kSinkhornClamp);
    for (int b = 0; b < kStreams; ++b) {
      if (rowStep)
        mat[a * kStreams + b] /= sum;
      else
        mat[b * kStreams + a] /= sum;
    }
  }
}

/// Sinkhorn-Knopp on one kStreams x kStreams matrix, as on the CPU.
__device__ void sinkhorn(const float *logits, float *out) {
  float m[kStreams * kStreams];
  sinkhornStart(logits, m);
  for (int step = 0; step < 2 * kSinkhornIterations; ++step)
    sinkhornStep(m, step);
  for (int e = 0; e < kStreams * kStreams; ++e)
    out[e] = m[e];
}

extern "C" __global__ void mhcc_mhc_coeffs_forward(const float *squares, const float *p, const float *bias,
                                                   const float *alpha, float *coef, float *aux, int64_t rows,
                                                   int64_t C) {
  int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= rows)
    return;
  const int64_t width = kStreams * C;
  const int K = kCoefficients;
  float rms = sqrtf(squares[t] / float(width));
  float r = 1.0f / (rms + kMhcRmsEps);
  float *h = aux + t * (K + 1);
  for (int k = 0; k < K; ++k) {
    float a = k < kStreams ? alpha[0] : k < 2 * kStreams ? alpha[1] : alpha[2];
    h[k] = r * p[t * K + k] * a + bias[k];
  }
  h[K] = r;
  float *out = coef + t * K;
  for (int k = 0; k < kStreams; ++k) {
    out[k] = sigmoidf(h[k]);
    out[kStreams + k] = 2.0f * sigmoidf(h[kStreams + k]);
  }
  sinkhorn(h + 2 * kStreams, out + 2 * kStreams);
}

/// Per token: dh (through the sigmoids and the unrolled Sinkhorn), dp and
/// the scale of the RMS term; the reductions over tokens run afterwards.
extern "C" __global__ void mhcc_mhc_coeffs_backward(const float *squares, const float *p, const float *alpha,
                                                    const float *aux, const float *dCoef, float *dh, float *dp,
                                                    float *rScale, int64_t rows, int64_t C) {
  int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= rows)
    return;
  const int64_t width = kStreams * C;
  const int K = kCoefficients;
  const float *h = aux + t * (K + 1);
  const float r = h[K];
  const float *dc = dCoef + t * K;
  float *g = dh + t * K;
  for (int k = 0; k < kStreams; ++k) {
    float s = sigmoidf(h[k]);
    g[k] = dc[k] * s * (1.0f - s);
    float s2 = sigmoidf(h[kStreams + k]);
    g[kStreams + k] = 2.0f * dc[kStreams + k] * s2 * (1.0f - s2);
  }
  // Sinkhorn backward, each step's input recomputed from the logits.
  {
    constexpr int nn = kStreams * kStreams;
    const float *logits = h + 2 * kStreams;
    float m0[kStreams * kStreams];
    sinkhornStart(logits, m0);
    float gr[kStreams * kStreams];
    for (int e = 0; e < nn; ++e)
      gr[e] = dc[2 * kStreams + e];
    // Walk the steps backwards. Each step's input matrix comes from one
    // forward sweep saved in (thread-local) memory; past kCachedSinkhornSteps
    // steps it is recomputed from m0 instead. Both produce the same bits.
    float xs[kStreams * kStreams];
    constexpr bool cached = 2 * kSinkhornIterations * nn <= kCachedSinkhornSteps * 16;
    float saved[cached ? 2 * kSinkhornIterations * nn : 1];
    if (cached) {
      for (int e = 0; e < nn; ++e)
        xs[e] = m0[e];
      for (int step = 0; step < 2 * kSinkhornIterations; ++step) {
        for (int e = 0; e < nn; ++e)
          saved[step * nn + e] = xs[e];
        sinkhornStep(xs, step);
      }
    }
    for (int it = kSinkhornIterations - 1; it >= 0; --it) {
      for (int half = 1; half >= 0; --half) {
        // xs = the matrix entering step (2 it + half)
        const int step = 2 * it + half;
        if (cached) {
          for (int e = 0; e < nn; ++e)
            xs[e] = saved[step * nn + e];
        } else {
          for (int e = 0; e < nn; ++e)
            xs[e] = m0[e];
          for (int s2 = 0; s2 < step; ++s2)
            sinkhornStep(xs, s2);
        }
        bool rowStep = half == 0;
        for (int a = 0; a < kStreams; ++a) {
          float sum = 0, dot = 0;
          for (int b = 0; b < kStreams; ++b)
            sum += rowStep ? xs[a * kStreams + b] : xs[b * kStreams + a];
          bool clamped = sum < kSinkhornClamp;
          sum = fmaxf(sum, kSinkhornClamp);
          for (int b = 0; b < kStreams; ++b) {
            int e = rowStep ? a * kStreams + b : b * kStreams + a;
            dot += gr[e] * xs[e];
          }
          for (int b = 0; b < kStreams; ++b) {
            int e = rowStep ? a * kStreams + b : b * kStreams + a;
            gr[e] = gr[e] / sum - (clamped ? 0.0f : dot / (sum * sum));
          }
        }
      }
    }
    for (int e = 0; e < nn; ++e)
      g[2 * kStreams + e] = gr[e] * m0[e];
  }
  float dr = 0;
  for (int k = 0; k < K; ++k) {
    float a = k < kStreams ? alpha[0] : k < 2 * kStreams ? alpha[1] : alpha[2];
    dp[t * K + k] = g[k] * r * a;
    dr += g[k] * p[t * K + k] * a;
  }
  float rms = sqrtf(squares[t] / float(width));
  rScale[t] = rms > 0 ? -dr * r * r / (float(width) * rms) : 0.0f;
}

/// Summands of dBias (column k) and of dAlpha (column g: pre, post, res).
struct MhcBiasGrad {
  const float *dh;
  __device__ float operator()(int64_t t, int64_t k) const { return dh[t * kCoefficients + k]; }
};
struct MhcAlphaGrad {
  const float *dh, *p, *aux;
  __device__ float operator()(int64_t t, int64_t group) const {
    const int K = kCoefficients;
    int from = group == 0 ? 0 : group == 1 ? kStreams : 2 * kStreams;
    int to = group == 0 ? kStreams : group == 1 ? 2 * kStreams : K;
    float r = aux[t * (K + 1) + K], acc = 0;
    for (int j = from; j < to; ++j)
      acc += dh[t * K + j] * r * p[t * K + j];
    return acc;
  }
};

/// partial: columnChunks(rows) x kCoefficients.
extern "C" __global__ void mhcc_mhc_bias_grad_partials(const float *dh, int64_t rows, float *partial) {
  columnPartials(MhcBiasGrad{dh}, rows, kCoefficients, partial);
}

/// partial: columnChunks(rows) x 3.
extern "C" __global__ void mhcc_mhc_alpha_grad_partials(const float *dh, const float *p, const float *aux,
                                                        int64_t rows, float *partial) {
  columnPartials(MhcAlphaGrad{dh, p, aux}, rows, 3, partial);
}

extern "C" __global__ void mhcc_row_scale_add(const float *x, const float *scale, float *dx, int64_t rows,
                                              int64_t width) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < rows * width)
    dx[i] += scale[i / width] * x[i];
}

extern "C" __global__ void mhcc_mhc_pre_forward(const float *x, const float *coef, float *u, int64_t rows, int64_t C) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * C)
    return;
  const int K = kCoefficients;
  int64_t t = i / C, c = i % C;
  float sum = 0;
  for (int s = 0; s < kStreams; ++s)
    sum += coef[t * K + s] * x[(t * kStreams + s) * C + c];
  u[i] = sum;
}

extern "C" __global__ void mhcc_mhc_pre_backward_x(const float *coef, const float *du, float *dx, int64_t rows,
                                                   int64_t C) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * kStreams * C)
    return;
  const int K = kCoefficients;
  int64_t t = i / (kStreams * C), s = (i / C) % kStreams, c = i % C;
  dx[i] += coef[t * K + s] * du[t * C + c];
}

/// One warp per (t, s): dCoef[t, s] += <du[t], x[t, s]>.
extern "C" __global__ void mhcc_mhc_pre_backward_coef(const float *x, const float *du, float *dCoef, int64_t rows,
                                                      int64_t C) {
  int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (i >= rows * kStreams)
    return;
  const int K = kCoefficients;
  int64_t t = i / kStreams, s = i % kStreams;
  float dot = 0;
  for (int64_t c = lane; c < C; c += 32)
    dot += du[t * C + c] * x[(t * kStreams + s) * C + c];
  dot = warpSum(dot);
  if (lane == 0)
    dCoef[t * K + s] += dot;
}

extern "C" __global__ void mhcc_mhc_post_res_forward(const float *x, const float *coef, const float *y, float *out,
                                                     int64_t rows, int64_t C) {
  int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= rows * kStreams * C)
    return;
  const int K = kCoefficients;
  int64_t t = e / (kStreams * C), i = (e / C) % kStreams, c = e % C;
  const float *hpost = coef + t * K + kStreams, *hres = coef + t * K + 2 * kStreams;
  float sum = 0;
  for (int j = 0; j < kStreams; ++j)
    sum += hres[i * kStreams + j] * x[(t * kStreams + j) * C + c];
  out[e] = sum + hpost[i] * y[t * C + c];
}

/// dy[t,c] and dx[t,j,c]: sums over the output streams i, in order.
extern "C" __global__ void mhcc_mhc_post_res_backward_values(const float *coef, const float *dOut, float *dx, float *dy,
                                                             int64_t rows, int64_t C) {
  int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int K = kCoefficients;
  if (e < rows * C) {
    int64_t t = e / C, c = e % C;
    const float *hpost = coef + t * K + kStreams;
    float acc = dy[e];
    for (int i = 0; i < kStreams; ++i)
      acc += hpost[i] * dOut[(t * kStreams + i) * C + c];
    dy[e] = acc;
  }
  if (e < rows * kStreams * C) {
    int64_t t = e / (kStreams * C), j = (e / C) % kStreams, c = e % C;
    const float *hres = coef + t * K + 2 * kStreams;
    float acc = dx[e];
    for (int i = 0; i < kStreams; ++i)
      acc += hres[i * kStreams + j] * dOut[(t * kStreams + i) * C + c];
    dx[e] = acc;
  }
}

/// One warp per (t, i): dCoef's post entry <dOut[t,i], y[t]> and res row
/// <dOut[t,i], x[t,j]> for every j.
extern "C" __global__ void mhcc_mhc_post_res_backward_coef(const float *x, const float *y, const float *dOut,
                                                           float *dCoef, int64_t rows, int64_t C) {
  int64_t e = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (e >= rows * kStreams)
    return;
  const int K = kCoefficients;
  int64_t t = e / kStreams, i = e % kStreams;
  const float *g = dOut + (t * kStreams + i) * C;
  float dotY = 0;
  for (int64_t c = lane; c < C; c += 32)
    dotY += g[c] * y[t * C + c];
  dotY = warpSum(dotY);
  if (lane == 0)
    dCoef[t * K + kStreams + i] += dotY;
  for (int j = 0; j < kStreams; ++j) {
    const float *xj = x + (t * kStreams + j) * C;
    float dot = 0;
    for (int64_t c = lane; c < C; c += 32)
      dot += g[c] * xj[c];
    dot = warpSum(dot);
    if (lane == 0)
      dCoef[t * K + 2 * kStreams + i * kStreams + j] += dot;
  }
}

extern "C" __global__ void mhcc_residual_forward(const float *x, const float *y, float *out, int64_t count) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < count)
    out[i] = x[i] + y[i];
}

extern "C" __global__ void mhcc_residual_backward(const float *dOut, float *dx, float *dy, int64_t count) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < count) {
    dx[i] += dOut[i];
    dy[i] += dOut[i];
  }
}

// ---- RMSNorm ----------------------------------------------------------------------------

extern "C" __global__ void mhcc_rms_norm_stats(const float *squares, float *aux, int64_t rows, int64_t C, float eps) {
  int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t < rows)
    aux[t] = 1.0f / sqrtf(squares[t] / float(C) + eps);
}

extern "C" __global__ void mhcc_rms_norm_apply(const float *u, const float *gain, const float *aux, float *y,
                                               int64_t rows, int64_t C) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < rows * C)
    y[i] = u[i] * aux[i / C] * gain[i % C];
}

/// One warp per row.
extern "C" __global__ void mhcc_rms_norm_backward_row(const float *u, const float *gain, const float *aux,
                                                      const float *dy, float *du, int64_t rows, int64_t C) {
  int64_t t = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (t >= rows)
    return;
  float s = aux[t], dot = 0;
  for (int64_t c = lane; c < C; c += 32)
    dot += gain[c] * dy[t * C + c] * u[t * C + c];
  dot = warpSum(dot);
  float k = s * s * s / float(C) * dot;
  for (int64_t c = lane; c < C; c += 32)
    du[t * C + c] += s * gain[c] * dy[t * C + c] - k * u[t * C + c];
}

struct RmsNormGainGrad {
  const float *u, *aux, *dy;
  int64_t C;
  __device__ float operator()(int64_t t, int64_t c) const { return dy[t * C + c] * u[t * C + c] * aux[t]; }
};

/// partial: columnChunks(rows) x C.
extern "C" __global__ void mhcc_rms_norm_gain_grad_partials(const float *u, const float *aux, const float *dy,
                                                            int64_t rows, int64_t C, float *partial) {
  columnPartials(RmsNormGainGrad{u, aux, dy, C}, rows, C, partial);
}

// ---- attention ---------------------------------------------------------------------------

extern "C" __global__ void mhcc_rope(float *qkv, int64_t rows, int64_t C, int64_t heads, int64_t seq, int inverse,
                                     int64_t rowStride) {
  const int64_t d = C / heads, pairs = d / 2;
  int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= rows * 2 * heads * pairs)
    return;
  int64_t t = e / (2 * heads * pairs);
  int64_t rest = e % (2 * heads * pairs);
  int64_t which = rest / (heads * pairs); // 0: q, 1: k
  int64_t h = (rest / pairs) % heads, j = rest % pairs;
  double theta = double(t % seq) * pow(kRopeBase, -2.0 * double(j) / double(d));
  float c = float(cos(theta)), s = float(sin(theta));
  if (inverse)
    s = -s;
  float *v = qkv + t * rowStride + which * C + h * d + 2 * j;
  float a = v[0], b = v[1];
  v[0] = a * c - b * s;
  v[1] = a * s + b * c;
}

/// One block per score row (head, query i) of one sequence: causal softmax
/// in place (P, zero above the diagonal) and the row's log-sum-exp.
extern "C" __global__ void mhcc_causal_softmax(float *scores, float *lse, int64_t seq, int64_t heads,
                                               int64_t lseOffset) {
  const int64_t h = blockIdx.x / seq, i = blockIdx.x % seq;
  float *row = scores + (h * seq + i) * seq;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x)
    m = fmaxf(m, row[j]);
  m = blockMax(m);
  float sum = 0;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x)
    sum += expf(row[j] - m);
  sum = blockSum(sum);
  const float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < seq; j += blockDim.x)
    row[j] = j <= i ? expf(row[j] - m) * inv : 0.0f;
  if (threadIdx.x == 0)
    lse[(lseOffset + i) * heads + h] = m + logf(sum);
}

/// Backward of one score row: P from the saved log-sum-exp, then
/// dS = P (dP - <P, dP>) * scale; P replaces the scores, dS replaces dP.
extern "C" __global__ void mhcc_causal_softmax_backward(float *scores, float *dP, const float *lse, int64_t seq,
                                                        int64_t heads, int64_t lseOffset, float scale) {
  const int64_t h = blockIdx.x / seq, i = blockIdx.x % seq;
  float *row = scores + (h * seq + i) * seq, *grad = dP + (h * seq + i) * seq;
  const float l = lse[(lseOffset + i) * heads + h];
  float dot = 0;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x)
    dot += expf(row[j] - l) * grad[j];
  dot = blockSum(dot);
  for (int64_t j = threadIdx.x; j < seq; j += blockDim.x) {
    float p = j <= i ? expf(row[j] - l) : 0.0f;
    row[j] = p;
    grad[j] = p * (grad[j] - dot) * scale;
  }
}

// ---- SwiGLU ---------------------------------------------------------------------------------

extern "C" __global__ void mhcc_swiglu_gate(const float *a, const float *b, float *hsw, int64_t count) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < count)
    hsw[i] = a[i] * sigmoidf(a[i]) * b[i];
}

extern "C" __global__ void mhcc_swiglu_backward_gate(const float *a, const float *b, const float *dh, float *da,
                                                     float *db, int64_t count) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= count)
    return;
  float s = sigmoidf(a[i]);
  db[i] = dh[i] * a[i] * s;
  da[i] = dh[i] * b[i] * s * (1.0f + a[i] * (1.0f - s));
}

// ---- cross-entropy ------------------------------------------------------------------------

/// One block per row.
extern "C" __global__ void mhcc_log_sum_exp(const float *logits, float *aux, int64_t rows, int64_t V) {
  const float *row = logits + blockIdx.x * V;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
    m = fmaxf(m, row[v]);
  m = blockMax(m);
  float sum = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
    sum += expf(row[v] - m);
  sum = blockSum(sum);
  if (threadIdx.x == 0)
    aux[blockIdx.x] = m + logf(sum);
}

extern "C" __global__ void mhcc_loss(const float *logits, const int32_t *labels, const float *aux, float *loss,
                                     int64_t rows, int64_t V, int64_t shift, int64_t seq) {
  if (blockIdx.x * blockDim.x + threadIdx.x != 0)
    return;
  float total = 0;
  int64_t counted = 0;
  for (int64_t t = 0; t < rows; ++t)
    if ((t % seq) + shift < seq) {
      total += aux[t] - logits[t * V + labels[t + shift]];
      ++counted;
    }
  *loss = counted ? total / float(counted) : 0.0f;
}

extern "C" __global__ void mhcc_cross_entropy_backward(const float *logits, const int32_t *labels, const float *aux,
                                                       float factor, float *dLogits, int64_t rows, int64_t V,
                                                       int64_t shift, int64_t seq) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * V)
    return;
  int64_t t = i / V, v = i % V;
  if ((t % seq) + shift >= seq)
    return;
  float g = factor * expf(logits[i] - aux[t]);
  if (labels[t + shift] == v)
    g -= factor;
  dLogits[i] += g;
}

