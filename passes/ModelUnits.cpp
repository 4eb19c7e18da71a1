//===- ModelUnits.cpp - mhc IR -> cost-model units --------------------------===//
#include "passes/ModelUnits.h"

#include "dialects/mhc/IR/MhcOps.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/FormatVariadic.h"

using namespace mlir;

namespace mhcc {

FailureOr<ModelUnits> collectModelUnits(func::FuncOp func) {
  auto config = func->getAttrOfType<mhc::ModelConfigAttr>(mhc::kConfigAttrName);
  if (!config)
    return func.emitError() << "not an mhc model: missing '"
                            << mhc::kConfigAttrName << "' attribute";
  ModelUnits model;
  model.name = func.getSymName().str();
  ModelDims &d = model.dims;
  d.vocab = config.getVocab();
  d.hidden = config.getHidden();
  d.heads = config.getHeads();
  d.ffnHidden = config.getFfnHidden();
  d.seqLen = config.getSeqLen();
  d.microBatch = config.getMicroBatch();
  d.streams = config.getStreams();
  d.sinkhornIterations = config.getSinkhornIterations();
  d.dtypeBytes = config.getDtype().isBF16() ? 2 : 4;

  for (Operation &op : func.getBody().front()) {
    std::optional<UnitKind> kind;
    std::string name;
    int64_t layer = -1;
    llvm::TypeSwitch<Operation *>(&op)
        .Case([&](mhc::EmbeddingOp o) { kind = UnitKind::Embedding; name = o.getNode().str(); })
        .Case([&](mhc::ExpandOp o) { kind = UnitKind::Expand; name = o.getNode().str(); })
        .Case([&](mhc::HyperConnectionOp o) {
          kind = o.getSublayerKind() == "attention" ? UnitKind::AttentionSublayer
                                                    : UnitKind::MlpSublayer;
          name = o.getNode().str();
          layer = o.getLayer();
        })
        .Case([&](mhc::ContractOp o) { kind = UnitKind::Contract; name = o.getNode().str(); })
        .Case([&](mhc::RmsNormOp o) { kind = UnitKind::FinalNorm; name = o.getNode().str(); })
        .Case([&](mhc::LmHeadOp o) { kind = UnitKind::LmHead; name = o.getNode().str(); })
        .Case([&](mhc::CrossEntropyOp o) { kind = UnitKind::Loss; name = o.getNode().str(); })
        .Case([&](mhc::MtpOp o) { kind = UnitKind::Mtp; name = o.getNode().str(); });
    if (!kind)
      continue;
    UnitCost cost = unitCost(*kind, d);
    cost.name = name;
    cost.layer = layer;
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

std::string humanBytes(double bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  return llvm::formatv("{0:F1} {1}", bytes, units[unit]).str();
}
} // namespace

std::string formatModelSummary(const ModelUnits &model) {
  const ModelDims &d = model.dims;
  ModelTotals totals = totalCost(model.units, d);
  std::string out;
  llvm::raw_string_ostream os(out);
  int mtpModules = 0;
  for (const UnitCost &u : model.units)
    mtpModules += u.kind == UnitKind::Mtp;
  os << llvm::formatv("model {0}: {1} layers{2}, C = {3}, n = {4}, heads = {5}, "
                      "FFN = {6}, vocab = {7}, seq = {8} x {9}, {10}\n",
                      model.name, totals.layers,
                      mtpModules ? llvm::formatv(" + {0} MTP", mtpModules).str()
                                 : std::string(),
                      d.hidden, d.streams, d.heads, d.ffnHidden, d.vocab,
                      d.seqLen, d.microBatch, d.dtypeBytes == 2 ? "bf16" : "f32");
  os << llvm::formatv("parameters: {0} ({1:F2} M), of which mHC mappings {2} "
                      "({3:F2}%)\n",
                      withSeparators(totals.params), totals.params / 1e6,
                      withSeparators(totals.mhcParams),
                      100.0 * totals.mhcParams / totals.params);
  os << llvm::formatv("FLOPs per token: forward {0:F2} M, training {1:F2} M "
                      "(3x forward)\n",
                      totals.forwardFlopsPerToken / 1e6,
                      totals.trainingFlopsPerToken() / 1e6);
  double perToken = double(d.residualWidth()) * d.dtypeBytes;
  os << llvm::formatv("pipeline boundary: n*C = {0} values per token ({1}), "
                      "{2} per microbatch of {3} tokens\n",
                      d.residualWidth(), humanBytes(perToken),
                      humanBytes(perToken * d.tokens()), d.tokens());
  return out;
}

} // namespace mhcc
