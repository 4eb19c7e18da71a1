//===- Dtype.h - how a tensor's elements are stored -----------------*- C++ -*-===//
#ifndef MHCC_RUNTIME_PROGRAM_DTYPE_H
#define MHCC_RUNTIME_PROGRAM_DTYPE_H

#include <cstdint>
#include <string>

namespace mhcc::runtime {

/// Storage of a value (docs/precision.md): a GPU stores bf16 in two bytes;
/// the CPU reference backend stores every value as a float, rounded to bf16
/// where the dtype says so.
enum class Dtype : uint8_t { F32, BF16 };

inline Dtype dtypeOf(const std::string &name) { return name == "bf16" ? Dtype::BF16 : Dtype::F32; }
inline int64_t dtypeBytes(Dtype d) { return d == Dtype::BF16 ? 2 : 4; }

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_PROGRAM_DTYPE_H
