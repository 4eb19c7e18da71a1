//===- CpuDevice.h - the CPU reference backend's Device ------------*- C++ -*-===//
//
// One thread per pipeline rank in this process. Ranks share a CpuWorld: the
// weights (one copy, read by every rank), the in-memory channels with NCCL's
// semantics (a FIFO per directed pair; sends never block; receives wait,
// with a deadline instead of a hang) and the optimizer, which runs once all
// ranks have finished their lists (runtime/train/Optimizer.h, on the host).
// Kernels: runtime/cpu/Kernels.h through StageExecutor.h, plain loops in a
// fixed order. Same artifact, seed and data: the same bits, whatever the
// layout.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CPU_CPUDEVICE_H
#define MHCC_RUNTIME_CPU_CPUDEVICE_H

#include "runtime/exec/Device.h"

namespace mhcc::runtime {

/// One device per pipeline rank, all in this process and sharing one world.
DeviceFactory cpuDevices();

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CPU_CPUDEVICE_H
