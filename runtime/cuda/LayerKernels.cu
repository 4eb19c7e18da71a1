//===- LayerKernels.cu - RMSNorm, RoPE, SwiGLU, cross-entropy -------------------===//
//
// A part of the model's kernel library: mhcc concatenates ModelKernels.cu,
// MhcKernels.cu, MhcMixKernels.cu, MhcFusedKernels.cu, MhcBackwardKernels.cu and LayerKernels.cu (in that
// order) after the model's constants and compiles them as one file; the helpers and
// conventions are ModelKernels.cu's.
//
//===----------------------------------------------------------------------===//

// ---- RMSNorm ----------------------------------------------------------------------------

/// One warp per row (any block of whole warps up to kThreads): the row's
/// sum of squares in mhcc_row_squares's order (a lane's elements c = lane,
/// lane + 32, ..., then the butterfly), aux[t] = 1 / sqrt(mean + eps), then
/// y = u s gain. The bits of the three launches it replaced (row squares,
/// statistics, apply). A row of up to kNormResident 16-byte vectors a lane
/// (C = 2048 in bf16) is loaded at once and kept in registers (copied to
/// shared memory for the sum's order); longer rows stream through shared
/// memory and are read again, from L2, for y.
constexpr int kNormResident = 8;

extern "C" __global__ void mhcc_rms_norm_forward(const act_t *u, const act_t *gain, float *aux, act_t *y,
                                                 int64_t rows, int64_t C, float eps) {
  kernelPrologue();
  constexpr int kTiles = warpTiles<1>(), E = kTiles * 32 * kVec;
  static_assert(E / kVec <= 32 * kNormResident, "the streamed stage fits the resident row's buffer");
  __shared__ uint4 staged[kThreads / 32][32 * kNormResident];
  int64_t t = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (t >= rows)
    return;
  const act_t *row = u + t * C;
  act_t *const buf = reinterpret_cast<act_t *>(staged[threadIdx.x / 32]);
  const bool vec = C % kVec == 0 && aligned16(u) && aligned16(gain) && aligned16(y);
  act_t *out = y + t * C;
  float sq = 0;
  if (vec && C <= 32 * kNormResident * kVec) {
    const int vectors = int(C / kVec); // lane l holds vectors l, l + 32, ...
    uint4 r[kNormResident];
    for (int v = 0; v < kNormResident; ++v)
      if (lane + 32 * v < vectors)
        r[v] = *reinterpret_cast<const uint4 *>(row + (lane + 32 * v) * kVec);
    for (int v = 0; v < kNormResident; ++v)
      if (lane + 32 * v < vectors)
        staged[threadIdx.x / 32][lane + 32 * v] = r[v];
    __syncwarp();
    for (int64_t c = lane; c < C; c += 32)
      sq += load(buf[c]) * load(buf[c]);
    sq = warpSum(sq);
    const float s = 1.0f / sqrtf(sq / float(C) + eps);
    if (lane == 0)
      aux[t] = s;
    for (int v = 0; v < kNormResident; ++v)
      if (lane + 32 * v < vectors) {
        const int64_t c = int64_t(lane + 32 * v) * kVec;
        float uv[kVec], gv[kVec], o[kVec];
        unpackVec(r[v], uv);
        loadVec(gain + c, gv);
        for (int k = 0; k < kVec; ++k)
          o[k] = uv[k] * s * gv[k];
        storeVec(out + c, o);
      }
    return;
  }
  warpStream<kTiles, 1>(&row, &buf, C, vec, lane, [&](int64_t, int n) {
    for (int j = 0; j < E / 32; ++j) {
      const int k = lane + 32 * j;
      if (k < n)
        sq += load(buf[k]) * load(buf[k]);
    }
  });
  sq = warpSum(sq);
  const float s = 1.0f / sqrtf(sq / float(C) + eps);
  if (lane == 0)
    aux[t] = s;
  if (vec) {
    for (int64_t c = int64_t(lane) * kVec; c < C; c += 32 * kVec) {
      float uv[kVec], gv[kVec], o[kVec];
      loadVec(row + c, uv);
      loadVec(gain + c, gv);
      for (int k = 0; k < kVec; ++k)
        o[k] = uv[k] * s * gv[k];
      storeVec(out + c, o);
    }
    return;
  }
  for (int64_t c = lane; c < C; c += 32)
    store(&out[c], load(row[c]) * s * load(gain[c]));
}

/// One warp per row (any block of whole warps up to kThreads). du += the
/// row's gradient; with `fresh` du holds nothing yet and is not read: each
/// element is stored as 0 + its gradient, the bits of an add into zeros.
extern "C" __global__ void mhcc_rms_norm_backward_row(const act_t *u, const act_t *gain, const float *aux,
                                                      const act_t *dy, act_t *du, int fresh, int64_t rows,
                                                      int64_t C) {
  kernelPrologue();
  constexpr int kTiles = warpTiles<4>(), E = kTiles * 32 * kVec;
  __shared__ uint4 staged[kThreads / 32][4][E / kVec];
  int64_t t = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (t >= rows)
    return;
  act_t *buf[4];
  for (int a = 0; a < 4; ++a)
    buf[a] = reinterpret_cast<act_t *>(staged[threadIdx.x / 32][a]);
  const act_t *src[4] = {gain, dy + t * C, u + t * C, du + t * C};
  const bool vec = C % kVec == 0 && aligned16(u) && aligned16(gain) && aligned16(dy) && aligned16(du);
  float s = aux[t], dot = 0;
  warpStream<kTiles, 3>(src, buf, C, vec, lane, [&](int64_t, int n) {
    for (int j = 0; j < E / 32; ++j) {
      const int c = lane + 32 * j;
      if (c < n)
        dot += load(buf[0][c]) * load(buf[1][c]) * load(buf[2][c]);
    }
  });
  dot = warpSum(dot);
  float k = s * s * s / float(C) * dot;
  act_t *duRow = du + t * C, *bdu = buf[3];
  auto addRow = [&](int64_t base, int n) {
    for (int j = 0; j < E / 32; ++j) {
      const int c = lane + 32 * j;
      if (c < n) {
        const float g = s * load(buf[0][c]) * load(buf[1][c]) - k * load(buf[2][c]);
        const float prior = fresh ? 0.0f : load(bdu[c]);
        store(&bdu[c], prior + g);
      }
    }
    __syncwarp();
    if (vec && n == E) {
      for (int v = 0; v < kTiles; ++v)
        *reinterpret_cast<uint4 *>(duRow + base + (v * 32 + lane) * kVec) =
            *reinterpret_cast<const uint4 *>(bdu + (v * 32 + lane) * kVec);
    } else {
      for (int c = lane; c < n; c += 32)
        duRow[base + c] = bdu[c];
    }
  };
  if (fresh) // du's tiles staged as scratch only
    warpStream<kTiles, 3>(src, buf, C, vec, lane, addRow);
  else
    warpStream<kTiles, 4>(src, buf, C, vec, lane, addRow);
}

struct RmsNormGainGrad {
  const act_t *u;
  const float *aux;
  const act_t *dy;
  int64_t C;
  __device__ float operator()(int64_t t, int64_t c) const { return load(dy[t * C + c]) * load(u[t * C + c]) * aux[t]; }
};

/// partial: columnChunks(rows) x C. One thread per column of a chunk (as
/// columnPartials), the rows' loads issued in groups of 16 ahead of their adds.
extern "C" __global__ void mhcc_rms_norm_gain_grad_partials(const act_t *u, const float *aux, const act_t *dy,
                                                            int64_t rows, int64_t C, float *partial) {
  kernelPrologue();
  int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  int64_t chunk = blockIdx.y;
  if (c >= C)
    return;
  constexpr int G = 16;
  const int64_t end = min(rows, (chunk + 1) * kChunkRows);
  int64_t t = chunk * kChunkRows;
  float acc = 0;
  for (; t + G <= end; t += G) {
    float d[G], uu[G], a[G];
    for (int g = 0; g < G; ++g) {
      d[g] = load(dy[(t + g) * C + c]);
      uu[g] = load(u[(t + g) * C + c]);
      a[g] = aux[t + g];
    }
    for (int g = 0; g < G; ++g)
      acc += d[g] * uu[g] * a[g];
  }
  for (; t < end; ++t)
    acc += load(dy[t * C + c]) * load(u[t * C + c]) * aux[t];
  partial[chunk * C + c] = acc;
}

// ---- attention ---------------------------------------------------------------------------

/// pow(kRopeBase, -2 j / d): the frequency of pair j.
__device__ __forceinline__ double ropeFreq(int64_t j, int64_t d) { return pow(kRopeBase, -2.0 * double(j) / double(d)); }

/// Row t's rotary position: its offset in its packed document, or in its
/// sequence without documents (positions null).
__device__ __forceinline__ int64_t ropePosition(const int32_t *positions, int64_t t, int64_t seq) {
  return positions ? int64_t(positions[t]) : t % seq;
}

/// The rotation at position pos of a pair with frequency freq (the inverse:
/// -angle).
__device__ __forceinline__ void ropeAngle(int64_t pos, double freq, int inverse, float &c, float &s) {
  double theta = double(pos) * freq;
  c = float(cos(theta));
  s = float(sin(theta));
  if (inverse)
    s = -s;
}

/// table[pos * pairs + j] = (cos, sin) of position pos and pair j, as
/// ropeAngle computes them (double arguments, float results): the model's
/// rotations once per device (ModelKernels::ropeTable), so mhcc_rope reads
/// them instead of evaluating double cos and sin for every token.
extern "C" __global__ void mhcc_rope_table(float2 *table, int64_t seq, int64_t d) {
  kernelPrologue();
  const int64_t pairs = d / 2;
  for (int64_t i = gridThread(); i < seq * pairs; i += gridThreads()) {
    float c, s;
    ropeAngle(i / pairs, ropeFreq(i % pairs, d), 0, c, s);
    table[i] = make_float2(c, s);
  }
}

/// The rotation of position pos, pair j from the table (its inverse: -sin,
/// as ropeAngle negates it).
__device__ __forceinline__ void ropeFromTable(const float2 *table, int64_t pos, int64_t pairs, int64_t j,
                                              int inverse, float &c, float &s) {
  const float2 cs = table[pos * pairs + j];
  c = cs.x;
  s = inverse ? -cs.y : cs.y;
}

/// Where the head dim is a multiple of 8 (and C and rowStride of kVec): one
/// thread per (row, q or k, kRopePairs pairs), the rotations read once and
/// applied to every head, kRopeHeads heads' loads in flight at a time. Else
/// one thread per pair. table: mhcc_rope_table's for seq and C / heads.
constexpr int kRopePairs = 4, kRopeHeads = kVec;
constexpr int kRopeVecs = 2 * kRopePairs / kVec; // 16-byte vectors a head's kRopePairs pairs take

extern "C" __global__ void mhcc_rope(act_t *qkv, const int32_t *positions, const float2 *table, int64_t rows,
                                     int64_t C, int64_t heads, int64_t seq, int inverse, int64_t rowStride) {
  kernelPrologue();
  const int64_t d = C / heads, pairs = d / 2;
  if (d % (2 * kRopePairs) == 0 && C % kVec == 0 && rowStride % kVec == 0 && aligned16(qkv)) {
    const int64_t groups = pairs / kRopePairs;
    for (int64_t q = gridThread(); q < rows * 2 * groups; q += gridThreads()) {
      const int64_t t = q / (2 * groups), which = q / groups % 2, j0 = q % groups * kRopePairs;
      const int64_t pos = ropePosition(positions, t, seq);
      float c[kRopePairs], s[kRopePairs];
      for (int p = 0; p < kRopePairs; ++p)
        ropeFromTable(table, pos, pairs, j0 + p, inverse, c[p], s[p]);
      act_t *v = qkv + t * rowStride + which * C + 2 * j0;
      for (int64_t h0 = 0; h0 < heads; h0 += kRopeHeads) {
        uint4 raw[kRopeHeads][kRopeVecs];
        for (int b = 0; b < kRopeHeads; ++b)
          if (h0 + b < heads)
            for (int u = 0; u < kRopeVecs; ++u)
              raw[b][u] = *reinterpret_cast<const uint4 *>(v + (h0 + b) * d + u * kVec);
        for (int b = 0; b < kRopeHeads; ++b)
          if (h0 + b < heads)
            for (int u = 0; u < kRopeVecs; ++u) {
              float e[kVec];
              unpackVec(raw[b][u], e);
              for (int k = 0; k < kVec / 2; ++k) {
                const int p = u * kVec / 2 + k;
                float a = e[2 * k], bb = e[2 * k + 1];
                e[2 * k] = a * c[p] - bb * s[p];
                e[2 * k + 1] = a * s[p] + bb * c[p];
              }
              storeVecUnsplit(v + (h0 + b) * d + u * kVec, e);
            }
      }
    }
    return;
  }
  for (int64_t e = gridThread(); e < rows * 2 * heads * pairs; e += gridThreads()) {
    int64_t t = e / (2 * heads * pairs);
    int64_t rest = e % (2 * heads * pairs);
    int64_t which = rest / (heads * pairs); // 0: q, 1: k
    int64_t h = (rest / pairs) % heads, j = rest % pairs;
    float c, s;
    ropeFromTable(table, ropePosition(positions, t, seq), pairs, j, inverse, c, s);
    act_t *v = qkv + t * rowStride + which * C + h * d + 2 * j;
    float a = load(v[0]), b = load(v[1]);
    store(&v[0], a * c - b * s);
    store(&v[1], a * s + b * c);
  }
}

/// One block per score row (head, query i) of one sequence (its first token
/// at lseOffset): causal softmax in place (P, zero above the diagonal and,
/// with packed documents, before the query's document) and the row's
/// log-sum-exp. firstKeys (null: none): each token's document start in its
/// sequence; the visible keys are [first, i].
extern "C" __global__ void mhcc_causal_softmax(float *scores, float *lse, const int32_t *firstKeys, int64_t seq,
                                               int64_t heads, int64_t lseOffset) {
  kernelPrologue();
  const int64_t h = blockIdx.x / seq, i = blockIdx.x % seq;
  const int64_t first = firstKeys ? firstKeys[lseOffset + i] : 0;
  float *row = scores + (h * seq + i) * seq;
  float m = -INFINITY;
  for (int64_t j = first + threadIdx.x; j <= i; j += blockDim.x)
    m = fmaxf(m, row[j]);
  m = blockMax(m);
  float sum = 0;
  for (int64_t j = first + threadIdx.x; j <= i; j += blockDim.x)
    sum += expf(row[j] - m);
  sum = blockSum(sum);
  const float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < seq; j += blockDim.x)
    row[j] = j >= first && j <= i ? expf(row[j] - m) * inv : 0.0f;
  if (threadIdx.x == 0)
    lse[(lseOffset + i) * heads + h] = m + logf(sum);
}

/// Backward of one score row: P from the saved log-sum-exp, then
/// dS = P (dP - <P, dP>) * scale; P replaces the scores, dS replaces dP.
extern "C" __global__ void mhcc_causal_softmax_backward(float *scores, float *dP, const float *lse,
                                                        const int32_t *firstKeys, int64_t seq, int64_t heads,
                                                        int64_t lseOffset, float scale) {
  kernelPrologue();
  const int64_t h = blockIdx.x / seq, i = blockIdx.x % seq;
  const int64_t first = firstKeys ? firstKeys[lseOffset + i] : 0;
  float *row = scores + (h * seq + i) * seq, *grad = dP + (h * seq + i) * seq;
  const float l = lse[(lseOffset + i) * heads + h];
  float dot = 0;
  for (int64_t j = first + threadIdx.x; j <= i; j += blockDim.x)
    dot += expf(row[j] - l) * grad[j];
  dot = blockSum(dot);
  for (int64_t j = threadIdx.x; j < seq; j += blockDim.x) {
    float p = j >= first && j <= i ? expf(row[j] - l) : 0.0f;
    row[j] = p;
    grad[j] = p * (grad[j] - dot) * scale;
  }
}

// ---- SwiGLU ---------------------------------------------------------------------------------

extern "C" __global__ void mhcc_swiglu_gate(const act_t *a, const act_t *b, act_t *hsw, int64_t count) {
  kernelPrologue();
  const int64_t vecs = aligned16(a) && aligned16(b) && aligned16(hsw) ? count / kVec : 0;
  for (int64_t q = gridThread(); q < vecs; q += gridThreads()) {
    float av[kVec], bv[kVec], out[kVec];
    loadVec(a + q * kVec, av);
    loadVec(b + q * kVec, bv);
    for (int k = 0; k < kVec; ++k) {
      const float v = av[k] * sigmoidf(av[k]) * bv[k];
      out[k] = v;
    }
    storeVec(hsw + q * kVec, out);
  }
  for (int64_t i = vecs * kVec + gridThread(); i < count; i += gridThreads()) {
    const float v = load(a[i]) * sigmoidf(load(a[i])) * load(b[i]);
    store(&hsw[i], v);
  }
}

extern "C" __global__ void mhcc_swiglu_backward_gate(const act_t *a, const act_t *b, const act_t *dh, act_t *da,
                                                     act_t *db, int64_t count) {
  kernelPrologue();
  const bool vec = aligned16(a) && aligned16(b) && aligned16(dh) && aligned16(da) && aligned16(db);
  const int64_t vecs = vec ? count / kVec : 0;
  for (int64_t q = gridThread(); q < vecs; q += gridThreads()) {
    float av[kVec], bv[kVec], hv[kVec], gav[kVec], gbv[kVec];
    loadVec(a + q * kVec, av);
    loadVec(b + q * kVec, bv);
    loadVec(dh + q * kVec, hv);
    for (int k = 0; k < kVec; ++k) {
      float s = sigmoidf(av[k]);
      const float gb = hv[k] * av[k] * s;
      gbv[k] = gb;
      const float ga = hv[k] * bv[k] * s * (1.0f + av[k] * (1.0f - s));
      gav[k] = ga;
    }
    storeVec(db + q * kVec, gbv);
    storeVec(da + q * kVec, gav);
  }
  for (int64_t i = vecs * kVec + gridThread(); i < count; i += gridThreads()) {
    float s = sigmoidf(load(a[i]));
    const float gb = load(dh[i]) * load(a[i]) * s;
    store(&db[i], gb);
    const float ga = load(dh[i]) * load(b[i]) * s * (1.0f + load(a[i]) * (1.0f - s));
    store(&da[i], ga);
  }
}

// ---- cross-entropy ------------------------------------------------------------------------

/// One block of kThreads per row; thread i takes elements i, i + kThreads, ...
/// in order, as one element per step did. The row goes through shared memory
/// in stages of kLseTiles * kThreads * kVec elements (16-byte loads, the next
/// stage in flight); the first kLseSlots - 1 stages stay there for the second
/// pass, later ones are loaded again.
constexpr int kLseTiles = 2, kLseSlots = 5;

extern "C" __global__ void mhcc_log_sum_exp(const act_t *logits, float *aux, int64_t rows, int64_t V) {
  kernelPrologue();
  using S = Stage<kLseTiles, kThreads>;
  constexpr int E = S::kElems;
  __shared__ uint4 staged[kLseSlots][E / kVec];
  const act_t *row = logits + blockIdx.x * V;
  const bool vec = V % kVec == 0 && aligned16(logits);
  const int lane = threadIdx.x;
  const int64_t stages = (V + E - 1) / E;
  auto slot = [&](int64_t i) { return reinterpret_cast<act_t *>(staged[i < kLseSlots - 1 ? i : kLseSlots - 1]); };
  S s;
  s.fetch(row, min(V, int64_t(E)), vec, lane);
  float m = -INFINITY;
  for (int64_t i = 0; i < stages; ++i) {
    const int64_t base = i * E;
    const int n = int(min(V - base, int64_t(E)));
    __syncthreads(); // the rolling slot's readers are done
    s.put(slot(i), lane);
    __syncthreads();
    if (base + E < V)
      s.fetch(row + base + E, min(V - base - E, int64_t(E)), vec, lane);
    const act_t *b = slot(i);
    for (int j = 0; j < E / kThreads; ++j) {
      const int c = lane + kThreads * j;
      if (c < n)
        m = fmaxf(m, load(b[c]));
    }
  }
  m = blockMax(m);
  const int64_t kept = kLseSlots - 1;
  if (stages > kept)
    s.fetch(row + kept * E, min(V - kept * E, int64_t(E)), vec, lane);
  float sum = 0;
  for (int64_t i = 0; i < stages; ++i) {
    const int64_t base = i * E;
    const int n = int(min(V - base, int64_t(E)));
    if (i >= kept) {
      __syncthreads();
      s.put(slot(i), lane);
      __syncthreads();
      if (base + E < V)
        s.fetch(row + base + E, min(V - base - E, int64_t(E)), vec, lane);
    }
    const act_t *b = slot(i);
    for (int j = 0; j < E / kThreads; ++j) {
      const int c = lane + kThreads * j;
      if (c < n)
        sum += expf(load(b[c]) - m);
    }
  }
  sum = blockSum(sum);
  if (threadIdx.x == 0)
    aux[blockIdx.x] = m + logf(sum);
}

/// One block (any size up to kThreads): its threads gather each row's term
/// (+0 for a row without a label: adding +0 leaves the running total, which is
/// never -0, unchanged), then one thread adds them in row order, as the serial
/// loop did. rowMap, microbatchRows: a context rank's rows (microbatchRow,
/// microbatchCounted).
extern "C" __global__ void mhcc_loss(const act_t *logits, const int32_t *labels, const float *aux, float *loss,
                                     int64_t rows, int64_t V, int64_t shift, int64_t seq, const int32_t *rowMap,
                                     int64_t microbatchRows) {
  kernelPrologue();
  constexpr int kRows = 2048; // rows gathered per pass
  __shared__ float terms[kRows];
  __shared__ int64_t counts[kThreads];
  if (blockIdx.x != 0)
    return;
  float total = 0;
  int64_t counted = 0;
  for (int64_t first = 0; first < rows; first += kRows) {
    const int n = int(min(rows - first, int64_t(kRows)));
    for (int r = threadIdx.x; r < n; r += blockDim.x) {
      const int64_t t = first + r, row = microbatchRow(rowMap, t);
      float term = 0.0f;
      if ((row % seq) + shift < seq) {
        term = aux[t] - load(logits[t * V + labels[row + shift]]);
        ++counted;
      }
      terms[r] = term;
    }
    __syncthreads();
    if (threadIdx.x == 0)
      for (int r = 0; r < n; ++r)
        total += terms[r];
    __syncthreads();
  }
  counts[threadIdx.x] = counted;
  __syncthreads();
  if (threadIdx.x == 0) {
    counted = 0;
    for (int i = 0; i < int(blockDim.x); ++i)
      counted += counts[i];
    if (rowMap)
      counted = microbatchCounted(microbatchRows, shift, seq);
    *loss = counted ? total / float(counted) : 0.0f;
  }
}

/// `logits` are vocabulary columns [first, first + V) (tensor parallelism's
/// share; first = 0 without it), aux the whole row's log-sum-exp; rowMap as
/// mhcc_loss's.
extern "C" __global__ void mhcc_cross_entropy_backward(const act_t *logits, const int32_t *labels, const float *aux,
                                                       float factor, act_t *dLogits, int64_t rows, int64_t V,
                                                       int64_t shift, int64_t seq, int64_t first,
                                                       const int32_t *rowMap) {
  kernelPrologue();
  if (V % kVec == 0 && aligned16(logits) && aligned16(dLogits)) {
    for (int64_t i = gridThread() * kVec; i < rows * V; i += gridThreads() * kVec) {
      int64_t t = i / V, v = i % V, row = microbatchRow(rowMap, t);
      if ((row % seq) + shift >= seq)
        continue;
      const float at = aux[t];
      const int64_t label = labels[row + shift] - first;
      float lv[kVec], dv[kVec];
      loadVec(logits + i, lv);
      loadVec(dLogits + i, dv);
      for (int k = 0; k < kVec; ++k) {
        float g = factor * expf(lv[k] - at);
        if (label == v + k)
          g -= factor;
        dv[k] = dv[k] + g;
      }
      storeVec(dLogits + i, dv);
    }
    return;
  }
  for (int64_t i = gridThread(); i < rows * V; i += gridThreads()) {
    int64_t t = i / V, v = i % V, row = microbatchRow(rowMap, t);
    if ((row % seq) + shift >= seq)
      continue;
    float g = factor * expf(load(logits[i]) - aux[t]);
    if (labels[row + shift] - first == v)
      g -= factor;
    store(&dLogits[i], load(dLogits[i]) + g);
  }
}
