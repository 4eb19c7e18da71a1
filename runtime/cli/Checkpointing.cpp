//===- Checkpointing.cpp - mhcrun's saves, overlapped with training --------===//
#include "runtime/cli/Checkpointing.h"

#include <chrono>
#include <cstdio>
#include <memory>

namespace mhcc::runtime {

using Clock = std::chrono::steady_clock;

bool Checkpointer::finish(std::string *error) {
  if (!writer_.joinable())
    return true;
  writer_.join();
  if (!writeError_.empty()) {
    if (error)
      *error = "saving iteration " + std::to_string(iteration_) + ": " + writeError_;
    writeError_.clear();
    return false;
  }
  if (speaker_)
    std::printf("mhcrun: saved %s (copy to host %.1f ms, blocking; write %.1f ms, in the background)\n",
                checkpointFolder(dir_, iteration_).c_str(), copyMs_, writeMs_);
  return true;
}

bool Checkpointer::save(Trainer &trainer, std::string &error) {
  const auto start = Clock::now();
  auto state = std::make_shared<ParameterState>();
  if (!trainer.saveState(*state, error))
    return false;
  const double copyMs = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  if (!finish(&error))
    return false;
  copyMs_ = copyMs;
  iteration_ = trainer.stepsDone();
  const Artifact &a = trainer.artifact();
  writer_ = std::thread([this, state, &a] {
    const auto begin = Clock::now();
    std::string error;
    if (!saveCheckpoint(dir_, iteration_, a, options_, *state, shard_, error))
      writeError_ = error;
    writeMs_ = std::chrono::duration<double, std::milli>(Clock::now() - begin).count();
  });
  return true;
}

} // namespace mhcc::runtime
