//===- GdnKernels.h - CPU Gated DeltaNet, forward and backward ----*- C++ -*-===//
//
// Part of the CPU reference kernels (Kernels.h, whose conventions hold here:
// row-major, backwards add into their outputs, B / W halves by nullptr);
// included at its end.
//
// Gated DeltaNet (Yang, Kautz and Hatamizadeh, 2024), per head of width
// d = C / heads, as FLA's GatedDeltaNet layer computes it:
//   p = x W_qkv; z = causal depthwise conv of p (kGdnConvWidth taps);
//   q, k = L2-normalized silu(z) per head, v = silu(z);
//   beta = sigmoid(x W_ab[:, h]), alpha = exp(-exp(a_log) softplus(x W_ab[:, H + h] + dt_bias));
//   S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T  (S: d x d, zero at a sequence's
//   and a packed document's start), o_t = S_t q_t / sqrt(d);
//   y = (rmsnorm(o) * out_norm * silu(x W_gate)) W_o, the norm per head.
// Here the recurrence runs token by token in a fixed order (the GPU's
// chunk-parallel scans compute the same sums in another order); the
// backward recomputes the states. Under tensor parallelism a rank runs its
// heads: `inner` = C / tp columns of q, k, v, the gate and the norm, H its
// heads, x and y still C wide (y a partial sum over the ranks). Documents (kernels::Documents'
// firstKeys): the conv reads no token before its document, the state
// restarts at it.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CPU_GDNKERNELS_H
#define MHCC_RUNTIME_CPU_GDNKERNELS_H

#include "runtime/cpu/Kernels.h"

namespace mhcc::runtime::kernels {

constexpr int64_t kGdnConvWidth = 4;
constexpr double kGdnL2Eps = 1e-6;

/// Floats the forward keeps per row (the aux layout below) for C and heads.
inline int64_t gdnAuxPerRow(int64_t C, int64_t heads) { return 11 * C + 5 * heads; }

/// Where a row's pieces live in aux: p, z, the activations a = [q k v]
/// (q, k normalized), 1 / |silu(z)| of q and k per head, the gate logits ab,
/// the recurrence output o, the norm's 1 / rms per head, the gate g.
template <typename T> struct GdnAux {
  T *p, *z, *a, *inv, *ab, *o, *rms, *g;
  GdnAux(T *aux, int64_t rows, int64_t C, int64_t H)
      : p(aux), z(p + rows * 3 * C), a(z + rows * 3 * C), inv(a + rows * 3 * C), ab(inv + rows * 2 * H),
        o(ab + rows * 2 * H), rms(o + rows * C), g(rms + rows * H) {}
};

template <typename T> T softplus(T x) { return x > T(20) ? x : std::log1p(std::exp(x)); }

/// The row of sequence position `i` (row t) a conv tap `j` reads, or -1 before the document.
inline int64_t gdnTapRow(int64_t t, int64_t j, int64_t seq, const Documents &docs) {
  const int64_t back = kGdnConvWidth - 1 - j, i = t % seq;
  return i - back >= docs.firstKey(t) ? t - back : -1;
}

/// Head h's recurrence over one sequence's rows [t0, t0 + seq): calls
/// step(t, restarted, S) after each token, S the state after it and
/// `restarted` whether the state began from zero at it (a document's start).
template <typename T, typename Step>
void gdnScan(const T *a, const T *ab, const T *alphaOf, int64_t t0, int64_t seq, int64_t C, int64_t H, int64_t h,
             const Documents &docs, Step step) {
  const int64_t d = C / H;
  std::vector<T> S(d * d, T(0)), u(d);
  for (int64_t t = t0; t < t0 + seq; ++t) {
    const bool restart = t % seq == docs.firstKey(t);
    if (restart)
      std::fill(S.begin(), S.end(), T(0));
    const T *k = a + t * 3 * C + C + h * d, *v = a + t * 3 * C + 2 * C + h * d;
    const T alpha = alphaOf[t * H + h], beta = sigmoid(ab[t * 2 * H + h]);
    for (int64_t i = 0; i < d; ++i) {
      T *row = S.data() + i * d, dot = 0;
      for (int64_t j = 0; j < d; ++j) {
        row[j] *= alpha;
        dot += row[j] * k[j];
      }
      u[i] = dot;
    }
    for (int64_t i = 0; i < d; ++i)
      addScaled(S.data() + i * d, k, beta * (v[i] - u[i]), d);
    step(t, restart, S.data());
  }
}

/// The decay of every row and head: alpha = exp(-exp(a_log) softplus(ab[H + h] + dt_bias)).
template <typename T>
std::vector<T> gdnAlphas(const T *ab, const T *aLog, const T *dtBias, int64_t rows, int64_t H) {
  std::vector<T> alpha(rows * H);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t h = 0; h < H; ++h)
      alpha[t * H + h] = std::exp(-std::exp(aLog[h]) * softplus(ab[t * 2 * H + H + h] + dtBias[h]));
  return alpha;
}

template <typename T>
void gdnForward(const T *x, const T *wqkv, const T *conv, const T *wab, const T *aLog, const T *dtBias,
                const T *outNorm, const T *wgate, const T *wo, T *y, T *auxData, int64_t rows, int64_t C,
                int64_t H, int64_t seq, double eps, Store<T> store = nullptr, Documents docs = {},
                int64_t inner = 0) {
  const int64_t D = inner ? inner : C; // the heads' width: C / tp under tensor parallelism
  const int64_t d = D / H;
  GdnAux<T> aux(auxData, rows, D, H);
  matmul(x, wqkv, aux.p, rows, C, 3 * D);
  stored(store, aux.p, rows * 3 * D);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t c = 0; c < 3 * D; ++c) {
      T z = 0;
      for (int64_t j = 0; j < kGdnConvWidth; ++j)
        if (const int64_t r = gdnTapRow(t, j, seq, docs); r >= 0)
          z += conv[j * 3 * D + c] * aux.p[r * 3 * D + c];
      aux.z[t * 3 * D + c] = z;
      aux.a[t * 3 * D + c] = z * sigmoid(z);
    }
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t part = 0; part < 2; ++part) // q and k, L2-normalized per head
      for (int64_t h = 0; h < H; ++h) {
        T *v = aux.a + t * 3 * D + part * D + h * d, sq = 0;
        for (int64_t e = 0; e < d; ++e)
          sq += v[e] * v[e];
        const T inv = T(1) / std::sqrt(sq + T(kGdnL2Eps));
        aux.inv[t * 2 * H + part * H + h] = inv;
        for (int64_t e = 0; e < d; ++e)
          v[e] *= inv;
      }
  matmul(x, wab, aux.ab, rows, C, 2 * H);
  const std::vector<T> alpha = gdnAlphas(aux.ab, aLog, dtBias, rows, H);
  const T scale = T(1) / std::sqrt(T(d));
  for (int64_t t0 = 0; t0 < rows; t0 += seq)
    for (int64_t h = 0; h < H; ++h)
      gdnScan(aux.a, aux.ab, alpha.data(), t0, seq, D, H, h, docs, [&](int64_t t, bool, const T *S) {
        const T *q = aux.a + t * 3 * D + h * d;
        T *o = aux.o + t * D + h * d;
        for (int64_t i = 0; i < d; ++i) {
          T dot = 0;
          for (int64_t j = 0; j < d; ++j)
            dot += S[i * d + j] * q[j];
          o[i] = dot * scale;
        }
      });
  matmul(x, wgate, aux.g, rows, C, D);
  stored(store, aux.g, rows * D);
  std::vector<T> n(rows * D);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const T *o = aux.o + t * D + h * d;
      T sq = 0;
      for (int64_t e = 0; e < d; ++e)
        sq += o[e] * o[e];
      const T r = T(1) / std::sqrt(sq / T(d) + T(eps));
      aux.rms[t * H + h] = r;
      for (int64_t e = 0; e < d; ++e) {
        const T g = aux.g[t * D + h * d + e];
        n[t * D + h * d + e] = o[e] * r * outNorm[e] * g * sigmoid(g);
      }
    }
  stored(store, n.data(), rows * D);
  matmul(n.data(), wo, y, rows, D, C);
}

/// Weight gradients: dWqkv, dConv, dWab, dALog, dDtBias, dOutNorm, dWgate,
/// dWo (all null for the B half); dx null for the W half.
template <typename T> struct GdnGrads {
  T *dx = nullptr, *dWqkv = nullptr, *dConv = nullptr, *dWab = nullptr, *dALog = nullptr, *dDtBias = nullptr,
    *dOutNorm = nullptr, *dWgate = nullptr, *dWo = nullptr;
};

/// The gated RMSNorm per head, n = (o r) * out_norm * silu(g), backwards
/// from dn: dO, dG (written) and dOutNorm (added to, unless null).
template <typename T>
void gdnGatedNormBackward(const GdnAux<T> &aux, const T *outNorm, const T *dn, T *dO, T *dG, T *dOutNorm,
                          int64_t rows, int64_t D, int64_t H) {
  const int64_t d = D / H;
  std::vector<T> dHat(d);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const T r = aux.rms[t * H + h];
      T dot = 0; // sum of d(o r) * (o r) over the head
      for (int64_t e = 0; e < d; ++e) {
        const int64_t c = t * D + h * d + e;
        const T g = aux.g[c], sg = sigmoid(g), hat = aux.o[c] * r;
        dG[c] = dn[c] * hat * outNorm[e] * sg * (T(1) + g * (T(1) - sg));
        const T dm = dn[c] * g * sg;
        if (dOutNorm)
          dOutNorm[e] += dm * hat;
        dHat[e] = dm * outNorm[e];
        dot += dHat[e] * hat;
      }
      for (int64_t e = 0; e < d; ++e) {
        const int64_t c = t * D + h * d + e;
        dO[c] = r * (dHat[e] - aux.o[c] * r * dot / T(d));
      }
    }
}

/// One token of head h's recurrence, backwards: o = scale S q and
/// S = a prev + beta e k^T (u = a prev k, e = v - u; prev null: a zero
/// state). dS holds the gradient of S on entry and of prev on return; dq,
/// dk, dv are added to; returns the gradients of beta's and alpha's logits.
template <typename T> struct GdnStepGrads {
  T dBetaLogit = 0, dLogAlpha = 0;
};
template <typename T> struct GdnStepScratch {
  explicit GdnStepScratch(int64_t d) : e(d), u(d), de(d), du(d), dSt(d * d) {}
  std::vector<T> e, u, de, du, dSt;
};
template <typename T>
GdnStepGrads<T> gdnStepBackward(const T *S, const T *prev, const T *q, const T *k, const T *v, const T *gO, T a,
                                T beta, T scale, int64_t d, T *dS, T *dq, T *dk, T *dv, GdnStepScratch<T> &w) {
  std::vector<T> &e = w.e, &u = w.u, &de = w.de, &du = w.du, &dSt = w.dSt;
  for (int64_t r = 0; r < d; ++r)
    addScaled(dS + r * d, q, scale * gO[r], d);
  for (int64_t j = 0; j < d; ++j) {
    T sum = 0;
    for (int64_t r = 0; r < d; ++r)
      sum += S[r * d + j] * gO[r];
    dq[j] += scale * sum;
  }
  for (int64_t r = 0; r < d; ++r) {
    T dot = 0;
    for (int64_t j = 0; j < d; ++j)
      dot += (prev ? a * prev[r * d + j] : T(0)) * k[j];
    u[r] = dot;
    e[r] = v[r] - u[r];
  }
  T dBeta = 0;
  for (int64_t r = 0; r < d; ++r) {
    T dSk = 0;
    for (int64_t j = 0; j < d; ++j)
      dSk += dS[r * d + j] * k[j];
    dBeta += e[r] * dSk;
    de[r] = beta * dSk;
    dv[r] += de[r];
    du[r] = -de[r];
  }
  for (int64_t j = 0; j < d; ++j) {
    T sum = 0;
    for (int64_t r = 0; r < d; ++r)
      sum += beta * dS[r * d + j] * e[r] + (prev ? a * prev[r * d + j] : T(0)) * du[r];
    dk[j] += sum;
  }
  // dS~ = dS + du k^T, then through S~ = a prev.
  T dAlpha = 0;
  for (int64_t r = 0; r < d; ++r)
    for (int64_t j = 0; j < d; ++j) {
      dSt[r * d + j] = dS[r * d + j] + du[r] * k[j];
      if (prev)
        dAlpha += dSt[r * d + j] * prev[r * d + j];
    }
  for (int64_t r = 0; r < d * d; ++r)
    dS[r] = prev ? a * dSt[r] : T(0);
  // alpha = exp(l), l = -exp(a_log) softplus(ab + dt_bias)
  return {dBeta * beta * (T(1) - beta), dAlpha * a};
}

/// The recurrence backwards from each sequence's end over its recomputed
/// states: dA (q, k, v; added to), dAb's beta logits, dLogAlpha (written).
template <typename T>
void gdnRecurrenceBackward(const GdnAux<T> &aux, const T *alpha, const T *dO, T *dA, T *dAb, T *dLogAlpha,
                           int64_t rows, int64_t D, int64_t H, int64_t seq, const Documents &docs) {
  const int64_t d = D / H;
  const T scale = T(1) / std::sqrt(T(d));
  std::vector<T> states(seq * d * d), dS(d * d);
  std::vector<char> restarts(seq);
  GdnStepScratch<T> scratch(d);
  for (int64_t t0 = 0; t0 < rows; t0 += seq)
    for (int64_t h = 0; h < H; ++h) {
      gdnScan(aux.a, aux.ab, alpha, t0, seq, D, H, h, docs, [&](int64_t t, bool restart, const T *S) {
        std::copy(S, S + d * d, states.begin() + (t - t0) * d * d);
        restarts[t - t0] = restart;
      });
      std::fill(dS.begin(), dS.end(), T(0));
      for (int64_t i = seq - 1; i >= 0; --i) {
        const int64_t t = t0 + i;
        const T *prev = i > 0 && !restarts[i] ? states.data() + (i - 1) * d * d : nullptr; // null: zero
        const T *q = aux.a + t * 3 * D + h * d;
        T *dq = dA + t * 3 * D + h * d;
        const GdnStepGrads<T> g =
            gdnStepBackward(states.data() + i * d * d, prev, q, q + D, q + 2 * D, dO + t * D + h * d,
                            alpha[t * H + h], sigmoid(aux.ab[t * 2 * H + h]), scale, d, dS.data(), dq, dq + D,
                            dq + 2 * D, scratch);
        dAb[t * 2 * H + h] = g.dBetaLogit;
        dLogAlpha[t * H + h] = g.dLogAlpha;
      }
    }
}

/// q and k's L2 norms (per head, in place in dA), then silu: dZ (written).
template <typename T>
void gdnActivationBackward(const GdnAux<T> &aux, T *dA, T *dZ, int64_t rows, int64_t D, int64_t H) {
  const int64_t d = D / H;
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t part = 0; part < 2; ++part)
      for (int64_t h = 0; h < H; ++h) {
        const T *nv = aux.a + t * 3 * D + part * D + h * d;
        T *g = dA + t * 3 * D + part * D + h * d, dot = 0;
        for (int64_t e2 = 0; e2 < d; ++e2)
          dot += nv[e2] * g[e2];
        const T inv = aux.inv[t * 2 * H + part * H + h];
        for (int64_t e2 = 0; e2 < d; ++e2)
          g[e2] = inv * (g[e2] - nv[e2] * dot);
      }
    for (int64_t c = 0; c < 3 * D; ++c) {
      const T z = aux.z[t * 3 * D + c], s = sigmoid(z);
      dZ[t * 3 * D + c] = dA[t * 3 * D + c] * s * (T(1) + z * (T(1) - s));
    }
  }
}

template <typename T>
void gdnBackward(const T *x, const T *wqkv, const T *conv, const T *wab, const T *aLog, const T *dtBias,
                 const T *outNorm, const T *wgate, const T *wo, const T *auxData, const T *dy, GdnGrads<T> grads,
                 int64_t rows, int64_t C, int64_t H, int64_t seq, Store<T> store = nullptr, Documents docs = {},
                 int64_t inner = 0) {
  const int64_t D = inner ? inner : C;
  const int64_t d = D / H;
  GdnAux<T> aux(const_cast<T *>(auxData), rows, D, H);
  // The normed, gated output again (what W_o read), then its gradient.
  std::vector<T> n(rows * D), dn(rows * D, T(0));
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t e = 0; e < d; ++e) {
        const int64_t c = t * D + h * d + e;
        const T g = aux.g[c];
        n[c] = aux.o[c] * aux.rms[t * H + h] * outNorm[e] * g * sigmoid(g);
      }
  stored(store, n.data(), rows * D);
  if (grads.dWo)
    matmulTransAAcc(n.data(), dy, grads.dWo, rows, D, C);
  matmulTransBAcc(dy, wo, dn.data(), rows, C, D);
  std::vector<T> dO(rows * D), dG(rows * D);
  gdnGatedNormBackward(aux, outNorm, dn.data(), dO.data(), dG.data(), grads.dOutNorm, rows, D, H);
  stored(store, dG.data(), rows * D);
  if (grads.dWgate)
    matmulTransAAcc(x, dG.data(), grads.dWgate, rows, C, D);
  if (grads.dx)
    matmulTransBAcc(dG.data(), wgate, grads.dx, rows, D, C);
  const std::vector<T> alpha = gdnAlphas(aux.ab, aLog, dtBias, rows, H);
  std::vector<T> dA(rows * 3 * D, T(0)), dAb(rows * 2 * H, T(0)), dLogAlpha(rows * H, T(0));
  gdnRecurrenceBackward(aux, alpha.data(), dO.data(), dA.data(), dAb.data(), dLogAlpha.data(), rows, D, H, seq,
                        docs);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const T z = aux.ab[t * 2 * H + H + h] + dtBias[h], dl = dLogAlpha[t * H + h], decay = std::exp(aLog[h]);
      const T dz = dl * -decay * sigmoid(z);
      dAb[t * 2 * H + H + h] = dz;
      if (grads.dDtBias)
        grads.dDtBias[h] += dz;
      if (grads.dALog) // d l / d a_log = l itself
        grads.dALog[h] += dl * -decay * softplus(z);
    }
  if (grads.dWab)
    matmulTransAAcc(x, dAb.data(), grads.dWab, rows, C, 2 * H);
  if (grads.dx)
    matmulTransBAcc(dAb.data(), wab, grads.dx, rows, 2 * H, C);
  std::vector<T> dZ(rows * 3 * D);
  gdnActivationBackward(aux, dA.data(), dZ.data(), rows, D, H);
  // The causal conv: each tap's weight and the projection it read.
  std::vector<T> dP(rows * 3 * D, T(0));
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t j = 0; j < kGdnConvWidth; ++j)
      if (const int64_t r = gdnTapRow(t, j, seq, docs); r >= 0)
        for (int64_t c = 0; c < 3 * D; ++c) {
          const T g = dZ[t * 3 * D + c];
          if (grads.dConv)
            grads.dConv[j * 3 * D + c] += g * aux.p[r * 3 * D + c];
          dP[r * 3 * D + c] += g * conv[j * 3 * D + c];
        }
  stored(store, dP.data(), rows * 3 * D);
  if (grads.dWqkv)
    matmulTransAAcc(x, dP.data(), grads.dWqkv, rows, C, 3 * D);
  if (grads.dx)
    matmulTransBAcc(dP.data(), wqkv, grads.dx, rows, 3 * D, C);
}

} // namespace mhcc::runtime::kernels

#endif // MHCC_RUNTIME_CPU_GDNKERNELS_H
