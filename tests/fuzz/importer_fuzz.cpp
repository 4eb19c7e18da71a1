// libFuzzer target: the model-graph reader and the importer behind it
// (compiler/ModelGraph.cpp -> compiler/Importer.cpp), then mhcc's pipeline
// phases on the imported IR. Every graph the reader accepts must import into
// IR that verifies (mhcc reports anything else as an internal error), and the
// phases after it may refuse the model only with a diagnostic.
#include "compiler/Importer.h"
#include "compiler/InitAll.h"
#include "compiler/ModelGraph.h"
#include "passes/ModelUnits.h"
#include "passes/PipelineIR.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/Pass/PassManager.h"

#include <cstddef>
#include <cstdint>
#include <string>

using namespace mlir;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string text(reinterpret_cast<const char *>(data), size);
  mhcc::ModelError error;
  std::optional<mhcc::ModelGraph> graph = mhcc::parseModelGraph(text, error);
  if (!graph)
    return 0;

  DialectRegistry registry;
  mhcc::registerAllDialects(registry);
  MLIRContext context(registry, MLIRContext::Threading::DISABLED);
  ScopedDiagnosticHandler quiet(&context, [](Diagnostic &) { return success(); });
  OwningOpRef<ModuleOp> module = mhcc::importModelGraph(context, *graph, "fuzz.json");
  if (!module)
    __builtin_trap(); // an accepted graph whose IR does not verify

  // The summary's sizes and costs (int64 products of the model's sizes).
  FailureOr<func::FuncOp> func = mhcc::findModelFunc(*module);
  if (failed(func))
    __builtin_trap();
  if (FailureOr<mhcc::ModelUnits> units = mhcc::collectModelUnits(*func); succeeded(units))
    (void)mhcc::formatModelSummary(*units);

  // Two ranks and two microbatches, interleaved where the model has layers
  // enough for two chunks each: partition, P2P, schedule and its verifier.
  mhcc::PipelineOptions options;
  options.pp = 2;
  options.vpp = graph->numLayers() >= 4 ? 2 : 1;
  options.microbatches = 2;
  PassManager pm(&context);
  mhcc::buildPipeline(pm, options);
  (void)pm.run(*module);
  return 0;
}
