//===- AutoPartition.h - cost-balanced pipeline partition ----------*- C++ -*-===//
//
// Splits a model's units (embedding, each transformer layer, the loss with
// its MTP modules) into p*v contiguous virtual stages so that the slowest
// stage is as fast as possible while every stage fits a memory cap: the
// dynamic program of Alpa's stage construction, on a chain. Plain C++.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_PASSES_PIPELINE_AUTOPARTITION_H
#define MHCC_PASSES_PIPELINE_AUTOPARTITION_H

#include "passes/pipeline/Layout.h"

#include <optional>
#include <string>
#include <vector>

namespace mhcc::pipeline {

/// One indivisible piece of the chain, in forward order.
struct PartitionUnit {
  char symbol = 't';        // 'E', 't' or 'L' (L carries its MTP modules)
  int64_t mtpModules = 0;   // for 'L'
  double time = 0;          // forward + backward of one microbatch, any unit
  double parameterBytes = 0; // weights, gradients and optimizer state
  double activationBytes = 0; // kept from forward to backward, one microbatch
  /// Under activation recomputation (activationBytes then holds only the
  /// checkpoints): what its last sublayer and its largest sublayer drop,
  /// one microbatch. A stage keeps its last sublayer whole (the runtime
  /// never drops a stage's last segment), in every microbatch in flight,
  /// and a backward holds one sublayer's working set at a time.
  double lastSublayerDrop = 0, largestSublayerDrop = 0;
};

struct PartitionRequest {
  int64_t pp = 1;
  int64_t vpp = 1;
  /// Bytes one virtual stage may use: parameters plus the activations of the
  /// microbatches in flight (at most p under 1F1B). <= 0: no cap.
  double memoryCapBytes = 0;
};

struct PartitionResult {
  Layout layout;
  std::vector<double> stageTimes;
  std::vector<double> stageBytes;
  double slowestStage = 0;
};

/// Returns the partition minimizing the slowest stage's time under the cap;
/// ties go to the partition whose earlier stages are fuller. Empty stages are
/// allowed where there are more stages than units, except the first (it holds
/// E) and the last (it holds L).
std::optional<PartitionResult> partitionChain(const std::vector<PartitionUnit> &units,
                                              const PartitionRequest &request,
                                              std::string &error);

} // namespace mhcc::pipeline

#endif // MHCC_PASSES_PIPELINE_AUTOPARTITION_H
