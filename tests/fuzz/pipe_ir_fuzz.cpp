// libFuzzer target: mhc-opt on mutated `mhc` / `pipe` IR. The parser and the
// ops' verifiers must refuse what the passes cannot handle (out-of-range
// stages and ranks, duplicate orders, inconsistent schedules), so that every
// pass after a successful parse either succeeds or emits a diagnostic. Each
// input runs the phases it has not been through yet: partition (pp = 2) when
// the function has no layout, P2P when it has no boundaries, a 1F1B schedule
// of two microbatches when the module has none, then the schedule verifier.
#include "compiler/InitAll.h"
#include "dialects/pipe/IR/PipeOps.h"
#include "passes/PipelineIR.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"

#include <cstddef>
#include <cstdint>
#include <string>

using namespace mlir;

namespace {

/// Runs one textual pipeline on the module; false when a pass failed.
bool runPipeline(ModuleOp module, const std::string &pipeline) {
  PassManager pm(module.getContext());
  if (failed(parsePassPipeline(pipeline, pm)))
    __builtin_trap(); // the pipelines below are fixed and valid
  return succeeded(pm.run(module));
}

bool anyOp(ModuleOp module, llvm::function_ref<bool(Operation *)> match) {
  return module->walk([&](Operation *op) { return match(op) ? WalkResult::interrupt() : WalkResult::advance(); })
      .wasInterrupted();
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  mhcc::registerAllPasses();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  DialectRegistry registry;
  mhcc::registerAllDialects(registry);
  MLIRContext context(registry, MLIRContext::Threading::DISABLED);
  ScopedDiagnosticHandler quiet(&context, [](Diagnostic &) { return success(); });
  // NUL-terminated, as mhc-opt's file buffers are: MLIR's lexer reads up to
  // the terminator (parseSourceString over libFuzzer's unterminated bytes
  // reads past them: an overflow of the harness, not of mhc-opt).
  const std::string text(reinterpret_cast<const char *>(data), size);
  ParserConfig config(&context);
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(text, config);
  if (!module)
    return 0;

  const bool hasLayout = anyOp(*module, [](Operation *op) { return op->hasAttr(mhcc::pipe::kLayoutAttr); });
  if (!hasLayout && !runPipeline(*module, "builtin.module(pipe-partition{pp=2})"))
    return 0;
  const bool hasBoundaries = anyOp(*module, [](Operation *op) { return isa<mhcc::pipe::BoundaryOp>(op); });
  if (!hasBoundaries && !runPipeline(*module, "builtin.module(pipe-insert-p2p)"))
    return 0;
  const bool hasSchedule = anyOp(*module, [](Operation *op) { return isa<mhcc::pipe::ScheduleOp>(op); });
  if (!hasSchedule && !runPipeline(*module, "builtin.module(pipe-schedule{kind=1f1b microbatches=2})"))
    return 0;
  (void)runPipeline(*module, "builtin.module(pipe-verify-schedule)");
  return 0;
}
