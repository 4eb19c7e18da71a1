//===- Model.h - the model's sizes, in one place -------------------*- C++ -*-===//
//
// Filled once from the module's #mhc.config (passes/ModelUnits.cpp,
// modelInfoOf) and read by the cost model, the partitioner, the P2P
// insertion, the lowering and, through the artifact, the runtime. Plain data,
// no MLIR.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_PROGRAM_MODEL_H
#define MHCC_RUNTIME_PROGRAM_MODEL_H

#include <cstdint>
#include <string>

namespace mhcc::runtime {

struct ModelInfo {
  std::string name;
  int64_t vocab = 0, hidden = 0, heads = 0, ffnHidden = 0, seqLen = 0, microBatch = 1;
  int64_t streams = 1, sinkhornIterations = 1; // n, and K
  double gatingFactor = 0.01, normEps = 1e-6;
  std::string dtype = "f32"; // "f32" or "bf16": the model's activations and GEMM operands
  int64_t seed = 0;
  /// Model FLOPs per trained token (forward + backward, the compiler's cost
  /// model; recompute not counted): what TFLOP/s and MFU are computed from.
  double trainingFlopsPerToken = 0;
  /// The residual stream's storage (expand, post-res mix, residual add, and
  /// their gradients) where it differs from dtype: "f32" in a bf16 model
  /// (docs/precision.md); empty: as dtype. Read it through residualStorage().
  std::string residualDtype;

  int64_t tokens() const { return seqLen * microBatch; }
  /// n*C: the width of the residual stream, hence of most pipeline boundaries.
  int64_t residualWidth() const { return streams * hidden; }
  int64_t dtypeBytes() const { return dtype == "bf16" ? 2 : 4; }
  const std::string &residualStorage() const { return residualDtype.empty() ? dtype : residualDtype; }
  int64_t residualBytes() const { return residualStorage() == "bf16" ? 2 : 4; }
  /// n = 1 with the residual stored apart from the activations (fp32 beside
  /// bf16): each sublayer's input u is a one-stream contract of the stream,
  /// a rounding copy (compiler/Lowering.cpp), which the cost model and
  /// measured profiles count in the mixing.
  bool roundsSublayerInput() const { return streams == 1 && residualStorage() != dtype; }
};

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_PROGRAM_MODEL_H
