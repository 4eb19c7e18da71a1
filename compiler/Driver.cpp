//===- Driver.cpp - the mhcc command line -------------------------------------===//
//
// mhcc MODEL.json [-o OUT] [--emit=summary|mlir|programs|cuda|artifact]
//      [--compile-to=PHASE] [pipeline options] [--cuda-arch=auto|none|sm_90]
//
// Every failure prints one line and exits 1: a bad flag as "mhcc: --flag:
// why" before the model is read, a bad model naming the file and the place.
// Output files are only written (atomically) once the compile succeeded.
//
//===----------------------------------------------------------------------===//
#include "compiler/codegen/CudaCodegen.h"
#include "compiler/Driver.h"
#include "compiler/Lowering.h"
#include "compiler/InitAll.h"
#include "compiler/Pipeline.h"
#include "compiler/Version.h"
#include "llvm/Support/FormatVariadic.h"

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

#include <fstream>
#include <sstream>

#include <xxhash.h>

using namespace mlir;

namespace mhcc {
namespace {

/// XXH3-64 of the model file, in hex: ties an artifact to its source.
std::string hashFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  std::string text = bytes.str();
  return llvm::formatv("{0:x16}", XXH3_64bits(text.data(), text.size())).str();
}

constexpr const char kOverview[] =
    "mhcc: compiles mHC transformer model graphs for pipelined training\n\n"
    "  Default options can be set in MHCC_OPTIONS. MLIR's IR-printing, timing and\n"
    "  pass-manager flags (--mlir-print-ir-after-all, --mlir-timing, ...) and\n"
    "  LLVM's own are listed by --help-hidden.\n";

/// --help shows mhcc's categories (and --help, --version). LLVM's
/// HideUnrelatedOptions would hide the rest from --help-hidden too; they stay
/// there, so MLIR's debugging flags can still be found.
void hideUnrelatedOptions() {
  std::vector<llvm::cl::Option *> listed;
  for (auto &entry : llvm::cl::getRegisteredOptions())
    if (entry.second->getOptionHiddenFlag() != llvm::cl::ReallyHidden)
      listed.push_back(entry.second);
  llvm::cl::HideUnrelatedOptions({&compilationCategory(), &pipelineCategory(), &cudaCategory()});
  for (llvm::cl::Option *option : listed)
    if (option->getOptionHiddenFlag() == llvm::cl::ReallyHidden)
      option->setHiddenFlag(llvm::cl::Hidden);
}

/// Compiles the model's CUDA kernels into the artifact for --cuda-arch (auto:
/// sm_90 when nvcc is found, else a CPU-only artifact with a note).
LogicalResult addDeviceCode(runtime::Artifact &artifact, const DriverOptions &options) {
  const std::string &arch = options.cudaArch;
  if (arch == "none")
    return success();
  std::string nvccError;
  std::optional<std::string> nvcc = codegen::findNvcc(options.nvcc, nvccError);
  if (!nvcc && (arch != "auto" || !options.nvcc.empty()))
  {
    fail(nvccError + "; the CUDA kernels for " + arch +
         " need it: install the CUDA toolkit, pass --nvcc PATH, or --cuda-arch none for a "
         "CPU-only artifact");
    return failure();
  }
  if (!nvcc) {
    llvm::errs() << "mhcc: note: " << nvccError << ": the artifact runs on the CPU backend only; "
                 << "pass --nvcc PATH for GPU kernels, or --cuda-arch none to silence this\n";
    return success();
  }
  std::string codegenError;
  std::optional<runtime::DeviceCode> code = codegen::compileModelKernels(
      artifact.model, codegen::emitModelKernels(artifact.model, artifact.modelHash), *nvcc,
      codegen::kCudaArch, codegenError);
  if (!code) {
    fail(codegenError);
    return failure();
  }
  artifact.deviceCode = std::move(*code);
  return success();
}

/// Writes what --emit asks for; output files appear only when all succeeded.
int emitOutput(ModuleOp module, const DriverOptions &options, const SimulationOptions &simulation) {
  std::optional<runtime::Artifact> artifact;
  if (options.needsArtifact()) {
    FailureOr<runtime::Artifact> built = buildArtifact(module, hashFile(options.input));
    if (failed(built))
      return fail("cannot build the artifact of " + options.input + " (see above)");
    artifact = std::move(*built);
    artifact->prediction = predictStep(module, simulation);
  }
  if (options.emit == EmitKind::Artifact) {
    std::string writeError;
    if (failed(addDeviceCode(*artifact, options)))
      return 1;
    if (!runtime::writeArtifact(options.output, *artifact, writeError))
      return fail(writeError);
    return options.trace.empty() || succeeded(writePredictedTrace(module, simulation, options.trace)) ? 0 : 1;
  }
  std::string message;
  std::unique_ptr<llvm::ToolOutputFile> out = openOutputFile(options.output, &message);
  if (!out)
    return fail("cannot write '" + options.output + "': " + message);
  if (options.emit == EmitKind::Mlir)
    module.print(out->os());
  else if (options.emit == EmitKind::Programs)
    out->os() << formatPrograms(*artifact);
  else if (options.emit == EmitKind::Cuda)
    out->os() << codegen::emitModelKernels(artifact->model, artifact->modelHash);
  else if (failed(printSummary(module, options, simulation, out->os())))
    return 1;
  if (!options.trace.empty() && failed(writePredictedTrace(module, simulation, options.trace)))
    return 1;
  out->keep();
  return 0;
}

} // namespace

int runMhcc(int argc, char **argv) {
  llvm::InitLLVM initLLVM(argc, argv);
  registerAsmPrinterCLOptions();
  registerMLIRContextCLOptions();
  registerPassManagerCLOptions();
  registerDefaultTimingManagerCLOptions();
  DriverOptions options;
  PipelineOptions pipeline;
  PipelineFlags pipelineFlags(pipeline);
  setVersionPrinter("mhcc");
  hideUnrelatedOptions();
  // MHCC_OPTIONS holds default options, read before the command line's.
  llvm::cl::ParseCommandLineOptions(argc, argv, kOverview, nullptr, nullptr, "MHCC_OPTIONS");
  if (std::optional<std::string> error = checkFlags(options, pipeline))
    return fail(*error);

  DialectRegistry registry;
  registerAllDialects(registry);
  MLIRContext context(registry);
  // --schedule auto's ranking: in the summary, else one note on stderr.
  std::string ranking;
  llvm::raw_string_ostream rankingStream(ranking);
  SimulationOptions simulation;
  OwningOpRef<ModuleOp> module = compileModel(context, options.input, pipeline, options, simulation, rankingStream);
  if (!ranking.empty() && (!module || options.emit != EmitKind::Summary))
    llvm::errs() << "mhcc: note: " << ranking;
  else if (!ranking.empty())
    llvm::outs() << ranking;
  if (!module)
    return 1;
  return emitOutput(*module, options, simulation);
}

} // namespace mhcc
