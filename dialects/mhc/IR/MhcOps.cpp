//===- MhcOps.cpp - mhc dialect operations ----------------------------------===//
//
// Verifiers: every width is checked against n (streams), C and V of the
// enclosing function's #mhc.config (the one place the model's sizes live; its
// own verifier ties C to the heads), and every activation's leading dimension
// T against the op's other operands.
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

/// Checks that `type` holds the config's `expected` element type: dtype for
/// activations, residual_dtype for the residual stream.
LogicalResult checkElementType(Operation *op, StringRef what, Type type, Type expected,
                               StringRef configField) {
  if (getElementTypeOrSelf(type) != expected)
    return op->emitOpError() << "element types differ from #mhc.config: " << what << " " << type
                             << " must hold " << expected << " (" << configField << ")";
  return success();
}


/// The #mhc.config of the model function around `op`.
FailureOr<ModelConfigAttr> configOf(Operation *op) {
  for (Operation *parent = op->getParentOp(); parent; parent = parent->getParentOp())
    if (auto config = parent->getAttrOfType<ModelConfigAttr>(kConfigAttrName))
      return config;
  return op->emitOpError() << "must be inside a function carrying #mhc.config ('"
                           << kConfigAttrName << "'), which holds the model's sizes";
}

/// Checks that a width equals a size of the config: "result width 15 must be
/// V = 16".
LogicalResult checkWidth(Operation *op, StringRef what, int64_t width, StringRef size,
                         int64_t expected) {
  if (width != expected)
    return op->emitOpError() << what << " width " << width << " must be " << size << " = "
                             << expected;
  return success();
}

/// Checks that a width is n*C of the config, spelled out in the message.
LogicalResult checkResidualWidth(Operation *op, StringRef what, int64_t width,
                                 ModelConfigAttr config) {
  if (width != config.getResidualWidth())
    return op->emitOpError() << what << " width " << width << " must be n*C = "
                             << config.getStreams() << "*" << config.getHidden() << " = "
                             << config.getResidualWidth();
  return success();
}

} // namespace

LogicalResult EmbeddingOp::verify() {
  int64_t tokens, width;
  FailureOr<ModelConfigAttr> config = configOf(*this);
  if (failed(config) ||
      failed(checkMatrix(*this, "result", getResult().getType(), tokens, width)) ||
      failed(checkSameTokens(*this, getTokens().getType().getDimSize(0), tokens, "result")))
    return failure();
  return checkWidth(*this, "result", width, "C", config->getHidden());
}

LogicalResult ExpandOp::verify() {
  int64_t inTokens, hidden, outTokens, outWidth;
  FailureOr<ModelConfigAttr> config = configOf(*this);
  if (failed(config) ||
      failed(checkMatrix(*this, "input", getInput().getType(), inTokens, hidden)) ||
      failed(checkMatrix(*this, "result", getResult().getType(), outTokens, outWidth)) ||
      failed(checkSameTokens(*this, inTokens, outTokens, "result")) ||
      failed(checkElementType(*this, "input", getInput().getType(), config->getDtype(), "dtype")) ||
      failed(checkElementType(*this, "result", getResult().getType(), config->getResidualElementType(),
                              "residual_dtype")) ||
      failed(checkWidth(*this, "input", hidden, "C", config->getHidden())))
    return failure();
  return checkResidualWidth(*this, "result", outWidth, *config);
}

LogicalResult ContractOp::verify() {
  int64_t inTokens, width, outTokens, hidden;
  FailureOr<ModelConfigAttr> config = configOf(*this);
  if (failed(config) ||
      failed(checkMatrix(*this, "input", getInput().getType(), inTokens, width)) ||
      failed(checkMatrix(*this, "result", getResult().getType(), outTokens, hidden)) ||
      failed(checkSameTokens(*this, inTokens, outTokens, "result")) ||
      failed(checkElementType(*this, "input", getInput().getType(), config->getResidualElementType(),
                              "residual_dtype")) ||
      failed(checkElementType(*this, "result", getResult().getType(), config->getDtype(), "dtype")) ||
      failed(checkResidualWidth(*this, "input", width, *config)))
    return failure();
  return checkWidth(*this, "result", hidden, "C", config->getHidden());
}

StringRef HyperConnectionOp::getSublayerKind() {
  for (Operation &op : getBody().front()) {
    if (isa<AttentionOp>(op))
      return "attention";
    if (isa<GatedDeltaNetOp>(op))
      return "gdn";
    if (isa<SwiGluMlpOp>(op))
      return "mlp";
  }
  return "";
}

LogicalResult HyperConnectionOp::verify() {
  int64_t tokens, width;
  FailureOr<ModelConfigAttr> config = configOf(*this);
  if (failed(config) ||
      failed(checkMatrix(*this, "residual", getResidual().getType(), tokens, width)) ||
      failed(checkResidualWidth(*this, "residual", width, *config)) ||
      failed(checkElementType(*this, "residual", getResidual().getType(), config->getResidualElementType(),
                              "residual_dtype")))
    return failure();
  // The sublayer reads the pre-mix u in the activations' dtype.
  auto sublayerType = RankedTensorType::get({tokens, config->getHidden()}, config->getDtype());
  Block &body = getBody().front();
  if (body.getNumArguments() != 1 || body.getArgument(0).getType() != sublayerType)
    return emitOpError() << "body must take one argument u of type " << sublayerType
                         << " (the C-wide sublayer input)";
  auto yield = dyn_cast<YieldOp>(body.getTerminator());
  if (!yield)
    return emitOpError() << "body must end in mhc.yield";
  if (yield.getValue().getType() != sublayerType)
    return emitOpError() << "body must yield " << sublayerType << ", got "
                         << yield.getValue().getType();
  if (getSublayerKind().empty())
    return emitOpError() << "body holds none of mhc.attention, mhc.gated_delta_net and mhc.swiglu_mlp";
  return success();
}

LogicalResult RmsNormOp::verify() {
  int64_t tokens, width;
  FailureOr<ModelConfigAttr> config = configOf(*this);
  if (failed(config) ||
      failed(checkMatrix(*this, "input", getInput().getType(), tokens, width)) ||
      failed(checkWidth(*this, "input", width, "C", config->getHidden())))
    return failure();
  if (!(getEps().convertToDouble() > 0.0))
    return emitOpError() << "eps must be positive";
  return success();
}

/// A token mixer (attention, Gated DeltaNet) reads [T, C] with T whole
/// sequences: it mixes along each sequence. C, heads and an even head
/// dimension agree: the config's verifier checked them.
static LogicalResult verifyTokenMixer(Operation *op, Type input) {
  int64_t tokens, hidden;
  FailureOr<ModelConfigAttr> config = configOf(op);
  if (failed(config) || failed(checkMatrix(op, "input", input, tokens, hidden)) ||
      failed(checkWidth(op, "input", hidden, "C", config->getHidden())))
    return failure();
  if (tokens % config->getSeqLen() != 0)
    return op->emitOpError() << "tokens T = " << tokens << " must be a multiple of seq_len = "
                             << config->getSeqLen();
  return success();
}

LogicalResult AttentionOp::verify() { return verifyTokenMixer(*this, getInput().getType()); }

LogicalResult GatedDeltaNetOp::verify() { return verifyTokenMixer(*this, getInput().getType()); }

LogicalResult SwiGluMlpOp::verify() {
  int64_t tokens, hidden;
  FailureOr<ModelConfigAttr> config = configOf(*this);
  if (failed(config) || failed(checkMatrix(*this, "input", getInput().getType(), tokens, hidden)))
    return failure();
  return checkWidth(*this, "input", hidden, "C", config->getHidden());
}

LogicalResult LmHeadOp::verify() {
  int64_t inTokens, hidden, outTokens, vocab;
  FailureOr<ModelConfigAttr> config = configOf(*this);
  if (failed(config) ||
      failed(checkMatrix(*this, "input", getInput().getType(), inTokens, hidden)) ||
      failed(checkMatrix(*this, "result", getResult().getType(), outTokens, vocab)) ||
      failed(checkSameTokens(*this, inTokens, outTokens, "result")) ||
      failed(checkWidth(*this, "input", hidden, "C", config->getHidden())))
    return failure();
  return checkWidth(*this, "result", vocab, "V", config->getVocab());
}

LogicalResult CrossEntropyOp::verify() {
  int64_t tokens, vocab;
  FailureOr<ModelConfigAttr> config = configOf(*this);
  if (failed(config) ||
      failed(checkMatrix(*this, "logits", getLogits().getType(), tokens, vocab)) ||
      failed(checkWidth(*this, "logits", vocab, "V", config->getVocab())) ||
      failed(checkSameTokens(*this, tokens, getLabels().getType().getDimSize(0), "labels")))
    return failure();
  if (getLossName().empty())
    return emitOpError() << "loss_name must not be empty";
  return success();
}

LogicalResult MtpOp::verify() {
  int64_t tokens, width;
  FailureOr<ModelConfigAttr> config = configOf(*this);
  if (failed(config) ||
      failed(checkMatrix(*this, "residual", getResidual().getType(), tokens, width)) ||
      failed(checkSameTokens(*this, tokens, getTokens().getType().getDimSize(0), "tokens")) ||
      failed(checkSameTokens(*this, tokens, getLabels().getType().getDimSize(0), "labels")) ||
      failed(checkResidualWidth(*this, "residual", width, *config)) ||
      failed(checkElementType(*this, "residual", getResidual().getType(), config->getResidualElementType(),
                              "residual_dtype")))
    return failure();
  if (!(getLossWeight().convertToDouble() > 0.0))
    return emitOpError() << "loss_weight must be positive";
  return success();
}

#define GET_OP_CLASSES
#include "dialects/mhc/IR/MhcOps.cpp.inc"
