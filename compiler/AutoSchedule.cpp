//===- AutoSchedule.cpp - mhcc --schedule auto ------------------------------===//
#include "compiler/AutoSchedule.h"

#include "passes/CostModel.h"
#include "passes/pipeline/Schedule.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>

using namespace mlir;

namespace mhcc {
namespace {

struct Candidate {
  std::string kind;
  int64_t vpp = 1;
  bool recompute = false; // activation recomputation, tried under a memory cap
  int64_t sublayersPerSegment = 1; // with it: two where one a segment is refused too
  OwningOpRef<ModuleOp> module;
  pipeline::SimulationResult result;
  int64_t peakBytes = 0;
  std::string refusal; // why it was not compiled; empty when it was

  std::string name() const {
    return (vpp > 1 ? llvm::formatv("{0} vpp={1}", kind, vpp).str() : kind) + (recompute ? " +recompute" : "") +
           (recompute && sublayersPerSegment > 1 ? " " + std::to_string(sublayersPerSegment) : "");
  }
};

/// The candidates: with a layout, the kinds its chunk count allows; else
/// one chunk for 1F1B and ZB-H1, 2..kAutoMaxVpp chunks interleaved
/// (compileAutoSchedule adds a recomputing twin where the cap refuses one,
/// and one of two sublayers a segment where it refuses that too).
std::vector<Candidate> candidatesFor(const PipelineOptions &options) {
  std::vector<Candidate> candidates;
  auto add = [&](const char *kind, int64_t vpp) {
    Candidate c;
    c.kind = kind;
    c.vpp = vpp;
    c.recompute = options.recomputeSublayers;
    c.sublayersPerSegment = options.recomputeNumSublayers;
    candidates.push_back(std::move(c));
  };
  if (!options.layout.empty()) {
    if (options.vpp == 1) {
      add("1f1b", 1);
      add("zb-h1", 1);
    } else {
      add("interleaved", options.vpp);
    }
    return candidates;
  }
  add("1f1b", 1);
  add("zb-h1", 1);
  for (int64_t vpp = 2; vpp <= kAutoMaxVpp; ++vpp)
    add("interleaved", vpp);
  return candidates;
}

/// Compiles one candidate from a clone of `imported` and simulates it; on
/// failure, fills `refusal` with the first diagnostic.
void compileCandidate(ModuleOp imported, const PipelineOptions &base, const SimulationOptions &simulation,
                      Candidate &c) {
  PipelineOptions options = base;
  options.schedule = c.kind;
  options.vpp = c.vpp;
  options.recomputeSublayers = c.recompute;
  options.recomputeNumSublayers = c.recompute ? c.sublayersPerSegment : 1;
  if (std::optional<OptionError> error = options.validate()) {
    c.refusal = error->message;
    return;
  }
  std::string firstError;
  ScopedDiagnosticHandler capture(imported.getContext(), [&](Diagnostic &d) {
    if (firstError.empty() && d.getSeverity() == DiagnosticSeverity::Error)
      firstError = d.str();
    return success();
  });
  c.module = imported.clone();
  PassManager pm(imported.getContext());
  buildPipeline(pm, options);
  if (failed(pm.run(*c.module))) {
    c.refusal = firstError.empty() ? "the compile failed" : firstError;
    c.module = nullptr;
    return;
  }
  FailureOr<pipeline::SimulationResult> result = simulateModuleSchedule(*c.module, simulation);
  if (failed(result)) {
    c.refusal = firstError.empty() ? "cannot cost the schedule" : firstError;
    c.module = nullptr;
    return;
  }
  c.result = std::move(*result);
  for (int64_t bytes : c.result.peakBytes)
    c.peakBytes = std::max(c.peakBytes, bytes);
}

} // namespace

OwningOpRef<ModuleOp> compileAutoSchedule(ModuleOp imported, const PipelineOptions &options,
                                          const SimulationOptions &simulation, llvm::raw_ostream &report) {
  std::vector<Candidate> candidates = candidatesFor(options);
  const bool tryRecompute = options.layout.empty() && options.memoryCapGib > 0 && !options.recomputeSublayers;
  for (size_t k = 0; k < candidates.size(); ++k) {
    compileCandidate(imported, options, simulation, candidates[k]);
    // Where the memory cap refused it, the same schedule recomputing one
    // sublayer a segment, right after it; where that is refused too, two.
    const Candidate &c = candidates[k];
    if (tryRecompute && c.sublayersPerSegment == 1 && c.refusal.find("memory cap") != std::string::npos) {
      Candidate twin;
      twin.kind = c.kind;
      twin.vpp = c.vpp;
      twin.recompute = true;
      twin.sublayersPerSegment = c.recompute ? 2 : 1;
      candidates.insert(candidates.begin() + long(k) + 1, std::move(twin));
    }
  }
  // Fastest first; ties by the smaller activation peak, then in candidate
  // order (a stable sort), so the ranking is the same on every machine.
  std::stable_sort(candidates.begin(), candidates.end(), [](const Candidate &a, const Candidate &b) {
    if (a.refusal.empty() != b.refusal.empty())
      return a.refusal.empty();
    if (!a.refusal.empty())
      return false;
    if (a.result.makespan != b.result.makespan)
      return a.result.makespan < b.result.makespan;
    return a.peakBytes < b.peakBytes;
  });
  report << llvm::formatv("schedule auto: pp = {0}, m = {1}, {2} candidates with {3} "
                          "(predicted step, bubble = idle / (ranks x step), peak live activations per rank):\n",
                          options.pp, options.microbatches, candidates.size(), simulation.profile.describe());
  int rank = 0;
  for (const Candidate &c : candidates) {
    if (c.refusal.empty()) {
      ++rank;
      report << llvm::formatv("  {0}. {1,-28} step {2:F3} ms, bubble {3:F4}, peak {4}{5}\n", rank, c.name(),
                              c.result.makespan, c.result.bubbleFraction, humanBytes(double(c.peakBytes)),
                              rank == 1 ? "  <- chosen" : "");
    } else
      report << llvm::formatv("  -. {0,-28} refused: {1}\n", c.name(), c.refusal);
  }
  if (candidates.empty() || !candidates.front().refusal.empty())
    return nullptr;
  return std::move(candidates.front().module);
}

} // namespace mhcc
