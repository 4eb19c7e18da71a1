//===- TestFaults.h - the fault tests' hooks into a rank ---------*- C++ -*-===//
//
// For the fault tests only (tests/runtime/rank_loss_test.sh, the GPU suite's
// faults part): MHCC_TEST_KILL_RANK_AT / MHCC_TEST_HANG_RANK_AT /
// MHCC_TEST_STOP_RANK_AT = "R:K" make rank R SIGKILL itself, sleep forever,
// or SIGSTOP itself (no progress, no heartbeat), at the first exchange of the K-th
// step its process runs (a CPU process: once that exchange completed, so
// that its peers are in the step too): a rank lost or stuck mid-step. MHCC_TEST_SLOW_RANK =
// "R:MS": rank R sleeps MS milliseconds before every instruction, a slow rank
// that progresses. A rank that is a thread of the CPU backend's one process
// honours only the hang (at its K-th step's first forward, until the run
// fails: a thread cannot be killed alone) and the slowness. Unset, every
// hook is a comparison with -1.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_EXEC_TESTFAULTS_H
#define MHCC_RUNTIME_EXEC_TESTFAULTS_H

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace mhcc::runtime {

class TestFaults {
public:
  explicit TestFaults(int64_t rank)
      : killAt_(step("MHCC_TEST_KILL_RANK_AT", rank)), hangAt_(step("MHCC_TEST_HANG_RANK_AT", rank)),
        stopAt_(step("MHCC_TEST_STOP_RANK_AT", rank)), slowMs_(step("MHCC_TEST_SLOW_RANK", rank)) {}

  /// At an exchange of step `stepsRun` (1-based, counted by this process).
  void atExchange(int64_t stepsRun) const {
    if (stepsRun == killAt_)
      std::raise(SIGKILL);
    if (stepsRun == stopAt_)
      std::raise(SIGSTOP);
    if (stepsRun == hangAt_)
      while (true)
        std::this_thread::sleep_for(std::chrono::hours(1));
  }
  /// Whether a thread rank hangs at its `stepsRun`-th step (it does so itself).
  bool hangsAt(int64_t stepsRun) const { return stepsRun == hangAt_; }
  /// Before an instruction.
  void slowDown() const {
    if (slowMs_ > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(slowMs_));
  }

private:
  static int64_t step(const char *name, int64_t rank) {
    const char *value = std::getenv(name);
    long long r = -1, k = -1;
    if (!value || std::sscanf(value, "%lld:%lld", &r, &k) != 2 || r != rank)
      return -1;
    return k;
  }
  int64_t killAt_, hangAt_, stopAt_, slowMs_;
};

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_EXEC_TESTFAULTS_H
