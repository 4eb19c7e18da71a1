//===- Parameters.h - initial parameter values ---------------------*- C++ -*-===//
#ifndef MHCC_RUNTIME_TRAIN_PARAMETERS_H
#define MHCC_RUNTIME_TRAIN_PARAMETERS_H

#include "runtime/artifact/Artifact.h"

#include <vector>

namespace mhcc::runtime {

/// Deterministic initial value of every element of parameter `info`, from
/// the model seed and the parameter's name (not its placement), so every
/// layout and backend starts from the same bits.
std::vector<float> initialParameter(const ParamInfo &info, int64_t seed);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_TRAIN_PARAMETERS_H
