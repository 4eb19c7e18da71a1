//===- Pipeline.cpp - mhcc's compilation phases and their options -----------===//
#include "compiler/Pipeline.h"

#include "passes/Passes.h"
#include "passes/pipeline/Layout.h"
#include "passes/pipeline/Schedule.h"
#include "runtime/artifact/Artifact.h"
#include "mlir/Pass/PassRegistry.h"
#include "llvm/Support/FormatVariadic.h"

#include <cmath>
#include <functional>

namespace mhcc {

llvm::cl::OptionCategory &compilationCategory() {
  static llvm::cl::OptionCategory category("Compilation");
  return category;
}

llvm::cl::OptionCategory &pipelineCategory() {
  static llvm::cl::OptionCategory category("Pipeline parallelism");
  return category;
}

template <typename Binder>
void PipelineOptions::bindOptions(Binder &binder) {
  namespace cl = llvm::cl;
  binder.option(compileTo, "compile-to", cl::desc("Stop after this phase"),
                cl::value_desc("phase"), cl::cat(compilationCategory()),
                cl::values(clEnumValN(Phase::Import, "import",
                                      "JSON model graph to the verified mhc dialect"),
                           clEnumValN(Phase::Partition, "partition",
                                      "layers to virtual pipeline stages"),
                           clEnumValN(Phase::P2P, "p2p",
                                      "width-aware boundary transfers between stages"),
                           clEnumValN(Phase::Schedule, "schedule",
                                      "verified per-rank instruction lists (default)")));
  binder.option(pp, "pp", cl::desc("Pipeline ranks p"), cl::cat(pipelineCategory()));
  binder.option(vpp, "vpp", cl::desc("Virtual chunks per rank v"), cl::cat(pipelineCategory()));
  binder.option(layout, "layout",
                cl::desc("Megatron-style layout (E, t, m, L, |, *N), e.g. Et|tt|tt|tL; "
                         "default: cost-balanced automatic partition"),
                cl::cat(pipelineCategory()));
  binder.option(memoryCapGib, "memory-cap-gib",
                cl::desc("Memory per virtual stage for the automatic partition; 0: no cap"),
                cl::cat(pipelineCategory()));
  binder.option(microbatches, "microbatches", cl::desc("Microbatches per step m"),
                cl::cat(pipelineCategory()));
  binder.option(schedule, "schedule",
                cl::desc("gpipe, 1f1b, interleaved, zb-h1, or auto: the fastest predicted of "
                         "1f1b, zb-h1 and interleaved with 2-4 chunks, under --memory-cap-gib also with "
                         "--recompute-sublayers where the cap refuses them (default: 1f1b, "
                         "interleaved if --vpp > 1)"),
                cl::cat(pipelineCategory()));
  binder.option(microbatchGroup, "microbatch-group",
                cl::desc("Interleaved microbatch group g (default p)"),
                cl::cat(pipelineCategory()));
  binder.option(dp, "dp",
                cl::desc("Data-parallel replicas of the pipeline (world = pp x dp ranks, data-parallel "
                         "fastest); each takes its share of every global batch of dp x --microbatches "
                         "microbatches, and each stage's gradients are summed over the replicas by an ALLREDUCE "
                         "right after the stage's last backward (CPU backend)"),
                cl::cat(pipelineCategory()));
  binder.option(cp, "cp",
                cl::desc("Context-parallel ranks per sequence (world = pp x dp x cp ranks, context-parallel "
                         "fastest): each holds 2 of the sequence's 2 cp chunks (rank i: i and 2 cp - 1 - i, the "
                         "load-balanced causal split), so every boundary carries seq_len / cp tokens; attention "
                         "exchanges q, k, v within the group, and the gradient ALLREDUCE spans dp x cp (CPU "
                         "backend)"),
                cl::cat(pipelineCategory()));
  binder.option(tp, "tp",
                cl::desc("Tensor-parallel ranks per layer (world = pp x dp x cp x tp ranks, tensor-parallel "
                         "fastest, as Megatron orders them): column-parallel q/k/v and gate/up, row-parallel "
                         "output and down projections, vocabulary-parallel embedding, LM head and "
                         "cross-entropy; the mHC parameters are replicated (CPU backend)"),
                cl::cat(pipelineCategory()));
  binder.option(sequenceParallel, "sequence-parallel",
                cl::desc("With --tp: norms, mHC mixing and the residual run on seq_len / tp of each sequence "
                         "per tensor-parallel rank (all-gather before the column-parallel GEMMs, "
                         "reduce-scatter after the row-parallel ones), so every boundary carries that share"),
                cl::cat(pipelineCategory()));
  binder.option(distributedOptimizer, "distributed-optimizer",
                cl::desc("With --dp or --cp: Megatron's distributed optimizer (ZeRO-1): each member of the gradient "
                         "group (dp x cp ranks) receives its part of the summed gradients (a REDUCESCATTER "
                         "instead of the ALLREDUCE), keeps Adam's moments of that part alone, updates it and "
                         "all-gathers the updated weights"),
                cl::cat(pipelineCategory()));
  binder.option(recomputeSublayers, "recompute-sublayers",
                cl::desc("Activation recomputation (Megatron's full, uniform): each sublayer keeps its "
                         "input residual and runs its forward again before its backward; the partition, the "
                         "predicted step and memory count it, and mhcrun recomputes (the same bits)"),
                cl::cat(pipelineCategory()));
  binder.option(recomputeNumSublayers, "recompute-num-sublayers",
                cl::desc("With --recompute-sublayers: the sublayers each recomputed segment holds (Megatron's "
                         "--recompute-num-layers): only a segment's input is kept, so fewer checkpoints and a "
                         "larger working set, the same bits"),
                cl::cat(pipelineCategory()));
  binder.option(testMisorderP2P, "test-misorder-p2p",
                cl::desc("Testing only: swap two same-peer receives so verification must fail"),
                cl::cat(pipelineCategory()), cl::Hidden);
}

std::optional<OptionError> PipelineOptions::validate() const {
  auto atLeastOne = [](const char *name, int64_t value) -> std::optional<OptionError> {
    if (value >= 1)
      return std::nullopt;
    return OptionError{name, "must be at least 1, got " + std::to_string(value)};
  };
  if (auto error = atLeastOne("pp", pp))
    return error;
  if (auto error = atLeastOne("vpp", vpp))
    return error;
  if (auto error = atLeastOne("microbatches", microbatches))
    return error;
  if (dp < 1 || dp > runtime::kMaxDataParallel)
    return OptionError{"dp", "must be 1 to " + std::to_string(runtime::kMaxDataParallel) + " replicas, got " +
                                 std::to_string(dp)};
  if (pp >= 1 && pp <= kMaxPipelineRanks && pp * dp > runtime::kMaxWorldSize)
    return OptionError{"dp", "pp x dp = " + std::to_string(pp * dp) + " ranks, more than " +
                                 std::to_string(runtime::kMaxWorldSize)};
  if (cp < 1 || cp > runtime::kMaxContextParallel)
    return OptionError{"cp", "must be 1 to " + std::to_string(runtime::kMaxContextParallel) + " ranks, got " +
                                 std::to_string(cp)};
  if (pp >= 1 && pp <= kMaxPipelineRanks && pp * dp * cp > runtime::kMaxWorldSize)
    return OptionError{"cp", "pp x dp x cp = " + std::to_string(pp * dp * cp) + " ranks, more than " +
                                 std::to_string(runtime::kMaxWorldSize)};
  if (tp < 1 || tp > runtime::kMaxTensorParallel)
    return OptionError{"tp", "must be 1 to " + std::to_string(runtime::kMaxTensorParallel) + " ranks, got " +
                                 std::to_string(tp)};
  if (pp >= 1 && pp <= kMaxPipelineRanks && pp * dp * cp * tp > runtime::kMaxWorldSize)
    return OptionError{"tp", "pp x dp x cp x tp = " + std::to_string(pp * dp * cp * tp) + " ranks, more than " +
                                 std::to_string(runtime::kMaxWorldSize)};
  if (sequenceParallel && tp < 2)
    return OptionError{"sequence-parallel", "splits sequences over the tensor-parallel ranks; it needs --tp 2 or "
                                            "more"};
  if (recomputeNumSublayers < 1 || recomputeNumSublayers > 1024)
    return OptionError{"recompute-num-sublayers", "must be 1 to 1024 sublayers a segment, got " +
                                                      std::to_string(recomputeNumSublayers)};
  if (recomputeNumSublayers > 1 && !recomputeSublayers)
    return OptionError{"recompute-num-sublayers", "sizes the recomputed segments; add --recompute-sublayers"};
  if (distributedOptimizer && dp * cp < 2)
    return OptionError{"distributed-optimizer", "shards the optimizer over the gradient group (dp x cp ranks); it "
                                                "needs --dp or --cp of 2 or more"};
  // Bounds checked where the flags enter, so no product below overflows and
  // no phase is asked for millions of lists (issue 14): far past any real
  // run, small enough that a compile stays quick.
  auto atMost = [](const char *name, int64_t value, int64_t limit) -> std::optional<OptionError> {
    if (value <= limit)
      return std::nullopt;
    return OptionError{name, "must be at most " + std::to_string(limit) + ", got " + std::to_string(value)};
  };
  if (auto error = atMost("pp", pp, kMaxPipelineRanks))
    return error;
  if (auto error = atMost("vpp", vpp, kMaxVirtualStages))
    return error;
  if (auto error = atMost("microbatches", microbatches, kMaxMicrobatches))
    return error;
  if (pp * vpp * microbatches > kMaxStageMicrobatches)
    return OptionError{"microbatches", "pp x vpp x microbatches = " + std::to_string(pp * vpp * microbatches) +
                                           " stage-microbatch pairs, more than the " +
                                           std::to_string(kMaxStageMicrobatches) +
                                           " a compile simulates in reasonable time; use fewer microbatches"};
  if (microbatchGroup < 0)
    return OptionError{"microbatch-group",
                       "must be 0 (g = p) or a group size, got " + std::to_string(microbatchGroup)};
  if (!(memoryCapGib >= 0) || !std::isfinite(memoryCapGib))
    return OptionError{"memory-cap-gib", llvm::formatv("must be 0 (no cap) or a number of GiB, "
                                                       "got {0}", memoryCapGib)};
  if (!layout.empty()) {
    std::string error;
    std::optional<std::vector<std::string>> stages = pipeline::expandLayout(layout, error);
    if (!stages)
      return OptionError{"layout", "'" + layout + "': " + error};
    if (int64_t(stages->size()) != pp * vpp)
      return OptionError{"layout", "'" + layout + "' has " + std::to_string(stages->size()) +
                                       " virtual stages, but pp x vpp = " +
                                       std::to_string(pp) + " x " + std::to_string(vpp) +
                                       " needs " + std::to_string(pp * vpp) +
                                       " (separate them with '|'; a stage may be empty)"};
  }
  if (schedule == "auto") {
    // Each candidate is checked by this function again, with its kind and vpp.
    if (compileTo < Phase::Schedule)
      return OptionError{"schedule", "auto compares complete schedules; drop --compile-to"};
    if (vpp != 1 && layout.empty())
      return OptionError{"schedule", "auto chooses the chunks per rank itself; drop --vpp (or give "
                                     "--layout to fix them)"};
    return std::nullopt;
  }
  std::optional<pipeline::ScheduleKind> kind = pipeline::parseScheduleKind(scheduleKind());
  if (!kind)
    return OptionError{"schedule", "unknown schedule '" + schedule +
                                       "'; choose gpipe, 1f1b, interleaved, zb-h1 or auto"};
  if (compileTo < Phase::Schedule)
    return std::nullopt;
  if (std::optional<std::string> problem =
          pipeline::checkScheduleShape(*kind, pp, vpp, microbatches, microbatchGroup))
    return OptionError{"schedule " + scheduleKind(), *problem};
  return std::nullopt;
}

PipelineFlags::PipelineFlags(PipelineOptions &options) { options.bindOptions(*this); }

PipelineFlags::~PipelineFlags() {
  for (std::unique_ptr<llvm::cl::Option> &flag : flags_)
    flag->removeArgument();
}

void buildPipeline(mlir::OpPassManager &pm, const PipelineOptions &options) {
  // Import is done by the importer itself.
  if (options.compileTo < Phase::Partition)
    return;
  PipePartitionOptions partition;
  partition.pp = options.pp;
  partition.vpp = options.vpp;
  partition.layout = options.layout;
  partition.memoryCapGib = options.memoryCapGib;
  partition.recomputeSublayers = options.recomputeSublayers;
  partition.recomputeNumSublayers = options.recomputeNumSublayers;
  pm.addPass(createPipePartition(partition));
  if (options.compileTo < Phase::P2P)
    return;
  pm.addPass(createPipeInsertP2P());
  if (options.compileTo < Phase::Schedule)
    return;
  PipeScheduleOptions schedule;
  schedule.kind = options.scheduleKind();
  schedule.microbatches = options.microbatches;
  schedule.groupSize = options.microbatchGroup;
  schedule.dp = options.dp;
  schedule.cp = options.cp;
  schedule.tp = options.tp;
  schedule.sequenceParallel = options.sequenceParallel;
  schedule.distributedOptimizer = options.distributedOptimizer;
  schedule.recomputeSublayers = options.recomputeSublayers;
  schedule.recomputeNumSublayers = options.recomputeNumSublayers;
  pm.addPass(createPipeSchedule(schedule));
  if (options.testMisorderP2P)
    pm.addPass(createPipeTestMisorderP2P());
  // Every compile verifies the schedule it emits.
  pm.addPass(createPipeVerifySchedule());
}

namespace {

/// The options of -mhcc-pipeline: PipelineOptions' declarations bound to
/// pass options, read back into a PipelineOptions after parsing.
class PipelinePassOptions : public mlir::PassPipelineOptions<PipelinePassOptions> {
public:
  PipelinePassOptions() { values_.bindOptions(*this); }

  template <typename T, typename... Modifiers>
  void option(T &field, llvm::StringRef name, Modifiers &&...modifiers) {
    auto passOption = std::make_unique<Option<T>>(
        *this, name, std::forward<Modifiers>(modifiers)..., llvm::cl::init(field));
    Option<T> *read = passOption.get();
    readBack_.push_back([read, &field] { field = read->getValue(); });
    passOptions_.push_back(std::move(passOption));
  }

  PipelineOptions values() const {
    for (const std::function<void()> &read : readBack_)
      read();
    return values_;
  }

private:
  mutable PipelineOptions values_;
  std::vector<std::function<void()>> readBack_;
  std::vector<std::unique_ptr<llvm::cl::Option>> passOptions_;
};

} // namespace

void registerMhccPipeline() {
  mlir::registerPassPipeline(
      "mhcc-pipeline",
      "mhcc's compile after import: partition, boundaries, schedule and its verification, "
      "with mhcc's own options (pp=2 vpp=2 ...)",
      [](mlir::OpPassManager &pm, llvm::StringRef text,
         llvm::function_ref<mlir::LogicalResult(const llvm::Twine &)> errorHandler) {
        PipelinePassOptions passOptions;
        if (failed(passOptions.parseFromString(text)))
          return mlir::failure();
        PipelineOptions options = passOptions.values();
        if (std::optional<OptionError> error = options.validate())
          return errorHandler("mhcc-pipeline option " + error->option + ": " + error->message);
        buildPipeline(pm, options);
        return mlir::success();
      },
      [](llvm::function_ref<void(const mlir::detail::PassOptions &)> optionsHandler) {
        optionsHandler(PipelinePassOptions());
      });
}

} // namespace mhcc
