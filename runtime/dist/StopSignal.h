//===- StopSignal.h - SIGTERM / SIGINT as a request to stop ----------*- C++ -*-===//
//
// A training process asked to stop (Slurm's preemption, Ctrl-C, the --gpus
// parent forwarding its own signal) finishes the iteration it is in, saves
// a final checkpoint when --save is given and exits 128 + the signal. The
// handler only records the signal (async-signal-safe); the training loop
// reads it at iteration boundaries. In a multi-process CPU run the ranks
// agree on it through the step's gather (CpuProcessDevice), so every rank
// stops after the same iteration.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_DIST_STOPSIGNAL_H
#define MHCC_RUNTIME_DIST_STOPSIGNAL_H

namespace mhcc::runtime {

/// Records SIGTERM and SIGINT instead of dying; idempotent.
void installStopHandler();
/// The first stop signal this process received since installStopHandler (0: none).
int stopSignal();
/// "SIGTERM", "SIGINT" or "signal N".
const char *stopSignalName(int signal);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_DIST_STOPSIGNAL_H
