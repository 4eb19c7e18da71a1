//===- DriverSteps.cpp - mhcc's flag checks, compile and summary -----------===//
//
// The parts of mhcc between parsing the command line and writing the output
// (compiler/Driver.h); Driver.cpp's runMhcc strings them together.
//
//===----------------------------------------------------------------------===//
#include "compiler/Driver.h"

#include "compiler/AutoSchedule.h"

#include "compiler/codegen/CudaCodegen.h"
#include "compiler/Importer.h"
#include "compiler/ModelGraph.h"
#include "dialects/mhc/IR/MhcOps.h"
#include "passes/ModelUnits.h"
#include "passes/PipelineIR.h"
#include "runtime/cli/FlagChecks.h"

#include "mlir/Pass/PassManager.h"
#include "llvm/Support/FormatVariadic.h"

#include <cmath>

using namespace mlir;

namespace mhcc {

llvm::cl::OptionCategory &cudaCategory() {
  static llvm::cl::OptionCategory category("CUDA kernels");
  return category;
}

int fail(const std::string &message) {
  llvm::errs() << "mhcc: " << message << "\n";
  return 1;
}

namespace {

/// Bytes a parameter element costs a CUDA rank besides activations: the
/// fp32 master (what an fp32 model's kernels read; a bf16 model's read a
/// bf16 copy beside it), Adam's two fp32 moments and the fp32 main gradient.
/// The distributed optimizer splits the moments, and a bf16 model's
/// masters, over its `parts` (what mhcrun's banner prints per rank).
double cudaStateBytesPerParameter(bool bf16, int64_t parts, bool remainders) {
  // mhcrun --store-param-remainders: a master as its bf16 copy and 2 bytes.
  const double copy = bf16 ? 2 : 0, master = remainders ? 2 : 4, moments = 8, gradient = 4;
  if (parts <= 1)
    return copy + master + moments + gradient;
  return copy + gradient + (bf16 ? (master + moments) / double(parts) : master + moments / double(parts));
}

/// What MTP's uses of the embedding and the LM head (parameters the stages'
/// costs give to their first users) add on the CUDA backend, by pipeline
/// rank: a gradient buffer a use; on the MTP rank, if another rank owns the
/// embedding, its copy (a bf16 model's bf16 copy, and the fp32 master
/// unless the distributed optimizer splits the masters); on each owner a
/// buffer for its part of the summed gradient (runtime/cuda/CudaRank.cpp).
std::vector<double> sharedParameterBytes(func::FuncOp func, const pipeline::Schedule &schedule, const ModelInfo &dims,
                                         int64_t parts, bool remainders) {
  std::vector<int64_t> modules(schedule.pp, 0); // MTP modules by rank
  for (auto mtp : func.getOps<mhc::MtpOp>())
    if (auto stage = mtp->getAttrOfType<IntegerAttr>(pipe::kStageAttr))
      ++modules[stage.getInt() % schedule.pp];
  std::vector<double> bytes(schedule.pp, 0);
  const bool bf16 = dims.dtype == "bf16", partMasters = bf16 && parts > 1;
  const double table = double(dims.vocab) * double(dims.hidden) / double(schedule.tp); // embedding or head, a rank's
  for (int64_t r = 0; r < schedule.pp; ++r) {
    if (modules[r] == 0)
      continue;
    bytes[r] += double(modules[r]) * 2 * 4 * table; // a gradient for each module's use of each
    if (r != 0)                                      // the embedding held here too
      bytes[r] += table * ((bf16 ? 2 : 0) + (partMasters || remainders ? 0 : 4));
    bytes[0] += 4 * table / double(parts); // the embedding's owner: its part of the sum
    bytes[r] += 4 * table / double(parts); // the head's owner (L's rank, MTP's): likewise
  }
  return bytes;
}

/// Each rank's predicted device memory on the CUDA backend: its stages'
/// parameters (tensor-parallel blocks) at cudaStateBytesPerParameter, what
/// MTP's shared parameters add, plus the simulated peak of live activations
/// and boundary buffers.
void printDeviceMemory(func::FuncOp func, const ModelInfo &dims, const pipeline::Schedule &schedule,
                       const pipeline::ScheduleSpec &spec, const pipeline::SimulationResult &result,
                       llvm::raw_ostream &os) {
  const int64_t parts = schedule.distributedOptimizer ? schedule.dp * schedule.cp : 1;
  const bool bf16 = dims.dtype == "bf16";
  // Each rank's state and total, whole masters or (bf16) remainders.
  auto ranks = [&](bool remainders) {
    const double perParameter = cudaStateBytesPerParameter(bf16, parts, remainders);
    const std::vector<double> shared = sharedParameterBytes(func, schedule, dims, parts, remainders);
    std::string out;
    for (int64_t r = 0; r < schedule.pp; ++r) {
      int64_t params = 0;
      for (size_t s = r; s < spec.stages.size(); s += schedule.pp)
        params += spec.stages[s].params;
      const double state = double(params) * perParameter + shared[r];
      out += " rank " + std::to_string(r) + " " + humanBytes(state + double(result.peakBytes[r])) + " (" +
             humanBytes(state) + " + " + humanBytes(double(result.peakBytes[r])) + ")" +
             (r + 1 < schedule.pp ? ";" : "");
    }
    return out;
  };
  os << llvm::formatv("predicted device memory a rank on the CUDA backend (the parameters' state at {0:F1} B "
                      "each, plus the peak activations; workspaces, the pool's slack and the CUDA context not "
                      "counted):",
                      cudaStateBytesPerParameter(bf16, parts, false))
     << ranks(false) << "\n";
  if (bf16)
    os << llvm::formatv("  with mhcrun --store-param-remainders (each fp32 master as its bf16 copy and 16 bits, "
                        "{0:F1} B a parameter):",
                        cudaStateBytesPerParameter(bf16, parts, true))
       << ranks(true) << "\n";
}

/// What the pipeline phases decided, if they ran: layout, boundaries and the
/// schedule's predicted bubble and memory (with --print-schedule, the full
/// per-rank timeline).
LogicalResult printPipelineSummary(ModuleOp module, func::FuncOp func,
                                   const SimulationOptions &simulation, bool timeline, llvm::raw_ostream &os) {
  if (!func->hasAttr(pipe::kLayoutAttr))
    return success();
  FailureOr<pipeline::Layout> layout = layoutOf(func);
  if (failed(layout))
    return failure();
  os << "pipeline: pp = " << layout->pp << ", vpp = " << layout->vpp << ", layout "
     << layout->toString() << "\n";
  // Under context (and sequence) parallelism each rank sends its share of
  // the boundary's tokens.
  int64_t cp = 1, tp = 1;
  bool sequenceParallel = false;
  for (auto scheduleOp : module.getOps<pipe::ScheduleOp>()) {
    cp = scheduleOp.getCp().value_or(1);
    tp = scheduleOp.getTp().value_or(1);
    sequenceParallel = scheduleOp.getSequenceParallel();
  }
  for (auto boundary : func.getOps<pipe::BoundaryOp>()) {
    auto type = cast<RankedTensorType>(boundary.getInput().getType());
    os << "  boundary stage " << boundary.getSrcStage() << " -> " << boundary.getDstStage()
       << " (rank " << boundary.getSrcRank() << " -> " << boundary.getDstRank()
       << (boundary.getWraparound() ? ", wraparound" : "") << "): activation and gradient " << type;
    if (cp > 1)
      os << ", per context-parallel rank " << type.getDimSize(0) / cp << " x " << type.getDimSize(1)
         << " (S/cp x n*C)";
    if (sequenceParallel)
      os << ", per tensor-parallel rank " << type.getDimSize(0) / cp / tp << " x " << type.getDimSize(1)
         << (cp > 1 ? " (S/(cp tp) x n*C)" : " (S/tp x n*C)");
    os << "\n";
  }
  for (auto scheduleOp : module.getOps<pipe::ScheduleOp>()) {
    pipeline::Schedule schedule = readSchedule(scheduleOp);
    FailureOr<pipeline::ScheduleSpec> spec = scheduleSpecOf(
        func, schedule.kind, schedule.microbatches, schedule.groupSize, simulation, schedule.cp, schedule.tp,
        schedule.sequenceParallel, schedule.recomputeSublayers, schedule.recomputeNumSublayers);
    if (failed(spec))
      return failure();
    pipeline::SimulationResult result = pipeline::simulateSchedule(schedule, *spec);
    os << llvm::formatv("schedule {0}: m = {1}{2}, verified; predicted step {3:F3} ms with {4}, "
                        "bubble fraction {5:F4} (idle / (ranks x step))\n",
                        pipeline::scheduleKindName(schedule.kind), schedule.microbatches,
                        schedule.groupSize ? llvm::formatv(", g = {0}", schedule.groupSize).str()
                                           : std::string(),
                        result.makespan, simulation.profile.describe(), result.bubbleFraction);
    if (schedule.dp > 1)
      os << "data parallel: dp = " << schedule.dp << " replicas of each rank's list (world = pp x dp = "
         << schedule.pp * schedule.dp << " ranks, rank = pipeline rank x dp + replica); replica d takes "
         << "microbatches d, d + " << schedule.dp << ", ... of the global batch of " << schedule.dp * schedule.microbatches
         << "; each stage's ALLREDUCE sums its gradients over the replicas right after the stage's last backward, "
            "while the rank goes on with its other stages' (a bucket per model chunk)\n";
    if (schedule.cp > 1)
      os << "context parallel: cp = " << schedule.cp << " ranks share each sequence (world = pp x dp x cp = "
         << schedule.pp * schedule.dp * schedule.cp
         << " ranks, rank = (pipeline rank x dp + replica) x cp + context rank); context rank i holds chunks i and "
         << 2 * schedule.cp - 1 << " - i of the sequence's " << 2 * schedule.cp
         << " (load-balanced causal split), so every boundary carries " << spec->tokens
         << " tokens a microbatch; attention exchanges q, k, v within the group (each rank its own queries and keys), and "
            "the ALLREDUCE spans dp x cp = "
         << schedule.dp * schedule.cp << " ranks\n";
    if (schedule.distributedOptimizer)
      os << "distributed optimizer: each stage's gradient reduction is a REDUCESCATTER over the gradient group (dp x "
            "cp = "
         << schedule.dp * schedule.cp
         << " ranks), each member keeping Adam's moments of its part of every parameter, updating it and "
            "all-gathering the weights\n";
    if (schedule.recomputeSublayers)
      os << "activation recomputation: "
         << (schedule.recomputeNumSublayers > 1
                 ? "each segment of " + std::to_string(schedule.recomputeNumSublayers) + " sublayers keeps its input "
                   "residual from its forward to its backward and runs its forward again before it"
                 : std::string("each sublayer keeps its input residual from its forward to its backward and runs its "
                               "forward again before it"))
         << " (the peaks and step above count it, with the recomputed forwards' collectives under tp or cp; "
            "mhcrun recomputes)\n";
    if (schedule.tp > 1)
      os << "tensor parallel: tp = " << schedule.tp << " ranks split each layer (world = pp x dp x cp x tp = "
         << schedule.pp * schedule.dp * schedule.cp * schedule.tp
         << " ranks, tensor-parallel fastest); column-parallel q/k/v and gate/up, row-parallel output and down "
            "projections, vocabulary-parallel embedding, LM head and cross-entropy, mHC replicated; "
         << (schedule.sequenceParallel
                 ? "sequence parallel: each rank holds " + std::to_string(spec->tokens) +
                       " tokens a microbatch outside the GEMMs (all-gather before the column-parallel ones, "
                       "reduce-scatter after the row-parallel ones)"
                 : std::string("every rank holds the whole microbatch (all-reduce after the row-parallel GEMMs)"))
         << "; the time splits the GEMMs and heads evenly and keeps the mixing, expand, contract and final norm "
            "whole on every rank unless sequence parallelism shards their rows (the embedding's lookup whole "
            "either way), each collective priced as a ring over the link\n";
    if (FailureOr<ModelInfo> dims = modelInfoOf(func); succeeded(dims))
      printDeviceMemory(func, *dims, schedule, *spec, result, os);
    if (timeline)
      os << pipeline::formatTimeline(schedule, result);
  }
  return success();
}

} // namespace

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
  if (!options.deviceProfile.empty() && options.simTflops.getNumOccurrences() > 0)
    return std::string("--sim-tflops: a flat rate and --device-profile exclude each other; keep one");
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

std::optional<SimulationOptions> simulationOptions(const DriverOptions &options, const std::string &dtype,
                                                   std::string &error) {
  const bool flatRate = options.simTflops.getNumOccurrences() > 0;
  const bool link = options.simLinkGBps.getNumOccurrences() > 0;
  SimulationOptions simulation;
  if (options.deviceProfile.empty() && (flatRate || link)) {
    simulation.profile = nominalProfile(options.simTflops, options.simLinkGBps);
    return simulation;
  }
  std::string name = options.deviceProfile;
  if (name.empty())
    name = options.cudaArch == "none" ? "cpu" : dtype == "bf16" ? "h200-bf16" : "h200-fp32";
  std::optional<DeviceProfile> profile = loadDeviceProfile(name, error);
  if (!profile) {
    error = "--device-profile: " + error;
    return std::nullopt;
  }
  simulation.profile = *profile;
  if (link)
    simulation.profile.linkGBps = options.simLinkGBps;
  return simulation;
}

/// Why `graph` cannot be split over pipeline.tp tensor-parallel ranks
/// (empty: it can): whole heads, FFN columns and vocabulary rows per rank,
/// whole sequence shares under sequence parallelism.
std::string tensorParallelProblem(const ModelGraph &graph, const PipelineOptions &pipeline) {
  const ModelConfig &m = graph.config;
  const int64_t tp = pipeline.tp;
  if (tp == 1)
    return "";
  auto notDivided = [&](const char *what, int64_t value) {
    return std::string(what) + " " + std::to_string(value) + " does not split over tp = " + std::to_string(tp);
  };
  if (m.heads % tp)
    return notDivided("heads", m.heads) + " (each rank takes whole heads)";
  if (m.ffnHidden % tp)
    return notDivided("ffn_hidden", m.ffnHidden);
  if (m.vocab % tp)
    return notDivided("vocab", m.vocab) + " (the embedding and LM head split it)";
  if (pipeline.sequenceParallel && pipeline.cp == 1 && m.seqLen % tp)
    return notDivided("seq_len", m.seqLen) + " under --sequence-parallel";
  if (pipeline.sequenceParallel && pipeline.cp > 1 && m.seqLen % (2 * pipeline.cp) == 0 &&
      (m.seqLen / pipeline.cp) % tp)
    return notDivided("seq_len / cp", m.seqLen / pipeline.cp) +
           " under --sequence-parallel (each context-parallel rank's rows of a sequence split over the "
           "tensor-parallel ranks)";
  return "";
}

OwningOpRef<ModuleOp> compileModel(MLIRContext &context, const std::string &input,
                                   const PipelineOptions &pipeline, const DriverOptions &options,
                                   SimulationOptions &simulation, llvm::raw_ostream &report) {
  ModelError error;
  std::optional<ModelGraph> graph = loadModelGraph(input, error);
  if (!graph) {
    llvm::errs() << formatModelError(input, error) << "\n";
    return nullptr;
  }
  if (pipeline.cp > 1 && graph->config.seqLen % (2 * pipeline.cp) != 0) {
    fail("--cp " + std::to_string(pipeline.cp) + ": seq_len " + std::to_string(graph->config.seqLen) + " of " + input +
         " does not split into 2 x cp = " + std::to_string(2 * pipeline.cp) +
         " equal chunks (the load-balanced causal split); choose a cp that divides seq_len / 2");
    return nullptr;
  }
  if (std::string problem = tensorParallelProblem(*graph, pipeline); !problem.empty()) {
    fail("--tp " + std::to_string(pipeline.tp) + ": " + problem + " of " + input);
    return nullptr;
  }
  std::string profileError;
  std::optional<SimulationOptions> rates =
      simulationOptions(options, graph->config.dtype, profileError);
  if (!rates) {
    fail(profileError);
    return nullptr;
  }
  simulation = *rates;
  OwningOpRef<ModuleOp> module = importModelGraph(context, *graph, input);
  if (!module) {
    fail("internal error: the imported IR of " + input +
         " does not verify (please report it with the model file)");
    return nullptr;
  }
  if (pipeline.schedule == "auto") {
    OwningOpRef<ModuleOp> chosen = compileAutoSchedule(*module, pipeline, simulation, report);
    if (!chosen)
      fail("--schedule auto: no candidate schedule compiles for " + input + " (the ranking says why)");
    return chosen;
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

std::optional<runtime::Prediction> predictStep(ModuleOp module, const SimulationOptions &simulation) {
  FailureOr<pipeline::SimulationResult> result = simulateModuleSchedule(module, simulation);
  if (failed(result))
    return std::nullopt;
  return runtime::Prediction{result->makespan, result->bubbleFraction, simulation.profile.describe()};
}

LogicalResult printSummary(ModuleOp module, const DriverOptions &options, const SimulationOptions &simulation,
                           llvm::raw_ostream &os) {
  FailureOr<func::FuncOp> func = findModelFunc(module);
  if (failed(func))
    return failure();
  FailureOr<ModelUnits> model = collectModelUnits(*func);
  if (failed(model))
    return failure();
  os << formatModelSummary(*model);
  return printPipelineSummary(module, *func, simulation, options.printSchedule, os);
}

LogicalResult writePredictedTrace(ModuleOp module, const SimulationOptions &simulation, const std::string &path) {
  auto scheduleOps = module.getOps<pipe::ScheduleOp>();
  if (scheduleOps.empty())
    return module.emitError() << "--trace: the module has no pipeline schedule to trace (compile it to the "
                                 "schedule: drop --compile-to or use --compile-to=schedule)";
  FailureOr<pipeline::SimulationResult> result = simulateModuleSchedule(module, simulation);
  if (failed(result))
    return failure();
  std::error_code error;
  llvm::raw_fd_ostream trace(path, error);
  if (error)
    return module.emitError() << "--trace: cannot write '" << path << "': " << error.message();
  trace << pipeline::predictedTrace(readSchedule(*scheduleOps.begin()), *result);
  trace.close();
  if (trace.has_error())
    return module.emitError() << "--trace: writing '" << path << "' failed";
  return success();
}

} // namespace mhcc
