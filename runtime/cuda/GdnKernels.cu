//===- GdnKernels.cu - Gated DeltaNet on the GPU, forward and backward -----===//
//
// The GPU twin of runtime/cpu/GdnKernels.h (its math, its aux layout, its
// rounding points in bf16), declared in DeviceKernels.h. The projections go
// through Gemms; the conv, the norms and the gates are one thread or one
// warp per element or head row; the state recurrence is GdnWy.cu's. No
// atomics: every sum has one writer and a fixed order.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/DeviceKernelsImpl.h"
#include "runtime/cuda/GdnScan.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

namespace mhcc::runtime::cuda {
namespace {

__device__ inline float widen(float v) { return v; }
__device__ inline float widen(bf16 v) { return __bfloat162float(v); }
template <typename A> __device__ inline A narrow(float v) {
  if constexpr (std::is_same_v<A, float>)
    return v;
  else
    return __float2bfloat16_rn(v);
}
__device__ inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ inline float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/// Sum over a warp, the same butterfly on every call (deterministic).
__device__ inline float warpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The conv's tap rule (the CPU's gdnTapRow): tap j of row t, at place i in
// its sequence, reads row t - back (back = 3 - j) when i - back is still in
// t's document (i - back >= firstKeyOf(t)), and nothing before it.

/// bf16 models round what the CPU rounds (its `stored` points): a product
/// kept in fp32 aux is rounded in place.
__global__ void roundToBf16Kernel(float *p, int64_t count) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < count)
    p[i] = __bfloat162float(__float2bfloat16_rn(p[i]));
}

/// The grid of the conv kernels: a thread per column, rows t = blockIdx.y,
/// blockIdx.y + gridDim.y, ... (about 16 a thread, so that its four conv
/// weights are loaded once for them); each finds its row's place in the
/// sequence with one 32-bit modulo, not the 64-bit divisions per element
/// and tap that made these kernels compute-bound (ncu: 10% of the copy
/// bandwidth; docs/gpu_results.md session 16).
inline dim3 columnRowGrid(int64_t width, int64_t rows) {
  constexpr int64_t kRowGroups = 256;
  return dim3(unsigned((width + kThreads - 1) / kThreads), unsigned(rows < kRowGroups ? rows : kRowGroups));
}
__device__ inline int64_t positionIn(int64_t t, int64_t seq) { return int64_t(uint32_t(t) % uint32_t(seq)); }

/// z = causal depthwise conv of p, a = silu(z). Grid: columnRowGrid.
template <typename A>
__global__ void convForwardKernel(const float *p, const A *conv, float *z, float *a, int64_t rows, int64_t width,
                                  int64_t seq, const int32_t *firstKeys) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= width)
    return;
  float w[kGdnConvWidth];
  for (int j = 0; j < kGdnConvWidth; ++j)
    w[j] = widen(conv[j * width + c]);
  for (int64_t t = blockIdx.y; t < rows; t += gridDim.y) {
    const int64_t i = positionIn(t, seq), first = firstKeyOf(firstKeys, t);
    float acc = 0;
    for (int j = 0; j < kGdnConvWidth; ++j) // the tap rule above
      if (const int back = kGdnConvWidth - 1 - j; i - back >= first)
        acc += w[j] * p[(t - back) * width + c];
    z[t * width + c] = acc;
    a[t * width + c] = acc * sigmoidf(acc);
  }
}

/// q and k L2-normalized per head in place; one warp per (row, part, head).
__global__ void l2NormKernel(float *a, float *inv, int64_t rows, int64_t C, int64_t H) {
  const int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= rows * 2 * H)
    return;
  const int64_t t = w / (2 * H), part = (w / H) % 2, h = w % H, d = C / H;
  float *v = a + t * 3 * C + part * C + h * d, sq = 0;
  for (int64_t e = lane; e < d; e += 32)
    sq += v[e] * v[e];
  const float r = 1.0f / sqrtf(warpSum(sq) + float(kGdnL2Eps));
  if (lane == 0)
    inv[t * 2 * H + part * H + h] = r;
  for (int64_t e = lane; e < d; e += 32)
    v[e] *= r;
}

/// The decay alpha and the write strength beta of every (row, head):
/// out[t, h] = alpha, out[t, H + h] = beta.
template <typename A>
__global__ void gatesKernel(const float *ab, const A *aLog, const A *dtBias, float *out, int64_t rows, int64_t H) {
  int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= rows * H)
    return;
  const int64_t t = e / H, h = e % H;
  out[t * 2 * H + h] = expf(-expf(widen(aLog[h])) * softplusf(ab[t * 2 * H + H + h] + widen(dtBias[h])));
  out[t * 2 * H + H + h] = sigmoidf(ab[t * 2 * H + h]);
}

/// n = rmsnorm(o) per head * out_norm * silu(g), keeping 1 / rms; one warp
/// per (row, head).
template <typename A>
__global__ void gatedNormKernel(const float *o, const float *g, const A *outNorm, float *rms, A *n, int64_t rows,
                                int64_t C, int64_t H, float eps) {
  const int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= rows * H)
    return;
  const int64_t t = w / H, h = w % H, d = C / H, base = t * C + h * d;
  float sq = 0;
  for (int64_t e = lane; e < d; e += 32)
    sq += o[base + e] * o[base + e];
  const float r = 1.0f / sqrtf(warpSum(sq) / float(d) + eps);
  if (lane == 0)
    rms[t * H + h] = r;
  for (int64_t e = lane; e < d; e += 32) {
    const float gate = g[base + e];
    n[base + e] = narrow<A>(o[base + e] * r * widen(outNorm[e]) * gate * sigmoidf(gate));
  }
}

/// The same n from the kept 1 / rms (the backward's recompute).
template <typename A>
__global__ void gatedNormAgainKernel(const float *o, const float *g, const A *outNorm, const float *rms, A *n,
                                     int64_t rows, int64_t C, int64_t H) {
  int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= rows * C)
    return;
  const int64_t t = e / C, d = C / H, h = (e % C) / d, i = e % d;
  const float gate = g[e];
  n[e] = narrow<A>(o[e] * rms[t * H + h] * widen(outNorm[i]) * gate * sigmoidf(gate));
}

/// The gated norm's backward, one warp per (row, head): dG (A), the
/// out_norm summands dm * hat (fp32, summed over rows later), dO (fp32).
template <typename A>
__global__ void gatedNormBackwardKernel(const float *o, const float *g, const A *outNorm, const float *rms,
                                        const float *dn, A *dG, float *outNormTerms, float *dO, int64_t rows, int64_t C,
                                        int64_t H) {
  const int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= rows * H)
    return;
  const int64_t t = w / H, h = w % H, d = C / H, base = t * C + h * d;
  const float r = rms[t * H + h];
  float dot = 0;
  for (int64_t e = lane; e < d; e += 32) {
    const int64_t c = base + e;
    const float gate = g[c], sg = sigmoidf(gate), hat = o[c] * r, w8 = widen(outNorm[e]);
    dG[c] = narrow<A>(dn[c] * hat * w8 * sg * (1.0f + gate * (1.0f - sg)));
    const float dm = dn[c] * gate * sg;
    outNormTerms[c] = dm * hat;
    dot += dm * w8 * hat;
  }
  dot = warpSum(dot);
  for (int64_t e = lane; e < d; e += 32) {
    const int64_t c = base + e;
    const float gate = g[c], dm = dn[c] * gate * sigmoidf(gate);
    dO[c] = r * (dm * widen(outNorm[e]) - o[c] * r * dot / float(d));
  }
}

/// Through alpha = exp(-exp(a_log) softplus(ab + dt_bias)): dAb[t, H + h],
/// and the per-row summands of dt_bias and a_log (small[t, h], small[t, H + h]).
template <typename A>
__global__ void decayBackwardKernel(const float *ab, const A *aLog, const A *dtBias, const float *dLogAlpha, float *dAb,
                                    float *small, int64_t rows, int64_t H) {
  int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= rows * H)
    return;
  const int64_t t = e / H, h = e % H;
  const float z = ab[t * 2 * H + H + h] + widen(dtBias[h]), dl = dLogAlpha[e], decay = expf(widen(aLog[h]));
  const float dz = dl * -decay * sigmoidf(z);
  dAb[t * 2 * H + H + h] = dz;
  small[t * 2 * H + h] = dz;
  small[t * 2 * H + H + h] = dl * -decay * softplusf(z);
}

/// From the gradient of a = [q k v] (q, k normalized) to that of z: the L2
/// norms' backward then silu's; one warp per (row, part, head).
__global__ void activationBackwardKernel(const float *aux_a, const float *z, const float *inv, float *dA, float *dZ,
                                         int64_t rows, int64_t C, int64_t H) {
  const int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= rows * 3 * H)
    return;
  const int64_t t = w / (3 * H), part = (w / H) % 3, h = w % H, d = C / H, base = t * 3 * C + part * C + h * d;
  if (part < 2) {
    float dot = 0;
    for (int64_t e = lane; e < d; e += 32)
      dot += aux_a[base + e] * dA[base + e];
    dot = warpSum(dot);
    const float r = inv[t * 2 * H + part * H + h];
    for (int64_t e = lane; e < d; e += 32)
      dA[base + e] = r * (dA[base + e] - aux_a[base + e] * dot);
  }
  for (int64_t e = lane; e < d; e += 32) {
    const float zz = z[base + e], s = sigmoidf(zz);
    dZ[base + e] = dA[base + e] * s * (1.0f + zz * (1.0f - s));
  }
}

/// dP[r, c] = sum over the rows t whose conv taps read row r (t ascending):
/// t = r + back in r's sequence, whose tap 3 - back reads r when r lies in
/// t's document. Grid: columnRowGrid.
template <typename A>
__global__ void convBackwardKernel(const float *dZ, const A *conv, A *dP, int64_t rows, int64_t width, int64_t seq,
                                   const int32_t *firstKeys) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= width)
    return;
  float w[kGdnConvWidth];
  for (int j = 0; j < kGdnConvWidth; ++j)
    w[j] = widen(conv[j * width + c]);
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t i = positionIn(r, seq);
    float acc = 0;
    for (int back = 0; back < kGdnConvWidth; ++back) {
      const int64_t t = r + back;
      if (t < rows && i + back < seq && i >= firstKeyOf(firstKeys, t))
        acc += dZ[t * width + c] * w[kGdnConvWidth - 1 - back];
    }
    dP[r * width + c] = narrow<A>(acc);
  }
}

/// Partial sums of dConv[j, c] = sum over t of dZ[t, c] p[tap(t, j), c]
/// over chunks of kColumnChunkRows rows (t ascending).
__global__ void convWeightPartialsKernel(const float *dZ, const float *p, int64_t rows, int64_t width, int64_t seq,
                                         const int32_t *firstKeys, float *partial) {
  const int64_t col = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, chunk = blockIdx.y;
  if (col >= kGdnConvWidth * width)
    return;
  const int64_t j = col / width, c = col % width, back = kGdnConvWidth - 1 - j,
                end = (chunk + 1) * kColumnChunkRows < rows ? (chunk + 1) * kColumnChunkRows : rows;
  float acc = 0;
  int64_t i = positionIn(chunk * kColumnChunkRows, seq); // t's place in its sequence, stepped with t
  for (int64_t t = chunk * kColumnChunkRows; t < end; ++t, i = i + 1 == seq ? 0 : i + 1)
    if (i - back >= firstKeyOf(firstKeys, t)) // the tap rule
      acc += dZ[t * width + c] * p[(t - back) * width + c];
  partial[chunk * kGdnConvWidth * width + col] = acc;
}

/// Partial column sums of a [rows, cols] fp32 matrix over row chunks.
__global__ void columnPartialsKernel(const float *m, int64_t rows, int64_t cols, float *partial) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, chunk = blockIdx.y;
  if (c >= cols)
    return;
  const int64_t end = (chunk + 1) * kColumnChunkRows < rows ? (chunk + 1) * kColumnChunkRows : rows;
  float acc = 0;
  for (int64_t t = chunk * kColumnChunkRows; t < end; ++t)
    acc += m[t * cols + c];
  partial[chunk * cols + c] = acc;
}

/// dst (and dst2 from column `split`) += the column sums of m.
void addColumnSumsOf(const float *m, int64_t rows, int64_t cols, float *partial, float *dst, cudaStream_t s,
                     int64_t split = INT64_MAX, float *dst2 = nullptr) {
  if (!rows)
    return;
  columnPartialsKernel<<<dim3(blocks(cols), unsigned(columnChunks(rows))), kThreads, 0, s>>>(m, rows, cols, partial);
  addColumnPartials(partial, columnChunks(rows), cols, dst, s, split, dst2);
}

template <typename A> void roundLikeStorage(float *p, int64_t count, cudaStream_t s) {
  if constexpr (!std::is_same_v<A, float>)
    if (count)
      roundToBf16Kernel<<<blocks(count), kThreads, 0, s>>>(p, count);
}

/// Byte-sized pieces of raw float memory, laid out one after another.
struct Carver {
  char *next;
  template <typename T> T *take(int64_t count) {
    T *p = reinterpret_cast<T *>(next);
    next += ((count * int64_t(sizeof(T)) + 255) / 256) * 256;
    return p;
  }
};
struct CarvedSize {
  int64_t bytes = 0;
  CarvedSize &add(int64_t count, int64_t size) {
    bytes += ((count * size + 255) / 256) * 256;
    return *this;
  }
  int64_t floats() const { return bytes / 4; }
};

/// The aux pieces: GdnAux's on the CPU, then (256-byte aligned) what the
/// forward's scans keep for the backward (gdnScanKeptFloats).
struct Aux {
  float *p, *z, *a, *inv, *ab, *o, *rms, *g, *scans;
  Aux(float *aux, int64_t rows, int64_t C, int64_t H)
      : p(aux), z(p + rows * 3 * C), a(z + rows * 3 * C), inv(a + rows * 3 * C), ab(inv + rows * 2 * H),
        o(ab + rows * 2 * H), rms(o + rows * C), g(rms + rows * H), scans(aux + scansOffset(rows, C, H)) {}
  static int64_t scansOffset(int64_t rows, int64_t C, int64_t H) { return (rows * (11 * C + 5 * H) + 63) / 64 * 64; }
};

/// What B leaves for W (A-typed pieces are GEMM operands).
template <typename A> struct Stash {
  A *dG, *dAb, *dP;
  float *outNormTerms, *small, *dZ;
  Stash(float *raw, int64_t rows, int64_t C, int64_t H) {
    Carver c{reinterpret_cast<char *>(raw)};
    dG = c.take<A>(rows * C);
    dAb = c.take<A>(rows * 2 * H);
    dP = c.take<A>(rows * 3 * C);
    outNormTerms = c.take<float>(rows * C);
    small = c.take<float>(rows * 2 * H);
    dZ = c.take<float>(rows * 3 * C);
  }
};
int64_t stashFloats(int64_t rows, int64_t C, int64_t H, int actBytes) {
  return CarvedSize{}
      .add(rows * C, actBytes)
      .add(rows * 2 * H, actBytes)
      .add(rows * 3 * C, actBytes)
      .add(rows * C, 4)
      .add(rows * 2 * H, 4)
      .add(rows * 3 * C, 4)
      .floats();
}

} // namespace

std::string gdnHeadDimError(int64_t d) {
  return "gated_delta_net on the GPU takes head dims 16, 32, 64 or 128 (hidden / heads), not " + std::to_string(d) +
         ": change heads, or train on the CPU backend (--backend cpu)";
}
bool gdnHeadDimSupported(int64_t d) { return d == 16 || d == 32 || d == 64 || d == 128; }

int64_t gdnAuxFloats(int64_t rows, int64_t C, int64_t H, int64_t seq) {
  return Aux::scansOffset(rows, C, H) + gdnScanKeptFloats(rows, C, H, seq);
}
int64_t gdnForwardScratch(int64_t rows, int64_t C, int64_t H, int64_t seq, int actBytes) {
  return CarvedSize{}.add(rows * 2 * H, 4).add(rows * C, actBytes).floats();
}
int64_t gdnBackwardStash(int64_t rows, int64_t C, int64_t H, int actBytes) { return stashFloats(rows, C, H, actBytes); }
int64_t gdnBackwardScratch(int64_t rows, int64_t C, int64_t H, int64_t seq, int actBytes) {
  const int64_t partials = std::max<int64_t>(
      {columnChunks(rows) * kGdnConvWidth * 3 * C, columnChunks(rows * H) * (C / H), columnChunks(rows) * 2 * H});
  return CarvedSize{}
      .add(rows * C, actBytes)                                // n
      .add(rows * C, 4)                                       // dn
      .add(rows * C, 4)                                       // dO
      .add(rows * 3 * C, 4)                                   // dA
      .add(rows * 2 * H, 4)                                   // dAb (fp32)
      .add(rows * H, 4)                                       // dLogAlpha
      .add(gdnScanScratchFloats(rows, C, H, seq), 4)       // the scans' state gradients
      .add(partials, 4)
      .floats();
}

template <typename A>
std::string gdnForward(Gemms &g, const A *x, const GdnWeights<A> &w, A *y, float *auxData, float *scratch, int64_t rows,
                       int64_t C, int64_t D, int64_t H, int64_t seq, double eps, DeviceDocuments docs,
                       cudaStream_t s) {
  // Everything between the projections is D wide (C / tp: this rank's H heads).
  if (!gdnHeadDimSupported(D / H))
    return gdnHeadDimError(D / H);
  Aux aux(auxData, rows, D, H);
  Carver carve{reinterpret_cast<char *>(scratch)};
  float *gates = carve.take<float>(rows * 2 * H);
  A *n = carve.take<A>(rows * D);
  matmul<A, float>(g, x, w.wqkv, aux.p, rows, C, 3 * D, false);
  roundLikeStorage<A>(aux.p, rows * 3 * D, s);
  convForwardKernel<A><<<columnRowGrid(3 * D, rows), kThreads, 0, s>>>(aux.p, w.conv, aux.z, aux.a, rows, 3 * D, seq,
                                                                       docs.firstKeys);
  l2NormKernel<<<warpBlocks(rows * 2 * H), kThreads, 0, s>>>(aux.a, aux.inv, rows, D, H);
  matmul<A, float>(g, x, w.wab, aux.ab, rows, C, 2 * H, false);
  gatesKernel<A><<<blocks(rows * H), kThreads, 0, s>>>(aux.ab, w.aLog, w.dtBias, gates, rows, H);
  std::string error = gdnScans(false, aux.a, gates, nullptr, aux.o, nullptr, nullptr, nullptr, aux.scans, nullptr,
                               rows, D, H, seq, docs.firstKeys, s);
  if (!error.empty())
    return error;
  matmul<A, float>(g, x, w.wgate, aux.g, rows, C, D, false);
  roundLikeStorage<A>(aux.g, rows * D, s);
  gatedNormKernel<A>
      <<<warpBlocks(rows * H), kThreads, 0, s>>>(aux.o, aux.g, w.outNorm, aux.rms, n, rows, D, H, float(eps));
  matmul<A, A>(g, n, w.wo, y, rows, D, C, false);
  return lastError("gated_delta_net forward");
}

template <typename A>
std::string gdnBackward(Gemms &g, const A *x, const GdnWeights<A> &w, const float *auxData, const A *dy, A *dx,
                        const GdnWeightGrads &dw, float *stashData, float *scratch, int64_t rows, int64_t C,
                        int64_t D, int64_t H, int64_t seq, GradParts parts, DeviceDocuments docs, cudaStream_t s) {
  if (!gdnHeadDimSupported(D / H))
    return gdnHeadDimError(D / H);
  Aux aux(const_cast<float *>(auxData), rows, D, H);
  Stash<A> kept(stashData, rows, D, H);
  Carver carve{reinterpret_cast<char *>(scratch)};
  A *n = carve.take<A>(rows * D);
  float *dn = carve.take<float>(rows * D), *dO = carve.take<float>(rows * D);
  float *dA = carve.take<float>(rows * 3 * D);
  float *dAb = carve.take<float>(rows * 2 * H), *dLogAlpha = carve.take<float>(rows * H);
  float *states = carve.take<float>(gdnScanScratchFloats(rows, D, H, seq));
  float *partial = reinterpret_cast<float *>(carve.next);
  if (parts.inputs) {
    fill(dn, rows * D, 0.0f, s);
    matmulTransBAcc<A, float>(g, dy, w.wo, dn, rows, C, D);
    gatedNormBackwardKernel<A><<<warpBlocks(rows * H), kThreads, 0, s>>>(aux.o, aux.g, w.outNorm, aux.rms, dn, kept.dG,
                                                                         kept.outNormTerms, dO, rows, D, H);
    matmulTransBAcc<A, A>(g, kept.dG, w.wgate, dx, rows, D, C);
    std::string error = gdnScans(true, aux.a, nullptr, dO, nullptr, dA, dAb, dLogAlpha, aux.scans, states, rows, D,
                                 H, seq, docs.firstKeys, s);
    if (!error.empty())
      return error;
    decayBackwardKernel<A>
        <<<blocks(rows * H), kThreads, 0, s>>>(aux.ab, w.aLog, w.dtBias, dLogAlpha, dAb, kept.small, rows, H);
    if constexpr (std::is_same_v<A, float>) // the GEMM operand copy of the gate logits' gradient
      cudaMemcpyAsync(kept.dAb, dAb, rows * 2 * H * sizeof(float), cudaMemcpyDeviceToDevice, s);
    else
      toBf16(dAb, kept.dAb, rows * 2 * H, s);
    matmulTransBAcc<A, A>(g, kept.dAb, w.wab, dx, rows, 2 * H, C);
    activationBackwardKernel<<<warpBlocks(rows * 3 * H), kThreads, 0, s>>>(aux.a, aux.z, aux.inv, dA, kept.dZ, rows, D,
                                                                           H);
    convBackwardKernel<A><<<columnRowGrid(3 * D, rows), kThreads, 0, s>>>(kept.dZ, w.conv, kept.dP, rows, 3 * D, seq,
                                                                           docs.firstKeys);
    matmulTransBAcc<A, A>(g, kept.dP, w.wqkv, dx, rows, 3 * D, C);
  }
  if (parts.weights) {
    gatedNormAgainKernel<A><<<blocks(rows * D), kThreads, 0, s>>>(aux.o, aux.g, w.outNorm, aux.rms, n, rows, D, H);
    matmulTransAAcc<A, float>(g, n, dy, dw.wo, rows, D, C);
    addColumnSumsOf(kept.outNormTerms, rows * H, D / H, partial, dw.outNorm, s);
    matmulTransAAcc<A, float>(g, x, kept.dG, dw.wgate, rows, C, D);
    matmulTransAAcc<A, float>(g, x, kept.dAb, dw.wab, rows, C, 2 * H);
    addColumnSumsOf(kept.small, rows, 2 * H, partial, dw.dtBias, s, H, dw.aLog);
    const int64_t width = 3 * D;
    convWeightPartialsKernel<<<dim3(blocks(kGdnConvWidth * width), unsigned(columnChunks(rows))), kThreads, 0, s>>>(
        kept.dZ, aux.p, rows, width, seq, docs.firstKeys, partial);
    addColumnPartials(partial, columnChunks(rows), kGdnConvWidth * width, dw.conv, s);
    matmulTransAAcc<A, float>(g, x, kept.dP, dw.wqkv, rows, C, 3 * D);
  }
  return lastError("gated_delta_net backward");
}

template std::string gdnForward<float>(Gemms &, const float *, const GdnWeights<float> &, float *, float *, float *,
                                       int64_t, int64_t, int64_t, int64_t, int64_t, double, DeviceDocuments,
                                       cudaStream_t);
template std::string gdnForward<bf16>(Gemms &, const bf16 *, const GdnWeights<bf16> &, bf16 *, float *, float *,
                                      int64_t, int64_t, int64_t, int64_t, int64_t, double, DeviceDocuments,
                                      cudaStream_t);
template std::string gdnBackward<float>(Gemms &, const float *, const GdnWeights<float> &, const float *, const float *,
                                        float *, const GdnWeightGrads &, float *, float *, int64_t, int64_t, int64_t,
                                        int64_t, int64_t, GradParts, DeviceDocuments, cudaStream_t);
template std::string gdnBackward<bf16>(Gemms &, const bf16 *, const GdnWeights<bf16> &, const float *, const bf16 *,
                                       bf16 *, const GdnWeightGrads &, float *, float *, int64_t, int64_t, int64_t,
                                       int64_t, int64_t, GradParts, DeviceDocuments, cudaStream_t);

} // namespace mhcc::runtime::cuda
