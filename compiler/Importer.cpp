//===- Importer.cpp - ModelGraph -> mhc dialect -----------------------------===//
#include "compiler/Importer.h"

#include "dialects/mhc/IR/MhcOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Verifier.h"

using namespace mlir;

namespace mhcc {
namespace {

class GraphImporter {
public:
  GraphImporter(MLIRContext &context, const ModelGraph &graph, StringRef file)
      : context_(context), graph_(graph), file_(file.str()), builder_(&context) {
    const ModelConfig &c = graph.config;
    elementType_ = c.dtype == "bf16" ? Type(builder_.getBF16Type())
                                     : Type(builder_.getF32Type());
    tokens_ = c.tokens();
    hiddenType_ = RankedTensorType::get({tokens_, c.hidden}, elementType_);
    residualElementType_ = c.residualStorage() == "bf16" ? Type(builder_.getBF16Type())
                                                     : Type(builder_.getF32Type());
    residualType_ = RankedTensorType::get({tokens_, c.residualWidth()}, residualElementType_);
    logitsType_ = RankedTensorType::get({tokens_, c.vocab}, elementType_);
    lossType_ = RankedTensorType::get({}, builder_.getF32Type());
    idsType_ = RankedTensorType::get({tokens_}, builder_.getI32Type());
  }

  OwningOpRef<ModuleOp> run() {
    Location fileLoc = FileLineColLoc::get(&context_, file_, 1, 1);
    OwningOpRef<ModuleOp> module = ModuleOp::create(fileLoc, graph_.name);
    builder_.setInsertionPointToEnd(module->getBody());

    SmallVector<Type> lossTypes;
    for (const ModelNode &node : graph_.nodes)
      if (outputKind(node.op) == ValueKind::Loss)
        lossTypes.push_back(lossType_);
    auto funcType = builder_.getFunctionType({idsType_, idsType_}, lossTypes);
    auto func = func::FuncOp::create(builder_, fileLoc, graph_.name, funcType);
    func->setAttr(mhc::kConfigAttrName, configAttr());
    func.setArgAttr(0, "mhc.name", builder_.getStringAttr("tokens"));
    func.setArgAttr(1, "mhc.name", builder_.getStringAttr("labels"));
    Block *entry = func.addEntryBlock();
    tokenIds_ = entry->getArgument(0);
    labelIds_ = entry->getArgument(1);
    builder_.setInsertionPointToEnd(entry);

    SmallVector<Value> values;
    SmallVector<Value> lmLosses, mtpLosses;
    for (const ModelNode &node : graph_.nodes) {
      Value input = node.inputs.empty() ? Value() : values[node.inputs[0]];
      Value result = emitNode(node, input);
      values.push_back(result);
      if (node.op == NodeOp::CrossEntropy)
        lmLosses.push_back(result);
      else if (node.op == NodeOp::Mtp)
        mtpLosses.push_back(result);
    }
    lmLosses.append(mtpLosses.begin(), mtpLosses.end());
    func::ReturnOp::create(builder_, fileLoc, lmLosses);
    return module;
  }

private:
  Location locOf(const ModelNode &node) {
    Location source = FileLineColLoc::get(&context_, file_ + "#" + node.pointer, 0, 0);
    return NameLoc::get(builder_.getStringAttr(node.name), source);
  }

  mhc::ModelConfigAttr configAttr() {
    const ModelConfig &c = graph_.config;
    return mhc::ModelConfigAttr::get(
        &context_, c.vocab, c.hidden, c.heads, c.ffnHidden, c.seqLen,
        c.microBatch, c.streams, c.sinkhornIterations,
        builder_.getF64FloatAttr(c.gatingFactor),
        builder_.getF64FloatAttr(c.normEps), elementType_,
        // Printed only where it differs from dtype.
        residualElementType_ == elementType_ ? Type() : residualElementType_, c.seed);
  }

  /// The C-wide sublayer F(RMSNorm(u)) inside a hyper-connection body.
  Value emitSublayerBody(const ModelNode &node, Location loc, Value u) {
    const ModelConfig &c = graph_.config;
    Value normed = mhc::RmsNormOp::create(builder_, loc, u, llvm::APFloat(c.normEps),
                                          node.name + ".norm");
    if (node.sublayer == SublayerKind::Attention)
      return mhc::AttentionOp::create(builder_, loc, normed, node.name + ".attention");
    if (node.sublayer == SublayerKind::Gdn)
      return mhc::GatedDeltaNetOp::create(builder_, loc, normed, node.name + ".gdn");
    return mhc::SwiGluMlpOp::create(builder_, loc, normed, node.name + ".mlp");
  }

  Value emitNode(const ModelNode &node, Value input) {
    Location loc = locOf(node);
    switch (node.op) {
    case NodeOp::Embedding:
      return mhc::EmbeddingOp::create(builder_, loc, hiddenType_, tokenIds_, node.name);
    case NodeOp::MhcExpand:
      return mhc::ExpandOp::create(builder_, loc, residualType_, input, node.name);
    case NodeOp::MhcSublayer: {
      auto op = mhc::HyperConnectionOp::create(builder_, loc, residualType_, input,
                                               node.layer, node.name);
      OpBuilder::InsertionGuard guard(builder_);
      Block *body = builder_.createBlock(&op.getBody(), {}, {hiddenType_}, {loc});
      Value y = emitSublayerBody(node, loc, body->getArgument(0));
      mhc::YieldOp::create(builder_, loc, y);
      return op.getResult();
    }
    case NodeOp::MhcContract:
      return mhc::ContractOp::create(builder_, loc, hiddenType_, input, node.name);
    case NodeOp::RmsNorm:
      return mhc::RmsNormOp::create(builder_, loc, input, llvm::APFloat(node.eps),
                                    node.name);
    case NodeOp::LmHead:
      return mhc::LmHeadOp::create(builder_, loc, logitsType_, input, node.name);
    case NodeOp::CrossEntropy:
      return mhc::CrossEntropyOp::create(builder_, loc, lossType_, input,
                                         labelIds_, node.lossName, node.name);
    case NodeOp::Mtp:
      return mhc::MtpOp::create(builder_, loc, lossType_, input, tokenIds_, labelIds_,
                                node.depth, llvm::APFloat(node.lossWeight), node.name);
    }
    llvm_unreachable("unknown node op");
  }

  MLIRContext &context_;
  const ModelGraph &graph_;
  std::string file_;
  OpBuilder builder_;
  Type elementType_, residualElementType_;
  int64_t tokens_ = 0;
  RankedTensorType hiddenType_, residualType_, logitsType_, lossType_, idsType_;
  Value tokenIds_, labelIds_;
};

} // namespace

OwningOpRef<ModuleOp> importModelGraph(MLIRContext &context,
                                       const ModelGraph &graph, StringRef file) {
  context.loadDialect<mhc::MhcDialect, func::FuncDialect>();
  OwningOpRef<ModuleOp> module = GraphImporter(context, graph, file).run();
  // The graph was validated; a verifier failure here is an importer bug.
  if (failed(verify(*module)))
    return nullptr;
  return module;
}

} // namespace mhcc
