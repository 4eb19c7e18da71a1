// The CPU backend's blocked matrix products give the bits of the plain
// triple loops (each element summed in ascending order of the summed index),
// at shapes that are and are not multiples of the blocks; the larger shapes
// are split over threads where there are several cores.
#include "runtime/cpu/Kernels.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace mhcc::runtime {
namespace {

namespace k = kernels;

template <typename T> std::vector<T> random(int64_t count, std::mt19937 &rng) {
  std::normal_distribution<double> normal;
  std::vector<T> v(count);
  for (T &x : v)
    x = T(normal(rng));
  return v;
}

// The reference loops (the kernels before blocking).
template <typename T> void plainMatmul(const T *a, const T *b, T *c, int64_t M, int64_t K, int64_t N) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t kk = 0; kk < K; ++kk)
      for (int64_t j = 0; j < N; ++j)
        c[i * N + j] += a[i * K + kk] * b[kk * N + j];
}
template <typename T> void plainTransA(const T *a, const T *b, T *c, int64_t M, int64_t K, int64_t N) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t kk = 0; kk < K; ++kk)
      for (int64_t j = 0; j < N; ++j)
        c[kk * N + j] += a[i * K + kk] * b[i * N + j];
}
template <typename T> void plainTransB(const T *a, const T *b, T *c, int64_t M, int64_t N, int64_t K) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t kk = 0; kk < K; ++kk) {
      T sum = 0;
      for (int64_t j = 0; j < N; ++j)
        sum += a[i * N + j] * b[kk * N + j];
      c[i * K + kk] += sum;
    }
}

template <typename T> bool sameBits(const std::vector<T> &x, const std::vector<T> &y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
}

template <typename T> void checkShapes() {
  std::mt19937 rng(7);
  // M K N: below and above the row block, the 2x-row-block threshold of
  // a b^T, and the 512-column block; a few large enough to use threads.
  const int64_t shapes[][3] = {{1, 5, 3},    {3, 7, 9},     {7, 64, 33},    {8, 1, 1},     {9, 513, 17},
                               {13, 17, 1030}, {64, 600, 700}, {130, 96, 520}, {257, 300, 64}};
  for (const auto &s : shapes) {
    const int64_t M = s[0], K = s[1], N = s[2];
    SCOPED_TRACE(testing::Message() << M << " x " << K << " x " << N);
    auto a = random<T>(M * K, rng), b = random<T>(K * N, rng), g = random<T>(M * N, rng);
    auto c0 = random<T>(M * N, rng);
    std::vector<T> expected = c0, got = c0;
    plainMatmul(a.data(), b.data(), expected.data(), M, K, N);
    k::matmul(a.data(), b.data(), got.data(), M, K, N, /*accumulate=*/true);
    EXPECT_TRUE(sameBits(expected, got)) << "a b";
    auto w0 = random<T>(K * N, rng);
    expected = w0, got = w0;
    plainTransA(a.data(), g.data(), expected.data(), M, K, N);
    k::matmulTransAAcc(a.data(), g.data(), got.data(), M, K, N);
    EXPECT_TRUE(sameBits(expected, got)) << "a^T b";
    auto x0 = random<T>(M * K, rng);
    expected = x0, got = x0;
    plainTransB(g.data(), b.data(), expected.data(), M, N, K);
    k::matmulTransBAcc(g.data(), b.data(), got.data(), M, N, K);
    EXPECT_TRUE(sameBits(expected, got)) << "a b^T";
  }
}

TEST(CpuProducts, BlockedEqualsPlainLoopsInFloat) { checkShapes<float>(); }
TEST(CpuProducts, BlockedEqualsPlainLoopsInDouble) { checkShapes<double>(); }

} // namespace
} // namespace mhcc::runtime
