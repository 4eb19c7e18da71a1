//===- ModelUnits.cpp - mhc IR -> cost-model units --------------------------===//
#include "passes/ModelUnits.h"

#include "dialects/mhc/IR/MhcOps.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/FormatVariadic.h"

using namespace mlir;

namespace mhcc {

std::optional<UnitKind> unitKindOf(Operation *op) {
  return llvm::TypeSwitch<Operation *, std::optional<UnitKind>>(op)
      .Case([](mhc::EmbeddingOp) { return UnitKind::Embedding; })
      .Case([](mhc::ExpandOp) { return UnitKind::Expand; })
      .Case([](mhc::HyperConnectionOp o) {
        const StringRef kind = o.getSublayerKind();
        return kind == "attention" ? UnitKind::AttentionSublayer
               : kind == "gdn"     ? UnitKind::GdnSublayer
                                   : UnitKind::MlpSublayer;
      })
      .Case([](mhc::ContractOp) { return UnitKind::Contract; })
      .Case([](mhc::RmsNormOp) { return UnitKind::FinalNorm; })
      .Case([](mhc::LmHeadOp) { return UnitKind::LmHead; })
      .Case([](mhc::CrossEntropyOp) { return UnitKind::Loss; })
      .Case([](mhc::MtpOp) { return UnitKind::Mtp; })
      .Default([](Operation *) { return std::nullopt; });
}

FailureOr<ModelInfo> modelInfoOf(func::FuncOp func) {
  auto config = func->getAttrOfType<mhc::ModelConfigAttr>(mhc::kConfigAttrName);
  if (!config)
    return func.emitError() << "not an mhc model: missing '"
                            << mhc::kConfigAttrName << "' attribute";
  ModelInfo d;
  d.name = func.getSymName().str();
  d.vocab = config.getVocab();
  d.hidden = config.getHidden();
  d.heads = config.getHeads();
  d.ffnHidden = config.getFfnHidden();
  d.seqLen = config.getSeqLen();
  d.microBatch = config.getMicroBatch();
  d.streams = config.getStreams();
  d.sinkhornIterations = config.getSinkhornIterations();
  d.gatingFactor = config.getGatingFactor().getValueAsDouble();
  d.normEps = config.getNormEps().getValueAsDouble();
  d.dtype = config.getDtype().isBF16() ? "bf16" : "f32";
  d.residualDtype = config.getResidualElementType().isBF16() ? "bf16" : "f32";
  d.seed = config.getSeed();
  return d;
}

FailureOr<ModelUnits> collectModelUnits(func::FuncOp func) {
  FailureOr<ModelInfo> dims = modelInfoOf(func);
  if (failed(dims))
    return failure();
  ModelUnits model;
  model.dims = *dims;
  for (Operation &op : func.getBody().front()) {
    std::optional<UnitKind> kind = unitKindOf(&op);
    if (!kind)
      continue;
    UnitCost cost = unitCost(*kind, model.dims);
    cost.name = op.getAttrOfType<StringAttr>("node").getValue().str();
    if (auto hc = dyn_cast<mhc::HyperConnectionOp>(op))
      cost.layer = hc.getLayer();
    model.units.push_back(cost);
  }
  return model;
}

namespace {
std::string withSeparators(int64_t value) {
  std::string digits = std::to_string(value), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0)
      out += ',';
    out += digits[i];
  }
  return out;
}

} // namespace

std::string formatModelSummary(const ModelUnits &model) {
  const ModelInfo &d = model.dims;
  ModelTotals totals = totalCost(model.units, d);
  std::string out;
  llvm::raw_string_ostream os(out);
  int mtpModules = 0, gdnLayers = 0;
  for (const UnitCost &u : model.units) {
    mtpModules += u.kind == UnitKind::Mtp;
    gdnLayers += u.kind == UnitKind::GdnSublayer;
  }
  // A hybrid stack says how its layers mix tokens.
  const std::string mixers =
      gdnLayers ? llvm::formatv(" ({0} Gated DeltaNet, {1} attention)", gdnLayers, totals.layers - gdnLayers).str()
                : std::string();
  os << llvm::formatv("model {0}: {1} layers{2}{3}, C = {4}, n = {5}, heads = {6}, "
                      "FFN = {7}, vocab = {8}, seq = {9} x {10}, {11}\n",
                      model.dims.name, totals.layers, mixers,
                      mtpModules ? llvm::formatv(" + {0} MTP", mtpModules).str()
                                 : std::string(),
                      d.hidden, d.streams, d.heads, d.ffnHidden, d.vocab,
                      d.seqLen, d.microBatch,
                      d.residualStorage() == d.dtype ? d.dtype
                                                     : d.dtype + " (residual " + d.residualStorage() + ")");
  os << llvm::formatv("parameters: {0} ({1:F2} M), of which mHC mappings {2} "
                      "({3:F2}%)\n",
                      withSeparators(totals.params), totals.params / 1e6,
                      withSeparators(totals.mhcParams),
                      100.0 * totals.mhcParams / totals.params);
  os << llvm::formatv("FLOPs per token: forward {0:F2} M, training {1:F2} M "
                      "(3x forward)\n",
                      totals.forwardFlopsPerToken / 1e6,
                      totals.trainingFlopsPerToken() / 1e6);
  double perToken = double(d.residualWidth()) * d.residualBytes();
  os << llvm::formatv("pipeline boundary: n*C = {0} values per token ({1}), "
                      "{2} per microbatch of {3} tokens\n",
                      d.residualWidth(), humanBytes(perToken),
                      humanBytes(perToken * d.tokens()), d.tokens());
  return out;
}

} // namespace mhcc
