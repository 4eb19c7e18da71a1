//===- MhcOps.cpp - mhc dialect operations ----------------------------------===//
//
// Verifiers: every width is checked against n (streams), C, heads, F and V,
// and every activation's leading dimension T against the op's other operands.
//
//===----------------------------------------------------------------------===//
#include "dialects/mhc/IR/MhcOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/TypeUtilities.h"

using namespace mlir;
using namespace mhcc::mhc;

namespace {

/// Checks that `type` is tensor<T x W> and returns W through `width`.
LogicalResult checkMatrix(Operation *op, StringRef what, Type type,
                          int64_t &tokens, int64_t &width) {
  auto tensor = cast<RankedTensorType>(type);
  if (tensor.getRank() != 2 || !tensor.hasStaticShape())
    return op->emitOpError() << what << " must be a static tensor<T x W>, got "
                             << type;
  tokens = tensor.getDimSize(0);
  width = tensor.getDimSize(1);
  return success();
}

LogicalResult checkSameTokens(Operation *op, int64_t expected, int64_t got,
                              StringRef what) {
  if (expected != got)
    return op->emitOpError() << what << " has " << got
                             << " tokens but the op's input has " << expected;
  return success();
}

LogicalResult checkSameElementType(Operation *op, Type a, Type b) {
  if (getElementTypeOrSelf(a) != getElementTypeOrSelf(b))
    return op->emitOpError() << "element types differ: " << a << " vs " << b;
  return success();
}

} // namespace

LogicalResult EmbeddingOp::verify() {
  int64_t tokens, width;
  if (failed(checkMatrix(*this, "result", getResult().getType(), tokens, width)))
    return failure();
  return checkSameTokens(*this, getTokens().getType().getDimSize(0), tokens,
                         "result");
}

LogicalResult ExpandOp::verify() {
  int64_t inTokens, hidden, outTokens, outWidth;
  if (failed(checkMatrix(*this, "input", getInput().getType(), inTokens, hidden)) ||
      failed(checkMatrix(*this, "result", getResult().getType(), outTokens,
                         outWidth)) ||
      failed(checkSameTokens(*this, inTokens, outTokens, "result")) ||
      failed(checkSameElementType(*this, getInput().getType(),
                                  getResult().getType())))
    return failure();
  if (outWidth != int64_t(getStreams()) * hidden)
    return emitOpError() << "result width " << outWidth << " must be n*C = "
                         << int64_t(getStreams()) << "*" << hidden << " = "
                         << int64_t(getStreams()) * hidden;
  return success();
}

LogicalResult ContractOp::verify() {
  int64_t inTokens, width, outTokens, hidden;
  if (failed(checkMatrix(*this, "input", getInput().getType(), inTokens, width)) ||
      failed(checkMatrix(*this, "result", getResult().getType(), outTokens,
                         hidden)) ||
      failed(checkSameTokens(*this, inTokens, outTokens, "result")) ||
      failed(checkSameElementType(*this, getInput().getType(),
                                  getResult().getType())))
    return failure();
  if (width != int64_t(getStreams()) * hidden)
    return emitOpError() << "input width " << width << " must be n*C = "
                         << int64_t(getStreams()) << "*" << hidden << " = "
                         << int64_t(getStreams()) * hidden;
  return success();
}

StringRef HyperConnectionOp::getSublayerKind() {
  for (Operation &op : getBody().front()) {
    if (isa<AttentionOp>(op))
      return "attention";
    if (isa<SwiGluMlpOp>(op))
      return "mlp";
  }
  return "";
}

LogicalResult HyperConnectionOp::verify() {
  int64_t tokens, width;
  if (failed(checkMatrix(*this, "residual", getResidual().getType(), tokens,
                         width)))
    return failure();
  int64_t n = int64_t(getStreams());
  if (width % n != 0)
    return emitOpError() << "residual width " << width
                         << " is not a multiple of streams n = " << n;
  int64_t hidden = width / n;
  auto residualType = cast<RankedTensorType>(getResidual().getType());
  auto sublayerType = RankedTensorType::get({tokens, hidden},
                                            residualType.getElementType());
  Block &body = getBody().front();
  if (body.getNumArguments() != 1 || body.getArgument(0).getType() != sublayerType)
    return emitOpError() << "body must take one argument u of type "
                         << sublayerType << " (the C-wide sublayer input)";
  auto yield = dyn_cast<YieldOp>(body.getTerminator());
  if (!yield)
    return emitOpError() << "body must end in mhc.yield";
  if (yield.getValue().getType() != sublayerType)
    return emitOpError() << "body must yield " << sublayerType << ", got "
                         << yield.getValue().getType();
  if (getSublayerKind().empty())
    return emitOpError() << "body holds neither mhc.attention nor mhc.swiglu_mlp";
  if (!(getGatingFactor().convertToDouble() > 0.0))
    return emitOpError() << "gating_factor must be positive";
  return success();
}

LogicalResult RmsNormOp::verify() {
  int64_t tokens, width;
  if (failed(checkMatrix(*this, "input", getInput().getType(), tokens, width)))
    return failure();
  if (!(getEps().convertToDouble() > 0.0))
    return emitOpError() << "eps must be positive";
  return success();
}

LogicalResult AttentionOp::verify() {
  int64_t tokens, hidden;
  if (failed(checkMatrix(*this, "input", getInput().getType(), tokens, hidden)))
    return failure();
  int64_t heads = int64_t(getNumHeads());
  if (hidden % heads != 0)
    return emitOpError() << "hidden size C = " << hidden
                         << " is not divisible by num_heads = " << heads;
  if ((hidden / heads) % 2 != 0)
    return emitOpError() << "head dimension " << hidden / heads
                         << " must be even for rotary positions";
  if (tokens % int64_t(getSeqLen()) != 0)
    return emitOpError() << "tokens T = " << tokens
                         << " must be a multiple of seq_len = " << int64_t(getSeqLen());
  return success();
}

LogicalResult SwiGluMlpOp::verify() {
  int64_t tokens, hidden;
  return checkMatrix(*this, "input", getInput().getType(), tokens, hidden);
}

LogicalResult LmHeadOp::verify() {
  int64_t inTokens, hidden, outTokens, vocab;
  if (failed(checkMatrix(*this, "input", getInput().getType(), inTokens, hidden)) ||
      failed(checkMatrix(*this, "result", getResult().getType(), outTokens,
                         vocab)) ||
      failed(checkSameTokens(*this, inTokens, outTokens, "result")))
    return failure();
  if (vocab != int64_t(getVocab()))
    return emitOpError() << "result width " << vocab << " must equal vocab = "
                         << int64_t(getVocab());
  return success();
}

LogicalResult CrossEntropyOp::verify() {
  int64_t tokens, vocab;
  if (failed(checkMatrix(*this, "logits", getLogits().getType(), tokens, vocab)))
    return failure();
  if (failed(checkSameTokens(*this, tokens, getLabels().getType().getDimSize(0),
                             "labels")))
    return failure();
  if (getLossName().empty())
    return emitOpError() << "loss_name must not be empty";
  return success();
}

LogicalResult MtpOp::verify() {
  int64_t tokens, width;
  if (failed(checkMatrix(*this, "residual", getResidual().getType(), tokens,
                         width)) ||
      failed(checkSameTokens(*this, tokens, getTokens().getType().getDimSize(0),
                             "tokens")) ||
      failed(checkSameTokens(*this, tokens, getLabels().getType().getDimSize(0),
                             "labels")))
    return failure();
  if (width % int64_t(getStreams()) != 0)
    return emitOpError() << "residual width " << width
                         << " is not a multiple of streams n = " << int64_t(getStreams());
  int64_t hidden = width / int64_t(getStreams());
  if (hidden % int64_t(getNumHeads()) != 0)
    return emitOpError() << "hidden size C = " << hidden
                         << " is not divisible by num_heads = " << int64_t(getNumHeads());
  if (!(getLossWeight().convertToDouble() > 0.0))
    return emitOpError() << "loss_weight must be positive";
  return success();
}

#define GET_OP_CLASSES
#include "dialects/mhc/IR/MhcOps.cpp.inc"
