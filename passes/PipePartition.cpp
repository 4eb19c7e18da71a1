//===- PipePartition.cpp - -pipe-partition ------------------------------------===//
#include "passes/Passes.h"
#include "passes/PipelineIR.h"

#define DEBUG_TYPE "pipe-partition"

namespace mhcc {

#define GEN_PASS_DEF_PIPEPARTITION
#include "passes/Passes.h.inc"

namespace {
struct PipePartitionPass : public impl::PipePartitionBase<PipePartitionPass> {
  using PipePartitionBase::PipePartitionBase;

  void runOnOperation() override {
    mlir::FailureOr<mlir::func::FuncOp> func = findModelFunc(getOperation());
    if (failed(func))
      return signalPassFailure();
    if (pp < 1 || vpp < 1) {
      func->emitError() << "pp and vpp must be at least 1, got pp = " << int64_t(pp)
                        << ", vpp = " << int64_t(vpp);
      return signalPassFailure();
    }
    pipeline::ModelShape shape = modelShapeOf(*func);
    pipeline::Layout chosen;
    std::string error;
    if (!layout.empty()) {
      std::optional<pipeline::Layout> parsed = pipeline::parseLayout(layout, pp, vpp, shape, error);
      if (!parsed) {
        func->emitError() << "invalid pipeline layout '" << layout << "': " << error;
        return signalPassFailure();
      }
      chosen = *parsed;
    } else {
      mlir::FailureOr<std::vector<pipeline::PartitionUnit>> units = partitionUnitsOf(*func, recomputeSublayers, recomputeNumSublayers);
      if (failed(units))
        return signalPassFailure();
      pipeline::PartitionRequest request{pp, vpp, memoryCapGib * double(1ull << 30)};
      std::optional<pipeline::PartitionResult> result = pipeline::partitionChain(*units, request, error);
      if (!result) {
        func->emitError() << error;
        return signalPassFailure();
      }
      chosen = result->layout;
    }
    if (failed(applyLayout(*func, chosen)))
      return signalPassFailure();
  }
};
} // namespace

} // namespace mhcc
