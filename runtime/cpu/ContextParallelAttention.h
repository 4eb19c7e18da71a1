//===- ContextParallelAttention.h - attention split over a CP group -*- C++ -*-===//
//
// Causal attention under context parallelism (mhcc --cp) with a K/V
// exchange: a rank projects and rotates q, k and v for its own rows only
// (its two chunks of every sequence), all-gathers the group's rows of k and
// v, and computes attention for its own queries against the gathered
// keys; the backward gathers q, k, v, dO and then each query's
// log-sum-exp and rowDot = sum_j p_j dp_j, and every rank computes dQ of
// its own queries (against every key) and dK, dV of its own keys (over
// every query that sees them, FlashAttention-2's split). Each rank thus
// does 1/cp of the attention work.
//
// Bits: every own row's q, k, v, o, log-sum-exp and dq / dk / dv are
// computed with the operations, operands and order of the whole-sequence
// kernels (AttentionKernels.h): a key's dK and dV still sum its queries in
// ascending order from zero, a query's scores sum d in ascending order.
// So the rows' outputs and input gradients are the bits one rank per
// sequence gets; only the weight gradients (each rank's rows, then the
// ranks, in the gradient all-reduce) sum in another grouping.
//
// The gathers are collectives: every rank of the group calls them in the
// same order (false when one failed).
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CPU_CONTEXTPARALLELATTENTION_H
#define MHCC_RUNTIME_CPU_CONTEXTPARALLELATTENTION_H

#include "runtime/cpu/Kernels.h"

#include <functional>

namespace mhcc::runtime::kernels {

/// Gathers every context-parallel rank's rows ([rows, cols] each) into microbatch order ([all, cols]).
template <typename T> using GatherRows = std::function<bool(const T *local, int64_t cols, T *all)>;

/// This rank's rows (0 .. rows - 1, rowMap: each one's microbatch row) grouped by sequence, in row order.
inline std::vector<std::vector<int64_t>> rowsBySequence(const int64_t *rowMap, int64_t rows, int64_t seq,
                                                        int64_t sequences) {
  std::vector<std::vector<int64_t>> bySequence(sequences);
  for (int64_t t = 0; t < rows; ++t)
    bySequence[rowMap[t] / seq].push_back(t);
  return bySequence;
}

/// The rank's part of attentionForward (same x, weights, y and aux layout, over its `rows` rows; `all`: the
/// microbatch's rows, docs indexed by microbatch row).
template <typename T>
bool contextParallelAttentionForward(const T *x, const T *wqkv, const T *wo, T *y, T *aux, int64_t rows,
                                     const int64_t *rowMap, int64_t all, int64_t C, int64_t heads, int64_t seq,
                                     Store<T> store, Documents docs, int64_t inner, const GatherRows<T> &gather) {
  const int64_t D = inner ? inner : C, d = D / heads;
  T *qkv = aux, *o = aux + rows * 3 * D, *lse = o + rows * D;
  projectQueriesKeysValues(x, wqkv, qkv, rows, C, D, heads, seq, store, docs, rowMap);
  // The queries stay: only the rows' k and v ([rows, 2D]) are exchanged.
  std::vector<T> kv(rows * 2 * D), kvAll(all * 2 * D);
  for (int64_t t = 0; t < rows; ++t)
    std::copy_n(qkv + t * 3 * D + D, 2 * D, kv.data() + t * 2 * D);
  if (!gather(kv.data(), 2 * D, kvAll.data()))
    return false;
  const T scale = T(1) / std::sqrt(T(d));
  const auto bySequence = rowsBySequence(rowMap, rows, seq, all / seq);
  parallelFor((all / seq) * heads, rows / (all / seq) * seq * d, [&](int64_t begin, int64_t end) {
    std::vector<T> p(seq), kt(d * seq);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / heads, h = bh % heads;
      const T *seqRows = kvAll.data() + b * seq * 2 * D;
      transposeHead(seqRows + h * d, 2 * D, seq, d, kt.data());
      for (int64_t t : bySequence[b]) {
        T *out = o + t * D + h * d;
        lse[t * heads + h] = attendRow(qkv + t * 3 * D + h * d, kt.data(), seqRows + D + h * d, 2 * D, seq, d,
                                       rowMap[t] % seq, docs.firstKey(rowMap[t]), scale, p.data(), out);
        stored(store, out, d);
      }
    }
  });
  matmul(o, wo, y, rows, D, C);
  return true;
}

/// The rank's part of attentionBackward (its rows' dx added into dx when not null; its rows' share of the weight
/// gradients added into dWqkv / dWo when not null).
template <typename T>
bool contextParallelAttentionBackward(const T *x, const T *wqkv, const T *wo, const T *aux, const T *dy, T *dx,
                                      T *dWqkv, T *dWo, int64_t rows, const int64_t *rowMap, int64_t all, int64_t C,
                                      int64_t heads, int64_t seq, Store<T> store, Documents docs, int64_t inner,
                                      const GatherRows<T> &gather) {
  const int64_t D = inner ? inner : C, d = D / heads, sequences = all / seq;
  const T *qkv = aux, *o = aux + rows * 3 * D, *lse = o + rows * D;
  const std::vector<T> dO = outputProjectionBackward(o, dy, wo, dWo, rows, C, D, store);
  std::vector<T> dQkv(rows * 3 * D, T(0));
  std::vector<T> qkvAll(all * 3 * D), dOAll(all * D);
  if (!gather(qkv, 3 * D, qkvAll.data()) || !gather(dO.data(), D, dOAll.data()))
    return false;
  const T scale = T(1) / std::sqrt(T(d));
  const auto bySequence = rowsBySequence(rowMap, rows, seq, sequences);
  const int64_t work = rows / sequences * seq * d;
  // Own queries: dq, and each one's log-sum-exp and rowDot for the keys' owners ([rows, 2 heads]).
  std::vector<T> stats(rows * 2 * heads), statsAll(all * 2 * heads);
  parallelFor(sequences * heads, work, [&](int64_t begin, int64_t end) {
    std::vector<T> p(seq), dp(seq), ds(seq), kt(d * seq), vt(d * seq);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / heads, h = bh % heads;
      const T *seqRows = qkvAll.data() + b * seq * 3 * D;
      transposeHead(seqRows + D + h * d, 3 * D, seq, d, kt.data());
      transposeHead(seqRows + 2 * D + h * d, 3 * D, seq, d, vt.data());
      for (int64_t t : bySequence[b]) {
        stats[t * 2 * heads + h] = lse[t * heads + h];
        stats[t * 2 * heads + heads + h] = queryRowBackward(
            qkv + t * 3 * D + h * d, dO.data() + t * D + h * d, kt.data(), vt.data(), seqRows + D + h * d, 3 * D, seq,
            d, rowMap[t] % seq, docs.firstKey(rowMap[t]), scale, lse[t * heads + h], p.data(), dp.data(), ds.data(),
            dQkv.data() + t * 3 * D + h * d);
      }
    }
  });
  if (!gather(stats.data(), 2 * heads, statsAll.data()))
    return false;
  // Own keys: dk and dv over every query that sees them, in ascending order (attentionBackward's per-key sums).
  parallelFor(sequences * heads, work, [&](int64_t begin, int64_t end) {
    std::vector<T> qt(d * seq), gt(d * seq), s(seq), dp(seq), dk(d), dv(d);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / heads, h = bh % heads;
      const T *seqRows = qkvAll.data() + b * seq * 3 * D, *seqGrads = dOAll.data() + b * seq * D;
      transposeHead(seqRows + h * d, 3 * D, seq, d, qt.data());
      transposeHead(seqGrads + h * d, D, seq, d, gt.data());
      for (int64_t t : bySequence[b]) {
        const int64_t j = rowMap[t] % seq;
        const T *k = qkv + t * 3 * D + D + h * d, *v = k + D;
        // Scores and dP of key j against queries j .. seq - 1, each summed over d in ascending order.
        std::fill(s.begin() + j, s.end(), T(0));
        std::fill(dp.begin() + j, dp.end(), T(0));
        for (int64_t e = 0; e < d; ++e) {
          addScaled(s.data() + j, qt.data() + e * seq + j, k[e], seq - j);
          addScaled(dp.data() + j, gt.data() + e * seq + j, v[e], seq - j);
        }
        std::fill(dk.begin(), dk.end(), T(0));
        std::fill(dv.begin(), dv.end(), T(0));
        for (int64_t i = j; i < seq; ++i) {
          const int64_t ti = b * seq + i;
          if (docs.firstKey(ti) > j)
            continue; // the query's document starts after the key
          const T *st = statsAll.data() + ti * 2 * heads;
          const T prob = std::exp(s[i] * scale - st[h]);
          const T ds = prob * (dp[i] - st[heads + h]) * scale;
          addScaled(dk.data(), seqRows + i * 3 * D + h * d, ds, d);
          addScaled(dv.data(), seqGrads + i * D + h * d, prob, d);
        }
        T *dkOut = dQkv.data() + t * 3 * D + D + h * d, *dvOut = dkOut + D;
        for (int64_t e = 0; e < d; ++e) {
          dkOut[e] += dk[e];
          dvOut[e] += dv[e];
        }
      }
    }
  });
  projectionBackward(x, wqkv, dQkv.data(), dWqkv, dx, rows, C, D, heads, seq, store, docs, rowMap);
  return true;
}

} // namespace mhcc::runtime::kernels

#endif // MHCC_RUNTIME_CPU_CONTEXTPARALLELATTENTION_H
