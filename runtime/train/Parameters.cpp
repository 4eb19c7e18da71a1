//===- Parameters.cpp - initial parameter values ----------------------------===//
#include "runtime/train/Parameters.h"

#include "runtime/cpu/Parallel.h"
#include "runtime/data/Dataset.h"

#include <cmath>

#include <xxhash.h>

namespace mhcc::runtime {

std::vector<float> initialParameter(const ParamInfo &info, int64_t seed) {
  std::vector<float> values(info.count());
  const uint64_t stream = mix64(uint64_t(seed) ^ XXH3_64bits(info.name.data(), info.name.size()));
  auto uniform = [&](uint64_t counter) { // in (0, 1]
    return (double(mix64(stream + counter) >> 11) + 1.0) * 0x1.0p-53;
  };
  enum { Normal, Xavier, Ones, Constant, Zeros } kind =
      info.init == "normal" ? Normal : info.init == "xavier_uniform" ? Xavier : info.init == "ones" ? Ones
      : info.init == "constant" ? Constant : Zeros;
  // Each element depends on its index alone, so any split gives the same bits.
  auto fill = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      double v = 0;
      switch (kind) {
      case Normal: {
        double u1 = uniform(2 * i), u2 = uniform(2 * i + 1);
        v = info.scale * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
        break;
      }
      case Xavier:
        v = info.scale * (2.0 * uniform(i) - 1.0);
        break;
      case Ones:
        v = 1.0;
        break;
      case Constant:
        v = info.scale;
        break;
      case Zeros:
        break;
      }
      values[i] = static_cast<float>(v);
    }
  };
  // A normal sample (log, sqrt, cos) costs about as much as 16 multiply-adds.
  parallelFor(static_cast<int64_t>(values.size()), 16, [&](int64_t begin, int64_t end) { fill(begin, end); });
  return values;
}

} // namespace mhcc::runtime
