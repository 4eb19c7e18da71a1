//===- ModelSummary.cpp - -mhc-model-summary ---------------------------------===//
#include "passes/ModelUnits.h"
#include "passes/Passes.h"

#include "llvm/Support/raw_ostream.h"

#define DEBUG_TYPE "mhc-model-summary"

namespace mhcc {

#define GEN_PASS_DEF_MHCMODELSUMMARY
#include "passes/Passes.h.inc"

namespace {
struct MhcModelSummaryPass
    : public impl::MhcModelSummaryBase<MhcModelSummaryPass> {
  void runOnOperation() override {
    for (auto func : getOperation().getOps<mlir::func::FuncOp>()) {
      if (!func->hasAttr(mhc::kConfigAttrName))
        continue;
      mlir::FailureOr<ModelUnits> model = collectModelUnits(func);
      if (failed(model))
        return signalPassFailure();
      llvm::outs() << formatModelSummary(*model);
    }
    markAllAnalysesPreserved();
  }
};
} // namespace

} // namespace mhcc
