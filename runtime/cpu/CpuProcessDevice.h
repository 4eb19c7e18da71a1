//===- CpuProcessDevice.h - one CPU rank per process ----------------*- C++ -*-===//
//
// The CPU backend with one process per rank of the mesh (mhcrun --processes
// pp x dp, or mpirun / srun with --backend cpu): the same kernels and launch
// table as CpuDevice (StageExecutor.h), channels carried between processes
// by a SocketMesh. Bits equal the in-process CPU run: every rank keeps a copy
// of every weight; a data-parallel ALLREDUCE sends the replicas' gradients to
// replica 0's rank, which adds them in replica order; at the end of a step
// each rank sends its losses and peak memory (replica 0's ranks also their
// stages' slot gradients) to rank 0, which runs the same
// completeStep (Optimizer.h) as CpuWorld over the same arrays in the same
// order, then sends every rank the updated weights and the step's numbers.
// The gather also carries each rank's stop signal, so all stop together.
// Each instruction, exchange and message counts as the rank's progress,
// which the mesh's heartbeats carry to the peers: a rank waited on is
// declared stuck only when it stops progressing (SocketMesh.h).
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CPU_CPUPROCESSDEVICE_H
#define MHCC_RUNTIME_CPU_CPUPROCESSDEVICE_H

#include "runtime/exec/Device.h"

#include <string>

namespace mhcc::runtime {

/// This process's one rank of `size` (the artifact's pp); sockets meet in
/// `socketDir` (one host).
DeviceFactory cpuProcessDevice(int64_t rank, int64_t size, std::string socketDir);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CPU_CPUPROCESSDEVICE_H
