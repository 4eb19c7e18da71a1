//===- AttentionKernels.h - CPU causal attention with RoPE --------*- C++ -*-===//
//
// Part of the CPU reference kernels (Kernels.h, whose conventions hold here:
// row-major, backwards add into their outputs, B / W halves by nullptr);
// included at its end.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CPU_ATTENTIONKERNELS_H
#define MHCC_RUNTIME_CPU_ATTENTIONKERNELS_H

#include "runtime/cpu/Kernels.h"

namespace mhcc::runtime::kernels {

// ---- attention ------------------------------------------------------------------------

/// Documents packed into the sequences of a microbatch (mhcrun
/// --reset-position-ids / --reset-attention-mask, Megatron's flags), one
/// entry per token of the microbatch; a null array leaves each sequence one
/// document in that respect. Documents are contiguous, so a token's first
/// key is its document's start and the keys it sees are [firstKey, itself].
struct Documents {
  const int32_t *positions = nullptr; // RoPE position: the token's offset in its document
  const int32_t *firstKeys = nullptr; // the first key it attends to, as an offset in its sequence
  int64_t position(int64_t t, int64_t seq) const { return positions ? positions[t] : t % seq; }
  int64_t firstKey(int64_t t) const { return firstKeys ? firstKeys[t] : 0; }
};

template <typename T>
void rotate(T *v, int64_t pos, int64_t headDim, bool inverse) {
  for (int64_t j = 0; j < headDim / 2; ++j) {
    double theta = pos * std::pow(kRopeBase, -2.0 * j / headDim);
    T c = T(std::cos(theta)), s = T(std::sin(theta));
    if (inverse)
      s = -s;
    T a = v[2 * j], b = v[2 * j + 1];
    v[2 * j] = a * c - b * s;
    v[2 * j + 1] = a * s + b * c;
  }
}

/// One head's [seq, d] slice of rows `stride` apart, transposed to [d, seq].
template <typename T> void transposeHead(const T *rows, int64_t stride, int64_t seq, int64_t d, T *out) {
  for (int64_t j = 0; j < seq; ++j)
    for (int64_t e = 0; e < d; ++e)
      out[e * seq + j] = rows[j * stride + e];
}

/// dots[j] = sum over e of x[e] * rowsT[e, j] for j <= last, each summed in
/// ascending e (the bits of one dot product at a time), all j together.
template <typename T> void causalDots(const T *x, const T *rowsT, int64_t seq, int64_t d, int64_t last, T *dots) {
  std::fill(dots, dots + last + 1, T(0));
  for (int64_t e = 0; e < d; ++e)
    addScaled(dots, rowsT + e * seq, x[e], last + 1);
}

/// Rotates q and k of every head of `rows` rows of [rows, 3D] (inverse: their
/// gradients back) to the position of each row (docs.position of its
/// microbatch row, rowMap[t]; null: t).
template <typename T>
void rotateQueriesKeys(T *qkv, int64_t rows, int64_t D, int64_t heads, int64_t seq, Documents docs,
                       const int64_t *rowMap, bool inverse) {
  const int64_t d = D / heads;
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t position = docs.position(rowMap ? rowMap[t] : t, seq);
      rotate(qkv + t * 3 * D + h * d, position, d, inverse);
      rotate(qkv + t * 3 * D + D + h * d, position, d, inverse);
    }
}

/// The forward's start: qkv = x W_qkv, q and k rotated, rounded where kept.
template <typename T>
void projectQueriesKeysValues(const T *x, const T *wqkv, T *qkv, int64_t rows, int64_t C, int64_t D, int64_t heads,
                              int64_t seq, Store<T> store, Documents docs, const int64_t *rowMap) {
  matmul(x, wqkv, qkv, rows, C, 3 * D);
  stored(store, qkv, rows * 3 * D);
  rotateQueriesKeys(qkv, rows, D, heads, seq, docs, rowMap, false);
  stored(store, qkv, rows * 3 * D);
}

/// The backward's start: dW_o (when not null) += o^T dy, and dO = dy W_o^T,
/// rounded where kept.
template <typename T>
std::vector<T> outputProjectionBackward(const T *o, const T *dy, const T *wo, T *dWo, int64_t rows, int64_t C,
                                        int64_t D, Store<T> store) {
  if (dWo)
    matmulTransAAcc(o, dy, dWo, rows, D, C);
  std::vector<T> dO(rows * D, T(0));
  matmulTransBAcc(dy, wo, dO.data(), rows, C, D);
  stored(store, dO.data(), rows * D);
  return dO;
}

/// The backward's end: dQkv's q and k rotated back, rounded, and dW_qkv and
/// dx (each when not null) added.
template <typename T>
void projectionBackward(const T *x, const T *wqkv, T *dQkv, T *dWqkv, T *dx, int64_t rows, int64_t C, int64_t D,
                        int64_t heads, int64_t seq, Store<T> store, Documents docs, const int64_t *rowMap) {
  rotateQueriesKeys(dQkv, rows, D, heads, seq, docs, rowMap, true);
  stored(store, dQkv, rows * 3 * D);
  if (dWqkv)
    matmulTransAAcc(x, dQkv, dWqkv, rows, C, 3 * D);
  if (dx)
    matmulTransBAcc(dQkv, wqkv, dx, rows, 3 * D, C);
}

/// One query row of one head: its scores against keys first..i of its
/// sequence (kt: the head's keys transposed, [d, seq]; p: seq scratch), the
/// softmax, and out = sum of p_j v_j (values: the head's value of the
/// sequence's first row, rows `stride` apart). Returns the log-sum-exp.
template <typename T>
T attendRow(const T *q, const T *kt, const T *values, int64_t stride, int64_t seq, int64_t d, int64_t i, int64_t first,
            T scale, T *p, T *out) {
  causalDots(q, kt, seq, d, i, p);
  T maxScore = -INFINITY;
  for (int64_t j = first; j <= i; ++j) {
    p[j] = p[j] * scale;
    maxScore = std::max(maxScore, p[j]);
  }
  T sum = 0;
  for (int64_t j = first; j <= i; ++j) {
    p[j] = std::exp(p[j] - maxScore);
    sum += p[j];
  }
  std::fill(out, out + d, T(0));
  for (int64_t j = first; j <= i; ++j)
    addScaled(out, values + j * stride, p[j] / sum, d);
  return maxScore + std::log(sum);
}

/// One query row's backward against keys first..i (kt, vt: the head's keys
/// and values transposed): p (probabilities) and ds (score gradients,
/// scaled) over first..i, dq += sum of ds_j k_j (keys: the head's key of
/// the sequence's first row, rows `stride` apart). Returns
/// rowDot = sum of p_j dp_j. dp: seq scratch.
template <typename T>
T queryRowBackward(const T *q, const T *gO, const T *kt, const T *vt, const T *keys, int64_t stride, int64_t seq,
                   int64_t d, int64_t i, int64_t first, T scale, T lse, T *p, T *dp, T *ds, T *dq) {
  causalDots(q, kt, seq, d, i, p);
  causalDots(gO, vt, seq, d, i, dp);
  T rowDot = 0;
  for (int64_t j = first; j <= i; ++j) {
    p[j] = std::exp(p[j] * scale - lse);
    rowDot += p[j] * dp[j];
  }
  for (int64_t j = first; j <= i; ++j) {
    ds[j] = p[j] * (dp[j] - rowDot) * scale;
    addScaled(dq, keys + j * stride, ds[j], d);
  }
  return rowDot;
}

/// Causal multi-head self-attention with rotary positions. x and y are
/// [rows, C]; the heads span D = `inner` columns (0: C; less on a
/// tensor-parallel rank, which holds heads / tp of them and partial sums of
/// y). aux: [rows, 3D] rotated q, k and v, then [rows, D] attention output
/// o, then [rows, heads]
/// log-sum-exp of each score row. A query attends to the keys of its own
/// document only (`docs`); its score row is summed from its document's start,
/// so a packed document gets the bits it would get alone.
template <typename T>
void attentionForward(const T *x, const T *wqkv, const T *wo, T *y, T *aux, int64_t rows,
                      int64_t C, int64_t heads, int64_t seq, Store<T> store = nullptr, Documents docs = {},
                      int64_t inner = 0) {
  const int64_t D = inner ? inner : C, d = D / heads;
  T *qkv = aux, *o = aux + rows * 3 * D, *lse = o + rows * D;
  projectQueriesKeysValues(x, wqkv, qkv, rows, C, D, heads, seq, store, docs, nullptr);
  const T scale = T(1) / std::sqrt(T(d));
  // (sequence, head) pairs are independent: split them over threads.
  parallelFor((rows / seq) * heads, seq * seq * d, [&](int64_t begin, int64_t end) {
    std::vector<T> p(seq), kt(d * seq);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / heads, h = bh % heads;
      const T *seqRows = qkv + b * seq * 3 * D;
      transposeHead(seqRows + D + h * d, 3 * D, seq, d, kt.data());
      for (int64_t i = 0; i < seq; ++i) {
        const int64_t ti = b * seq + i;
        T *out = o + ti * D + h * d;
        lse[ti * heads + h] =
            attendRow(qkv + ti * 3 * D + h * d, kt.data(), seqRows + 2 * D + h * d, 3 * D, seq, d, i,
                      docs.firstKey(ti), scale, p.data(), out);
        stored(store, out, d);
      }
    }
  });
  matmul(o, wo, y, rows, D, C);
}

template <typename T>
void attentionBackward(const T *x, const T *wqkv, const T *wo, const T *aux, const T *dy, T *dx,
                       T *dWqkv, T *dWo, int64_t rows, int64_t C, int64_t heads, int64_t seq,
                       Store<T> store = nullptr, Documents docs = {}, int64_t inner = 0) {
  const int64_t D = inner ? inner : C, d = D / heads;
  const T *qkv = aux, *o = aux + rows * 3 * D, *lse = o + rows * D;
  const std::vector<T> dO = outputProjectionBackward(o, dy, wo, dWo, rows, C, D, store);
  std::vector<T> dQkv(rows * 3 * D, T(0));
  const T scale = T(1) / std::sqrt(T(d));
  // (sequence, head) pairs touch disjoint slices of dQkv: split them over threads.
  parallelFor((rows / seq) * heads, 2 * seq * seq * d, [&](int64_t begin, int64_t end) {
    std::vector<T> p(seq), dp(seq), ds(seq), kt(d * seq), vt(d * seq), dkt(d * seq), dvt(d * seq);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / heads, h = bh % heads;
      transposeHead(qkv + b * seq * 3 * D + D + h * d, 3 * D, seq, d, kt.data());
      transposeHead(qkv + b * seq * 3 * D + 2 * D + h * d, 3 * D, seq, d, vt.data());
      // dK and dV of this head accumulate transposed ([d, seq]) so that one
      // query row updates every key at once; each element still sums over
      // the queries i in ascending order, from 0 as the zeroed dQkv would.
      std::fill(dkt.begin(), dkt.end(), T(0));
      std::fill(dvt.begin(), dvt.end(), T(0));
      for (int64_t i = 0; i < seq; ++i) {
        const int64_t ti = b * seq + i, first = docs.firstKey(ti);
        const T *q = qkv + ti * 3 * D + h * d;
        const T *gO = dO.data() + ti * D + h * d;
        queryRowBackward(q, gO, kt.data(), vt.data(), qkv + b * seq * 3 * D + D + h * d, 3 * D, seq, d, i, first,
                         scale, lse[ti * heads + h], p.data(), dp.data(), ds.data(), dQkv.data() + ti * 3 * D + h * d);
        for (int64_t e = 0; e < d; ++e) {
          T *dkRow = dkt.data() + e * seq, *dvRow = dvt.data() + e * seq;
          const T qe = q[e], ge = gO[e];
          for (int64_t j = first; j <= i; ++j) {
            dkRow[j] += ds[j] * qe;
            dvRow[j] += p[j] * ge;
          }
        }
      }
      for (int64_t j = 0; j < seq; ++j) {
        T *dk = dQkv.data() + (b * seq + j) * 3 * D + D + h * d, *dv = dk + D;
        for (int64_t e = 0; e < d; ++e) {
          dk[e] += dkt[e * seq + j];
          dv[e] += dvt[e * seq + j];
        }
      }
    }
  });
  projectionBackward(x, wqkv, dQkv.data(), dWqkv, dx, rows, C, D, heads, seq, store, docs, nullptr);
}

} // namespace mhcc::runtime::kernels

#endif // MHCC_RUNTIME_CPU_ATTENTIONKERNELS_H
