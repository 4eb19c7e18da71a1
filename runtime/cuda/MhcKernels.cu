//===- MhcKernels.cu - mHC coefficients: projection, Sinkhorn, gradients --------===//
//
// A part of the model's kernel library: mhcc concatenates ModelKernels.cu,
// MhcKernels.cu, MhcMixKernels.cu, MhcFusedKernels.cu, MhcBackwardKernels.cu and LayerKernels.cu (in that
// order) after the model's constants and compiles them as one file; the helpers and
// conventions are ModelKernels.cu's.
//
//===----------------------------------------------------------------------===//

// ---- mHC ------------------------------------------------------------------------------

// The coefficient kernels give every token a group of kCoeffLanes lanes of one
// warp. Lane q of a group owns the Sinkhorn matrix entries e = j * kCoeffLanes
// + q (slot j < kCoeffSlots, e < n * n; row e / n, column e % n) and keeps
// their Sinkhorn state, and in the backward their per-step cache, in
// registers; it also owns the pre/post coefficients k = i * kCoeffLanes + q
// (k < 2 n). kCoeffLanes is n * n up to a warp (1 lane at n = 1, 16 and two
// tokens a warp at n = 4) and beyond that the largest multiple of n in a warp
// (30 at n = 6, 28 at n = 7, 32 at n = 8: two entries per lane), so a row
// never straddles two slots and both entries of a lane share their column.
//
// Bit-identical to one thread per token running the serial loops: a row or
// column sum (and the backward's dot) gathers the line's n terms with
// __shfl_sync and adds them in index order starting from +0, a row max takes
// the fmaxf in index order, and every other value is computed by one lane
// with the same expression as the serial code. A term's product is formed by
// the lane that adds it (dot += gr * xs), so nvcc contracts exactly the
// multiply-adds the serial code had, and no expf result meets an add on the
// lane that computed it (the serial code's sums did not contract them either).
//
// Launch: blocks of kCoeffThreads threads (any multiple of 32 works: a warp
// takes tokens warp * kCoeffTokensPerWarp onwards), grid =
// ceil(rows / mhcc_abi_coeff_tokens_per_block). Every lane of a warp runs
// every shuffle; lanes of a token past `rows` (or in no group: lanes 27..31
// at n = 3) compute on dummies and store nothing, and a warp with no token
// below `rows` returns at once.

constexpr int kCoeffEntries = kStreams * kStreams;
constexpr int kCoeffLanes = kCoeffEntries <= 32 ? kCoeffEntries : 32 / kStreams * kStreams;
constexpr int kCoeffSlots = (kCoeffEntries + kCoeffLanes - 1) / kCoeffLanes;     // entries a lane owns
constexpr int kCoeffGateSlots = (2 * kStreams + kCoeffLanes - 1) / kCoeffLanes; // pre/post a lane owns
constexpr int kCoeffRowsPerSlot = kCoeffLanes / kStreams;
constexpr int kCoeffTokensPerWarp = 32 / kCoeffLanes;
constexpr int kCoeffThreads = 64; // few tokens a block: spread the serial Sinkhorn over the SMs
constexpr int kCoeffTokensPerBlock = kCoeffThreads / 32 * kCoeffTokensPerWarp;
// The backward keeps every step's input in registers while a lane needs at
// most this many floats for it (2 kSinkhornIterations kCoeffSlots: up to 40
// iterations at n <= 5, 20 at n = 6..8); past it each step's input is
// recomputed from m0. Both give the same bits.
constexpr int kCachedSinkhornFloats = 80;

extern "C" __device__ const int mhcc_abi_coeff_block_threads = kCoeffThreads;
extern "C" __device__ const int mhcc_abi_coeff_tokens_per_block = kCoeffTokensPerBlock;

/// Term b of the line through this lane's entry of slot j: its row when kRow
/// (held in slot j by lanes q / n * n + b), else its column q % n (row b is in
/// slot b / kCoeffRowsPerSlot, lane (b % kCoeffRowsPerSlot) n + q % n). Every
/// lane of the warp calls it together; base is the group's first lane.
template <bool kRow>
__device__ __forceinline__ float coeffLineTerm(const float (&v)[kCoeffSlots], int j, int b, int q, int base) {
  if (kRow)
    return __shfl_sync(0xffffffffu, v[j], base + q / kStreams * kStreams + b);
  return __shfl_sync(0xffffffffu, v[b / kCoeffRowsPerSlot], base + b % kCoeffRowsPerSlot * kStreams + q % kStreams);
}

/// m = exp(logit - row max) for this lane's entries: the positive matrix
/// Sinkhorn starts from (the max taken over the row in index order).
__device__ __forceinline__ void coeffSinkhornStart(const float (&logit)[kCoeffSlots], float (&m)[kCoeffSlots], int q,
                                                   int base) {
#pragma unroll
  for (int j = 0; j < kCoeffSlots; ++j) {
    float rowMax = coeffLineTerm<true>(logit, j, 0, q, base);
#pragma unroll
    for (int b = 1; b < kStreams; ++b)
      rowMax = fmaxf(rowMax, coeffLineTerm<true>(logit, j, b, q, base));
    m[j] = expf(logit[j] - rowMax);
  }
}

/// One Sinkhorn step over this lane's entries (kRow: normalize rows, else
/// columns), each line summed in index order from +0 and clamped.
template <bool kRow>
__device__ __forceinline__ void coeffSinkhornStep(float (&m)[kCoeffSlots], int q, int base) {
  constexpr int lines = kRow ? kCoeffSlots : 1; // a lane's entries share one column
  float sums[lines];
#pragma unroll
  for (int j = 0; j < lines; ++j) {
    float sum = 0;
#pragma unroll
    for (int b = 0; b < kStreams; ++b)
      sum += coeffLineTerm<kRow>(m, j, b, q, base);
    sums[j] = fmaxf(sum, kSinkhornClamp);
  }
#pragma unroll
  for (int j = 0; j < kCoeffSlots; ++j)
    m[j] /= sums[kRow ? j : 0];
}

/// The gradient through one Sinkhorn step: xs is the step's input, gr the
/// gradient of its output on entry and of its input on return.
template <bool kRow>
__device__ __forceinline__ void coeffSinkhornStepBackward(const float (&xs)[kCoeffSlots], float (&gr)[kCoeffSlots],
                                                          int q, int base) {
  constexpr int lines = kRow ? kCoeffSlots : 1;
  float sums[lines], dots[lines];
  bool clamps[lines];
#pragma unroll
  for (int j = 0; j < lines; ++j) {
    float x[kStreams];
#pragma unroll
    for (int b = 0; b < kStreams; ++b)
      x[b] = coeffLineTerm<kRow>(xs, j, b, q, base);
    float sum = 0, dot = 0;
#pragma unroll
    for (int b = 0; b < kStreams; ++b)
      sum += x[b];
    bool clamped = sum < kSinkhornClamp;
    sum = fmaxf(sum, kSinkhornClamp);
#pragma unroll
    for (int b = 0; b < kStreams; ++b)
      dot += coeffLineTerm<kRow>(gr, j, b, q, base) * x[b];
    sums[j] = sum;
    dots[j] = dot;
    clamps[j] = clamped;
  }
#pragma unroll
  for (int j = 0; j < kCoeffSlots; ++j) {
    const float sum = sums[kRow ? j : 0], dot = dots[kRow ? j : 0];
    const bool clamped = clamps[kRow ? j : 0];
    gr[j] = gr[j] / sum - (clamped ? 0.0f : dot / (sum * sum));
  }
}

/// This lane's place in the coefficient kernels' layout (the section
/// comment): its token t (valid: a real token below `rows`), its index q in
/// the token's group of lanes and the group's first lane.
struct CoeffLanes {
  int64_t t;
  bool valid, warpActive;
  int q, base;
  __device__ explicit CoeffLanes(int64_t rows) {
    const int64_t warp = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32, group = lane / kCoeffLanes;
    q = lane % kCoeffLanes;
    base = group * kCoeffLanes;
    t = warp * kCoeffTokensPerWarp + group;
    valid = group < kCoeffTokensPerWarp && t < rows;
    warpActive = warp * kCoeffTokensPerWarp < rows;
  }
};

/// One token's coefficients from its row's sum of squares and its projection
/// pRow (K floats): h and r into auxRow (K + 1 floats: h, then r), the
/// sigmoids of pre and post and the Sinkhorn projection of res into coefRow.
/// Every lane of the warp calls it together (q, base: the token's group, as
/// in the section comment); with `valid` false a group computes on dummies
/// and stores nothing.
__device__ __forceinline__ void mhcTokenCoeffs(float square, const float *pRow, const act_t *bias,
                                               const act_t *alpha, float *coefRow, float *auxRow, int64_t width,
                                               bool valid, int q, int base) {
  const int K = kCoefficients;
  float r = 0;
  if (valid) {
    float rms = sqrtf(square / float(width));
    r = 1.0f / (rms + kMhcRmsEps);
  }
#pragma unroll
  for (int i = 0; i < kCoeffGateSlots; ++i) {
    const int k = i * kCoeffLanes + q;
    if (valid && k < 2 * kStreams) {
      float a = k < kStreams ? load(alpha[0]) : load(alpha[1]);
      const float hk = r * pRow[k] * a + load(bias[k]);
      auxRow[k] = hk;
      if (k < kStreams)
        coefRow[k] = sigmoidf(hk);
      else
        coefRow[k] = 2.0f * sigmoidf(hk);
    }
  }
  float logit[kCoeffSlots];
#pragma unroll
  for (int j = 0; j < kCoeffSlots; ++j) {
    const int e = j * kCoeffLanes + q, k = 2 * kStreams + e;
    logit[j] = 0;
    if (valid && e < kCoeffEntries) {
      float a = load(alpha[2]);
      const float hk = r * pRow[k] * a + load(bias[k]);
      auxRow[k] = hk;
      logit[j] = hk;
    }
  }
  if (valid && q == 0)
    auxRow[K] = r;
  float m[kCoeffSlots];
  coeffSinkhornStart(logit, m, q, base);
  for (int it = 0; it < kSinkhornIterations; ++it) {
    coeffSinkhornStep<true>(m, q, base);
    coeffSinkhornStep<false>(m, q, base);
  }
#pragma unroll
  for (int j = 0; j < kCoeffSlots; ++j) {
    const int e = j * kCoeffLanes + q;
    if (valid && e < kCoeffEntries)
      coefRow[2 * kStreams + e] = m[j];
  }
}

/// Per token: h = r p alpha + bias into aux ([t, K + 1]: h, then r), the
/// sigmoids of pre and post and the Sinkhorn projection of res into coef.
/// Launch: block kCoeffThreads (64), grid ceil(rows / kCoeffTokensPerBlock);
/// see the section comment.
extern "C" __global__ void mhcc_mhc_coeffs_forward(const float *squares, const float *p, const act_t *bias,
                                                   const act_t *alpha, float *coef, float *aux, int64_t rows,
                                                   int64_t C) {
  kernelPrologue();
  const CoeffLanes l(rows);
  if (!l.warpActive)
    return; // the whole warp
  const int K = kCoefficients;
  mhcTokenCoeffs(l.valid ? squares[l.t] : 0.0f, p + l.t * K, bias, alpha, coef + l.t * K, aux + l.t * (K + 1),
                 kStreams * C, l.valid, l.q, l.base);
}

/// The Sinkhorn iterations backwards from m0 (the exponentiated logits):
/// gr, the gradient of the projected matrix on entry (after
/// `readGradients`, called once, after the forward sweep where that is
/// cached), is the gradient of m0 on return. Every step's input kept in
/// registers where they fit (kCachedSinkhornFloats), else recomputed.
template <typename ReadGradients>
__device__ __forceinline__ void coeffSinkhornBackward(const float (&m0)[kCoeffSlots], float (&gr)[kCoeffSlots], int q,
                                                      int base, ReadGradients readGradients) {
  constexpr bool cached = 2 * kSinkhornIterations * kCoeffSlots <= kCachedSinkhornFloats;
  if (cached) {
    // One forward sweep, every step's input kept (registers: fully unrolled).
    float saved[cached ? 2 * kSinkhornIterations : 1][kCoeffSlots];
    float xs[kCoeffSlots];
#pragma unroll
    for (int j = 0; j < kCoeffSlots; ++j)
      xs[j] = m0[j];
#pragma unroll
    for (int it = 0; it < (cached ? kSinkhornIterations : 0); ++it) {
#pragma unroll
      for (int j = 0; j < kCoeffSlots; ++j)
        saved[2 * it][j] = xs[j];
      coeffSinkhornStep<true>(xs, q, base);
#pragma unroll
      for (int j = 0; j < kCoeffSlots; ++j)
        saved[2 * it + 1][j] = xs[j];
      coeffSinkhornStep<false>(xs, q, base);
    }
    readGradients();
#pragma unroll
    for (int it = (cached ? kSinkhornIterations : 0) - 1; it >= 0; --it) {
      coeffSinkhornStepBackward<false>(saved[2 * it + 1], gr, q, base);
      coeffSinkhornStepBackward<true>(saved[2 * it], gr, q, base);
    }
  } else {
    readGradients();
    // Each step's input recomputed from m0.
    for (int it = kSinkhornIterations - 1; it >= 0; --it) {
#pragma unroll
      for (int half = 1; half >= 0; --half) {
        float xs[kCoeffSlots];
#pragma unroll
        for (int j = 0; j < kCoeffSlots; ++j)
          xs[j] = m0[j];
        for (int s2 = 0; s2 < it; ++s2) {
          coeffSinkhornStep<true>(xs, q, base);
          coeffSinkhornStep<false>(xs, q, base);
        }
        if (half == 1) {
          coeffSinkhornStep<true>(xs, q, base);
          coeffSinkhornStepBackward<false>(xs, gr, q, base);
        } else {
          coeffSinkhornStepBackward<true>(xs, gr, q, base);
        }
      }
    }
  }
}

/// A token's dp = dh r alpha, written by the lanes owning the entries
/// (gGate: pre and post, gRes: res), and the RMS term's scale into *rScale:
/// dr summed over k in order by the group's lane 0. pRow, dpRow: the
/// token's rows; square: its row square (read by lane 0 where valid).
__device__ __forceinline__ void coeffProjectionBackward(const float (&gGate)[kCoeffGateSlots],
                                                        const float (&gRes)[kCoeffSlots], float r, const act_t *alpha,
                                                        const float *pRow, const float *square, act_t *dpRow,
                                                        float *rScale, int64_t width, bool valid, int q, int base) {
#pragma unroll
  for (int i = 0; i < kCoeffGateSlots; ++i) {
    const int k = i * kCoeffLanes + q;
    if (valid && k < 2 * kStreams) {
      float a = k < kStreams ? load(alpha[0]) : load(alpha[1]);
      const float d = gGate[i] * r * a;
      store(&dpRow[k], d);
    }
  }
#pragma unroll
  for (int j = 0; j < kCoeffSlots; ++j) {
    const int e = j * kCoeffLanes + q;
    if (valid && e < kCoeffEntries) {
      float a = load(alpha[2]);
      const float d = gRes[j] * r * a;
      store(&dpRow[2 * kStreams + e], d);
    }
  }
  float dr = 0;
#pragma unroll
  for (int k = 0; k < kCoefficients; ++k) {
    float g;
    if (k < 2 * kStreams)
      g = __shfl_sync(0xffffffffu, gGate[k / kCoeffLanes], base + k % kCoeffLanes);
    else
      g = __shfl_sync(0xffffffffu, gRes[(k - 2 * kStreams) / kCoeffLanes], base + (k - 2 * kStreams) % kCoeffLanes);
    if (valid && q == 0) {
      float a = k < kStreams ? load(alpha[0]) : k < 2 * kStreams ? load(alpha[1]) : load(alpha[2]);
      dr += g * pRow[k] * a;
    }
  }
  if (valid && q == 0) {
    float rms = sqrtf(*square / float(width));
    *rScale = rms > 0 ? -dr * r * r / (float(width) * rms) : 0.0f;
  }
}

/// Per token: dh (through the sigmoids and the unrolled Sinkhorn), dp and
/// the scale of the RMS term; the reductions over tokens run afterwards.
/// Launch: block kCoeffThreads (64), grid ceil(rows / kCoeffTokensPerBlock);
/// see the section comment.
///
/// Dependent launch, with `early`: the Sinkhorn's forward sweep, about half
/// of the token's serial chain, reads only aux (written by the sublayer's
/// entry, which at least the kernel writing dCoef's pre entries follows:
/// pass B, or the pre backward; under recomputation the entry may run again
/// right before that kernel), so two or more kernels back: complete once
/// this grid is launched (kernelPrologue's comment). So it runs before the
/// wait, beside the kernel before, and dCoef is read after it. Nothing is
/// written before the wait: the same bits.
extern "C" __global__ void mhcc_mhc_coeffs_backward(const float *squares, const float *p, const act_t *alpha,
                                                    const float *aux, const float *dCoef, float *dh, act_t *dp,
                                                    float *rScale, int64_t rows, int64_t C, int early) {
  if (!early)
    kernelPrologue();
  const CoeffLanes lanes(rows);
  if (!lanes.warpActive)
    return; // the whole warp (with `early`, without a memory access)
  const int64_t t = lanes.t;
  const bool valid = lanes.valid;
  const int q = lanes.q, base = lanes.base;
  const int64_t width = kStreams * C;
  const int K = kCoefficients;
  const float r = valid ? aux[t * (K + 1) + K] : 0.0f;
  float logit[kCoeffSlots], gr[kCoeffSlots];
#pragma unroll
  for (int j = 0; j < kCoeffSlots; ++j) {
    const int e = j * kCoeffLanes + q;
    logit[j] = 0;
    gr[j] = 0;
    if (valid && e < kCoeffEntries)
      logit[j] = aux[t * (K + 1) + 2 * kStreams + e];
  }
  float m0[kCoeffSlots];
  coeffSinkhornStart(logit, m0, q, base);
  // dCoef (the kernel before's output) once the wait returned: the
  // sigmoids' backward into dh's pre and post entries, and gr.
  float gGate[kCoeffGateSlots];
  auto readGradients = [&] {
    if (early)
      kernelPrologue();
#pragma unroll
    for (int i = 0; i < kCoeffGateSlots; ++i) {
      const int k = i * kCoeffLanes + q;
      gGate[i] = 0;
      if (valid && k < 2 * kStreams) {
        const float hk = aux[t * (K + 1) + k];
        if (k < kStreams) {
          float s = sigmoidf(hk);
          gGate[i] = dCoef[t * K + k] * s * (1.0f - s);
        } else {
          float s2 = sigmoidf(hk);
          gGate[i] = 2.0f * dCoef[t * K + k] * s2 * (1.0f - s2);
        }
        dh[t * K + k] = gGate[i];
      }
    }
#pragma unroll
    for (int j = 0; j < kCoeffSlots; ++j) {
      const int e = j * kCoeffLanes + q;
      if (valid && e < kCoeffEntries)
        gr[j] = dCoef[t * K + 2 * kStreams + e];
    }
  };
  coeffSinkhornBackward(m0, gr, q, base, readGradients);
  float gRes[kCoeffSlots];
#pragma unroll
  for (int j = 0; j < kCoeffSlots; ++j) {
    const int e = j * kCoeffLanes + q;
    gRes[j] = gr[j] * m0[j];
    if (valid && e < kCoeffEntries)
      dh[t * K + 2 * kStreams + e] = gRes[j];
  }
  coeffProjectionBackward(gGate, gRes, r, alpha, p + t * K, squares + t, dp + t * K, rScale + t, width, valid, q,
                          base);
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

/// partial: columnChunks(rows) x kCoefficients. One block per chunk
/// (blockIdx.y; blockIdx.x > 0 has nothing to do): the chunk's rows of dh
/// (contiguous) go to shared memory, every thread loading, then thread k adds
/// column k's rows in order.
extern "C" __global__ void mhcc_mhc_bias_grad_partials(const float *dh, int64_t rows, float *partial) {
  kernelPrologue();
  if constexpr (kChunkRows * kCoefficients <= 8192) {
    __shared__ float chunkDh[kChunkRows * kCoefficients];
    if (blockIdx.x != 0)
      return; // the whole block
    const int64_t chunk = blockIdx.y, first = chunk * kChunkRows;
    const int64_t n = min(rows, first + kChunkRows) - first;
    for (int64_t e = threadIdx.x; e < n * kCoefficients; e += blockDim.x)
      chunkDh[e] = dh[first * kCoefficients + e];
    __syncthreads();
    for (int k = threadIdx.x; k < kCoefficients; k += blockDim.x) {
      float acc = 0;
      for (int64_t r = 0; r < n; ++r)
        acc += chunkDh[r * kCoefficients + k];
      partial[chunk * kCoefficients + k] = acc;
    }
  } else {
    columnPartials(MhcBiasGrad{dh}, rows, kCoefficients, partial);
  }
}

/// summand[g][r] = row r's summand of alpha column g (MhcAlphaGrad: a sum
/// over the group's coefficients in order) for the n rows of a chunk from
/// `first`, one (g, r) a thread of the block.
__device__ void stageAlphaSummands(float (&summand)[3][kChunkRows], const float *dh, const float *p, const float *aux,
                                   int64_t first, int64_t n) {
  const MhcAlphaGrad value{dh, p, aux};
  for (int e = threadIdx.x; e < 3 * kChunkRows; e += blockDim.x) {
    const int group = e / int(kChunkRows), r = e % int(kChunkRows);
    if (r < n)
      summand[group][r] = value(first + r, group);
  }
}

/// partial: columnChunks(rows) x 3. One block per chunk (blockIdx.y;
/// blockIdx.x > 0 has nothing to do): thread (g, r) computes row r's summand
/// of column g (MhcAlphaGrad: a sum over the group's coefficients in order)
/// into shared memory, then thread g adds the chunk's rows in order.
extern "C" __global__ void mhcc_mhc_alpha_grad_partials(const float *dh, const float *p, const float *aux,
                                                        int64_t rows, float *partial) {
  kernelPrologue();
  __shared__ float summand[3][kChunkRows];
  if (blockIdx.x != 0)
    return; // the whole block
  const int64_t chunk = blockIdx.y, first = chunk * kChunkRows;
  const int64_t n = min(rows, first + kChunkRows) - first;
  stageAlphaSummands(summand, dh, p, aux, first, n);
  __syncthreads();
  if (threadIdx.x < 3) {
    float acc = 0;
    for (int64_t r = 0; r < n; ++r)
      acc += summand[threadIdx.x][r];
    partial[chunk * 3 + threadIdx.x] = acc;
  }
}

/// Both gate parameters' partials of one chunk in one launch (what
/// mhcc_mhc_bias_grad_partials and mhcc_mhc_alpha_grad_partials compute, in
/// the same orders): partial[chunk] = K bias columns, then the 3 alpha ones.
/// One block per chunk (blockIdx.x). Only where the chunk's dh fits in shared
/// memory (kChunkRows K <= 8192, n <= 10; mhcCoeffsBackward checks it).
/// Dependent launch, with `early`: dh comes from the Sinkhorn backward,
/// which at least one kernel follows (the input gradient's pass), p and aux
/// from the forward, so the sums run before the wait (kernelPrologue's
/// comment), beside the kernel before; the partials are written after it.
extern "C" __global__ void mhcc_mhc_gate_grad_partials(const float *dh, const float *p, const float *aux,
                                                       int64_t rows, float *partial, int early) {
  if (!early)
    kernelPrologue();
  if constexpr (kChunkRows * kCoefficients <= 8192) {
    constexpr int K = kCoefficients;
    static_assert(K + 3 <= kThreads, "a column a thread (blockDim.x = kThreads)");
    __shared__ float chunkDh[kChunkRows * K];
    __shared__ float summand[3][kChunkRows];
    const int64_t chunk = blockIdx.x, first = chunk * kChunkRows;
    const int64_t n = min(rows, first + kChunkRows) - first;
    for (int64_t e = threadIdx.x; e < n * K; e += blockDim.x)
      chunkDh[e] = dh[first * K + e];
    stageAlphaSummands(summand, dh, p, aux, first, n);
    __syncthreads();
    const int k = threadIdx.x;
    float acc = 0;
    if (k < K + 3)
      for (int64_t r = 0; r < n; ++r)
        acc += k < K ? chunkDh[r * K + k] : summand[k - K][r];
    if (early)
      kernelPrologue();
    if (k < K + 3)
      partial[chunk * (K + 3) + k] = acc;
  } else if (early) {
    kernelPrologue();
  }
}
