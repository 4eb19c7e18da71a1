//===- Driver.cpp - the mhcc command line -------------------------------------===//
//
// mhcc MODEL.json [-o OUT] [--emit=summary|mlir] [--compile-to=PHASE]
//
// Every failure prints one line naming the file and the place, and exits 1;
// output files are only written (atomically) once the compile succeeded.
//
//===----------------------------------------------------------------------===//
#include "compiler/Importer.h"
#include "compiler/InitAll.h"
#include "compiler/ModelGraph.h"
#include "compiler/Pipeline.h"
#include "passes/ModelUnits.h"

#include "mlir/Debug/CLOptionsSetup.h"
#include "mlir/IR/AsmState.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Support/Timing.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;

namespace mhcc {
namespace {

enum class EmitKind { Summary, Mlir };

struct Options {
  llvm::cl::opt<std::string> input{llvm::cl::Positional, llvm::cl::Required,
                                   llvm::cl::desc("<model.json>")};
  llvm::cl::opt<std::string> output{"o", llvm::cl::desc("Output file ('-' = stdout)"),
                                    llvm::cl::value_desc("file"), llvm::cl::init("-")};
  llvm::cl::opt<EmitKind> emit{
      "emit", llvm::cl::desc("What to write"), llvm::cl::init(EmitKind::Summary),
      llvm::cl::values(
          clEnumValN(EmitKind::Summary, "summary",
                     "parameters, FLOPs per token, boundary width"),
          clEnumValN(EmitKind::Mlir, "mlir", "the IR after the last phase run"))};
  llvm::cl::opt<std::string> compileTo{
      "compile-to",
      llvm::cl::desc("Stop after this phase (" + phaseNames() + ")"),
      llvm::cl::value_desc("phase"), llvm::cl::init(allPhases().back().name)};
};

int fail(const std::string &message) {
  llvm::errs() << "mhcc: " << message << "\n";
  return 1;
}

} // namespace

int runMhcc(int argc, char **argv) {
  llvm::InitLLVM initLLVM(argc, argv);
  registerAsmPrinterCLOptions();
  registerMLIRContextCLOptions();
  registerPassManagerCLOptions();
  registerDefaultTimingManagerCLOptions();
  Options options;
  llvm::cl::ParseCommandLineOptions(
      argc, argv,
      "mhcc: compiles mHC transformer model graphs for pipelined training\n");

  std::optional<Phase> lastPhase = parsePhase(options.compileTo);
  if (!lastPhase)
    return fail("unknown phase '" + options.compileTo + "' for --compile-to; "
                "phases: " + phaseNames());

  ModelError error;
  std::optional<ModelGraph> graph = loadModelGraph(options.input, error);
  if (!graph) {
    llvm::errs() << formatModelError(options.input, error) << "\n";
    return 1;
  }

  DialectRegistry registry;
  registerAllDialects(registry);
  MLIRContext context(registry);
  OwningOpRef<ModuleOp> module = importModelGraph(context, *graph, options.input);
  if (!module)
    return fail("internal error: the imported IR of " + options.input +
                " does not verify (please report it with the model file)");

  PassManager pm(&context);
  if (failed(applyPassManagerCLOptions(pm)))
    return fail("bad pass manager options");
  buildPipeline(pm, *lastPhase);
  if (failed(pm.run(*module)))
    return fail("compilation of " + options.input + " failed (see above)");

  std::string message;
  std::unique_ptr<llvm::ToolOutputFile> out = openOutputFile(options.output, &message);
  if (!out)
    return fail("cannot write '" + options.output + "': " + message);
  if (options.emit == EmitKind::Mlir) {
    module->print(out->os());
  } else {
    for (auto func : module->getOps<func::FuncOp>()) {
      FailureOr<ModelUnits> model = collectModelUnits(func);
      if (failed(model))
        return 1;
      out->os() << formatModelSummary(*model);
    }
  }
  out->keep();
  return 0;
}

} // namespace mhcc
