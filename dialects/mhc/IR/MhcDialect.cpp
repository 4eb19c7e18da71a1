//===- MhcDialect.cpp - mhc dialect -----------------------------------------===//
#include "dialects/mhc/IR/MhcDialect.h"

#include "dialects/mhc/IR/MhcOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mhcc::mhc;

#include "dialects/mhc/IR/MhcDialect.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/mhc/IR/MhcAttrs.cpp.inc"

void MhcDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialects/mhc/IR/MhcOps.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialects/mhc/IR/MhcAttrs.cpp.inc"
      >();
}

LogicalResult ModelConfigAttr::verify(
    function_ref<InFlightDiagnostic()> emitError, int64_t vocab, int64_t hidden,
    int64_t heads, int64_t ffnHidden, int64_t seqLen, int64_t microBatch,
    int64_t streams, int64_t sinkhornIterations, FloatAttr gatingFactor,
    FloatAttr normEps, Type dtype, Type residualDtype, int64_t seed) {
  if (vocab < 2)
    return emitError() << "vocab must be at least 2, got " << vocab;
  if (hidden < 1 || heads < 1 || ffnHidden < 1 || seqLen < 1 || microBatch < 1)
    return emitError() << "hidden, heads, ffn_hidden, seq_len and micro_batch "
                          "must be positive";
  if (hidden % heads != 0)
    return emitError() << "hidden (" << hidden
                       << ") must be divisible by heads (" << heads << ")";
  if ((hidden / heads) % 2 != 0)
    return emitError() << "head dimension hidden/heads = " << hidden / heads
                       << " must be even for rotary positions";
  if (streams < 1)
    return emitError() << "streams (n) must be at least 1, got " << streams;
  if (sinkhornIterations < 1)
    return emitError() << "sinkhorn_iterations must be at least 1, got "
                       << sinkhornIterations;
  auto positiveFinite = [](FloatAttr value) {
    return value && value.getValue().isFiniteNonZero() &&
           !value.getValue().isNegative();
  };
  if (!positiveFinite(gatingFactor))
    return emitError() << "gating_factor must be positive and finite";
  if (!positiveFinite(normEps))
    return emitError() << "norm_eps must be positive and finite";
  if (!dtype.isF32() && !dtype.isBF16())
    return emitError() << "dtype must be f32 or bf16, got " << dtype;
  if (residualDtype && !residualDtype.isF32() && !residualDtype.isBF16())
    return emitError() << "residual_dtype must be f32 or bf16, got " << residualDtype;
  if (residualDtype && residualDtype.isBF16() && dtype.isF32())
    return emitError() << "residual_dtype = bf16 needs dtype = bf16 (an f32 model keeps its residual in f32)";
  if (seed < 0)
    return emitError() << "seed must be non-negative";
  return success();
}
