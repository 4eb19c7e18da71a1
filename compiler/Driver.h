//===- Driver.h - mhcc's own flags and compile steps -------------*- C++ -*-===//
//
// mhcc's flags beyond the pipeline's (compiler/Pipeline.h), the checks made
// before the model is read, and the steps runMhcc strings together (read,
// import and compile a model; print its summary). Declared here so the
// command-line fuzz target (tests/fuzz/mhcc_flags_fuzz.cpp) drives the very
// code mhcc runs.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_COMPILER_DRIVER_H
#define MHCC_COMPILER_DRIVER_H

#include "compiler/Pipeline.h"
#include "passes/PipelineIR.h"
#include "runtime/artifact/Artifact.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/raw_ostream.h"

#include <optional>
#include <string>

namespace mhcc {

enum class EmitKind { Summary, Mlir, Programs, Cuda, Artifact };

/// The --help category of the CUDA flags.
llvm::cl::OptionCategory &cudaCategory();

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
  llvm::cl::opt<std::string> deviceProfile{
      "device-profile",
      llvm::cl::desc("Rates the schedule simulator assumes: a built-in profile (h200-bf16, h200-fp32, "
                     "cpu) or a file from mhcrun --device-profile-out (default: cpu with --cuda-arch "
                     "none, else the H200 profile of the model's dtype)"),
      llvm::cl::value_desc("name|file.json"), llvm::cl::cat(pipelineCategory())};
  llvm::cl::opt<double> simTflops{"sim-tflops",
                                  llvm::cl::desc("A flat compute rate for every unit instead of a device profile"),
                                  llvm::cl::init(400), llvm::cl::cat(pipelineCategory())};
  llvm::cl::opt<double> simLinkGBps{
      "sim-link-gbps", llvm::cl::desc("P2P bandwidth with --sim-tflops, or instead of the profile's (GB/s)"),
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

/// Flag values that no model can make valid, as "--flag: why" (reported
/// before the model is read, never at its location), or nullopt.
std::optional<std::string> checkFlags(const DriverOptions &options, const PipelineOptions &pipeline);

/// Reads the model graph at `input`, chooses the simulator's rates for it
/// (simulationOptions), imports it and runs the pipeline's phases (for
/// --schedule auto, every candidate's, writing the ranking to `report`); on
/// failure the error has been printed and the result is null.
mlir::OwningOpRef<mlir::ModuleOp> compileModel(mlir::MLIRContext &context, const std::string &input,
                                               const PipelineOptions &pipeline, const DriverOptions &options,
                                               SimulationOptions &simulation, llvm::raw_ostream &report);

/// The simulator's rates for a model of `dtype`: --device-profile, else
/// --sim-tflops / --sim-link-gbps when given, else the built-in profile of
/// the target (cpu for --cuda-arch none, else h200-bf16 / h200-fp32);
/// --sim-link-gbps given with a profile replaces its link bandwidth. nullopt
/// and `error` when the profile cannot be read.
std::optional<SimulationOptions> simulationOptions(const DriverOptions &options, const std::string &dtype,
                                                   std::string &error);

/// The summary: the model's sizes and costs, and what the pipeline decided
/// (with --print-schedule the per-rank timeline).
mlir::LogicalResult printSummary(mlir::ModuleOp module, const DriverOptions &options,
                                 const SimulationOptions &simulation, llvm::raw_ostream &os);

/// --trace: the simulator's per-rank timeline of the module's schedule as
/// Chrome trace events at `path`, whatever --emit writes beside it.
mlir::LogicalResult writePredictedTrace(mlir::ModuleOp module, const SimulationOptions &simulation,
                                        const std::string &path);

/// The simulator's step time and bubble for the module's schedule, as the
/// artifact records them; nullopt without a schedule.
std::optional<runtime::Prediction> predictStep(mlir::ModuleOp module, const SimulationOptions &simulation);

/// Prints "mhcc: MESSAGE" and returns mhcc's failure status, 1.
int fail(const std::string &message);

} // namespace mhcc

#endif // MHCC_COMPILER_DRIVER_H
