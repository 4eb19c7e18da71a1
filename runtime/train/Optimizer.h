//===- Optimizer.h - gradient reduction and the optimizer step -----*- C++ -*-===//
//
// Shared by every backend so that all of them update weights identically:
// each parameter's gradient is the sum of its uses' gradients in model order
// (layout-independent), the global norm is accumulated in double in table
// order, clipping and AdamW / SGD run in fp32 on the host.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_TRAIN_OPTIMIZER_H
#define MHCC_RUNTIME_TRAIN_OPTIMIZER_H

#include "runtime/artifact/Artifact.h"
#include "runtime/exec/StepTypes.h"

#include <functional>
#include <vector>

namespace mhcc::runtime {

struct ReducedGradients {
  std::vector<std::vector<float>> grads; // by parameter
  double norm = 0;
  int64_t numZeros = 0;
};

/// slotGrads[stage][slot]: one host buffer per parameter use. `reduced`'s
/// buffers are reused from step to step: a fresh 0.6 GB gradient cost
/// seconds of page faults a step at C = 7168.
void reduceGradients(const Artifact &artifact, const std::vector<std::vector<const float *>> &slotGrads,
                     ReducedGradients &reduced);

/// The per-step scalars of the update, computed once on the host so that
/// every backend (and every rank) uses the same float values.
struct OptimizerScalars {
  float clip = 1.0f;      // multiplies every gradient
  double lr = 0;          // after warmup
  float beta1 = 0, beta2 = 0, eps = 0;
  float correction1 = 1, correction2 = 1; // Adam bias corrections
  bool sgd = false;
};
OptimizerScalars optimizerScalars(const TrainOptions &options, int64_t step, double gradNorm);

/// Adam's moments of a parameter's elements [begin, end): m[0] and v[0]
/// are element begin's.
struct MomentRange {
  int64_t begin = 0, end = 0;
  float *m = nullptr, *v = nullptr;
};
/// The ranges that together cover parameter p: the whole of it, or the
/// data-parallel replicas' shards under the distributed optimizer.
using MomentRanges = std::function<std::vector<MomentRange>(size_t param)>;
/// Whole-parameter moments, adamM[p] and adamV[p].
MomentRanges wholeMoments(std::vector<std::vector<float>> &adamM, std::vector<std::vector<float>> &adamV);

/// Clips by the global norm and applies AdamW or SGD for step `step`
/// (1-based), range by range; every element's update is the same
/// arithmetic however the moments are split. Returns the learning rate used.
double applyOptimizer(const Artifact &artifact, const TrainOptions &options, int64_t step,
                      ReducedGradients &reduced, std::vector<std::vector<float>> &weights,
                      const MomentRanges &moments);

/// Everything a backend does once its ranks finished step `result.step`:
/// losses into `result`, gradients reduced (and recorded with recordTaps),
/// norm, zeros, then the optimizer update of `weights`.
/// `reduced`: the reduced gradients' buffers, kept by the caller between steps.
void completeStep(const Artifact &artifact, const TrainOptions &options,
                  const std::vector<std::vector<double>> &losses,
                  const std::vector<std::vector<const float *>> &slotGrads,
                  std::vector<std::vector<float>> &weights, const MomentRanges &moments, ReducedGradients &reduced,
                  StepResult &result);

/// The step's "lm loss" and "mtp loss": means over microbatches (and MTP
/// modules) of the last stage's losses[mb][k], summed in microbatch order.
void summarizeLosses(const StageProgram &last, const std::vector<std::vector<double>> &losses,
                     StepResult &result);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_TRAIN_OPTIMIZER_H
