//===- TensorDump.h - mhcrun --dump-tensors ------------------------*- C++ -*-===//
//
// Writes what an outside reference needs to replay a CPU training run
// (tools/reference/): the initial weights and every microbatch's tokens and
// labels, then after each step the reduced gradients (before clipping), the
// updated weights and the step's losses and gradient norm, as safetensors
// files any NumPy or PyTorch reader opens.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_CLI_TENSORDUMP_H
#define MHCC_RUNTIME_CLI_TENSORDUMP_H

#include "runtime/data/Dataset.h"
#include "runtime/train/Trainer.h"

#include <string>

namespace mhcc::runtime {

/// With `result` null (before the first step): DIR/init.safetensors holds
/// "weight.NAME" for every parameter and "tokens.step<k>.mb<m>" /
/// "labels.step<k>.mb<m>" ([micro_batch, seq_len], int32) for steps 1..steps,
/// with packed documents also "positions.step<k>.mb<m>" and / or
/// "first_keys.step<k>.mb<m>" (StepInputs' positions and firstKeys).
/// After step k: DIR/step<k>.safetensors holds "grad.NAME" (the reduced
/// gradient, needs TrainOptions::recordTaps), "weight.NAME" (after the
/// update) and the float64 scalars "lm_loss", "mtp_loss" (when the model
/// has MTP), "grad_norm" and "learning_rate". The run's optimizer settings
/// are in each header's __metadata__. False and `error` on failure.
bool dumpTensors(const std::string &dir, Trainer &trainer, const TokenDataset &data,
                 const TrainOptions &options, int64_t steps, const StepResult *result, std::string &error);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_CLI_TENSORDUMP_H
