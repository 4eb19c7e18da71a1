//===- Bf16.h - rounding to bfloat16, as the GPU stores it ---------*- C++ -*-===//
//
// The CPU reference backend keeps bf16 tensors in float buffers whose every
// element is a bf16 value: written through roundToBf16, which rounds to
// nearest, ties to even, exactly as CUDA's __float2bfloat16_rn (overflow
// to infinity, NaN stays NaN). Products of two bf16 values are exact in
// fp32, so a product over bf16 operands accumulated in fp32 is what the
// tensor cores compute up to the summation order.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CPU_BF16_H
#define MHCC_RUNTIME_CPU_BF16_H

#include <cstdint>
#include <cstring>

namespace mhcc::runtime {

inline float roundToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    bits = (bits | 0x00400000u) & 0xffff0000u; // a quiet NaN, sign kept
  } else {
    bits += 0x7fffu + ((bits >> 16) & 1u); // to nearest, ties to even
    bits &= 0xffff0000u;
  }
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

/// The bf16 bits of the float whose bits are `bits`, rounded as
/// roundToBf16 rounds it (what a GPU stores for it).
inline uint16_t bf16BitsOf(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  x = roundToBf16(x);
  std::memcpy(&bits, &x, sizeof bits);
  return uint16_t(bits >> 16);
}

/// Rounds `count` floats in place (the CPU kernels' storage hook).
inline void roundBf16(float *data, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    data[i] = roundToBf16(data[i]);
}

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CPU_BF16_H
