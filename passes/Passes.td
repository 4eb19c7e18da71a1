//===- Passes.td - mhcc transformation passes --------------*- tablegen -*-===//
//
// Every pass of the mhcc pipeline. Algorithms live in plain C++ beside the
// passes (CostModel, ...) with their own unit tests; passes are thin.
//
//===----------------------------------------------------------------------===//

#ifndef MHCC_PASSES_TD
#define MHCC_PASSES_TD

include "mlir/Pass/PassBase.td"

def MhcModelSummary : Pass<"mhc-model-summary", "mlir::ModuleOp"> {
  let summary = "Print parameters, FLOPs per token and pipeline boundary width";
  let description = [{
    For every model function (a func.func carrying #mhc.config), prints the
    number of transformer layers, trainable parameters (and the share the mHC
    mappings W_map, b and alpha add), forward and training FLOPs per token
    from the cost model, and the width every pipeline boundary inside the
    mHC region carries: n*C values per token, the number a partition must
    budget for. The IR is not changed.

    ```
    model tiny: 4 layers, C = 64, n = 4, heads = 4, FFN = 176, vocab = 256
    ```
  }];
  let dependentDialects = ["::mhcc::mhc::MhcDialect"];
}

#endif // MHCC_PASSES_TD
