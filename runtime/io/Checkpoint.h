//===- Checkpoint.h - Megatron-style checkpoints by parameter name -*- C++ -*-===//
//
// DIR/iter_0000010/ holds model.safetensors (fp32 master weights, one tensor
// per parameter name), optim.safetensors (NAME.exp_avg, NAME.exp_avg_sq) and
// meta.json (iteration, model hash, the parameter table, optimizer
// settings, the XXH3-64 of every other file); DIR/latest_checkpointed_iteration.txt
// names the newest. Everything is stored by parameter name, never by rank,
// so a checkpoint saved under one pipeline layout loads under any other.
//
// A save writes into DIR/iter_N.tmp (iter_N.tmp-TOKEN in a multi-process
// run: CheckpointShard::runToken), fsyncs every file, renames the folder,
// fsyncs DIR, then replaces the pointer through a temporary and a rename:
// a process killed at any moment leaves the previous checkpoint loadable.
// In a multi-process run every rank writes a shard of what it holds
// (model-rankR.safetensors, optim-rankR.safetensors) and rank 0, once every
// shard is announced, writes meta.json and publishes the folder. Where a
// rank holds only pieces of a tensor (its tensor rank's block, its part of
// a distributed optimizer's moments or masters) its shard stores each piece
// as a tensor of its own, listed with its place in the whole under the
// file's "mhcc_pieces" metadata (Megatron's distributed checkpoints keep
// such offsets too); a load puts the pieces together and checks that they
// hold every element exactly once. So the folder still loads under any
// layout and mesh.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_IO_CHECKPOINT_H
#define MHCC_RUNTIME_IO_CHECKPOINT_H

#include "runtime/artifact/Artifact.h"
#include "runtime/exec/Device.h"
#include "runtime/exec/StepTypes.h"

#include <cstdint>
#include <string>

namespace mhcc::runtime {

/// Which part of the parameters this process writes: all (size 1), or what
/// rank `rank` of a `size`-process run holds.
struct CheckpointShard {
  int64_t rank = 0, size = 1;
  double timeoutSeconds = 600; // rank 0's wait for the other shards
  /// The same in every process of one run, different in the next (rank 0's
  /// random bytes, broadcast at start-up): the ranks of a multi-process
  /// save meet in DIR/iter_N.tmp-TOKEN, so the shards and markers a killed
  /// run left in its own folder are never mistaken for this run's.
  std::string runToken;
};

/// "DIR/iter_0000010".
std::string checkpointFolder(const std::string &dir, int64_t iteration);

/// Saves `state` (the entries this process filled: all, or what its rank
/// holds, whole or in the pieces `state` names) as iteration `iteration`.
/// False and `error` (one line naming the file) on failure; the previous
/// checkpoint is untouched then.
bool saveCheckpoint(const std::string &dir, int64_t iteration, const Artifact &a, const TrainOptions &options,
                    const ParameterState &state, const CheckpointShard &shard, std::string &error);

/// Loads DIR's latest checkpoint (or DIR itself when it is an iteration
/// folder): verifies every file's checksum, the model hash and every
/// parameter's shape, then fills all of `state` and `iteration`.
bool loadCheckpoint(const std::string &dir, const Artifact &a, ParameterState &state, int64_t &iteration,
                    std::string &error);

/// The fp32 weights alone, by parameter name (--export-safetensors).
bool exportWeights(const std::string &path, const Artifact &a, const ParameterState &state, int64_t iteration,
                   std::string &error);
/// Reads weights written by exportWeights (or any safetensors file with an
/// F32 tensor of the right shape for every parameter) into state.weights;
/// the moments stay empty (a fresh optimizer).
bool importWeights(const std::string &path, const Artifact &a, ParameterState &state, std::string &error);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_IO_CHECKPOINT_H
