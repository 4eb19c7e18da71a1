//===- Optimizer.cpp - gradient reduction and the optimizer step -------------===//
#include "runtime/train/Optimizer.h"

#include "runtime/cpu/Parallel.h"

#include <algorithm>
#include <cmath>

namespace mhcc::runtime {

void reduceGradients(const Artifact &a, const std::vector<std::vector<const float *>> &slotGrads,
                     ReducedGradients &reduced) {
  std::vector<std::vector<std::pair<int64_t, const float *>>> uses(a.params.size());
  for (size_t s = 0; s < a.stages.size(); ++s)
    for (size_t k = 0; k < a.stages[s].params.size(); ++k) {
      const ParamSlot &slot = a.stages[s].params[k];
      uses[slot.param].push_back({slot.useOrder, slotGrads[s][k]});
    }
  reduced.grads.resize(a.params.size());
  reduced.numZeros = 0;
  double squares = 0;
  for (size_t p = 0; p < a.params.size(); ++p) {
    std::sort(uses[p].begin(), uses[p].end(),
              [](const auto &x, const auto &y) { return x.first < y.first; });
    std::vector<float> &g = reduced.grads[p];
    g.resize(a.params[p].count()); // every element is written below, or zeroed for a parameter without uses
    if (uses[p].empty())
      std::fill(g.begin(), g.end(), 0.0f);
    // Elements are independent (each adds its uses in order): split them over
    // threads. The norm's sum below stays one sequential sum.
    parallelFor(int64_t(g.size()), int64_t(uses[p].size()), [&](int64_t begin, int64_t end) {
      for (size_t u = 0; u < uses[p].size(); ++u)
        for (int64_t e = begin; e < end; ++e)
          g[e] = u == 0 ? uses[p][u].second[e] : g[e] + uses[p][u].second[e];
    });
    for (float v : g) {
      squares += double(v) * double(v);
      reduced.numZeros += v == 0.0f;
    }
  }
  reduced.norm = std::sqrt(squares);
}

OptimizerScalars optimizerScalars(const TrainOptions &options, int64_t step, double gradNorm) {
  OptimizerScalars k;
  if (options.clipGrad > 0 && gradNorm > options.clipGrad)
    k.clip = static_cast<float>(options.clipGrad / (gradNorm + 1e-6));
  k.lr = options.lr;
  if (options.warmupSteps > 0)
    k.lr *= std::min(1.0, double(step) / double(options.warmupSteps));
  k.sgd = options.optimizer == "sgd";
  k.beta1 = float(options.beta1);
  k.beta2 = float(options.beta2);
  k.eps = float(options.adamEps);
  k.correction1 = float(1.0 - std::pow(options.beta1, double(step)));
  k.correction2 = float(1.0 - std::pow(options.beta2, double(step)));
  return k;
}

MomentRanges wholeMoments(std::vector<std::vector<float>> &adamM, std::vector<std::vector<float>> &adamV) {
  return [&adamM, &adamV](size_t p) {
    return std::vector<MomentRange>{{0, int64_t(adamM[p].size()), adamM[p].data(), adamV[p].data()}};
  };
}

double applyOptimizer(const Artifact &a, const TrainOptions &options, int64_t step,
                      ReducedGradients &reduced, std::vector<std::vector<float>> &weights,
                      const MomentRanges &moments) {
  const OptimizerScalars k = optimizerScalars(options, step, reduced.norm);
  const float lrF = static_cast<float>(k.lr), clip = k.clip;
  auto &grads = reduced.grads;
  // Every element's update is independent: threads split them, the bits
  // are the serial loop's.
  if (k.sgd) {
    for (size_t p = 0; p < a.params.size(); ++p)
      parallelFor(int64_t(grads[p].size()), 4, [&](int64_t begin, int64_t end) {
        for (int64_t e = begin; e < end; ++e)
          weights[p][e] -= lrF * (grads[p][e] * clip);
      });
    return k.lr;
  }
  const float b1 = k.beta1, b2 = k.beta2, eps = k.eps, c1 = k.correction1, c2 = k.correction2;
  for (size_t p = 0; p < a.params.size(); ++p) {
    const float decay = a.params[p].decay ? float(options.weightDecay) : 0.0f;
    for (const MomentRange &range : moments(p))
      parallelFor(range.end - range.begin, 16, [&](int64_t begin, int64_t end) {
        for (int64_t e = range.begin + begin; e < range.begin + end; ++e) {
          float g = grads[p][e] * clip;
          float &mm = range.m[e - range.begin], &vv = range.v[e - range.begin], &w = weights[p][e];
          mm = b1 * mm + (1.0f - b1) * g;
          vv = b2 * vv + (1.0f - b2) * g * g;
          float update = (mm / c1) / (std::sqrt(vv / c2) + eps);
          w -= lrF * (update + decay * w);
        }
      });
  }
  return k.lr;
}

void summarizeLosses(const StageProgram &last, const std::vector<std::vector<double>> &losses,
                     StepResult &result) {
  int lmCount = 0, mtpCount = 0;
  double lm = 0, mtp = 0;
  for (const auto &perMicrobatch : losses)
    for (size_t l = 0; l < last.losses.size(); ++l) {
      if (last.losses[l].name == "mtp loss") {
        mtp += perMicrobatch[l];
        ++mtpCount;
      } else {
        lm += perMicrobatch[l];
        ++lmCount;
      }
    }
  result.lmLoss = lmCount ? lm / lmCount : 0;
  if (mtpCount)
    result.mtpLoss = mtp / mtpCount;
}

void completeStep(const Artifact &a, const TrainOptions &options, const std::vector<std::vector<double>> &losses,
                  const std::vector<std::vector<const float *>> &slotGrads, std::vector<std::vector<float>> &weights,
                  const MomentRanges &moments, ReducedGradients &reduced, StepResult &result) {
  summarizeLosses(a.stages.back(), losses, result);
  reduceGradients(a, slotGrads, reduced);
  result.gradNorm = reduced.norm;
  result.numZeros = reduced.numZeros;
  if (options.recordTaps)
    for (size_t p = 0; p < a.params.size(); ++p)
      result.paramGrads[a.params[p].name] = reduced.grads[p];
  result.learningRate = applyOptimizer(a, options, result.step, reduced, weights, moments);
}

} // namespace mhcc::runtime
