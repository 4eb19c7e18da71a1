//===- RunLines.cpp - what mhcrun prints -------------------------------------===//
#include "runtime/cli/RunLines.h"

#include "runtime/artifact/TensorSplit.h"
#include "runtime/cuda/RankPlan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <iostream>

namespace mhcc::runtime {
namespace {

std::string timestamp() {
  std::time_t now = std::time(nullptr);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  return buffer;
}

} // namespace

std::string iterationLine(const StepResult &r, int64_t steps, int64_t samplesPerStep, double flopsPerToken,
                       double peakTflops) {
  char line[1024];
  double peakMiB = 0;
  std::string perRank; // " (per rank a b ...)" with more than one rank
  for (int64_t bytes : r.peakBytes) {
    char mib[32];
    std::snprintf(mib, sizeof mib, " %.1f", bytes / 1048576.0);
    perRank += mib;
    peakMiB = std::max(peakMiB, bytes / 1048576.0);
  }
  perRank = r.peakBytes.size() > 1 ? " (per rank" + perRank + ")" : "";
  std::snprintf(line, sizeof line,
                " [%s] iteration %8lld/%8lld | consumed samples: %12lld | elapsed time per iteration "
                "(ms): %.1f | learning rate: %.6E | global batch size: %5lld | lm loss: %.6E |%s "
                "grad norm: %.3f | num zeros: %lld | tokens per second: %.1f | TFLOP/s: %.3f |%s peak "
                "memory (MiB): %.1f%s |",
                timestamp().c_str(), (long long)r.step, (long long)steps,
                (long long)(r.step * samplesPerStep), r.seconds * 1e3, r.learningRate,
                (long long)samplesPerStep, r.lmLoss,
                r.mtpLoss ? (" mtp loss: " + [&] {
                  char b[32];
                  std::snprintf(b, sizeof b, "%.6E", *r.mtpLoss);
                  return std::string(b);
                }() + " |").c_str()
                          : "",
                r.gradNorm, (long long)r.numZeros, r.tokens / r.seconds,
                r.tokens / r.seconds * flopsPerToken / 1e12,
                peakTflops > 0 ? (" MFU: " + [&] {
                  char b[32];
                  std::snprintf(b, sizeof b, "%.2f%%", 100.0 * r.tokens / r.seconds * flopsPerToken / 1e12 / peakTflops);
                  return std::string(b);
                }() + " |").c_str()
                               : "",
                peakMiB, perRank.c_str());
  return line;
}

void printProgress(int64_t done, int64_t total, double lmLoss) {
  const int width = 30;
  int filled = static_cast<int>(width * done / std::max<int64_t>(1, total));
  std::fprintf(stderr, "\r[%s%s] %lld/%lld  lm loss %.4f ", std::string(filled, '#').c_str(),
               std::string(width - filled, '.').c_str(), (long long)done, (long long)total, lmLoss);
  std::fflush(stderr);
}

/// Device time by rank and primitive, largest first, then the host phases.
void printProfile(const std::map<std::string, double> &profileMs, int64_t iterations) {
  std::vector<std::pair<double, std::string>> rows;
  for (const auto &[name, ms] : profileMs)
    rows.push_back({ms / iterations, name});
  std::sort(rows.begin(), rows.end(), [](const auto &a, const auto &b) {
    bool hostA = a.second.rfind("host:", 0) == 0, hostB = b.second.rfind("host:", 0) == 0;
    return hostA != hostB ? hostB : a.first > b.first;
  });
  std::printf("mhcrun: profile, ms per iteration (mean of %lld)\n", (long long)iterations);
  for (const auto &[ms, name] : rows)
    std::printf("  %10.2f  %s\n", ms, name.c_str());
}

/// The optimizer's state a rank holds (fp32 masters and Adam's moments, 12
/// bytes a parameter element, of the parameters its stages use, its
/// tensor-parallel blocks of them, as `layout` keeps them), the largest over
/// the ranks: sharded over the gradient group's parts under the distributed
/// optimizer, and without it.
int64_t optimizerBytesPerRank(const Artifact &a, const OptimizerStateLayout &layout) {
  // The moments live on a parameter's owner (its first user's rank) alone;
  // every rank holding it keeps a master, or with the masters sharded the
  // owner its part, or with remainders the owner alone (the others' bf16
  // copies arrive whole: runtime/cuda/RankPlan.h).
  const std::vector<cuda::ParamPlan> plans = cuda::planParameters(a);
  const int64_t masterBytes = layout.remainders ? 2 : 4, momentBytes = layout.moments ? 8 : 0;
  int64_t largest = 0;
  for (int64_t r = 0; r < a.pp; ++r)
    for (int64_t d = 0; d < (layout.sharded ? a.optimizerParts() : 1); ++d) {
      int64_t bytes = 0;
      for (size_t p = 0; p < a.params.size(); ++p) {
        const cuda::ParamPlan &plan = plans[p];
        if (!std::binary_search(plan.holders.begin(), plan.holders.end(), r))
          continue;
        const int64_t count = shardCount(a.params[p], a.tp);
        const auto [begin, end] = layout.sharded ? a.shardOf(count, d) : std::pair<int64_t, int64_t>{0, count};
        const int64_t part = end - begin;
        if (plan.owner == r)
          bytes += momentBytes * part + masterBytes * (layout.mastersSharded ? part : count);
        else if (!layout.mastersSharded && !layout.remainders)
          bytes += 4 * count;
      }
      largest = std::max(largest, bytes);
    }
  return largest;
}

/// The validation pass's line, Megatron's format.
std::string validationLine(const StepResult &v) {
  char text[256];
  std::snprintf(text, sizeof text, " validation loss at iteration %lld | lm loss value: %.6E | lm loss PPL: %.6E |",
                (long long)v.step, v.lmLoss, std::exp(std::min(v.lmLoss, 20.0)));
  std::string line = text;
  if (v.mtpLoss) {
    std::snprintf(text, sizeof text, " mtp loss value: %.6E |", *v.mtpLoss);
    line += text;
  }
  const std::string rule(line.size(), '-');
  return rule + "\n" + line + "\n" + rule;
}

/// One --metrics line. Keys are snake_case, one style (docs/runtime.md);
/// tools/metrics_to_golden.py maps them to Megatron's golden-value names.
nlohmann::json metricsLine(const StepResult &r, double flopsPerToken) {
  const int64_t peakMax = r.peakBytes.empty() ? 0 : *std::max_element(r.peakBytes.begin(), r.peakBytes.end());
  nlohmann::json line = {{"iteration", r.step},          {"lm_loss", r.lmLoss},
                         {"grad_norm", r.gradNorm},      {"num_zeros", r.numZeros},
                         {"tokens_per_second", r.tokens / r.seconds},
                         {"tflops", r.tokens / r.seconds * flopsPerToken / 1e12},
                         {"elapsed_ms", r.seconds * 1e3}, {"learning_rate", r.learningRate},
                         {"peak_bytes_per_rank", r.peakBytes}, {"peak_bytes_max", peakMax}};
  if (r.mtpLoss)
    line["mtp_loss"] = *r.mtpLoss;
  if (!r.deviceReservedBytes.empty())
    line["device_reserved_bytes_per_rank"] = r.deviceReservedBytes;
  return line;
}

/// The run's first lines (the speaking rank's): the model, backend, mesh,
/// layout and data; with the distributed optimizer, its state per rank.
void printRunBanner(const Artifact &a, const std::string &backend, const RunFlags &f, const TokenDataset &data) {
  std::string mesh = ", pp = " + std::to_string(a.pp) + ", vpp = " + std::to_string(a.vpp);
  if (a.dp > 1)
    mesh += ", dp = " + std::to_string(a.dp);
  if (a.cp > 1)
    mesh += ", cp = " + std::to_string(a.cp) + " (" + std::to_string(a.rowsPerRank()) +
            " tokens of each microbatch a rank)";
  if (a.tp > 1)
    mesh += ", tp = " + std::to_string(a.tp) +
            (a.sequenceParallel ? " with sequence parallelism (" + std::to_string(a.rowsPerRank()) +
                                      " tokens of each microbatch a rank outside the GEMMs)"
                                : std::string());
  std::cout << "mhcrun: " << a.model.name << " (model " << a.modelHash << "), backend " << backend << mesh
            << ", layout " << a.layout << ", schedule " << a.scheduleKind
            << (backend == "cuda" ? ", memory plan " + f.memoryPlan : std::string()) << ", " << a.microbatches
            << " microbatches of " << a.model.tokens() << " tokens" << (a.dp > 1 ? " per replica" : "") << ", data "
            << data.source() << " (" << data.size() << " tokens)" << std::endl;
  if (f.options.recompute)
    std::cout << "mhcrun: activation recomputation: "
              << (f.options.recomputeNumSublayers > 1
                      ? "each segment of " + std::to_string(f.options.recomputeNumSublayers) +
                            " sublayers keeps its input and runs its forward again before its backward"
                      : std::string("each sublayer's forward runs again before its backward"))
              << " (" << (a.recomputeSublayers ? "compiled with --recompute-sublayers" : "--recompute-sublayers") << ")"
              << std::endl;
  // The CPU backend keeps whole fp32 masters (settled alike); the GPU the remainders.
  const bool remainders = backend == "cuda" && f.options.storeParamRemainders;
  // Both backends shard the moments; the CUDA backend also a bf16 model's
  // fp32 masters (its kernels read the bf16 copies). An fp32 model's
  // kernels read the masters, which each GPU keeps whole, and the CPU
  // backend keeps every weight on every rank.
  const bool mastersSharded = a.distributedOptimizer && backend == "cuda" && a.model.dtype == "bf16";
  // SGD keeps no moments on the GPU (the CPU backend's are there, unused).
  const bool moments = !(backend == "cuda" && f.options.optimizer == "sgd");
  if (a.distributedOptimizer) {
    const int64_t sharded = optimizerBytesPerRank(a, {true, mastersSharded, remainders, moments}),
                  whole = optimizerBytesPerRank(a, {false, false, remainders, moments});
    const char *what = mastersSharded ? (moments ? "fp32 masters and Adam moments" : "fp32 masters (SGD: no moments)")
                       : moments      ? "Adam moments (the fp32 masters whole on each rank)"
                                      : "the updates (SGD keeps no moments; the fp32 masters stay whole on each rank)";
    char line[320];
    std::snprintf(line, sizeof line,
                  "mhcrun: distributed optimizer: %s sharded over %lld parts (dp x cp), "
                  "%.2f MiB a rank (%.2f MiB without sharding)",
                  what, static_cast<long long>(a.optimizerParts()), sharded / 1048576.0, whole / 1048576.0);
    std::cout << line << std::endl;
  }
  if (remainders) {
    const OptimizerStateLayout layout{a.distributedOptimizer, mastersSharded, false, moments};
    OptimizerStateLayout withRemainders = layout;
    withRemainders.remainders = true;
    char line[240];
    std::snprintf(line, sizeof line,
                  "mhcrun: --store-param-remainders: each fp32 master kept as its bf16 copy and 16 bits, the "
                  "optimizer's state %.2f MiB a rank (%.2f MiB with whole masters)",
                  optimizerBytesPerRank(a, withRemainders) / 1048576.0, optimizerBytesPerRank(a, layout) / 1048576.0);
    std::cout << line << std::endl;
  }
}

} // namespace mhcc::runtime
