//===- Parallel.h - deterministic row-parallel loops for the CPU kernels -*- C++ -*-===//
//
// Splits independent items (rows of a product, heads of an attention) over
// threads. Every item is computed by one thread in the same order as the
// serial loop, so results are bit-identical whatever the thread count.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CPU_PARALLEL_H
#define MHCC_RUNTIME_CPU_PARALLEL_H

#include <cstdint>
#include <functional>

namespace mhcc::runtime {

/// Runs body(begin, end) over contiguous chunks of [0, items); in the
/// calling thread alone when items * costPerItem is small (threads cost
/// tens of microseconds) or MHCC_CPU_THREADS=1.
void parallelFor(int64_t items, int64_t costPerItem, const std::function<void(int64_t, int64_t)> &body);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CPU_PARALLEL_H
