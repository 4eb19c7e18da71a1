//===- HostMemory.h - whether the CPU backend's parameters fit the host --*- C++ -*-===//
//
// Without GPUs mhcrun trains on the CPU backend, which keeps every
// parameter's master, moments, copies and gradients in host memory (an
// fp32 float each) and its activations: 1b needs some 20 GiB before its
// first activation. A run that does not fit would be killed by the kernel
// mid-step, or push the machine into swap; mhcrun refuses it at start-up
// instead, naming what it needs and what the host has.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CLI_HOSTMEMORY_H
#define MHCC_RUNTIME_CLI_HOSTMEMORY_H

#include "runtime/artifact/Artifact.h"

#include <cstdint>
#include <optional>
#include <string>

namespace mhcc::runtime {

struct HostMemory {
  int64_t bytes = 0;
  std::string source; // where the figure came from, for the message
};

/// The memory this process may still take: the least of MemAvailable
/// (/proc/meminfo) and its cgroup's limit less its use, the reclaimable
/// page cache not counted (cgroup v2, else v1); MHCC_HOST_MEMORY_BYTES
/// overrides both. Nullopt where neither can be read (no check then).
std::optional<HostMemory> availableHostMemory();

/// The in-process CPU backend's activations at most: on each rank, the
/// forward values and aux of the microbatch-stages its schedule holds at
/// once (a forward until its backward), for every replica, context and
/// tensor rank; with recomputation (segments of `recomputeSegment`
/// sublayers, 0: none) what the dropped segments keep, and the largest
/// segment's while it runs again (runtime/program/Recompute.h). An upper
/// bound: the executor releases a value after its last reader.
int64_t cpuActivationBytes(const Artifact &a, int64_t recomputeSegment);

/// "" when the CPU backend's parameters (hostParameterBytes in one
/// process, hostProcessesParameterBytes with `processes`) and activations
/// fit `available`, else the one-line refusal (without the "mhcrun: "
/// prefix).
std::string hostMemoryProblem(const Artifact &a, const HostMemory &available, int64_t recomputeSegment,
                              bool processes = false);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CLI_HOSTMEMORY_H
