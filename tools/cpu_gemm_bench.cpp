// CPU reference matrix products: GFLOP/s of the three products the CPU
// backend uses, at training shapes (rows = tokens of a microbatch). Prints
// numbers; no thresholds. MHCC_CPU_THREADS sets the threads.
//   bazel run -c opt //tools:cpu_gemm_bench -- [M K N]...
#include "runtime/cpu/Kernels.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace k = mhcc::runtime::kernels;

template <typename F> double seconds(F &&f) {
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    auto start = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

int main(int argc, char **argv) {
  std::vector<std::array<int64_t, 3>> shapes = {{1024, 1024, 1024}, {1024, 1024, 4096}, {1024, 4096, 1024}};
  if (argc > 1) {
    shapes.clear();
    for (int i = 1; i + 2 < argc; i += 3)
      shapes.push_back({std::atoll(argv[i]), std::atoll(argv[i + 1]), std::atoll(argv[i + 2])});
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::printf("%-22s %12s %12s %12s  (GFLOP/s, best of 3)\n", "M x K x N", "a b", "a^T b", "a b^T");
  for (auto [M, K, N] : shapes) {
    std::vector<float> a(M * K), b(K * N), c(M * N), at(M * N), w(K * N);
    for (float &x : a)
      x = normal(rng);
    for (float &x : b)
      x = normal(rng);
    for (float &x : at)
      x = normal(rng);
    const double flops = 2.0 * double(M) * double(K) * double(N);
    // c[M,N] = a[M,K] b[K,N];  w[K,N] += a^T at;  a[M,K] += at[M,N] b[K,N]^T
    double forward = seconds([&] { k::matmul(a.data(), b.data(), c.data(), M, K, N); });
    double weights = seconds([&] { k::matmulTransAAcc(a.data(), at.data(), w.data(), M, K, N); });
    double inputs = seconds([&] { k::matmulTransBAcc(at.data(), b.data(), a.data(), M, N, K); });
    std::printf("%6lld x %5lld x %5lld %12.2f %12.2f %12.2f\n", (long long)M, (long long)K, (long long)N,
                flops / forward * 1e-9, flops / weights * 1e-9, flops / inputs * 1e-9);
  }
  return 0;
}
