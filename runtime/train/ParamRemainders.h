//===- ParamRemainders.h - an fp32 master as its bf16 copy and 16 bits --*- C++ -*-===//
//
// mhcrun --store-param-remainders (Megatron's store_param_remainders, Apex's
// DistributedFusedAdam): a bf16 model's GPU keeps each fp32 master weight as
// the bf16 copy its kernels read anyway plus the master's low 16 bits, 2
// bytes a parameter instead of 4. The copy is the master rounded to nearest,
// ties to even, so the master's high half is the copy or the copy minus one
// (it rounded up exactly when the low bits exceed 0x8000, or equal it with
// an odd high half). A master exactly halfway between two bf16 values (low
// bits 0x8000) is the one case 16 bits cannot tell apart: both neighbours'
// halfway points round to the same even copy. Such a master first moves one
// fp32 ulp toward its rounding (settleOffBf16Tie): its copy stays the
// round-to-nearest-even one, the master moves by 2^-24 of itself, about once
// in 65,536 updates. Apex and Transformer Engine instead round those ties
// away from zero in the copy, a bf16 ulp; here the copy keeps the rounding
// every other bf16 store uses (docs/precision.md). Both backends settle
// every master after it changes (the CPU keeps fp32 masters, settled), so
// they hold the same masters.
//
// Bit patterns, host and device alike; infinity passes through, NaN stays
// NaN (its low bits and, on the GPU, its payload not kept).
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_TRAIN_PARAMREMAINDERS_H
#define MHCC_RUNTIME_TRAIN_PARAMREMAINDERS_H

#include <cstdint>

#ifdef __CUDACC__
#define MHCC_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MHCC_HOST_DEVICE inline
#endif

namespace mhcc::runtime {

/// `bits` (an fp32 master) moved one ulp toward its bf16 rounding where it
/// lies exactly halfway between two bf16 values; unchanged elsewhere.
MHCC_HOST_DEVICE uint32_t settleOffBf16Tie(uint32_t bits) {
  if ((bits & 0xFFFFu) != 0x8000u)
    return bits;
  return (bits & 0x10000u) ? bits + 1 : bits - 1; // odd high half: rounds up; even: down
}

/// The master's bits from its bf16 copy (rounded to nearest even from a
/// settled master) and its low 16 bits.
MHCC_HOST_DEVICE uint32_t joinMaster(uint16_t copy, uint16_t low) {
  const uint32_t high = low > 0x8000u ? uint32_t(copy) - 1u : uint32_t(copy);
  return (high << 16) | low;
}

#undef MHCC_HOST_DEVICE

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_TRAIN_PARAMREMAINDERS_H
