// Attention under context parallelism with the K/V exchange
// (runtime/cpu/ContextParallelAttention.h) against the whole-sequence
// kernels (AttentionKernels.h), cp ranks run as threads with an in-process
// row gather.
//
// What must hold, and why: a rank computes its rows' q, k, v, scores,
// softmax, dq, dk and dv with the whole-sequence kernels' operations in
// their order (a key's dK / dV sum its queries ascending from zero), so
// its rows' outputs y, attention outputs o, log-sum-exps and input
// gradients dx are the same bits as one rank's, with and without packed
// documents, in float and double, at cp 2 and cp 4. Only the weight
// gradients differ: each rank sums its own rows, then the ranks are added
// (in the trainer, the gradient all-reduce): within 1e-5 (float) / 1e-12
// (double) of the largest. And the work is split: each rank sees rows / cp
// query rows.
#include "runtime/cpu/Kernels.h"
#include "runtime/cpu/ContextParallelAttention.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>

namespace mhcc::runtime::kernels {
namespace {

/// Microbatch rows of context rank r: chunks r and 2 cp - 1 - r of every sequence (the load-balanced split).
std::vector<int64_t> contextRowsOf(int64_t r, int64_t cp, int64_t sequences, int64_t seq) {
  std::vector<int64_t> rows;
  const int64_t chunk = seq / (2 * cp);
  for (int64_t b = 0; b < sequences; ++b)
    for (int64_t c : {r, 2 * cp - 1 - r})
      for (int64_t i = 0; i < chunk; ++i)
        rows.push_back(b * seq + c * chunk + i);
  return rows;
}

/// A row gather among `ranks` threads: each deposits its rows, waits for all, reads the whole microbatch.
template <typename T> class Rendezvous {
public:
  Rendezvous(int64_t ranks, const std::vector<std::vector<int64_t>> &rowMaps) : ranks_(ranks), rowMaps_(rowMaps) {}
  bool gather(int64_t rank, const T *local, int64_t cols, T *all) {
    std::unique_lock<std::mutex> lock(m_);
    const int64_t generation = generation_;
    if (arrived_ == 0)
      buffer_.clear();
    for (size_t t = 0; t < rowMaps_[rank].size(); ++t)
      buffer_[rowMaps_[rank][t]].assign(local + t * cols, local + (t + 1) * cols);
    if (++arrived_ == ranks_) {
      result_.assign(buffer_.size() * cols, T(0));
      for (const auto &[row, values] : buffer_)
        std::copy(values.begin(), values.end(), result_.begin() + row * cols);
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation; });
    }
    std::copy(result_.begin(), result_.end(), all);
    ++readers_;
    // The last reader lets the next gather start (nobody overwrites result_ while another still copies it).
    if (readers_ == ranks_) {
      readers_ = 0;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return readers_ == 0 || generation_ != generation + 1; });
    }
    return true;
  }

private:
  int64_t ranks_;
  const std::vector<std::vector<int64_t>> &rowMaps_;
  std::mutex m_;
  std::condition_variable cv_;
  std::map<int64_t, std::vector<T>> buffer_;
  std::vector<T> result_;
  int64_t arrived_ = 0, readers_ = 0, generation_ = 0;
};

template <typename T> bool sameBits(const T &a, const T &b) { return std::memcmp(&a, &b, sizeof(T)) == 0; }

template <typename T> void checkContextParallel(int64_t cp, bool documents) {
  const int64_t sequences = 2, seq = 32, heads = 2, C = 16, all = sequences * seq, D = C;
  std::mt19937 gen(7 + cp);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto randoms = [&](int64_t n, double scale) {
    std::vector<T> v(n);
    for (T &x : v)
      x = T(normal(gen) * scale);
    return v;
  };
  const std::vector<T> x = randoms(all * C, 1.0), wqkv = randoms(C * 3 * D, 0.3), wo = randoms(D * C, 0.3),
                       dy = randoms(all * C, 1.0);
  // Packed documents of 1 .. 12 tokens: positions restart, keys start at the document.
  std::vector<int32_t> positions(all), firstKeys(all);
  for (int64_t b = 0; b < sequences; ++b)
    for (int64_t i = 0, start = 0, next = 1 + int64_t(gen() % 12); i < seq; ++i) {
      if (i == next) {
        start = i;
        next = i + 1 + int64_t(gen() % 12);
      }
      positions[b * seq + i] = int32_t(i - start);
      firstKeys[b * seq + i] = int32_t(start);
    }
  Documents docs;
  if (documents)
    docs = {positions.data(), firstKeys.data()};

  // One rank: the whole microbatch.
  const int64_t auxPerRow = 4 * D + heads;
  std::vector<T> y(all * C), aux(all * auxPerRow), dx(all * C, T(0)), dWqkv(C * 3 * D, T(0)), dWo(D * C, T(0));
  attentionForward<T>(x.data(), wqkv.data(), wo.data(), y.data(), aux.data(), all, C, heads, seq, nullptr, docs);
  attentionBackward<T>(x.data(), wqkv.data(), wo.data(), aux.data(), dy.data(), dx.data(), dWqkv.data(), dWo.data(),
                       all, C, heads, seq, nullptr, docs);

  // cp ranks, each on its rows.
  std::vector<std::vector<int64_t>> rowMaps;
  for (int64_t r = 0; r < cp; ++r)
    rowMaps.push_back(contextRowsOf(r, cp, sequences, seq));
  Rendezvous<T> rendezvous(cp, rowMaps);
  std::vector<std::vector<T>> yR(cp), auxR(cp), dxR(cp), dWqkvR(cp), dWoR(cp);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < cp; ++r)
    threads.emplace_back([&, r] {
      const std::vector<int64_t> &map = rowMaps[r];
      const int64_t rows = int64_t(map.size());
      std::vector<T> xr(rows * C), dyr(rows * C);
      for (int64_t t = 0; t < rows; ++t) {
        std::copy_n(x.data() + map[t] * C, C, xr.data() + t * C);
        std::copy_n(dy.data() + map[t] * C, C, dyr.data() + t * C);
      }
      yR[r].assign(rows * C, T(0));
      auxR[r].assign(rows * auxPerRow, T(0));
      dxR[r].assign(rows * C, T(0));
      dWqkvR[r].assign(C * 3 * D, T(0));
      dWoR[r].assign(D * C, T(0));
      const GatherRows<T> gather = [&](const T *local, int64_t cols, T *out) {
        return rendezvous.gather(r, local, cols, out);
      };
      EXPECT_TRUE(contextParallelAttentionForward<T>(xr.data(), wqkv.data(), wo.data(), yR[r].data(),
                                                     auxR[r].data(), rows, map.data(), all, C, heads, seq, nullptr,
                                                     docs, 0, gather));
      EXPECT_TRUE(contextParallelAttentionBackward<T>(xr.data(), wqkv.data(), wo.data(), auxR[r].data(), dyr.data(),
                                                      dxR[r].data(), dWqkvR[r].data(), dWoR[r].data(), rows,
                                                      map.data(), all, C, heads, seq, nullptr, docs, 0, gather));
    });
  for (std::thread &t : threads)
    t.join();

  const std::string what = std::string(sizeof(T) == 4 ? "float" : "double") + " cp " + std::to_string(cp) +
                           (documents ? ", packed documents" : "");
  int64_t differing = 0;
  for (int64_t r = 0; r < cp; ++r) {
    const std::vector<int64_t> &map = rowMaps[r];
    EXPECT_EQ(int64_t(map.size()), all / cp) << what << ": rank " << r << " holds rows / cp rows";
    const int64_t rows = int64_t(map.size());
    for (int64_t t = 0; t < rows; ++t) {
      const int64_t m = map[t];
      for (int64_t e = 0; e < C; ++e) {
        differing += !sameBits(yR[r][t * C + e], y[m * C + e]);
        differing += !sameBits(dxR[r][t * C + e], dx[m * C + e]);
      }
      // o and the log-sum-exp (aux after q, k, v).
      for (int64_t e = 0; e < D; ++e)
        differing += !sameBits(auxR[r][rows * 3 * D + t * D + e], aux[all * 3 * D + m * D + e]);
      for (int64_t h = 0; h < heads; ++h)
        differing += !sameBits(auxR[r][rows * 4 * D + t * heads + h], aux[all * 4 * D + m * heads + h]);
    }
  }
  EXPECT_EQ(differing, 0) << what << ": rows' y, o, lse or dx differ from one rank's";
  // Weight gradients: the ranks' partial sums, added in rank order.
  const double tolerance = sizeof(T) == 4 ? 1e-5 : 1e-12;
  int64_t weightDiffering = 0;
  for (auto [whole, parts] : {std::pair{&dWqkv, &dWqkvR}, std::pair{&dWo, &dWoR}}) {
    double largest = 0, worst = 0;
    for (size_t i = 0; i < whole->size(); ++i) {
      T sum = 0;
      for (int64_t r = 0; r < cp; ++r)
        sum += (*parts)[r][i];
      largest = std::max(largest, std::abs(double((*whole)[i])));
      worst = std::max(worst, std::abs(double(sum) - double((*whole)[i])));
      weightDiffering += !sameBits(sum, (*whole)[i]);
    }
    EXPECT_LE(worst, tolerance * largest) << what << ": weight gradient";
  }
  std::printf("%s: every row's y, o, lse, dx the same bits; %lld weight-gradient elements sum in another order\n",
              what.c_str(), static_cast<long long>(weightDiffering));
}

TEST(ContextParallelAttention, RowsMatchOneRankBitForBit) {
  for (int64_t cp : {2, 4})
    for (bool documents : {false, true}) {
      checkContextParallel<float>(cp, documents);
      checkContextParallel<double>(cp, documents);
    }
}

} // namespace
} // namespace mhcc::runtime::kernels
