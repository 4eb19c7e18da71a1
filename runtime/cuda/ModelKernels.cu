//===- ModelKernels.cu - the model's CUDA kernels, specialized by mhcc ------===//
//
// mhcc prepends the model's constants (kStreams, kSinkhornIterations), its
// activation storage type (act_t: float, or __nv_bfloat16 for a bf16 model)
// and its residual stream's (res_t: act_t, or float for a bf16 model with
// residual_dtype f32) and compiles this file, followed by MhcKernels.cu, MhcMixKernels.cu,
// MhcFusedKernels.cu, MhcBackwardKernels.cu and LayerKernels.cu, with nvcc into the artifact; the runtime loads the image
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
// Storage (docs/precision.md): activations, their gradients and the weights
// as the kernels read them are act_t; every read of one goes through load()
// (exact widening to fp32), every write through store() (round to nearest
// even once, when the kernel's output is complete: a kernel adding into a
// gradient loads the old value, adds in fp32 and stores the sum once). The
// mHC coefficients, statistics (rstd, log-sum-exp, Sinkhorn state), the
// projections p and dh, column partials, weight gradients (fp32 main
// gradients), the causal softmax kernels' scores and the loss stay fp32. With
// act_t = float, load() and store() are plain reads and writes: an fp32
// model's kernels run exactly the operations, in the same order, they ran
// before act_t existed.
//
// Vectorization: the memory-bound kernels move activations 16 bytes at a
// time (kVec of them) where widths and pointers allow, one at a time
// otherwise, and every output element is still the same expression of the
// same operands, summed in the same order, as with one element per thread:
// the per-row sums stage tiles of a row through shared memory so that each
// lane still adds exactly the elements it added one access at a time (see
// "16-byte accesses" below). An fp32 and a bf16 model keep their bits.
//
// The mhcc_abi_* globals let the runtime check that an image matches the
// launch conventions it was built for.
//
//===----------------------------------------------------------------------===//
#include <cstdint>
#include <cstring>
#include <cuda_bf16.h>

constexpr int kThreads = 256;           // block size of every block-wide kernel
constexpr int64_t kChunkRows = 64;      // rows per partial in two-stage column sums
constexpr double kRopeBase = 10000.0;
constexpr float kMhcRmsEps = 1e-6f;
constexpr float kSinkhornClamp = 1e-6f;
constexpr int kCoefficients = kStreams * kStreams + 2 * kStreams; // pre, post, res

extern "C" __device__ const int mhcc_abi_version = 19;
extern "C" __device__ const int mhcc_abi_streams = kStreams;
extern "C" __device__ const int mhcc_abi_sinkhorn_iterations = kSinkhornIterations;
extern "C" __device__ const int mhcc_abi_block_threads = kThreads;
extern "C" __device__ const int mhcc_abi_chunk_rows = int(kChunkRows);
extern "C" __device__ const int mhcc_abi_activation_bytes = int(sizeof(act_t));
extern "C" __device__ const int mhcc_abi_residual_bytes = int(sizeof(res_t));

// ---- the residual stream's storage ----------------------------------------------------
// The kernels that read or write the stream (expand, contract, the row
// squares of the mHC entry, pre-mix, post-res, the n = 1 residual add, their
// backwards, the RMS term of the entry's input gradient) take it as res_t
// and run their bodies as templates over it: with res_t = act_t (every fp32
// model, and bf16 models by default) the body is the one they always ran,
// bits included. An fp32 stream beside bf16 activations takes quad paths
// instead (four consecutive columns a thread or lane: 16 bytes of the
// stream, 8 of activations, where widths and pointers allow; one element a
// step otherwise, the same expressions): the elementwise kernels compute
// each element as their one-element paths do; the per-row sums (row
// squares, the pre and post/res backwards' dots) add a lane's quads in
// order, their own fixed order. The fused entry and the backward's three
// mixing passes read the stream as act_t and are not launched for such
// models (CudaRank's wideResidual_), nor is the coefficients' tensor-core
// input gradient (DeviceKernels.cu takes SGEMMs and the row scale instead).
template <typename R> constexpr bool residualAsActivations() { return sizeof(R) == sizeof(act_t); }

/// Quads: four consecutive elements, widened from and rounded to either
/// storage type (bf16 pairs packed as packVec packs them).
__device__ __forceinline__ bool alignedQuad(const float *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
__device__ __forceinline__ bool alignedQuad(const __nv_bfloat16 *p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; }
__device__ __forceinline__ void loadQuad(const float *p, float (&v)[4]) {
  const float4 f = *reinterpret_cast<const float4 *>(p);
  v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
}
__device__ __forceinline__ void loadQuad(const __nv_bfloat16 *p, float (&v)[4]) {
  const uint2 raw = *reinterpret_cast<const uint2 *>(p);
  __nv_bfloat162 low, high;
  memcpy(&low, &raw.x, 4);
  memcpy(&high, &raw.y, 4);
  v[0] = __low2float(low), v[1] = __high2float(low), v[2] = __low2float(high), v[3] = __high2float(high);
}
__device__ __forceinline__ void storeQuad(float *p, const float (&v)[4]) {
  *reinterpret_cast<float4 *>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void storeQuad(__nv_bfloat16 *p, const float (&v)[4]) {
  const __nv_bfloat162 low = __floats2bfloat162_rn(v[0], v[1]), high = __floats2bfloat162_rn(v[2], v[3]);
  uint2 raw;
  memcpy(&raw.x, &low, 4);
  memcpy(&raw.y, &high, 4);
  *reinterpret_cast<uint2 *>(p) = raw;
}

// ---- activation storage --------------------------------------------------------------
// Reads widen exactly to fp32; writes round to nearest even (the CPU's Bf16.h).
// Where a stored value is an expression, kernels compute it into a local
// before store(), as the built-in = and += evaluate their right side first:
// with act_t = float the compiled code is then the pre-act_t code, instruction
// for instruction (only the order of address arithmetic could differ otherwise).

__device__ __forceinline__ float load(float v) { return v; }
__device__ __forceinline__ float load(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void store(float *p, float v) { *p = v; }
__device__ __forceinline__ void store(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

__device__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// ---- programmatic dependent launch (sm_90) ---------------------------------------------
// The host launches these kernels with programmatic stream serialization
// (ModelKernels::launchRaw): a kernel's blocks may be scheduled while the
// kernel before it in the stream drains, so its launch and prologue hide in
// that tail. Every kernel here runs kernelPrologue before it writes memory
// or reads what the kernel before it wrote: the wait returns once the
// previous kernel completed and its writes are visible, so the early start
// changes scheduling only, never the bits. The trigger then lets the next
// kernel start early in turn (it takes effect once every block of this grid
// has run it, i.e. in its last wave). Since every kernel launched so (these,
// and the runtime's own in DependentLaunch.cuh) triggers only after its own
// wait returned, and every other one starts once the one before it
// completed, a grid is launched only once everything two or more places
// before it in the stream completed: a kernel may read arrays written there
// before its wait (a kernel launched so that triggered before its wait
// would break this). Those that can take an `early` argument (1 where
// MHCC_EARLY_LOADS=1: pass B's first stage of dOut and x, the Sinkhorn
// backward's forward sweep, pass C's loads, the gate partials' sums, each
// naming its arrays) and then run beside the kernel before them.
__device__ __forceinline__ void kernelPrologue() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" :::);
#endif
}

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

// ---- 16-byte accesses ----------------------------------------------------------------
// Elementwise kernels take kVec consecutive elements per thread (grid-stride
// loops: any grid covers the work) when the width is a multiple of kVec and
// the pointers are 16-byte aligned, else one element per step as before.
// Per-row sums (one warp per row, lane l adding elements l, l + 32, ... in
// order, then warpSum) load a stage of the row with 16-byte accesses into a
// per-warp shared buffer and let lane l read its elements back from there:
// the same summands in the same order, with many loads in flight. Packed
// registers are reinterpreted with memcpy (well defined; compiles to moves).

constexpr int kVec = 16 / int(sizeof(act_t)); // activations per 16-byte access

/// Context parallelism: local row t is microbatch row rowMap[t] (null: t),
/// whose token id and label the kernels read and whose position in its
/// sequence masks the shifted losses.
__device__ __forceinline__ int64_t microbatchRow(const int32_t *rowMap, int64_t t) { return rowMap ? rowMap[t] : t; }
/// The rows a loss with `shift` counts (those whose label lies in their
/// sequence): with a rowMap, the whole microbatch's (microbatchRows), so a
/// context rank's loss is its share of the microbatch's mean.
__device__ __forceinline__ int64_t microbatchCounted(int64_t microbatchRows, int64_t shift, int64_t seq) {
  return (microbatchRows / seq) * max(int64_t(0), seq - shift);
}
__device__ __forceinline__ bool aligned16(const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
__device__ __forceinline__ int64_t gridThread() { return blockIdx.x * int64_t(blockDim.x) + threadIdx.x; }
__device__ __forceinline__ int64_t gridThreads() { return int64_t(gridDim.x) * blockDim.x; }

/// v[0, kVec) = the kVec activations packed in raw, widened.
__device__ __forceinline__ void unpackVec(const uint4 &raw, float *v) {
  act_t e[kVec];
  memcpy(e, &raw, sizeof raw);
  for (int k = 0; k < kVec; ++k)
    v[k] = load(e[k]);
}

/// Element e of the kVec activations packed in raw, widened.
__device__ __forceinline__ float vecElement(const uint4 &raw, int e) {
  act_t v[kVec];
  memcpy(v, &raw, sizeof raw);
  return load(v[e]);
}

/// v[0, kVec) rounded to activations, packed. bf16 pairs are put together
/// as 32-bit words (element 2k in the low half of word k): from an act_t
/// array copied into a uint4, nvcc split the 16-byte store into 4-byte ones
/// in some kernels (the coefficient input gradient, RoPE), a quarter of each
/// store's sector.
__device__ __forceinline__ uint4 packVec(const float *v) {
  if constexpr (sizeof(act_t) == 2) {
    uint32_t w[4];
    for (int k = 0; k < 4; ++k) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]); // .x = v[2k], low half
      memcpy(&w[k], &pair, 4);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
  } else {
    act_t e[kVec];
    for (int k = 0; k < kVec; ++k)
      store(&e[k], v[k]);
    uint4 raw;
    memcpy(&raw, e, sizeof raw);
    return raw;
  }
}

/// v[0, kVec) = the activations at p (16-byte aligned), widened. The load
/// goes to a local first: unpackVec's memcpy from a reference into global
/// memory compiled to 16 one-byte loads.
__device__ __forceinline__ void loadVec(const act_t *p, float *v) {
  const uint4 raw = *reinterpret_cast<const uint4 *>(p);
  unpackVec(raw, v);
}

/// loadVec, or kVec zeros (+0) without reading p when `zero`.
__device__ __forceinline__ void loadOrZero(const act_t *p, float *v, bool zero) {
  if (zero)
    for (int k = 0; k < kVec; ++k)
      v[k] = 0.0f;
  else
    loadVec(p, v);
}

/// Rounds v[0, kVec) and writes them to p (16-byte aligned) in one store.
__device__ __forceinline__ void storeVec(act_t *p, const float *v) { *reinterpret_cast<uint4 *>(p) = packVec(v); }

/// One 16-byte shared load: read through unpackVec's bf16 halves, nvcc split
/// a uint4 from shared memory into four 4-byte loads.
__device__ __forceinline__ uint4 loadShared16(const uint4 *p) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(uint32_t(__cvta_generic_to_shared(p))));
  return v;
}

/// storeVec with its 16-byte store spelled out in PTX, for the kernels where
/// nvcc split storeVec's store into four 4-byte ones (the coefficient input
/// gradient, RoPE; ncu: 8 of each sector's 32 bytes used a store). Not the
/// default: its memory clobber costs others registers (post/res backward
/// spilled 36 bytes instead of 8).
__device__ __forceinline__ void storeVecUnsplit(act_t *p, const float *v) {
  const uint4 raw = packVec(v);
  asm volatile("st.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(raw.x), "r"(raw.y), "r"(raw.z), "r"(raw.w)
               : "memory");
}

/// v = row[first, first + kCount) of a token's mHC coefficients: 16 bytes a
/// load where n is a multiple of 4 (then K and the pre/post/res offsets are)
/// and the row is aligned, else one float a load. The element kernels read
/// a token's coefficients in every thread: scalar loads kept L1 busy.
template <int kCount> __device__ __forceinline__ void loadCoefs(const float *row, int first, float (&v)[kCount]) {
  if constexpr (kStreams % 4 == 0 && kCount % 4 == 0) {
    if (aligned16(row)) {
      for (int i = 0; i < kCount; i += 4) {
        const float4 f = *reinterpret_cast<const float4 *>(row + first + i);
        v[i] = f.x;
        v[i + 1] = f.y;
        v[i + 2] = f.z;
        v[i + 3] = f.w;
      }
      return;
    }
  }
  for (int i = 0; i < kCount; ++i)
    v[i] = row[first + i];
}

/// A stage of kTiles * kLanes * kVec consecutive activations in registers,
/// kVec per lane and tile: fetch() loads src[0, count) (16 bytes per lane and
/// tile when `vec` and the stage is full, else element by element), put()
/// writes them to a shared buffer at the same offsets.
template <int kTiles, int kLanes> struct Stage {
  static constexpr int kElems = kTiles * kLanes * kVec;
  uint4 r[kTiles];
  __device__ __forceinline__ void fetch(const act_t *src, int64_t count, bool vec, int lane) {
    if (vec && count == kElems) {
      for (int u = 0; u < kTiles; ++u)
        r[u] = *reinterpret_cast<const uint4 *>(src + (u * kLanes + lane) * kVec);
    } else {
      for (int u = 0; u < kTiles; ++u) {
        act_t e[kVec];
        r[u] = make_uint4(0, 0, 0, 0);
        memcpy(e, &r[u], sizeof r[u]);
        for (int k = 0; k < kVec; ++k)
          if ((u * kLanes + lane) * kVec + k < count)
            e[k] = src[(u * kLanes + lane) * kVec + k];
        memcpy(&r[u], e, sizeof r[u]);
      }
    }
  }
  __device__ __forceinline__ void put(act_t *dst, int lane) const {
    for (int u = 0; u < kTiles; ++u)
      *reinterpret_cast<uint4 *>(dst + (u * kLanes + lane) * kVec) = r[u];
  }
};

/// Tiles (of 32 kVec activations) per array and stage of a warp streaming A
/// arrays through shared memory: at most 10 tiles a warp (5 KB; 40 KB for a
/// block of kThreads), at most 4 an array; 0 when A arrays do not fit.
template <int A> constexpr int warpTiles() { return 10 / A < 4 ? 10 / A : 4; }

/// Streams src[a][0, count) through the warp's shared buffers buf[a]
/// (kTiles * 32 * kVec activations each), the next stage's loads in flight
/// while body(base, n) reads the current stage: lane l's elements are
/// buf[a][l + 32 j] for l + 32 j < n (row offset base + l + 32 j), the
/// elements and order of `for (c = lane; c < count; c += 32)`. beforeLater()
/// runs after the first stage's loads of arrays [0, early) are issued and
/// before those of the others (a kernel's dependent-launch wait, where only
/// the later arrays come from the kernel before it).
template <int kTiles, int A, typename Body, typename BeforeLater>
__device__ __forceinline__ void warpStream(const act_t *const *src, act_t *const *buf, int64_t count, bool vec,
                                           int lane, Body body, int early, BeforeLater beforeLater) {
  using S = Stage<kTiles, 32>;
  S s[A];
  for (int a = 0; a < A; ++a) {
    if (a == early)
      beforeLater();
    s[a].fetch(src[a], min(count, int64_t(S::kElems)), vec, lane);
  }
  if (early >= A)
    beforeLater();
  for (int64_t base = 0; base < count; base += S::kElems) {
    __syncwarp(); // every lane is done reading the previous stage
    for (int a = 0; a < A; ++a)
      s[a].put(buf[a], lane);
    __syncwarp();
    const int64_t next = base + S::kElems;
    if (next < count)
      for (int a = 0; a < A; ++a)
        s[a].fetch(src[a] + next, min(count - next, int64_t(S::kElems)), vec, lane);
    body(base, int(min(count - base, int64_t(S::kElems))));
  }
}
template <int kTiles, int A, typename Body>
__device__ __forceinline__ void warpStream(const act_t *const *src, act_t *const *buf, int64_t count, bool vec,
                                           int lane, Body body) {
  warpStream<kTiles, A>(src, buf, count, vec, lane, body, 0, [] {});
}

/// One warp per row: out[t] = sum of squares of row t (of the residual
/// stream: the mHC entry's RMS). Any block of whole warps up to kThreads.
template <typename R> __device__ __forceinline__ void rowSquares(const R *x, float *out, int64_t rows, int64_t width) {
  int64_t t = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (t >= rows)
    return;
  const R *row = x + t * width;
  float sq = 0;
  if constexpr (residualAsActivations<R>()) {
    constexpr int kTiles = warpTiles<1>(), E = kTiles * 32 * kVec;
    __shared__ uint4 staged[kThreads / 32][E / kVec];
    act_t *const buf = reinterpret_cast<act_t *>(staged[threadIdx.x / 32]);
    const bool vec = width % kVec == 0 && aligned16(x);
    warpStream<kTiles, 1>(&row, &buf, width, vec, lane, [&](int64_t, int n) {
      for (int j = 0; j < E / 32; ++j) {
        const int k = lane + 32 * j;
        if (k < n)
          sq += load(buf[k]) * load(buf[k]);
      }
    });
  } else if (width % 4 == 0 && alignedQuad(x)) {
    for (int64_t c = 4 * lane; c < width; c += 128) {
      float v[4];
      loadQuad(row + c, v);
      for (int e = 0; e < 4; ++e)
        sq += v[e] * v[e];
    }
  } else {
    for (int64_t c = lane; c < width; c += 32)
      sq += load(row[c]) * load(row[c]);
  }
  sq = warpSum(sq);
  if (lane == 0)
    out[t] = sq;
}

extern "C" __global__ void mhcc_row_squares(const res_t *x, float *out, int64_t rows, int64_t width) {
  kernelPrologue();
  rowSquares(x, out, rows, width);
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

/// `table` holds vocabulary rows [first, first + share) (all of them
/// without tensor parallelism); a token outside them reads as zero, so the
/// tensor-parallel group's sum is the embedding. rowMap (context
/// parallelism; null: row t is microbatch row t): each row's microbatch row.
extern "C" __global__ void mhcc_embed_forward(const int32_t *tokens, const act_t *table, act_t *out, int64_t rows,
                                              int64_t C, int64_t shift, int64_t seq, int64_t first, int64_t share,
                                              const int32_t *rowMap) {
  kernelPrologue();
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * C)
    return;
  int64_t t = i / C, c = i % C;
  const int64_t row = microbatchRow(rowMap, t);
  int64_t src = (row % seq) + shift < seq ? row + shift : row;
  const int64_t id = int64_t(tokens[src]) - first;
  store(&out[i], id >= 0 && id < share ? load(table[id * C + c]) : 0.0f);
}

extern "C" __global__ void mhcc_embed_backward(const int32_t *offsets, const int32_t *positions, int64_t vocab,
                                               const act_t *dOut, float *dTable, int64_t C) {
  kernelPrologue();
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= vocab * C)
    return;
  int64_t v = i / C, c = i % C;
  float acc = dTable[i];
  for (int32_t p = offsets[v]; p < offsets[v + 1]; ++p)
    acc += load(dOut[int64_t(positions[p]) * C + c]);
  dTable[i] = acc;
}

template <typename R> __device__ __forceinline__ void expandForward(const act_t *h, R *x, int64_t rows, int64_t C) {
  if constexpr (residualAsActivations<R>()) {
    if (C % kVec == 0 && aligned16(h) && aligned16(x)) {
      // kVec columns of a row, every stream, a thread.
      for (int64_t q = gridThread() * kVec; q < rows * C; q += gridThreads() * kVec) {
        int64_t t = q / C, c = q % C;
        float v[kVec];
        loadVec(h + q, v);
        for (int s = 0; s < kStreams; ++s)
          storeVec(x + (t * kStreams + s) * C + c, v);
      }
      return;
    }
  } else if (C % 4 == 0 && alignedQuad(h) && alignedQuad(x)) {
    for (int64_t q = gridThread() * 4; q < rows * C; q += gridThreads() * 4) {
      int64_t t = q / C, c = q % C;
      float v[4];
      loadQuad(h + q, v);
      for (int s = 0; s < kStreams; ++s)
        storeQuad(x + (t * kStreams + s) * C + c, v);
    }
    return;
  }
  for (int64_t i = gridThread(); i < rows * kStreams * C; i += gridThreads()) {
    int64_t t = i / (kStreams * C), c = i % C;
    const float v = load(h[t * C + c]);
    store(&x[i], v);
  }
}

extern "C" __global__ void mhcc_expand_forward(const act_t *h, res_t *x, int64_t rows, int64_t C) {
  kernelPrologue();
  expandForward(h, x, rows, C);
}

template <typename R> __device__ __forceinline__ void expandBackward(const R *dx, act_t *dh, int64_t rows, int64_t C) {
  if constexpr (residualAsActivations<R>()) {
    if (C % kVec == 0 && aligned16(dx) && aligned16(dh)) {
      for (int64_t q = gridThread() * kVec; q < rows * C; q += gridThreads() * kVec) {
        int64_t t = q / C, c = q % C;
        float acc[kVec], g[kStreams][kVec];
        loadVec(dh + q, acc);
        for (int s = 0; s < kStreams; ++s)
          loadVec(dx + (t * kStreams + s) * C + c, g[s]);
        for (int e = 0; e < kVec; ++e)
          for (int s = 0; s < kStreams; ++s)
            acc[e] += g[s][e];
        storeVec(dh + q, acc);
      }
      return;
    }
  } else if (C % 4 == 0 && alignedQuad(dx) && alignedQuad(dh)) {
    for (int64_t q = gridThread() * 4; q < rows * C; q += gridThreads() * 4) {
      int64_t t = q / C, c = q % C;
      float acc[4], g[kStreams][4];
      loadQuad(dh + q, acc);
      for (int s = 0; s < kStreams; ++s)
        loadQuad(dx + (t * kStreams + s) * C + c, g[s]);
      for (int e = 0; e < 4; ++e)
        for (int s = 0; s < kStreams; ++s)
          acc[e] += g[s][e];
      storeQuad(dh + q, acc);
    }
    return;
  }
  for (int64_t i = gridThread(); i < rows * C; i += gridThreads()) {
    int64_t t = i / C, c = i % C;
    float acc = load(dh[i]);
    for (int64_t s = 0; s < kStreams; ++s)
      acc += load(dx[(t * kStreams + s) * C + c]);
    store(&dh[i], acc);
  }
}

extern "C" __global__ void mhcc_expand_backward(const res_t *dx, act_t *dh, int64_t rows, int64_t C) {
  kernelPrologue();
  expandBackward(dx, dh, rows, C);
}

template <typename R> __device__ __forceinline__ void contractForward(const R *x, act_t *h, int64_t rows, int64_t C) {
  if constexpr (residualAsActivations<R>()) {
    if (C % kVec == 0 && aligned16(x) && aligned16(h)) {
      for (int64_t q = gridThread() * kVec; q < rows * C; q += gridThreads() * kVec) {
        int64_t t = q / C, c = q % C;
        float xs[kStreams][kVec], out[kVec];
        for (int s = 0; s < kStreams; ++s)
          loadVec(x + (t * kStreams + s) * C + c, xs[s]);
        for (int e = 0; e < kVec; ++e) {
          float sum = 0;
          for (int s = 0; s < kStreams; ++s)
            sum += xs[s][e];
          out[e] = sum / float(kStreams);
        }
        storeVec(h + q, out);
      }
      return;
    }
  } else if (C % 4 == 0 && alignedQuad(x) && alignedQuad(h)) {
    for (int64_t q = gridThread() * 4; q < rows * C; q += gridThreads() * 4) {
      int64_t t = q / C, c = q % C;
      float xs[kStreams][4], out[4];
      for (int s = 0; s < kStreams; ++s)
        loadQuad(x + (t * kStreams + s) * C + c, xs[s]);
      for (int e = 0; e < 4; ++e) {
        float sum = 0;
        for (int s = 0; s < kStreams; ++s)
          sum += xs[s][e];
        out[e] = sum / float(kStreams);
      }
      storeQuad(h + q, out);
    }
    return;
  }
  for (int64_t i = gridThread(); i < rows * C; i += gridThreads()) {
    int64_t t = i / C, c = i % C;
    float sum = 0;
    for (int64_t s = 0; s < kStreams; ++s)
      sum += load(x[(t * kStreams + s) * C + c]);
    store(&h[i], sum / float(kStreams));
  }
}

extern "C" __global__ void mhcc_contract_forward(const res_t *x, act_t *h, int64_t rows, int64_t C) {
  kernelPrologue();
  contractForward(x, h, rows, C);
}

template <typename R> __device__ __forceinline__ void contractBackward(const act_t *dh, R *dx, int64_t rows, int64_t C) {
  if constexpr (residualAsActivations<R>()) {
    if (C % kVec == 0 && aligned16(dh) && aligned16(dx)) {
      for (int64_t q = gridThread() * kVec; q < rows * C; q += gridThreads() * kVec) {
        int64_t t = q / C, c = q % C;
        float g[kVec], v[kStreams][kVec];
        loadVec(dh + q, g);
        for (int e = 0; e < kVec; ++e)
          g[e] = g[e] / float(kStreams);
        for (int s = 0; s < kStreams; ++s)
          loadVec(dx + (t * kStreams + s) * C + c, v[s]);
        for (int s = 0; s < kStreams; ++s) {
          for (int e = 0; e < kVec; ++e)
            v[s][e] = v[s][e] + g[e];
          storeVec(dx + (t * kStreams + s) * C + c, v[s]);
        }
      }
      return;
    }
  } else if (C % 4 == 0 && alignedQuad(dh) && alignedQuad(dx)) {
    for (int64_t q = gridThread() * 4; q < rows * C; q += gridThreads() * 4) {
      int64_t t = q / C, c = q % C;
      float g[4], v[4];
      loadQuad(dh + q, g);
      for (int e = 0; e < 4; ++e)
        g[e] = g[e] / float(kStreams);
      for (int s = 0; s < kStreams; ++s) {
        loadQuad(dx + (t * kStreams + s) * C + c, v);
        for (int e = 0; e < 4; ++e)
          v[e] = v[e] + g[e];
        storeQuad(dx + (t * kStreams + s) * C + c, v);
      }
    }
    return;
  }
  for (int64_t i = gridThread(); i < rows * kStreams * C; i += gridThreads()) {
    int64_t t = i / (kStreams * C), c = i % C;
    const float g = load(dh[t * C + c]) / float(kStreams);
    store(&dx[i], load(dx[i]) + g);
  }
}

extern "C" __global__ void mhcc_contract_backward(const act_t *dh, res_t *dx, int64_t rows, int64_t C) {
  kernelPrologue();
  contractBackward(dh, dx, rows, C);
}
