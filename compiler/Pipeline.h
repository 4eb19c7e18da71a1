//===- Pipeline.h - mhcc's compilation phases and their options ---*- C++ -*-===//
//
// The options of a compile are declared once, in PipelineOptions::bindOptions,
// and bound two ways, as IREE binds its pipeline options: as mhcc's
// command-line flags (PipelineFlags) and as the options of the
// `mhcc-pipeline` pass pipeline that mhc-opt registers
// (registerMhccPipeline). Both build the same passes through buildPipeline.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_COMPILER_PIPELINE_H
#define MHCC_COMPILER_PIPELINE_H

#include "mlir/Pass/PassManager.h"
#include "llvm/Support/CommandLine.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mhcc {

/// The phases of a compile, in order; `--compile-to=PHASE` stops after one.
enum class Phase {
  Import,    // JSON model graph -> verified mhc dialect
  Partition, // layers -> virtual stages (pipe.stage)
  P2P,       // pipe.boundary on every stage edge
  Schedule,  // per-rank instruction lists, verified by simulation
};

/// The --help categories of the options below; mhcc adds its own flags to them.
llvm::cl::OptionCategory &compilationCategory();
llvm::cl::OptionCategory &pipelineCategory();

/// A bad option value: the option's name (`pp`) and what is wrong with it.
struct OptionError {
  std::string option;
  std::string message;
};

struct PipelineOptions {
  Phase compileTo = Phase::Schedule;
  int64_t pp = 1;
  int64_t vpp = 1;
  std::string layout;       // empty: cost-balanced automatic partition
  double memoryCapGib = 0;  // automatic partition only; 0: no cap
  int64_t microbatches = 8;
  std::string schedule;     // empty: 1f1b for vpp = 1, else interleaved; "auto" (AutoSchedule.h)
  int64_t microbatchGroup = 0; // interleaved g; 0: p
  int64_t dp = 1;              // data-parallel replicas of the pipeline
  int64_t cp = 1;              // context-parallel ranks sharing each sequence
  int64_t tp = 1;              // tensor-parallel ranks splitting each layer
  bool sequenceParallel = false; // Megatron's sequence parallelism (tp > 1)
  bool distributedOptimizer = false; // ZeRO-1 over the dp x cp gradient group (dp > 1)
  bool recomputeSublayers = false;   // activation recomputation, costed and recorded in the artifact
  int64_t recomputeNumSublayers = 1; // with it, the sublayers a recomputed segment holds
  bool testMisorderP2P = false;

  /// Declares every option once: `binder.option(field, name, modifiers...)`
  /// with the llvm::cl modifiers (description, values, category); the field's
  /// initializer above is the default.
  template <typename Binder>
  void bindOptions(Binder &binder);

  std::string scheduleKind() const {
    return !schedule.empty() ? schedule : vpp > 1 ? "interleaved" : "1f1b";
  }

  /// The first option value no model can make valid (pp = 0, an unknown
  /// schedule, a layout with a syntax error or the wrong number of stages, a
  /// schedule shape buildSchedule refuses), or nullopt. Tools report it as a
  /// flag error, not at the model.
  std::optional<OptionError> validate() const;

  /// Limits on the pipeline flags (validate).
  static constexpr int64_t kMaxPipelineRanks = 1024, kMaxVirtualStages = 64, kMaxMicrobatches = 4096;
  /// Stage x microbatch pairs, each a handful of instructions the verifier
  /// simulates (measured on the 2-core VM: 65,536 pairs at PP16/VPP4 compile
  /// in about 25 s).
  static constexpr int64_t kMaxStageMicrobatches = 65536;
};

/// mhcc's command-line flags for `options`, each writing into its field;
/// registered while this object lives.
class PipelineFlags {
public:
  explicit PipelineFlags(PipelineOptions &options);
  ~PipelineFlags();
  PipelineFlags(const PipelineFlags &) = delete;
  PipelineFlags &operator=(const PipelineFlags &) = delete;

  /// The binder call of PipelineOptions::bindOptions: one global flag.
  template <typename T, typename... Modifiers>
  void option(T &field, llvm::StringRef name, Modifiers &&...modifiers) {
    flags_.push_back(std::make_unique<llvm::cl::opt<T, /*ExternalStorage=*/true>>(
        name, llvm::cl::location(field), std::forward<Modifiers>(modifiers)...));
  }

private:
  std::vector<std::unique_ptr<llvm::cl::Option>> flags_;
};

/// Adds the passes of every phase after Import up to `options.compileTo`.
void buildPipeline(mlir::OpPassManager &pm, const PipelineOptions &options);

/// Registers `-mhcc-pipeline="pp=2 vpp=2 ..."`: mhcc's passes and options in
/// mhc-opt.
void registerMhccPipeline();

} // namespace mhcc

#endif // MHCC_COMPILER_PIPELINE_H
