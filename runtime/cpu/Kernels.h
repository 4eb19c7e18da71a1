//===- Kernels.h - CPU reference kernels, forward and backward ----*- C++ -*-===//
//
// The primitives a compiled stage program calls, each with its backward
// (vector-Jacobian product). Templated on the scalar type: the runtime runs
// them in float; the gradient checks run the same code in double against
// central finite differences.
//
// Conventions: row-major matrices; `rows` = tokens of one microbatch
// (micro_batch sequences of `seq` tokens); every backward *adds* into its
// gradient outputs (callers zero them), so values with several uses sum
// their gradients in the order the backward program runs. Loops run in a
// fixed order and accumulate in T: results are bit-identical run to run.
//
// Backwards with parameters compute two halves that the zero-bubble split
// runs separately: pass nullptr for the input gradient to compute only the
// weight gradients (W), or nullptr for the weight gradients to compute only
// the input gradient (B). Either half gives the same bits as the whole.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CPU_KERNELS_H
#define MHCC_RUNTIME_CPU_KERNELS_H

#include "runtime/cpu/Parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace mhcc::runtime::kernels {

constexpr double kRopeBase = 10000.0;

/// Where a composite kernel writes an intermediate that the GPU keeps in
/// memory (attention's q, k, v and o; SwiGLU's gate and up projections),
/// `store` rounds it to the storage type (bf16 models: runtime/cpu/Bf16.h);
/// null keeps the scalar's full precision (fp32 models, the double checks).
template <typename T> using Store = void (*)(T *, int64_t);
template <typename T> inline void stored(Store<T> store, T *data, int64_t count) {
  if (store)
    store(data, count);
}
constexpr double kMhcRmsEps = 1e-6;
constexpr double kSinkhornClamp = 1e-6;

// ---- matrix products ---------------------------------------------------------
// Each output element accumulates its products in ascending order of the
// summed index, starting from its old value (or from 0 for a b^T's dot
// products), exactly as the plain triple loop does; the loops are only
// blocked so that a tile of the operands stays in cache and independent
// elements vectorize. Same bits as the plain loops, whatever the blocking
// (//tests:cpu_kernels_test checks against them).

/// y[0, count) += alpha * x[0, count), element by element: the update every
/// product and attention loop here is made of (vectorizes, same bits as the
/// loop). y and x never overlap (restrict: no runtime alias check per call).
template <typename T> inline void addScaled(T *__restrict y, const T *__restrict x, T alpha, int64_t count) {
  for (int64_t e = 0; e < count; ++e)
    y[e] += alpha * x[e];
}

constexpr int64_t kProductRowBlock = 4;    // rows of c sharing one read of b's row
constexpr int64_t kProductColBlock = 512;  // columns of c kept in cache

/// Rows of a product the kernels below call few: a microbatch's tokens
/// against a wide weight, whose reads of b then dominate.
constexpr int64_t kThinRows = 128;

/// c[M,N] (+)= a[M,K] b[K,N]: every c[i,j] adds its K products in order.
template <typename T>
void matmul(const T *a, const T *b, T *c, int64_t M, int64_t K, int64_t N, bool accumulate = false) {
  if (!accumulate)
    std::fill(c, c + M * N, T(0));
  if (M <= kThinRows / 2 && N >= 4 * kProductColBlock) {
    // Few rows, many columns: split the columns, so b is read once (2x at C = 7168).
    parallelFor((N + kProductColBlock - 1) / kProductColBlock, M * K * kProductColBlock,
                [&](int64_t begin, int64_t end) {
                  for (int64_t j0 = begin * kProductColBlock; j0 < std::min(N, end * kProductColBlock);
                       j0 += kProductColBlock) {
                    const int64_t j1 = std::min(N, j0 + kProductColBlock);
                    for (int64_t k = 0; k < K; ++k)
                      for (int64_t i = 0; i < M; ++i)
                        addScaled(c + i * N + j0, b + k * N + j0, a[i * K + k], j1 - j0);
                  }
                });
    return;
  }
  parallelFor(M, K * N, [&](int64_t begin, int64_t end) {
    for (int64_t j0 = 0; j0 < N; j0 += kProductColBlock) {
      const int64_t j1 = std::min(N, j0 + kProductColBlock);
      for (int64_t i0 = begin; i0 < end; i0 += kProductRowBlock) {
        const int64_t i1 = std::min(end, i0 + kProductRowBlock);
        for (int64_t k = 0; k < K; ++k)
          for (int64_t i = i0; i < i1; ++i)
            addScaled(c + i * N + j0, b + k * N + j0, a[i * K + k], j1 - j0);
      }
    }
  });
}

/// c[K,N] += a[M,K]^T b[M,N]  (weight gradients; rows summed in order)
template <typename T>
void matmulTransAAcc(const T *a, const T *b, T *c, int64_t M, int64_t K, int64_t N) {
  constexpr int64_t kRowsOfC = 64; // with kProductColBlock columns: a tile of c in L2
  // Split over rows of c; each element still sums the M rows in order.
  parallelFor(K, M * N, [&](int64_t begin, int64_t end) {
    for (int64_t k0 = begin; k0 < end; k0 += kRowsOfC) {
      const int64_t k1 = std::min(end, k0 + kRowsOfC);
      for (int64_t j0 = 0; j0 < N; j0 += kProductColBlock) {
        const int64_t j1 = std::min(N, j0 + kProductColBlock);
        for (int64_t i = 0; i < M; ++i) {
          for (int64_t k = k0; k < k1; ++k)
            addScaled(c + k * N + j0, b + i * N + j0, a[i * K + k], j1 - j0);
        }
      }
    }
  });
}

/// c[M,K] += a[M,N] b[K,N]^T  (input gradients): c[i,k] += (sum over j of
/// a[i,j] b[k,j], j ascending from 0), however the loops below are arranged.
template <typename T>
void matmulTransBAcc(const T *a, const T *b, T *c, int64_t M, int64_t N, int64_t K) {
  if (M < 2 * kProductRowBlock) {
    // Few rows (the mHC mapping's per-token products): plain dot products.
    for (int64_t i = 0; i < M; ++i)
      for (int64_t k = 0; k < K; ++k) {
        const T *arow = a + i * N, *brow = b + k * N;
        T sum = 0;
        for (int64_t j = 0; j < N; ++j)
          sum += arow[j] * brow[j];
        c[i * K + k] += sum;
      }
    return;
  }
  if (M <= kThinRows) {
    // Few rows (a microbatch's tokens against a wide weight): a transposed
    // (small), each row of b read once, and the M dot products with it
    // advance together, j by j. The same products and sums as below; about
    // 10x faster at C = 7168, where transposing b cost more than the product.
    std::vector<T> at(N * M);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j)
        at[j * M + i] = a[i * N + j];
    parallelFor(K, M * N, [&](int64_t begin, int64_t end) {
      T sums[kThinRows];
      for (int64_t k = begin; k < end; ++k) {
        std::fill(sums, sums + M, T(0));
        for (int64_t j = 0; j < N; ++j)
          addScaled(sums, at.data() + j * M, b[k * N + j], M);
        for (int64_t i = 0; i < M; ++i)
          c[i * K + k] += sums[i];
      }
    });
    return;
  }
  // b transposed once, so that the dot products of one row of c with every
  // row of b advance together, j by j (each still a sequential sum).
  std::vector<T> bt(N * K);
  parallelFor(K, N, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k)
      for (int64_t j = 0; j < N; ++j)
        bt[j * K + k] = b[k * N + j];
  });
  parallelFor(M, K * N, [&](int64_t begin, int64_t end) {
    std::vector<T> sums(kProductRowBlock * kProductColBlock);
    for (int64_t k0 = 0; k0 < K; k0 += kProductColBlock) {
      const int64_t k1 = std::min(K, k0 + kProductColBlock), width = k1 - k0;
      for (int64_t i0 = begin; i0 < end; i0 += kProductRowBlock) {
        const int64_t i1 = std::min(end, i0 + kProductRowBlock);
        std::fill(sums.begin(), sums.end(), T(0));
        for (int64_t j = 0; j < N; ++j) {
          for (int64_t i = i0; i < i1; ++i)
            addScaled(sums.data() + (i - i0) * kProductColBlock, bt.data() + j * K + k0, a[i * N + j], width);
        }
        for (int64_t i = i0; i < i1; ++i)
          for (int64_t k = 0; k < width; ++k)
            c[i * K + k0 + k] += sums[(i - i0) * kProductColBlock + k];
      }
    }
  });
}

template <typename T> T sigmoid(T x) { return T(1) / (T(1) + std::exp(-x)); }

// ---- embedding, expand, contract ----------------------------------------------

/// Row t reads token t + shift of its sequence (its own token where that
/// falls past the end: such rows are masked out of the MTP loss).
inline int64_t shiftedRow(int64_t t, int64_t shift, int64_t seq) {
  return (t % seq) + shift < seq ? t + shift : t;
}

/// A context-parallel rank's rows (mhcc --cp): local row t is row
/// rowMap[t] of the microbatch, whose ids the token and label arrays hold;
/// null: every row, in order. The kernels that read ids take it.
inline int64_t microbatchRow(const int64_t *rowMap, int64_t t) { return rowMap ? rowMap[t] : t; }

template <typename T>
void embedForward(const int32_t *tokens, const T *table, T *out, int64_t rows, int64_t C,
                  int64_t shift, int64_t seq, const int64_t *rowMap = nullptr) {
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t id = tokens[shiftedRow(microbatchRow(rowMap, t), shift, seq)];
    std::copy(table + id * C, table + (id + 1) * C, out + t * C);
  }
}

template <typename T>
void embedBackward(const int32_t *tokens, const T *dOut, T *dTable, int64_t rows, int64_t C,
                   int64_t shift, int64_t seq, const int64_t *rowMap = nullptr) {
  for (int64_t t = 0; t < rows; ++t) {
    T *row = dTable + tokens[shiftedRow(microbatchRow(rowMap, t), shift, seq)] * C;
    for (int64_t c = 0; c < C; ++c)
      row[c] += dOut[t * C + c];
  }
}

template <typename T>
void expandForward(const T *h, T *x, int64_t rows, int64_t C, int64_t n) {
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t i = 0; i < n; ++i)
      std::copy(h + t * C, h + (t + 1) * C, x + (t * n + i) * C);
}

template <typename T>
void expandBackward(const T *dx, T *dh, int64_t rows, int64_t C, int64_t n) {
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < C; ++c)
        dh[t * C + c] += dx[(t * n + i) * C + c];
}

template <typename T>
void contractForward(const T *x, T *h, int64_t rows, int64_t C, int64_t n) {
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t c = 0; c < C; ++c) {
      T sum = 0;
      for (int64_t i = 0; i < n; ++i)
        sum += x[(t * n + i) * C + c];
      h[t * C + c] = sum / T(n);
    }
}

template <typename T>
void contractBackward(const T *dh, T *dx, int64_t rows, int64_t C, int64_t n) {
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < C; ++c)
        dx[(t * n + i) * C + c] += dh[t * C + c] / T(n);
}

// ---- mHC coefficients ------------------------------------------------------------

/// Sinkhorn-Knopp on one n x n matrix: M = exp(L - rowmax(L)), then `iters`
/// times divide rows, then columns, by their sums (clamped to >= 1e-6).
/// `trace` (optional) receives M and the matrix after every half-step.
template <typename T>
void sinkhorn(const T *logits, T *out, int64_t n, int64_t iters, std::vector<T> *trace = nullptr) {
  std::vector<T> m(n * n);
  for (int64_t i = 0; i < n; ++i) {
    T rowMax = logits[i * n];
    for (int64_t j = 1; j < n; ++j)
      rowMax = std::max(rowMax, logits[i * n + j]);
    for (int64_t j = 0; j < n; ++j)
      m[i * n + j] = std::exp(logits[i * n + j] - rowMax);
  }
  if (trace)
    trace->assign(m.begin(), m.end());
  for (int64_t it = 0; it < iters; ++it) {
    for (int64_t i = 0; i < n; ++i) {
      T sum = 0;
      for (int64_t j = 0; j < n; ++j)
        sum += m[i * n + j];
      sum = std::max(sum, T(kSinkhornClamp));
      for (int64_t j = 0; j < n; ++j)
        m[i * n + j] /= sum;
    }
    if (trace)
      trace->insert(trace->end(), m.begin(), m.end());
    for (int64_t j = 0; j < n; ++j) {
      T sum = 0;
      for (int64_t i = 0; i < n; ++i)
        sum += m[i * n + j];
      sum = std::max(sum, T(kSinkhornClamp));
      for (int64_t i = 0; i < n; ++i)
        m[i * n + j] /= sum;
    }
    if (trace)
      trace->insert(trace->end(), m.begin(), m.end());
  }
  std::copy(m.begin(), m.end(), out);
}

/// Backward through the unrolled iterations, recomputed from the logits.
/// The row-max shift is treated as a constant: the first row normalization
/// cancels it exactly.
template <typename T>
void sinkhornBackward(const T *logits, const T *dOut, T *dLogits, int64_t n, int64_t iters) {
  std::vector<T> trace, out(n * n);
  sinkhorn(logits, out.data(), n, iters, &trace);
  std::vector<T> g(dOut, dOut + n * n);
  auto step = [&](int64_t index) { return trace.data() + index * n * n; };
  for (int64_t it = iters - 1; it >= 0; --it) {
    // Column step: Y = X / s_j with X = step(2 it + 1).
    const T *x = step(2 * it + 1);
    for (int64_t j = 0; j < n; ++j) {
      T sum = 0, dot = 0;
      for (int64_t i = 0; i < n; ++i) {
        sum += x[i * n + j];
      }
      bool clamped = sum < T(kSinkhornClamp);
      sum = std::max(sum, T(kSinkhornClamp));
      for (int64_t i = 0; i < n; ++i)
        dot += g[i * n + j] * x[i * n + j];
      for (int64_t i = 0; i < n; ++i)
        g[i * n + j] = g[i * n + j] / sum - (clamped ? T(0) : dot / (sum * sum));
    }
    // Row step: Y = X / s_i with X = step(2 it).
    x = step(2 * it);
    for (int64_t i = 0; i < n; ++i) {
      T sum = 0, dot = 0;
      for (int64_t j = 0; j < n; ++j)
        sum += x[i * n + j];
      bool clamped = sum < T(kSinkhornClamp);
      sum = std::max(sum, T(kSinkhornClamp));
      for (int64_t j = 0; j < n; ++j)
        dot += g[i * n + j] * x[i * n + j];
      for (int64_t j = 0; j < n; ++j)
        g[i * n + j] = g[i * n + j] / sum - (clamped ? T(0) : dot / (sum * sum));
    }
  }
  const T *m = step(0);
  for (int64_t k = 0; k < n * n; ++k)
    dLogits[k] += g[k] * m[k];
}

/// Per token x (n*C): coef = [H_pre (n), H_post (n), H_res (n*n)].
/// aux per row: the pre-activations h (K = n^2 + 2n), then r.
template <typename T>
void mhcCoeffsForward(const T *x, const T *wmap, const T *bias, const T *alpha, T *coef, T *aux,
                      int64_t rows, int64_t C, int64_t n, int64_t iters) {
  const int64_t width = n * C, K = n * n + 2 * n;
  std::vector<T> p(K);
  for (int64_t t = 0; t < rows; ++t) {
    const T *xr = x + t * width;
    T sq = 0;
    for (int64_t k = 0; k < width; ++k)
      sq += xr[k] * xr[k];
    T rms = std::sqrt(sq / T(width));
    T r = T(1) / (rms + T(kMhcRmsEps));
    matmul(xr, wmap, p.data(), 1, width, K);
    T *h = aux + t * (K + 1);
    for (int64_t k = 0; k < K; ++k) {
      T a = k < n ? alpha[0] : k < 2 * n ? alpha[1] : alpha[2];
      h[k] = r * p[k] * a + bias[k];
    }
    h[K] = r;
    T *out = coef + t * K;
    for (int64_t k = 0; k < n; ++k) {
      out[k] = sigmoid(h[k]);
      out[n + k] = T(2) * sigmoid(h[n + k]);
    }
    sinkhorn(h + 2 * n, out + 2 * n, n, iters);
  }
}

template <typename T>
void mhcCoeffsBackward(const T *x, const T *wmap, const T *alpha, const T *aux, const T *dCoef,
                       T *dx, T *dWmap, T *dBias, T *dAlpha, int64_t rows, int64_t C, int64_t n,
                       int64_t iters) {
  const int64_t width = n * C, K = n * n + 2 * n;
  std::vector<T> p(K), dh(K), dp(K);
  for (int64_t t = 0; t < rows; ++t) {
    const T *xr = x + t * width;
    const T *h = aux + t * (K + 1);
    const T r = h[K];
    const T *dc = dCoef + t * K;
    std::fill(dh.begin(), dh.end(), T(0));
    for (int64_t k = 0; k < n; ++k) {
      T s = sigmoid(h[k]);
      dh[k] = dc[k] * s * (T(1) - s);
      T s2 = sigmoid(h[n + k]);
      dh[n + k] = T(2) * dc[n + k] * s2 * (T(1) - s2);
    }
    sinkhornBackward(h + 2 * n, dc + 2 * n, dh.data() + 2 * n, n, iters);
    matmul(xr, wmap, p.data(), 1, width, K);
    T dr = 0;
    for (int64_t k = 0; k < K; ++k) {
      int group = k < n ? 0 : k < 2 * n ? 1 : 2;
      T a = alpha[group];
      dp[k] = dh[k] * r * a;
      dr += dh[k] * p[k] * a;
      if (dWmap) {
        dAlpha[group] += dh[k] * r * p[k];
        dBias[k] += dh[k];
      }
    }
    // p = x W_map
    if (dWmap)
      matmulTransAAcc(xr, dp.data(), dWmap, 1, width, K);
    if (!dx)
      continue;
    matmulTransBAcc(dp.data(), wmap, dx + t * width, 1, K, width);
    // r = 1 / (rms + eps), rms = sqrt(mean(x^2)): dr/dx = -r^2 x / (width rms)
    T sq = 0;
    for (int64_t k = 0; k < width; ++k)
      sq += xr[k] * xr[k];
    T rms = std::sqrt(sq / T(width));
    if (rms > T(0)) {
      addScaled(dx + t * width, xr, -dr * r * r / (T(width) * rms), width);
    }
  }
}

/// u = sum_i H_pre[i] x_i
template <typename T>
void mhcPreForward(const T *x, const T *coef, T *u, int64_t rows, int64_t C, int64_t n) {
  const int64_t K = n * n + 2 * n;
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t c = 0; c < C; ++c) {
      T sum = 0;
      for (int64_t i = 0; i < n; ++i)
        sum += coef[t * K + i] * x[(t * n + i) * C + c];
      u[t * C + c] = sum;
    }
}

template <typename T>
void mhcPreBackward(const T *x, const T *coef, const T *du, T *dx, T *dCoef, int64_t rows,
                    int64_t C, int64_t n) {
  const int64_t K = n * n + 2 * n;
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t i = 0; i < n; ++i) {
      T h = coef[t * K + i], dot = 0;
      for (int64_t c = 0; c < C; ++c) {
        dx[(t * n + i) * C + c] += h * du[t * C + c];
        dot += du[t * C + c] * x[(t * n + i) * C + c];
      }
      dCoef[t * K + i] += dot;
    }
}

/// x'_i = sum_j H_res[i][j] x_j + H_post[i] y
template <typename T>
void mhcPostResForward(const T *x, const T *coef, const T *y, T *out, int64_t rows, int64_t C,
                       int64_t n) {
  const int64_t K = n * n + 2 * n;
  for (int64_t t = 0; t < rows; ++t) {
    const T *hpost = coef + t * K + n, *hres = coef + t * K + 2 * n;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < C; ++c) {
        T sum = 0;
        for (int64_t j = 0; j < n; ++j)
          sum += hres[i * n + j] * x[(t * n + j) * C + c];
        out[(t * n + i) * C + c] = sum + hpost[i] * y[t * C + c];
      }
  }
}

template <typename T>
void mhcPostResBackward(const T *x, const T *coef, const T *y, const T *dOut, T *dx, T *dCoef,
                        T *dy, int64_t rows, int64_t C, int64_t n) {
  const int64_t K = n * n + 2 * n;
  for (int64_t t = 0; t < rows; ++t) {
    const T *hpost = coef + t * K + n, *hres = coef + t * K + 2 * n;
    T *dpost = dCoef + t * K + n, *dres = dCoef + t * K + 2 * n;
    for (int64_t i = 0; i < n; ++i) {
      const T *g = dOut + (t * n + i) * C;
      T dotY = 0;
      for (int64_t c = 0; c < C; ++c) {
        dotY += g[c] * y[t * C + c];
        dy[t * C + c] += hpost[i] * g[c];
      }
      dpost[i] += dotY;
      for (int64_t j = 0; j < n; ++j) {
        const T *xj = x + (t * n + j) * C;
        T dot = 0;
        for (int64_t c = 0; c < C; ++c) {
          dot += g[c] * xj[c];
          dx[(t * n + j) * C + c] += hres[i * n + j] * g[c];
        }
        dres[i * n + j] += dot;
      }
    }
  }
}

/// The plain residual of n = 1: x' = x + y.
template <typename T>
void residualForward(const T *x, const T *y, T *out, int64_t count) {
  for (int64_t k = 0; k < count; ++k)
    out[k] = x[k] + y[k];
}

template <typename T>
void residualBackward(const T *dOut, T *dx, T *dy, int64_t count) {
  for (int64_t k = 0; k < count; ++k) {
    dx[k] += dOut[k];
    dy[k] += dOut[k];
  }
}

// ---- RMSNorm ------------------------------------------------------------------------

/// y = u / sqrt(mean(u^2) + eps) * g; aux per row: the inverse RMS.
template <typename T>
void rmsNormForward(const T *u, const T *gain, T *y, T *aux, int64_t rows, int64_t C, double eps) {
  for (int64_t t = 0; t < rows; ++t) {
    T sq = 0;
    for (int64_t c = 0; c < C; ++c)
      sq += u[t * C + c] * u[t * C + c];
    T s = T(1) / std::sqrt(sq / T(C) + T(eps));
    aux[t] = s;
    for (int64_t c = 0; c < C; ++c)
      y[t * C + c] = u[t * C + c] * s * gain[c];
  }
}

template <typename T>
void rmsNormBackward(const T *u, const T *gain, const T *aux, const T *dy, T *du, T *dGain,
                     int64_t rows, int64_t C) {
  for (int64_t t = 0; t < rows; ++t) {
    T s = aux[t], dot = 0;
    for (int64_t c = 0; c < C; ++c) {
      dot += gain[c] * dy[t * C + c] * u[t * C + c];
      if (dGain)
        dGain[c] += dy[t * C + c] * u[t * C + c] * s;
    }
    if (!du)
      continue;
    T k = s * s * s / T(C) * dot;
    for (int64_t c = 0; c < C; ++c)
      du[t * C + c] += s * gain[c] * dy[t * C + c] - k * u[t * C + c];
  }
}

// ---- SwiGLU MLP -----------------------------------------------------------------------

/// y = (silu(x Wg) * (x Wu)) Wd; aux: [rows, F] gate pre-activation, then
/// [rows, F] up projection, then [rows, F] their product.
template <typename T>
void swigluForward(const T *x, const T *wg, const T *wu, const T *wd, T *y, T *aux, int64_t rows,
                   int64_t C, int64_t F, Store<T> store = nullptr) {
  T *a = aux, *b = aux + rows * F, *hsw = aux + 2 * rows * F;
  matmul(x, wg, a, rows, C, F);
  matmul(x, wu, b, rows, C, F);
  stored(store, aux, 2 * rows * F);
  for (int64_t k = 0; k < rows * F; ++k)
    hsw[k] = a[k] * sigmoid(a[k]) * b[k];
  stored(store, hsw, rows * F);
  matmul(hsw, wd, y, rows, F, C);
}

template <typename T>
void swigluBackward(const T *x, const T *wg, const T *wu, const T *wd, const T *aux, const T *dy,
                    T *dx, T *dWg, T *dWu, T *dWd, int64_t rows, int64_t C, int64_t F,
                    Store<T> store = nullptr) {
  const T *a = aux, *b = aux + rows * F, *hsw = aux + 2 * rows * F;
  if (dWd)
    matmulTransAAcc(hsw, dy, dWd, rows, F, C);
  std::vector<T> dh(rows * F, T(0)), da(rows * F), db(rows * F);
  matmulTransBAcc(dy, wd, dh.data(), rows, C, F);
  stored(store, dh.data(), rows * F);
  for (int64_t k = 0; k < rows * F; ++k) {
    T s = sigmoid(a[k]);
    T silu = a[k] * s;
    db[k] = dh[k] * silu;
    da[k] = dh[k] * b[k] * s * (T(1) + a[k] * (T(1) - s));
  }
  stored(store, da.data(), rows * F);
  stored(store, db.data(), rows * F);
  if (dWg) {
    matmulTransAAcc(x, da.data(), dWg, rows, C, F);
    matmulTransAAcc(x, db.data(), dWu, rows, C, F);
  }
  if (dx) {
    matmulTransBAcc(da.data(), wg, dx, rows, F, C);
    matmulTransBAcc(db.data(), wu, dx, rows, F, C);
  }
}

// ---- projections and loss ---------------------------------------------------------

/// z = [a, b] W with W [2C, N]
template <typename T>
void concatProjForward(const T *a, const T *b, const T *w, T *z, int64_t rows, int64_t C,
                       int64_t N) {
  matmul(a, w, z, rows, C, N);
  matmul(b, w + C * N, z, rows, C, N, /*accumulate=*/true);
}

template <typename T>
void concatProjBackward(const T *a, const T *b, const T *w, const T *dz, T *da, T *db, T *dW,
                        int64_t rows, int64_t C, int64_t N) {
  if (dW) {
    matmulTransAAcc(a, dz, dW, rows, C, N);
    matmulTransAAcc(b, dz, dW + C * N, rows, C, N);
  }
  if (da) {
    matmulTransBAcc(dz, w, da, rows, N, C);
    matmulTransBAcc(dz, w + C * N, db, rows, N, C);
  }
}

/// Rows of a microbatch of `rows` (in sequences of `seq`) that a loss with
/// `shift` counts: those whose label lies in their sequence.
inline int64_t countedRows(int64_t rows, int64_t shift, int64_t seq) {
  return (rows / seq) * std::max<int64_t>(0, seq - shift);
}

/// Mean over the unmasked rows of -log softmax(logits)[label]; row t's label
/// is labels[t + shift] of its sequence, masked past the end. aux: lse per row.
/// With a context-parallel rowMap (microbatchRow), the rank's share of the
/// microbatch's mean: its rows' sum over the whole microbatch's count,
/// microbatchRows rows.
template <typename T>
T crossEntropyForward(const T *logits, const int32_t *labels, T *aux, int64_t rows, int64_t V,
                      int64_t shift, int64_t seq, const int64_t *rowMap = nullptr, int64_t microbatchRows = 0) {
  if (rowMap) {
    T total = 0;
    for (int64_t t = 0; t < rows; ++t) {
      const T *row = logits + t * V;
      const T maxLogit = *std::max_element(row, row + V);
      T sum = 0;
      for (int64_t v = 0; v < V; ++v)
        sum += std::exp(row[v] - maxLogit);
      aux[t] = maxLogit + std::log(sum);
      const int64_t g = rowMap[t];
      if ((g % seq) + shift < seq)
        total += aux[t] - row[labels[g + shift]];
    }
    const int64_t counted = countedRows(microbatchRows, shift, seq);
    return counted ? total / T(counted) : T(0);
  }
  T total = 0;
  int64_t counted = 0;
  for (int64_t t = 0; t < rows; ++t) {
    const T *row = logits + t * V;
    T maxLogit = row[0];
    for (int64_t v = 1; v < V; ++v)
      maxLogit = std::max(maxLogit, row[v]);
    T sum = 0;
    for (int64_t v = 0; v < V; ++v)
      sum += std::exp(row[v] - maxLogit);
    aux[t] = maxLogit + std::log(sum);
    if ((t % seq) + shift < seq) {
      total += aux[t] - row[labels[t + shift]];
      ++counted;
    }
  }
  return counted ? total / T(counted) : T(0);
}

/// dlogits += scale * (softmax - onehot) / counted rows
/// (rowMap, microbatchRows: as crossEntropyForward.) The logits are the V
/// columns of vocabulary ids vocabFirst ..: a tensor-parallel rank's share
/// (TensorParallel.h), whose rows' lse (aux) already spans the vocabulary.
template <typename T>
void crossEntropyBackward(const T *logits, const int32_t *labels, const T *aux, T scale,
                          T *dLogits, int64_t rows, int64_t V, int64_t shift, int64_t seq,
                          const int64_t *rowMap = nullptr, int64_t microbatchRows = 0, int64_t vocabFirst = 0) {
  int64_t counted = 0;
  if (rowMap)
    counted = countedRows(microbatchRows, shift, seq);
  else
    for (int64_t t = 0; t < rows; ++t)
      counted += (t % seq) + shift < seq;
  if (!counted)
    return;
  T factor = scale / T(counted);
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t g = microbatchRow(rowMap, t);
    if ((g % seq) + shift >= seq)
      continue;
    const T *row = logits + t * V;
    T *gradRow = dLogits + t * V;
    for (int64_t v = 0; v < V; ++v)
      gradRow[v] += factor * std::exp(row[v] - aux[t]);
    if (const int64_t label = labels[g + shift] - vocabFirst; label >= 0 && label < V)
      gradRow[label] -= factor;
  }
}

} // namespace mhcc::runtime::kernels

#include "runtime/cpu/AttentionKernels.h"
#include "runtime/cpu/GdnKernels.h"

#endif // MHCC_RUNTIME_CPU_KERNELS_H
