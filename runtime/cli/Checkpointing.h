//===- Checkpointing.h - mhcrun's saves, overlapped with training --*- C++ -*-===//
//
// A save copies the weights and moments to the host between two steps (the
// only part training waits for), then writes the files on a background
// thread while the next steps run. One save is in flight at a time: the
// next one (or the end of the run) waits for it, and only then reports its
// cost, so the log lines never interleave.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CLI_CHECKPOINTING_H
#define MHCC_RUNTIME_CLI_CHECKPOINTING_H

#include "runtime/io/Checkpoint.h"
#include "runtime/train/Trainer.h"

#include <string>
#include <thread>

namespace mhcc::runtime {

class Checkpointer {
public:
  /// `shard`: this process's part of each save (all of it, or with one
  /// process a rank what the rank holds).
  Checkpointer(std::string dir, TrainOptions options, CheckpointShard shard, bool speaker)
      : dir_(std::move(dir)), options_(std::move(options)), shard_(shard), speaker_(speaker) {}
  ~Checkpointer() { finish(); }

  /// Copies the trainer's state to the host and starts writing it as
  /// iteration trainer.stepsDone(); false and `error` when the copy or the
  /// previous write failed.
  bool save(Trainer &trainer, std::string &error);
  /// Waits for the write in flight; false and `error` if it failed.
  bool finish(std::string *error = nullptr);

private:
  std::string dir_;
  TrainOptions options_;
  CheckpointShard shard_;
  bool speaker_;
  std::thread writer_;
  std::string writeError_; // set by the writer thread, read after join
  double writeMs_ = 0, copyMs_ = 0;
  int64_t iteration_ = 0;
};

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CLI_CHECKPOINTING_H
