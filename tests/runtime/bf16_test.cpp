// roundToBf16 is round to nearest, ties to even (CUDA's __float2bfloat16_rn):
// checked on the edge cases and against a reference that picks the nearer of
// the two neighbouring bf16 values in double arithmetic, over random bit
// patterns of every exponent.
#include "runtime/cpu/Bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

namespace mhcc::runtime {
namespace {

uint32_t bitsOf(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}
float fromBits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

/// The nearer of the bf16 values below and above x (ties: even mantissa).
float referenceRound(float x) {
  const uint32_t low = bitsOf(x) & 0xffff0000u;
  if (low == bitsOf(x))
    return x;
  const float down = fromBits(low), up = fromBits(low + 0x10000u); // toward larger magnitude
  const double dDown = std::fabs(double(x) - double(down)), dUp = std::fabs(double(up) - double(x));
  if (dDown != dUp)
    return dDown < dUp ? down : up;
  return (low & 0x10000u) ? up : down;
}

TEST(Bf16, EdgeCases) {
  EXPECT_EQ(roundToBf16(1.0f), 1.0f);
  EXPECT_EQ(roundToBf16(1.0f + std::ldexp(1.0f, -8)), 1.0f); // a tie, to the even 1.0
  EXPECT_EQ(roundToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6)); // a tie, up to even
  EXPECT_EQ(roundToBf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(bitsOf(roundToBf16(-0.0f)), bitsOf(-0.0f));
  EXPECT_TRUE(std::isinf(roundToBf16(std::numeric_limits<float>::max()))); // rounds past the largest bf16
  EXPECT_EQ(roundToBf16(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  const float nan = roundToBf16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(nan));
  EXPECT_TRUE(std::isnan(roundToBf16(fromBits(0x7f800001u)))); // a NaN whose payload sits in the dropped bits
  EXPECT_EQ(roundToBf16(std::numeric_limits<float>::denorm_min()), 0.0f);
}

TEST(Bf16, MatchesTheNearestNeighbourReference) {
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    const float x = fromBits(rng());
    if (std::isnan(x) || std::isinf(x) || std::fabs(x) > 3.3e38f)
      continue; // covered above; the reference's "up" would overflow
    const float got = roundToBf16(x), want = referenceRound(x);
    ASSERT_EQ(bitsOf(got), bitsOf(want)) << "x bits " << std::hex << bitsOf(x);
  }
}

TEST(Bf16, RoundsBuffersInPlaceAndIsIdempotent) {
  float data[3] = {1.00390625f, -3.1415926f, 65504.5f};
  roundBf16(data, 3);
  for (float v : data) {
    EXPECT_EQ(bitsOf(v) & 0xffffu, 0u);
    EXPECT_EQ(roundToBf16(v), v);
  }
}

} // namespace
} // namespace mhcc::runtime
