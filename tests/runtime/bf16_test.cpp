// roundToBf16 is round to nearest, ties to even (CUDA's __float2bfloat16_rn):
// checked on the edge cases and against a reference that picks the nearer of
// the two neighbouring bf16 values in double arithmetic, over random bit
// patterns of every exponent. The remainders of --store-param-remainders
// (ParamRemainders.h): a settled master's copy is its unsettled copy, only
// ties move (one ulp), and the copy with the low 16 bits gives the settled
// master back exactly, for every low half under high halves of every kind.
#include "runtime/cpu/Bf16.h"
#include "runtime/train/ParamRemainders.h"

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

TEST(ParamRemainders, EveryLowHalfSettlesAndJoinsBackExactly) {
  // High halves: +-1 with an even and an odd mantissa, a subnormal, the
  // largest finite (its copy rounds up to infinity), small and large exponents.
  const uint32_t highs[] = {0x3F80, 0x3F81, 0xBF80, 0xBF81, 0x0000, 0x8000, 0x0001, 0x8001,
                            0x7F7F, 0xFF7F, 0x0080, 0x0081, 0x4B00, 0x4B01, 0x3400, 0xB7FF};
  int ties = 0;
  for (uint32_t high : highs)
    for (uint32_t low = 0; low <= 0xFFFFu; ++low) {
      const uint32_t master = high << 16 | low, settled = settleOffBf16Tie(master);
      ASSERT_EQ(bf16BitsOf(settled), bf16BitsOf(master)) << std::hex << master << ": settling moved the copy";
      if (low == 0x8000u) {
        ++ties;
        ASSERT_EQ(settled, (high & 1u) ? master + 1 : master - 1) << std::hex << master;
      } else {
        ASSERT_EQ(settled, master) << std::hex << master << ": not a tie, yet it moved";
      }
      ASSERT_EQ(settleOffBf16Tie(settled), settled) << std::hex << master << ": settling twice moved it again";
      ASSERT_EQ(joinMaster(bf16BitsOf(settled), uint16_t(settled & 0xFFFFu)), settled) << std::hex << master;
    }
  EXPECT_EQ(ties, 16);
}

TEST(ParamRemainders, RandomMastersJoinBackAndMoveAtMostOneUlp) {
  std::mt19937 rng(11);
  for (int i = 0; i < 2000000; ++i) {
    uint32_t master = rng();
    if (i % 64 == 0)
      master = (master & 0xFFFF0000u) | 0x8000u; // ties, often
    const float x = fromBits(master);
    if (std::isnan(x) || std::isinf(x))
      continue;
    const uint32_t settled = settleOffBf16Tie(master);
    ASSERT_LE(settled > master ? settled - master : master - settled, 1u);
    ASSERT_EQ(joinMaster(bf16BitsOf(settled), uint16_t(settled & 0xFFFFu)), settled) << std::hex << master;
  }
}

} // namespace
} // namespace mhcc::runtime
