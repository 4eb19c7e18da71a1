//===- GdnWy.cu - the Gated DeltaNet recurrence in its chunked WY form ----===//
//
// GdnScan.h's scans as matrix products over chunks of kChunk tokens, never
// materializing a token's state (Yang et al., "Gated Delta Networks", the
// chunkwise form). In a chunk with starting state S0 (rows: value dims,
// columns: key dims), g_r the cumulative log decay of token r within its
// document, Gam[r][i] = exp(g_r - g_i) (0 across a document start or for
// i > r), gam_r = exp(g_r) on tokens whose document continues from S0 (0
// after a start in the chunk) and rho_r = Gam[last][r]:
//   A = strictly-lower(diag(beta) (K K^T . Gam)),  T = (I + A)^-1
//   U~ = T diag(beta) V,  W = T diag(beta gam) K,  U = U~ - W S0^T
//   O = scale (diag(gam) Q S0^T + (Q K^T . Gam) U)
//   S1 = gam_last S0 + U^T diag(rho) K
// (u_r = beta_r (v_r - alpha_r S_{r-1} k_r) are the chunk's pseudo-values.)
// The forward: wyPrepareKernel (U~, W: every chunk at once), wyStatesKernel
// (the chain over chunks, a block per 16 state rows: rows are independent),
// wyOutputKernel (every chunk at once). The backward replays the first two,
// then sends dS back over the chunks (wyDiagGradKernel, wyStateGradKernel:
// dU = diag(rho) K dS1^T + scale P^T dO, dS0 = gam_last dS1 + scale dO^T
// diag(gam) Q - dU^T W), and every chunk takes its own gradients from S0,
// dS1 and dU (wyGradsKernel, wyWyGradsKernel: the products above walked back,
// T's through dA = -T^T dT T^T). The decay's gradient is summed over log
// gates and documents (dlog alpha_t = the sum of dg_r over r >= t in t's
// document and chunk; tools/reference/gdn_wy.py checks this algebra in
// float64). Products run in fp32 on the CUDA cores (4 x 4
// register tiles; lanes split k where tiles are few, added pairwise), every
// output's sum in a fixed order: deterministic, no atomics.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/DeviceKernels.h"
#include "runtime/cuda/GdnScan.h"
#include "runtime/cuda/GdnWyBlock.cuh"

#include <cuda_runtime.h>

namespace mhcc::runtime::cuda {
namespace {

using namespace wy;

/// One warp a (chunk, head): the tokens' decays and betas read at once, the prefix by lane 0.
__global__ void __launch_bounds__(32) wyGatesKernel(const float *gates, float *table, int64_t seq, int64_t H,
                                                    const int32_t *firstKeys) {
  __shared__ float logDecay[kChunk], g[kChunk], segOf[kChunk];
  __shared__ bool reset[kChunk];
  const Chunk c = blockChunk(seq);
  const int64_t h = blockIdx.y;
  float *out = table + gateSlot(blockIdx.x, H, h);
  for (int r = threadIdx.x; r < kChunk; r += 32) {
    const bool real = r < c.n;
    reset[r] = real && c.from + r == firstKeyOf(firstKeys, c.t0 + c.from + r);
    logDecay[r] = real ? fmaxf(logf(gates[c.token(r) * 2 * H + h]), kMinLogDecay) : 0.0f;
    out[kRowBeta * kChunk + r] = real ? gates[c.token(r) * 2 * H + H + h] : 0.0f;
    out[kRowReset * kChunk + r] = reset[r] ? 1.0f : 0.0f;
  }
  __syncwarp();
  if (threadIdx.x == 0) {
    float acc = 0.0f;
    int seg = 0;
    bool open = true;
    for (int r = 0; r < kChunk; ++r) {
      if (reset[r]) {
        ++seg;
        acc = 0.0f;
        open = false;
      } else {
        acc += logDecay[r];
      }
      g[r] = acc;
      segOf[r] = float(seg);
      out[kRowGam * kChunk + r] = open ? expf(acc) : 0.0f;
    }
  }
  __syncwarp();
  for (int r = threadIdx.x; r < kChunk; r += 32) {
    out[kRowG * kChunk + r] = g[r];
    out[kRowSeg * kChunk + r] = segOf[r];
    out[kRowRho * kChunk + r] = segOf[r] == segOf[kChunk - 1] ? expf(g[kChunk - 1] - g[r]) : 0.0f; // Gam[last][r]
  }
}

/// The block's chunk's K and V into shared memory, its gates, A = strictly-lower(diag(beta) (K K^T . Gam))
/// and T = (I + A)^-1 (A's upper triangle is clobbered), and K K^T where `KK` is given.
template <int D>
__device__ void chunkSystem(const float *a, const float *table, const Chunk &c, int64_t C, int64_t H, int64_t h,
                            ChunkGates &G, float *K, float *V, float *A, float *T, float *KK) {
  constexpr int PD = padded(D), PL = padded(kChunk);
  {
    const RowLoad<D> k(a + c.token(0) * 3 * C + C + h * D, 3 * C, c.n), v(a + c.token(0) * 3 * C + 2 * C + h * D, 3 * C, c.n);
    k.store(K);
    v.store(V);
  }
  loadGates(G, table, blockIdx.x, H, h);
  blockProduct<kChunk, kChunk, D>([&](int r, int k) { return K[r * PD + k]; }, [&](int k, int i) { return K[i * PD + k]; },
                                  [&](int r, int i, float v) {
                                    if (KK)
                                      KK[r * PL + i] = v;
                                    A[r * PL + i] = i < r ? G.beta[r] * G.decay(r, i) * v : 0.0f;
                                  });
  __syncthreads();
  invertUnitLower(A, T);
}

template <int D> constexpr int prepareSmem() { return (2 * matFloats<D>(kChunk) + 2 * matFloats<kChunk>(kChunk)) * 4; }

/// U~ = T diag(beta) V and W = T diag(beta gam) K, every chunk at once.
template <int D>
__global__ void __launch_bounds__(kThreads) wyPrepareKernel(const float *a, const float *table, float *U, float *W,
                                                           int64_t seq, int64_t C, int64_t H) {
  extern __shared__ float smem[];
  __shared__ ChunkGates G;
  constexpr int PD = padded(D), PL = padded(kChunk);
  float *K = smem, *V = K + matFloats<D>(kChunk), *A = V + matFloats<D>(kChunk), *T = A + matFloats<kChunk>(kChunk);
  const Chunk c = blockChunk(seq);
  const int64_t h = blockIdx.y;
  chunkSystem<D>(a, table, c, C, H, h, G, K, V, A, T, nullptr);
  float *u = U + c.token(0) * C + h * D, *w = W + c.token(0) * C + h * D;
  blockProduct<kChunk, D, kChunk>([&](int r, int m) { return T[r * PL + m]; },
                                  [&](int m, int j) { return G.beta[m] * V[m * PD + j]; },
                                  [&](int r, int j, float v) {
                                    if (r < c.n)
                                      u[r * C + j] = v;
                                  });
  blockProduct<kChunk, D, kChunk>([&](int r, int m) { return T[r * PL + m]; },
                                  [&](int m, int j) { return G.beta[m] * G.gam[m] * K[m * PD + j]; },
                                  [&](int r, int j, float v) {
                                    if (r < c.n)
                                      w[r * C + j] = v;
                                  });
}

template <int D> constexpr int chainSmem() {
  return (3 * matFloats<D>(kChunk) + matFloats<D>(rowsOf(D)) + 2 * matFloats<rowsOf(D)>(kChunk)) * 4;
}

/// What the chain reads of a chunk: K, W (and backward Q), its R columns of U (dU) and dO, its gates, fetched
/// into registers one chunk ahead.
template <int D, bool kGrad> struct ChainFetch {
  static constexpr int R = rowsOf(D);
  RowLoad<D> k, w, q;
  RowLoad<R> u, o;
  GateFetch gates;
  __device__ ChainFetch(const Chunk &c, const float *a, const float *table, const float *dO, const float *U,
                        const float *W, int64_t C, int64_t H, int64_t h, int64_t row0, int64_t chunks)
      : k(a + c.token(0) * 3 * C + C + h * D, 3 * C, c.n), w(W + c.token(0) * C + h * D, C, c.n),
        q(a + c.token(0) * 3 * C + h * D, 3 * C, kGrad ? c.n : 0), u(U + c.token(0) * C + h * D + row0, C, c.n),
        o(kGrad ? dO + c.token(0) * C + h * D + row0 : nullptr, C, kGrad ? c.n : 0), // no dO forward
        gates(table, c.seqIdx * chunks + c.index, H, h) {}
  __device__ void publish(float *K, float *Wt, float *Q, float *Uc, float *Oc, ChunkGates &G) const {
    k.store(K);
    w.store(Wt);
    u.store(Uc);
    if (kGrad) {
      q.store(Q);
      o.store(Oc);
    }
    gates.publish(G);
  }
};

/// The chain over a (sequence, head)'s chunks for the block's R state rows (blockIdx.z), S in shared memory.
/// Forward (kGrad false): checkpoint S, U = U~ - W S^T (in place), S = gam_last S + U^T diag(rho) K. Backward,
/// last chunk first, X = dS at the chunk's end: carry X, dU = diag(rho) K X^T + dU (the output's term, in
/// place), X = gam_last X + scale dO^T diag(gam) Q - dU^T W.
template <int D, bool kGrad>
__global__ void __launch_bounds__(kThreads)
    wyChainKernel(const float *a, const float *table, const float *dO, float *U, const float *W, float *states,
                  int64_t seq, int64_t C, int64_t H, float scale) {
  constexpr int R = rowsOf(D), PD = padded(D), PR = padded(R);
  extern __shared__ float smem[];
  __shared__ ChunkGates G;
  float *K = smem, *Wt = K + matFloats<D>(kChunk), *Q = Wt + matFloats<D>(kChunk), *X = Q + matFloats<D>(kChunk);
  float *Uc = X + matFloats<D>(R), *Oc = Uc + matFloats<R>(kChunk); // [token][row] columns of U (dU) and dO
  const int64_t h = blockIdx.y, chunks = chunksOf(seq), row0 = int64_t(blockIdx.z) * R;
  const auto chunkAt = [&](int64_t step) { return Chunk(seq, blockIdx.x, kGrad ? chunks - 1 - step : step); };
  for (int e = threadIdx.x; e < R * D; e += kThreads)
    X[(e / D) * PD + e % D] = 0.0f;
  ChainFetch<D, kGrad> next(chunkAt(0), a, table, dO, U, W, C, H, h, row0, chunks);
  for (int64_t step = 0; step < chunks; ++step) {
    const Chunk c = chunkAt(step);
    __syncthreads(); // the last chunk's products are done with shared memory
    next.publish(K, Wt, Q, Uc, Oc, G);
    float *slot = states + stateSlot(c.seqIdx, h, c.index, H, chunks, D) + row0 * D;
    for (int e = threadIdx.x; e < R * D; e += kThreads)
      slot[e] = X[(e / D) * PD + e % D];
    __syncthreads();
    if (step + 1 < chunks) // in flight while this chunk computes
      next = ChainFetch<D, kGrad>(chunkAt(step + 1), a, table, dO, U, W, C, H, h, row0, chunks);
    if (kGrad)
      blockProduct<kChunk, R, D>([&](int r, int j) { return K[r * PD + j]; }, [&](int j, int i) { return X[i * PD + j]; },
                                 [&](int r, int i, float v) { Uc[r * PR + i] = G.rho[r] * v + Uc[r * PR + i]; });
    else
      blockProduct<kChunk, R, D>([&](int r, int j) { return Wt[r * PD + j]; }, [&](int j, int i) { return X[i * PD + j]; },
                                 [&](int r, int i, float v) { Uc[r * PR + i] = Uc[r * PR + i] - v; });
    __syncthreads();
    float *u = U + c.token(0) * C + h * D + row0;
    for (int e = threadIdx.x; e < kChunk * R; e += kThreads)
      if (e / R < c.n)
        u[(e / R) * C + e % R] = Uc[(e / R) * PR + e % R];
    if (kGrad)
      blockProduct<R, D, 2 * kChunk>(
          [&](int i, int k) {
            return k < kChunk ? scale * Oc[k * PR + i] * G.gam[k] : -Uc[(k - kChunk) * PR + i];
          },
          [&](int k, int j) { return k < kChunk ? Q[k * PD + j] : Wt[(k - kChunk) * PD + j]; },
          [&](int i, int j, float v) { X[i * PD + j] = G.gamEnd * X[i * PD + j] + v; });
    else
      blockProduct<R, D, kChunk>([&](int i, int r) { return Uc[r * PR + i] * G.rho[r]; },
                                 [&](int r, int j) { return K[r * PD + j]; },
                                 [&](int i, int j, float v) { X[i * PD + j] = G.gamEnd * X[i * PD + j] + v; });
  }
}

template <int D> constexpr int outputSmem() {
  return (3 * matFloats<D>(kChunk) + matFloats<D>(D) + matFloats<kChunk>(kChunk)) * 4;
}

/// O = scale (diag(gam) Q S0^T + P U) with P = Q K^T . Gam, every chunk at once. Backward (kGrad): the output
/// gradient's own term of dU instead, scale P^T dO, before the chain adds the state's.
template <int D, bool kGrad>
__global__ void __launch_bounds__(kThreads)
    wyOutputKernel(const float *a, const float *table, const float *U, const float *checkpoints, const float *dO,
                   float *out, int64_t seq, int64_t C, int64_t H, float scale) {
  extern __shared__ float smem[];
  __shared__ ChunkGates G;
  constexpr int PD = padded(D), PL = padded(kChunk);
  float *Q = smem, *K = Q + matFloats<D>(kChunk), *Uo = K + matFloats<D>(kChunk), *S = Uo + matFloats<D>(kChunk);
  float *P = S + matFloats<D>(D);
  const Chunk c = blockChunk(seq);
  const int64_t h = blockIdx.y;
  {
    // Uo: U (forward) or dO (backward).
    const RowLoad<D> q(a + c.token(0) * 3 * C + h * D, 3 * C, c.n), k(a + c.token(0) * 3 * C + C + h * D, 3 * C, c.n),
        u((kGrad ? dO : U) + c.token(0) * C + h * D, C, c.n);
    const RowLoad<D, D> s0(kGrad ? nullptr : checkpoints + stateSlot(c.seqIdx, h, c.index, H, chunksOf(seq), D), D,
                           kGrad ? 0 : D);
    q.store(Q);
    k.store(K);
    u.store(Uo);
    if (!kGrad)
      s0.store(S);
  }
  loadGates(G, table, blockIdx.x, H, h);
  blockProduct<kChunk, kChunk, D>([&](int r, int k) { return Q[r * PD + k]; }, [&](int k, int i) { return K[i * PD + k]; },
                                  [&](int r, int i, float v) { P[r * PL + i] = G.decay(r, i) * v; });
  __syncthreads();
  float *o = out + c.token(0) * C + h * D;
  if (kGrad) {
    blockProduct<kChunk, D, kChunk>([&](int r, int m) { return P[m * PL + r]; }, [&](int m, int i) { return Uo[m * PD + i]; },
                                    [&](int r, int i, float v) {
                                      if (r < c.n)
                                        o[r * C + i] = scale * v;
                                    });
    return;
  }
  // The state's term waits in the output (the two products may give an output to different lanes: a barrier).
  blockProduct<kChunk, D, D>([&](int r, int j) { return Q[r * PD + j]; }, [&](int j, int i) { return S[i * PD + j]; },
                             [&](int r, int i, float v) {
                               if (r < c.n)
                                 o[r * C + i] = G.gam[r] * v;
                             });
  __syncthreads();
  blockProduct<kChunk, D, kChunk>([&](int r, int m) { return P[r * PL + m]; }, [&](int m, int i) { return Uo[m * PD + i]; },
                                  [&](int r, int i, float v) {
                                    if (r < c.n)
                                      o[r * C + i] = scale * (o[r * C + i] + v);
                                  });
}


/// Per-token terms of a chunk's gradient kernels, and a block's partial sums.
struct TokenTerms {
  float rowSum[kChunk], colSum[kChunk], dgam[kChunk], drho[kChunk], dbeta[kChunk];
  float partial[kThreads];
  float endTerm; // the decay's terms at the chunk's last token (gam_last and every rho)
};

/// Row r's and column r's sums of f(row, col) for every r (rowSum's lanes).
template <class F> __device__ inline void rowAndColumnSums(TokenTerms &t, const F &f) {
  const float row = rowSum(kChunk, f), col = rowSum(kChunk, [&](int r, int i) { return f(i, r); });
  if (rowLeader()) {
    t.rowSum[myRow()] = row;
    t.colSum[myRow()] = col;
  }
}

/// The sum of every thread's `part`, in thread order (a warp's lanes 16 apart, then pairwise).
__device__ inline float blockSum(TokenTerms &t, float part) {
  t.partial[threadIdx.x] = part;
  __syncthreads();
  float sum = 0.0f;
  if (threadIdx.x < 32) {
    for (int e = threadIdx.x; e < kThreads; e += 32)
      sum += t.partial[e];
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1)
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  }
  return sum; // in warp 0
}

template <int D> constexpr int gradsSmem() { return (5 * matFloats<D>(kChunk) + 2 * matFloats<kChunk>(kChunk)) * 4; }

/// A chunk's gradients through the output and the state (S0 and dS1 read from memory):
///   dQ = scale diag(gam) dO S0 + dQK K,  dK = diag(rho) U dS1 + dQK^T Q,  dW = -dU S0
/// with dP = scale dO U^T and dQK = dP . Gam; the decay's terms (through Gam, gam, rho, gam_last) into
/// `decayTerms` for wyWyGradsKernel, which adds the WY part to dK.
template <int D>
__global__ void __launch_bounds__(kThreads)
    wyGradsKernel(const float *a, const float *table, const float *dO, const float *U, const float *dU,
                  const float *checkpoints, const float *carries, float *dW, float *dA, float *decayTerms, int64_t seq,
                  int64_t C, int64_t H, float scale) {
  extern __shared__ float smem[];
  __shared__ ChunkGates G;
  __shared__ TokenTerms t;
  constexpr int PD = padded(D), PL = padded(kChunk);
  float *Q = smem, *K = Q + matFloats<D>(kChunk), *Us = K + matFloats<D>(kChunk), *O = Us + matFloats<D>(kChunk);
  float *X = O + matFloats<D>(kChunk), *QK = X + matFloats<D>(kChunk), *dP = QK + matFloats<kChunk>(kChunk);
  const Chunk c = blockChunk(seq);
  const int64_t h = blockIdx.y, slot = stateSlot(c.seqIdx, h, c.index, H, chunksOf(seq), D);
  const float *S0 = checkpoints + slot, *dS1 = carries + slot;
  {
    const RowLoad<D> q(a + c.token(0) * 3 * C + h * D, 3 * C, c.n), k(a + c.token(0) * 3 * C + C + h * D, 3 * C, c.n),
        u(U + c.token(0) * C + h * D, C, c.n), o(dO + c.token(0) * C + h * D, C, c.n);
    q.store(Q);
    k.store(K);
    u.store(Us);
    o.store(O);
  }
  loadGates(G, table, blockIdx.x, H, h);
  blockProduct<kChunk, kChunk, D>([&](int r, int k) { return Q[r * PD + k]; }, [&](int k, int i) { return K[i * PD + k]; },
                                  [&](int r, int i, float v) { QK[r * PL + i] = v; });
  blockProduct<kChunk, kChunk, D>([&](int r, int k) { return O[r * PD + k]; },
                                  [&](int k, int i) { return Us[i * PD + k]; },
                                  [&](int r, int i, float v) { dP[r * PL + i] = scale * v; });
  __syncthreads();
  rowAndColumnSums(t, [&](int r, int i) { return dP[r * PL + i] * QK[r * PL + i] * G.decay(r, i); });
  __syncthreads();
  for (int e = threadIdx.x; e < kChunk * kChunk; e += kThreads) // dP becomes dQK
    dP[(e / kChunk) * PL + e % kChunk] *= G.decay(e / kChunk, e % kChunk);
  __syncthreads();
  float *dq = dA + c.token(0) * 3 * C + h * D, *dk = dq + C;
  // X = dO S0: dQ's state term, and gam's term scale Q[r] . X[r] (= scale dO[r] . (S0 Q[r])).
  blockProduct<kChunk, D, D>([&](int r, int i) { return O[r * PD + i]; }, [&](int i, int j) { return S0[i * D + j]; },
                             [&](int r, int j, float v) { X[r * PD + j] = v; });
  __syncthreads(); // the next product may give X[r][j] to another lane
  blockProduct<kChunk, D, kChunk>([&](int r, int m) { return dP[r * PL + m]; }, [&](int m, int j) { return K[m * PD + j]; },
                                  [&](int r, int j, float v) {
                                    if (r < c.n)
                                      dq[r * 3 * C + j] = scale * G.gam[r] * X[r * PD + j] + v;
                                  });
  __syncthreads();
  const float gamTerm = rowSum(D, [&](int r, int j) { return Q[r * PD + j] * X[r * PD + j]; });
  if (rowLeader())
    t.dgam[myRow()] = scale * gamTerm;
  // O (dO) is done with: U dS1 in its place; rho's term K[r] . (U dS1)[r].
  blockProduct<kChunk, D, D>([&](int r, int i) { return Us[r * PD + i]; }, [&](int i, int j) { return dS1[i * D + j]; },
                             [&](int r, int j, float v) { O[r * PD + j] = v; });
  __syncthreads();
  const float rhoTerm = rowSum(D, [&](int r, int j) { return O[r * PD + j] * K[r * PD + j]; });
  if (rowLeader())
    t.drho[myRow()] = rhoTerm;
  blockProduct<kChunk, D, kChunk>([&](int r, int m) { return dP[m * PL + r]; }, [&](int m, int j) { return Q[m * PD + j]; },
                                  [&](int r, int j, float v) {
                                    if (r < c.n)
                                      dk[r * 3 * C + j] = G.rho[r] * O[r * PD + j] + v;
                                  });
  const float *du = dU + c.token(0) * C + h * D;
  float *dw = dW + c.token(0) * C + h * D;
  const int ldc = int(C);
  blockProduct<kChunk, D, D>([&](int r, int i) { return r < c.n ? du[r * ldc + i] : 0.0f; },
                             [&](int i, int j) { return S0[i * D + j]; },
                             [&](int r, int j, float v) {
                               if (r < c.n)
                                 dw[r * C + j] = -v;
                             });
  // gam_last's term: the sum of S0 . dS1.
  float part = 0.0f;
  for (int e = threadIdx.x; e < D * D; e += kThreads)
    part += S0[e] * dS1[e];
  const float dGamEnd = blockSum(t, part); // its barrier also publishes dgam and drho
  if (threadIdx.x == 0) {
    float rhoTerms = 0.0f;
    for (int i = 0; i < kChunk; ++i)
      rhoTerms += t.drho[i] * G.rho[i];
    t.endTerm = dGamEnd * G.gamEnd + rhoTerms;
  }
  __syncthreads();
  if (threadIdx.x < kChunk) {
    const int r = threadIdx.x;
    const float dg = t.rowSum[r] - t.colSum[r] + t.dgam[r] * G.gam[r] - t.drho[r] * G.rho[r];
    decayTerms[(int64_t(blockIdx.x) * H + h) * kChunk + r] = r == kChunk - 1 ? dg + t.endTerm : dg;
  }
}

template <int D> constexpr int wyGradsSmem() { return (3 * matFloats<D>(kChunk) + 4 * matFloats<kChunk>(kChunk)) * 4; }

/// A chunk's gradients through U~ = T diag(beta) V and W = T diag(beta gam) K (dU, dW from memory):
///   dT = dU (beta V)^T + dW (beta gam K)^T,  dA = strictly-lower(-T^T dT T^T)
///   dV = diag(beta) T^T dU,  dK += diag(beta gam) T^T dW + (dKK + dKK^T) K,  dKK = dA . beta Gam
/// then beta's gradient (into its logit's) and the decay's: dg_r summed from the token on over its document
/// in the chunk (log alpha of a document's first token is unused: 0).
template <int D>
__global__ void __launch_bounds__(kThreads)
    wyWyGradsKernel(const float *a, const float *table, const float *dU, const float *dW, const float *decayTerms,
                    float *dA, float *dAb, float *dLogAlpha, int64_t seq, int64_t C, int64_t H) {
  extern __shared__ float smem[];
  __shared__ ChunkGates G;
  __shared__ TokenTerms t;
  constexpr int PD = padded(D), PL = padded(kChunk);
  float *K = smem, *V = K + matFloats<D>(kChunk), *X = V + matFloats<D>(kChunk);
  float *KK = X + matFloats<D>(kChunk), *T = KK + matFloats<kChunk>(kChunk), *M = T + matFloats<kChunk>(kChunk);
  float *N = M + matFloats<kChunk>(kChunk);
  const Chunk c = blockChunk(seq);
  const int64_t h = blockIdx.y;
  chunkSystem<D>(a, table, c, C, H, h, G, K, V, M, T, KK);
  const float *du = dU + c.token(0) * C + h * D, *dw = dW + c.token(0) * C + h * D;
  const int ldc = int(C);
  const auto dURow = [&](int r, int j) { return r < c.n ? du[r * ldc + j] : 0.0f; };
  const auto dWRow = [&](int r, int j) { return r < c.n ? dw[r * ldc + j] : 0.0f; };
  blockProduct<kChunk, kChunk, 2 * D>(
      [&](int r, int k) { return k < D ? dURow(r, k) : dWRow(r, k - D); },
      [&](int k, int i) { return k < D ? G.beta[i] * V[i * PD + k] : G.beta[i] * G.gam[i] * K[i * PD + k - D]; },
      [&](int r, int i, float v) { N[r * PL + i] = v; }); // dT
  __syncthreads();
  blockProduct<kChunk, kChunk, kChunk>([&](int r, int m) { return N[r * PL + m]; },
                                       [&](int m, int i) { return T[i * PL + m]; },
                                       [&](int r, int i, float v) { M[r * PL + i] = v; }); // dT T^T
  __syncthreads();
  blockProduct<kChunk, kChunk, kChunk>([&](int r, int m) { return T[m * PL + r]; },
                                       [&](int m, int i) { return M[m * PL + i]; },
                                       [&](int r, int i, float v) { N[r * PL + i] = i < r ? -v : 0.0f; }); // dA
  blockProduct<kChunk, D, kChunk>([&](int r, int m) { return T[m * PL + r]; }, dURow,
                                  [&](int r, int j, float v) { X[r * PD + j] = v; }); // T^T dU
  __syncthreads();
  float *dk = dA + c.token(0) * 3 * C + C + h * D, *dv = dk + C;
  const float vTerm = rowSum(D, [&](int r, int j) { return V[r * PD + j] * X[r * PD + j]; });
  if (rowLeader())
    t.dbeta[myRow()] = vTerm;
  for (int e = threadIdx.x; e < kChunk * D; e += kThreads)
    if (e / D < c.n)
      dv[(e / D) * 3 * C + e % D] = G.beta[e / D] * X[(e / D) * PD + e % D];
  __syncthreads();
  blockProduct<kChunk, D, kChunk>([&](int r, int m) { return T[m * PL + r]; }, dWRow,
                                  [&](int r, int j, float v) { X[r * PD + j] = v; }); // T^T dW
  __syncthreads();
  const float kTerm = rowSum(D, [&](int r, int j) { return K[r * PD + j] * X[r * PD + j]; });
  const float aTerm = rowSum(kChunk, [&](int r, int i) { return i < r ? N[r * PL + i] * G.decay(r, i) * KK[r * PL + i] : 0.0f; });
  if (rowLeader()) {
    const int r = myRow();
    t.dbeta[r] = t.dbeta[r] + G.gam[r] * kTerm + aTerm;
    t.dgam[r] = G.beta[r] * kTerm;
  }
  rowAndColumnSums(t, [&](int r, int i) { return N[r * PL + i] * G.beta[r] * KK[r * PL + i] * G.decay(r, i); });
  for (int e = threadIdx.x; e < kChunk * kChunk; e += kThreads) { // dKK + dKK^T, dKK = dA . beta Gam
    const int r = e / kChunk, i = e % kChunk;
    M[r * PL + i] = i < r ? N[r * PL + i] * G.beta[r] * G.decay(r, i) : r < i ? N[i * PL + r] * G.beta[i] * G.decay(i, r)
                                                                               : 0.0f;
  }
  __syncthreads();
  blockProduct<kChunk, D, kChunk>([&](int r, int m) { return M[r * PL + m]; }, [&](int m, int j) { return K[m * PD + j]; },
                                  [&](int r, int j, float v) {
                                    if (r < c.n)
                                      dk[r * 3 * C + j] = dk[r * 3 * C + j] + G.beta[r] * G.gam[r] * X[r * PD + j] + v;
                                  });
  if (threadIdx.x == 0) {
    const float *terms = decayTerms + (int64_t(blockIdx.x) * H + h) * kChunk;
    float acc = 0.0f;
    for (int r = kChunk - 1; r >= 0; --r) {
      if (r == kChunk - 1 || G.seg[r] != G.seg[r + 1])
        acc = 0.0f;
      acc += terms[r] + t.rowSum[r] - t.colSum[r] + t.dgam[r] * G.gam[r];
      if (r < c.n) {
        const float beta = G.beta[r];
        dLogAlpha[c.token(r) * H + h] = G.reset[r] ? 0.0f : acc;
        dAb[c.token(r) * 2 * H + h] = t.dbeta[r] * beta * (1.0f - beta);
      }
    }
  }
}

template <class Kernel> void allowSmem(Kernel kernel, int bytes) {
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

template <int D>
void launchWy(bool backward, const float *a, const float *gates, const float *dO, float *o, float *dA, float *dAb,
              float *dLogAlpha, float *kept, float *scratch, int64_t rows, int64_t C, int64_t H, int64_t seq,
              const int32_t *firstKeys, cudaStream_t s) {
  const WyLayout L(rows, C, H, seq);
  const float scale = 1.0f / sqrtf(float(D));
  const dim3 everyChunk(unsigned(L.seqs * L.chunks), unsigned(H)), chains(unsigned(L.seqs), unsigned(H), D / rowsOf(D));
  float *U = L.u(kept), *W = L.w(kept), *checkpoints = L.checkpoints(kept), *table = L.gateTable(kept);
  allowSmem(wyPrepareKernel<D>, prepareSmem<D>());
  allowSmem(wyChainKernel<D, false>, chainSmem<D>());
  allowSmem(wyChainKernel<D, true>, chainSmem<D>());
  allowSmem(wyOutputKernel<D, false>, outputSmem<D>());
  allowSmem(wyOutputKernel<D, true>, outputSmem<D>());
  allowSmem(wyGradsKernel<D>, gradsSmem<D>());
  allowSmem(wyWyGradsKernel<D>, wyGradsSmem<D>());
  if (!backward) {
    // U, W, the chunks' starting states and the gate table stay in `kept`
    // for the backward, which would otherwise build them again (~0.8 ms a
    // layer at 1b's sizes).
    wyGatesKernel<<<everyChunk, 32, 0, s>>>(gates, table, seq, H, firstKeys);
    wyPrepareKernel<D><<<everyChunk, kThreads, prepareSmem<D>(), s>>>(a, table, U, W, seq, C, H);
    wyChainKernel<D, false><<<chains, kThreads, chainSmem<D>(), s>>>(a, table, nullptr, U, W, checkpoints, seq, C,
                                                                      H, scale);
    wyOutputKernel<D, false><<<everyChunk, kThreads, outputSmem<D>(), s>>>(a, table, U, checkpoints, nullptr, o, seq,
                                                                          C, H, scale);
    return;
  }
  float *dU = L.du(scratch), *dW = L.dw(scratch), *carries = L.carries(scratch), *decayTerms = L.decayTerms(scratch);
  wyOutputKernel<D, true><<<everyChunk, kThreads, outputSmem<D>(), s>>>(a, table, nullptr, nullptr, dO, dU, seq, C,
                                                                       H, scale);
  wyChainKernel<D, true><<<chains, kThreads, chainSmem<D>(), s>>>(a, table, dO, dU, W, carries, seq, C, H, scale);
  wyGradsKernel<D><<<everyChunk, kThreads, gradsSmem<D>(), s>>>(a, table, dO, U, dU, checkpoints, carries, dW, dA,
                                                                decayTerms, seq, C, H, scale);
  wyWyGradsKernel<D><<<everyChunk, kThreads, wyGradsSmem<D>(), s>>>(a, table, dU, dW, decayTerms, dA, dAb, dLogAlpha,
                                                                    seq, C, H);
}

} // namespace

std::string gdnScans(bool backward, const float *a, const float *gates, const float *dO, float *o, float *dA,
                     float *dAb, float *dLogAlpha, float *kept, float *scratch, int64_t rows, int64_t C, int64_t H,
                     int64_t seq, const int32_t *firstKeys, cudaStream_t s) {
  const int64_t d = C / H;
  const auto launch = d == 16   ? launchWy<16>
                      : d == 32 ? launchWy<32>
                      : d == 64 ? launchWy<64>
                      : d == 128 ? launchWy<128>
                                 : nullptr;
  if (!launch)
    return gdnHeadDimError(d);
  launch(backward, a, gates, dO, o, dA, dAb, dLogAlpha, kept, scratch, rows, C, H, seq, firstKeys, s);
  return lastError("gated_delta_net scan (WY form)");
}

int64_t gdnScanKeptFloats(int64_t rows, int64_t C, int64_t H, int64_t seq) {
  return WyLayout(rows, C, H, seq).keptFloats();
}

int64_t gdnScanScratchFloats(int64_t rows, int64_t C, int64_t H, int64_t seq) {
  return WyLayout(rows, C, H, seq).scratchFloats();
}

} // namespace mhcc::runtime::cuda
