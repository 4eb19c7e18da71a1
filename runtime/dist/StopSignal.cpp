//===- StopSignal.cpp - SIGTERM / SIGINT as a request to stop -----------------===//
#include "runtime/dist/StopSignal.h"

#include <csignal>

namespace mhcc::runtime {
namespace {
volatile sig_atomic_t gSignal = 0;
// Only the first signal counts: a second Ctrl-C does not change what is reported.
extern "C" void recordSignal(int signal) {
  if (!gSignal)
    gSignal = signal;
}
} // namespace

void installStopHandler() {
  struct sigaction action = {};
  action.sa_handler = recordSignal;
  sigemptyset(&action.sa_mask);
  // SA_RESTART: a write or read interrupted by the signal resumes; the loop
  // looks at the flag between iterations, never inside a step.
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

int stopSignal() { return gSignal; }

const char *stopSignalName(int signal) {
  switch (signal) {
  case SIGTERM:
    return "SIGTERM";
  case SIGINT:
    return "SIGINT";
  default:
    return "a signal";
  }
}

} // namespace mhcc::runtime
