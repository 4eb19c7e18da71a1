//===- Driver.cpp - the mhcc command line -------------------------------------===//
//
// mhcc MODEL.json [-o OUT] [--emit=summary|mlir|programs|cuda|artifact]
//      [--compile-to=PHASE] [--cuda-arch=auto|none|sm_90] [--nvcc=PATH]
//
// Every failure prints one line naming the file and the place, and exits 1;
// output files are only written (atomically) once the compile succeeded.
//
//===----------------------------------------------------------------------===//
#include "compiler/codegen/CudaCodegen.h"
#include "compiler/Importer.h"
#include "compiler/Lowering.h"
#include "compiler/InitAll.h"
#include "compiler/ModelGraph.h"
#include "compiler/Pipeline.h"
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
          clEnumValN(EmitKind::Mlir, "mlir", "the IR after the last phase run"),
          clEnumValN(EmitKind::Programs, "programs",
                     "each stage's forward and (autodiff) backward kernel program"),
          clEnumValN(EmitKind::Cuda, "cuda",
                     "the model's generated CUDA kernels (the source nvcc compiles)"),
          clEnumValN(EmitKind::Artifact, "artifact",
                     "the versioned artifact mhcrun executes (needs -o FILE)"))};
  llvm::cl::opt<std::string> compileTo{
      "compile-to",
      llvm::cl::desc("Stop after this phase (" + phaseNames() + ")"),
      llvm::cl::value_desc("phase"), llvm::cl::init(allPhases().back().name)};

  llvm::cl::OptionCategory cudaCategory{"CUDA kernels"};
  llvm::cl::opt<std::string> cudaArch{
      "cuda-arch",
      llvm::cl::desc("GPU architecture of the artifact's kernels: sm_90 (H100, H200; the only "
                     "one the runtime runs), none (CPU backend only), or auto (sm_90 when nvcc "
                     "is found, else none with a note)"),
      llvm::cl::init("auto"), llvm::cl::cat(cudaCategory)};
  llvm::cl::opt<std::string> nvcc{
      "nvcc", llvm::cl::desc("nvcc to compile the kernels with (default: $CUDA_HOME/bin, "
                             "/usr/local/cuda/bin, PATH)"),
      llvm::cl::value_desc("path"), llvm::cl::cat(cudaCategory)};

  llvm::cl::OptionCategory pipelineCategory{"Pipeline parallelism"};
  llvm::cl::opt<int64_t> pp{"pp", llvm::cl::desc("Pipeline ranks p"), llvm::cl::init(1),
                            llvm::cl::cat(pipelineCategory)};
  llvm::cl::opt<int64_t> vpp{"vpp", llvm::cl::desc("Virtual chunks per rank v"),
                             llvm::cl::init(1), llvm::cl::cat(pipelineCategory)};
  llvm::cl::opt<std::string> layout{
      "layout",
      llvm::cl::desc("Megatron-style layout (E, t, m, L, |, *N), e.g. Et|tt|tt|tL; "
                     "default: cost-balanced automatic partition"),
      llvm::cl::cat(pipelineCategory)};
  llvm::cl::opt<double> memoryCapGib{
      "memory-cap-gib", llvm::cl::desc("Memory per virtual stage for the automatic partition"),
      llvm::cl::init(0), llvm::cl::cat(pipelineCategory)};
  llvm::cl::opt<int64_t> microbatches{"microbatches", llvm::cl::desc("Microbatches per step m"),
                                      llvm::cl::init(8), llvm::cl::cat(pipelineCategory)};
  llvm::cl::opt<std::string> schedule{
      "schedule",
      llvm::cl::desc("gpipe, 1f1b, interleaved or zb-h1 (default: 1f1b, interleaved if --vpp > 1)"),
      llvm::cl::cat(pipelineCategory)};
  llvm::cl::opt<int64_t> microbatchGroup{
      "microbatch-group", llvm::cl::desc("Interleaved microbatch group g (default p)"),
      llvm::cl::init(0), llvm::cl::cat(pipelineCategory)};
  llvm::cl::opt<bool> printSchedule{
      "print-schedule",
      llvm::cl::desc("Print each rank's timeline, the predicted bubble and peak activations"),
      llvm::cl::cat(pipelineCategory)};
  llvm::cl::opt<double> simTflops{"sim-tflops",
                                  llvm::cl::desc("Compute rate the schedule simulator assumes"),
                                  llvm::cl::init(400), llvm::cl::cat(pipelineCategory)};
  llvm::cl::opt<double> simLinkGBps{
      "sim-link-gbps", llvm::cl::desc("P2P bandwidth the schedule simulator assumes (GB/s)"),
      llvm::cl::init(200), llvm::cl::cat(pipelineCategory)};
  llvm::cl::opt<bool> testMisorderP2P{
      "test-misorder-p2p",
      llvm::cl::desc("Testing only: swap two same-peer receives so verification must fail"),
      llvm::cl::Hidden};
};

/// What the pipeline phases decided, if they ran: layout, boundaries and the
/// schedule's predicted bubble and memory (with --print-schedule, the full
/// per-rank timeline).
LogicalResult printPipelineSummary(ModuleOp module, func::FuncOp func,
                                   const SimulationOptions &simulation, bool timeline,
                                   llvm::raw_ostream &os) {
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
                        "TFLOP/s and {5} GB/s P2P, bubble fraction {6:F4}\n",
                        pipeline::scheduleKindName(schedule.kind), schedule.microbatches,
                        schedule.groupSize ? llvm::formatv(", g = {0}", schedule.groupSize).str()
                                           : std::string(),
                        result.makespan, simulation.tflops, simulation.linkGBps,
                        result.bubbleFraction);
    if (timeline)
      os << pipeline::formatTimeline(schedule, result);
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

} // namespace

int runMhcc(int argc, char **argv) {
  llvm::InitLLVM initLLVM(argc, argv);
  registerAsmPrinterCLOptions();
  registerMLIRContextCLOptions();
  registerPassManagerCLOptions();
  registerDefaultTimingManagerCLOptions();
  Options options;
  // MHCC_OPTIONS holds default options, read before the command line's.
  llvm::cl::ParseCommandLineOptions(
      argc, argv,
      "mhcc: compiles mHC transformer model graphs for pipelined training\n", nullptr, nullptr,
      "MHCC_OPTIONS");

  std::optional<Phase> lastPhase = parsePhase(options.compileTo);
  if (!lastPhase)
    return fail("unknown phase '" + options.compileTo + "' for --compile-to; "
                "phases: " + phaseNames());

  bool needsArtifact = options.emit == EmitKind::Artifact || options.emit == EmitKind::Programs ||
                       options.emit == EmitKind::Cuda;
  if (needsArtifact && *lastPhase != Phase::Schedule)
    return fail("--emit=artifact, programs and cuda need every phase; drop --compile-to");
  const std::string cudaArch = options.cudaArch;
  const std::string supported = codegen::kCudaArch;
  if (cudaArch != "auto" && cudaArch != "none" && cudaArch != supported)
    return fail("--cuda-arch: " + cudaArch + " is not supported: mhcc's kernels and the runtime's GPU " +
                "check are for " + supported + " (H100, H200) only; use --cuda-arch " + supported +
                ", or none for a CPU-only artifact");
  if (options.emit == EmitKind::Artifact && options.output == "-")
    return fail("--emit=artifact writes a binary file: give it a name with -o FILE");

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
  PipelineOptions pipelineOptions;
  pipelineOptions.pp = options.pp;
  pipelineOptions.vpp = options.vpp;
  pipelineOptions.layout = options.layout;
  pipelineOptions.memoryCapGib = options.memoryCapGib;
  pipelineOptions.microbatches = options.microbatches;
  pipelineOptions.schedule = options.schedule;
  pipelineOptions.groupSize = options.microbatchGroup;
  pipelineOptions.testMisorderP2P = options.testMisorderP2P;
  buildPipeline(pm, *lastPhase, pipelineOptions);
  if (failed(pm.run(*module)))
    return fail("compilation of " + options.input + " failed (see above)");

  std::optional<runtime::Artifact> artifact;
  if (needsArtifact) {
    FailureOr<runtime::Artifact> built = buildArtifact(*module, hashFile(options.input));
    if (failed(built))
      return fail("cannot build the artifact of " + options.input + " (see above)");
    artifact = std::move(*built);
  }
  if (options.emit == EmitKind::Artifact && cudaArch != "none") {
    std::string nvccError;
    std::optional<std::string> nvcc = codegen::findNvcc(options.nvcc, nvccError);
    if (!nvcc && (cudaArch != "auto" || !options.nvcc.empty()))
      return fail(nvccError + "; the CUDA kernels for " + cudaArch +
                  " need it: install the CUDA toolkit, pass --nvcc PATH, or --cuda-arch none for a "
                  "CPU-only artifact");
    if (!nvcc) {
      llvm::errs() << "mhcc: note: " << nvccError << ": the artifact runs on the CPU backend only; "
                   << "pass --nvcc PATH for GPU kernels, or --cuda-arch none to silence this\n";
    } else {
      std::string codegenError;
      std::optional<runtime::DeviceCode> code = codegen::compileModelKernels(
          artifact->model, codegen::emitModelKernels(artifact->model, artifact->modelHash), *nvcc,
          codegen::kCudaArch, codegenError);
      if (!code)
        return fail(codegenError);
      artifact->deviceCode = std::move(*code);
    }
  }
  if (options.emit == EmitKind::Artifact) {
    std::string writeError;
    if (!runtime::writeArtifact(options.output, *artifact, writeError))
      return fail(writeError);
    return 0;
  }

  std::string message;
  std::unique_ptr<llvm::ToolOutputFile> out = openOutputFile(options.output, &message);
  if (!out)
    return fail("cannot write '" + options.output + "': " + message);
  if (options.emit == EmitKind::Mlir) {
    module->print(out->os());
  } else if (options.emit == EmitKind::Programs) {
    out->os() << formatPrograms(*artifact);
  } else if (options.emit == EmitKind::Cuda) {
    out->os() << codegen::emitModelKernels(artifact->model, artifact->modelHash);
  } else {
    FailureOr<func::FuncOp> func = findModelFunc(*module);
    if (failed(func))
      return 1;
    FailureOr<ModelUnits> model = collectModelUnits(*func);
    if (failed(model))
      return 1;
    out->os() << formatModelSummary(*model);
    SimulationOptions simulation{options.simTflops, options.simLinkGBps};
    if (failed(printPipelineSummary(*module, *func, simulation, options.printSchedule, out->os())))
      return 1;
  }
  out->keep();
  return 0;
}

} // namespace mhcc
