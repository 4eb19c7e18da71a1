//===- CudaDevice.h - the CUDA backend's Device ---------------------*- C++ -*-===//
//
// One GPU per rank of the mesh: either one process per rank (mhcrun --gpus N,
// mpirun, srun: cudaRankDevice) or every rank in this process on its own
// host thread (cudaDevices: the tests, and mhcrun --in-process, where
// --ranks-per-gpu N lets N ranks share a GPU). A rank's
// kernels (the artifact's generated ones, cuBLAS for products) run on one
// compute stream; messages on one stream per directed rank pair (NCCL: a
// communicator each; the model the schedule verifier checks); memory comes
// from a static plan (the first step recorded through the stream-ordered
// pool, later steps at fixed offsets of one arena) or from the pool. The
// optimizer runs on the GPUs: each parameter's gradient is reduced on its
// owner (the rank of its first use) in model order, the global norm comes
// from one all-reduce of per-parameter statistics, and the owner sends the
// updated weights to the other ranks holding the parameter, so results do
// not depend on the layout. Data-parallel replicas sum their gradients, and
// tensor-parallel ranks (with or without sequence parallelism) their
// partial sums, over one communicator per group (CudaTensorParallel.cpp).
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CUDA_CUDADEVICE_H
#define MHCC_RUNTIME_CUDA_CUDADEVICE_H

#include "runtime/dist/ProcessGroup.h"
#include "runtime/exec/Device.h"

namespace mhcc::runtime {

/// Sets the process environment the CUDA backend needs, unless the user
/// set it: CUDA_DEVICE_MAX_CONNECTIONS=1 (found on H200s: with one host
/// thread per GPU and the CUDA defaults, PP2 once hung in its first step),
/// NCCL_LAUNCH_MODE=PARALLEL (GROUP deadlocks in-process ZB-H1),
/// NCCL_NVLS_ENABLE=0. Call before the first CUDA call.
void prepareCudaEnvironment();

/// Every rank in this process, rank r on GPU r / ranksPerGpu. One rank a
/// GPU talks through NCCL; with ranksPerGpu > 1 every rank's messages are
/// device copies through in-process mailboxes (runtime/cuda/RankLinks.h:
/// the same bits, NCCL not exercised), so pipeline layouts run on fewer
/// GPUs than ranks. The factory fails (one line) when fewer GPUs are
/// visible than the ranks need, when a GPU is not sm_90, or on any CUDA,
/// cuBLAS or NCCL error during setup.
DeviceFactory cudaDevices(int ranksPerGpu = 1);

/// This process is rank `placement.rank` of a multi-process run; rank 0's
/// NCCL ids reach the others through `bootstrap` (both must outlive the
/// factory's call).
DeviceFactory cudaRankDevice(const ProcessPlacement &placement, Bootstrap &bootstrap);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CUDA_CUDADEVICE_H
