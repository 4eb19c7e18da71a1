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
#include "compiler/Importer.h"
#include "compiler/Lowering.h"
#include "compiler/InitAll.h"
#include "compiler/ModelGraph.h"
#include "compiler/Pipeline.h"
#include "compiler/Version.h"
#include "runtime/cli/FlagChecks.h"
#include "passes/ModelUnits.h"
#include "passes/PipelineIR.h"
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

enum class EmitKind { Summary, Mlir, Programs, Cuda, Artifact };

llvm::cl::OptionCategory &cudaCategory() {
  static llvm::cl::OptionCategory category("CUDA kernels");
  return category;
}

/// mhcc's flags beyond the pipeline's (compiler/Pipeline.h): what to read
/// and write, the schedule report, the CUDA kernels.
struct DriverOptions {
  llvm::cl::opt<std::string> input{llvm::cl::Positional, llvm::cl::Required,
                                   llvm::cl::desc("<model.json>"),
                                   llvm::cl::cat(compilationCategory())};
  llvm::cl::opt<std::string> output{"o", llvm::cl::desc("Output file ('-' = stdout)"),
                                    llvm::cl::value_desc("file"), llvm::cl::init("-"),
                                    llvm::cl::cat(compilationCategory())};
  llvm::cl::opt<EmitKind> emit{
      "emit", llvm::cl::desc("What to write"), llvm::cl::init(EmitKind::Summary),
      llvm::cl::cat(compilationCategory()),
      llvm::cl::values(
          clEnumValN(EmitKind::Summary, "summary",
                     "parameters, FLOPs per token, boundary width"),
          clEnumValN(EmitKind::Mlir, "mlir", "the IR after the last phase run"),
          clEnumValN(EmitKind::Programs, "programs",
                     "each stage's forward and (autodiff) backward kernel program"),
          clEnumValN(EmitKind::Cuda, "cuda",
                     "the model's generated CUDA kernels (the source nvcc compiles)"),
          clEnumValN(EmitKind::Artifact, "artifact",
                     "the versioned artifact mhcrun executes (needs -o FILE)"))};

  llvm::cl::opt<bool> printSchedule{
      "print-schedule",
      llvm::cl::desc("Print each rank's timeline, the predicted bubble and peak activations"),
      llvm::cl::cat(pipelineCategory())};
  llvm::cl::opt<std::string> trace{
      "trace",
      llvm::cl::desc("Write the predicted per-rank timeline here, as Chrome trace events (Perfetto, "
                     "chrome://tracing); mhcrun --trace writes the measured one with the same names"),
      llvm::cl::value_desc("file.json"), llvm::cl::cat(pipelineCategory())};
  llvm::cl::opt<double> simTflops{"sim-tflops",
                                  llvm::cl::desc("Compute rate the schedule simulator assumes"),
                                  llvm::cl::init(400), llvm::cl::cat(pipelineCategory())};
  llvm::cl::opt<double> simLinkGBps{
      "sim-link-gbps", llvm::cl::desc("P2P bandwidth the schedule simulator assumes (GB/s)"),
      llvm::cl::init(200), llvm::cl::cat(pipelineCategory())};

  llvm::cl::opt<std::string> cudaArch{
      "cuda-arch",
      llvm::cl::desc("GPU architecture of the artifact's kernels: sm_90 (H100, H200; the only "
                     "one the runtime runs), none (CPU backend only), or auto (sm_90 when nvcc "
                     "is found, else none with a note)"),
      llvm::cl::init("auto"), llvm::cl::cat(cudaCategory())};
  llvm::cl::opt<std::string> nvcc{
      "nvcc", llvm::cl::desc("nvcc to compile the kernels with (default: $CUDA_HOME/bin, "
                             "/usr/local/cuda/bin, PATH)"),
      llvm::cl::value_desc("path"), llvm::cl::cat(cudaCategory())};

  bool needsArtifact() const {
    return emit == EmitKind::Artifact || emit == EmitKind::Programs || emit == EmitKind::Cuda;
  }
};

/// What the pipeline phases decided, if they ran: layout, boundaries and the
/// schedule's predicted bubble and memory (with --print-schedule, the full
/// per-rank timeline).
LogicalResult printPipelineSummary(ModuleOp module, func::FuncOp func,
                                   const SimulationOptions &simulation, bool timeline,
                                   const std::string &tracePath, llvm::raw_ostream &os) {
  if (!func->hasAttr(pipe::kLayoutAttr))
    return success();
  FailureOr<pipeline::Layout> layout = layoutOf(func);
  if (failed(layout))
    return failure();
  os << "pipeline: pp = " << layout->pp << ", vpp = " << layout->vpp << ", layout "
     << layout->toString() << "\n";
  for (auto boundary : func.getOps<pipe::BoundaryOp>()) {
    auto type = cast<RankedTensorType>(boundary.getInput().getType());
    os << "  boundary stage " << boundary.getSrcStage() << " -> " << boundary.getDstStage()
       << " (rank " << boundary.getSrcRank() << " -> " << boundary.getDstRank()
       << (boundary.getWraparound() ? ", wraparound" : "") << "): activation and gradient "
       << type << "\n";
  }
  for (auto scheduleOp : module.getOps<pipe::ScheduleOp>()) {
    pipeline::Schedule schedule = readSchedule(scheduleOp);
    FailureOr<pipeline::ScheduleSpec> spec = scheduleSpecOf(
        func, schedule.kind, schedule.microbatches, schedule.groupSize, simulation);
    if (failed(spec))
      return failure();
    pipeline::SimulationResult result = pipeline::simulateSchedule(schedule, *spec);
    os << llvm::formatv("schedule {0}: m = {1}{2}, verified; predicted step {3:F3} ms at {4} "
                        "TFLOP/s and {5} GB/s P2P, bubble fraction {6:F4} (idle / (ranks x step))\n",
                        pipeline::scheduleKindName(schedule.kind), schedule.microbatches,
                        schedule.groupSize ? llvm::formatv(", g = {0}", schedule.groupSize).str()
                                           : std::string(),
                        result.makespan, simulation.tflops, simulation.linkGBps,
                        result.bubbleFraction);
    if (timeline)
      os << pipeline::formatTimeline(schedule, result);
    if (!tracePath.empty()) {
      std::error_code error;
      llvm::raw_fd_ostream trace(tracePath, error);
      if (error)
        return func.emitError() << "--trace: cannot write '" << tracePath << "': " << error.message();
      trace << pipeline::predictedTrace(schedule, result);
      trace.close();
      if (trace.has_error())
        return func.emitError() << "--trace: writing '" << tracePath << "' failed";
    }
  }
  return success();
}

/// XXH3-64 of the model file, in hex: ties an artifact to its source.
std::string hashFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  std::string text = bytes.str();
  return llvm::formatv("{0:x16}", XXH3_64bits(text.data(), text.size())).str();
}

int fail(const std::string &message) {
  llvm::errs() << "mhcc: " << message << "\n";
  return 1;
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

/// Flag values that no model can make valid, as "--flag: why": reported
/// before the model is read, never at its location.
std::optional<std::string> checkFlags(const DriverOptions &options,
                                      const PipelineOptions &pipeline) {
  if (std::optional<OptionError> error = pipeline.validate())
    return "--" + error->option + ": " + error->message;
  if (!std::isfinite(options.simTflops) || !(options.simTflops > 0))
    return llvm::formatv("--sim-tflops: must be a positive, finite rate, got {0}", options.simTflops.getValue()).str();
  if (!std::isfinite(options.simLinkGBps) || !(options.simLinkGBps >= 0))
    return llvm::formatv("--sim-link-gbps: must be 0 (free communication) or a positive, finite bandwidth, got {0}",
                         options.simLinkGBps.getValue())
        .str();
  if (options.needsArtifact() && pipeline.compileTo != Phase::Schedule)
    return std::string("--compile-to: --emit=artifact, programs and cuda need every phase; "
                       "drop --compile-to");
  const std::string &arch = options.cudaArch;
  const std::string supported = codegen::kCudaArch;
  if (arch != "auto" && arch != "none" && arch != supported)
    return "--cuda-arch: " + arch + " is not supported: mhcc's kernels and the runtime's GPU " +
           "check are for " + supported + " (H100, H200) only; use --cuda-arch " + supported +
           ", or none for a CPU-only artifact";
  if (options.output != "-")
    if (std::string problem = runtime::checkOutputPath("o", options.output, {options.input}); !problem.empty())
      return problem.substr(1); // "-o PATH: ...", as the other -o errors read
  if (std::string problem = runtime::checkOutputPath("trace", options.trace, {options.input, options.output});
      !problem.empty())
    return problem;
  if (options.emit == EmitKind::Artifact && options.output == "-")
    return std::string("-o: --emit=artifact writes a binary file: give it a name with -o FILE");
  return std::nullopt;
}

/// Reads the model graph, imports it and runs the pipeline's phases; on
/// failure, the error has been printed.
OwningOpRef<ModuleOp> compileModel(MLIRContext &context, const std::string &input,
                                   const PipelineOptions &pipeline) {
  ModelError error;
  std::optional<ModelGraph> graph = loadModelGraph(input, error);
  if (!graph) {
    llvm::errs() << formatModelError(input, error) << "\n";
    return nullptr;
  }
  OwningOpRef<ModuleOp> module = importModelGraph(context, *graph, input);
  if (!module) {
    fail("internal error: the imported IR of " + input +
         " does not verify (please report it with the model file)");
    return nullptr;
  }
  PassManager pm(&context);
  if (failed(applyPassManagerCLOptions(pm))) {
    fail("bad pass manager options");
    return nullptr;
  }
  buildPipeline(pm, pipeline);
  if (failed(pm.run(*module))) {
    fail("compilation of " + input + " failed (see above)");
    return nullptr;
  }
  return module;
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

/// The summary: the model's sizes and costs, and what the pipeline decided.
LogicalResult printSummary(ModuleOp module, const DriverOptions &options,
                           llvm::raw_ostream &os) {
  FailureOr<func::FuncOp> func = findModelFunc(module);
  if (failed(func))
    return failure();
  FailureOr<ModelUnits> model = collectModelUnits(*func);
  if (failed(model))
    return failure();
  os << formatModelSummary(*model);
  SimulationOptions simulation{options.simTflops, options.simLinkGBps};
  return printPipelineSummary(module, *func, simulation, options.printSchedule, options.trace, os);
}

/// Writes what --emit asks for; output files appear only when all succeeded.
int emitOutput(ModuleOp module, const DriverOptions &options) {
  std::optional<runtime::Artifact> artifact;
  if (options.needsArtifact()) {
    FailureOr<runtime::Artifact> built = buildArtifact(module, hashFile(options.input));
    if (failed(built))
      return fail("cannot build the artifact of " + options.input + " (see above)");
    artifact = std::move(*built);
  }
  if (options.emit == EmitKind::Artifact) {
    std::string writeError;
    if (failed(addDeviceCode(*artifact, options)))
      return 1;
    if (!runtime::writeArtifact(options.output, *artifact, writeError))
      return fail(writeError);
    return 0;
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
  else if (failed(printSummary(module, options, out->os())))
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
  OwningOpRef<ModuleOp> module = compileModel(context, options.input, pipeline);
  if (!module)
    return 1;
  return emitOutput(*module, options);
}

} // namespace mhcc
