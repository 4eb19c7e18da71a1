//===- Mhcrun.cpp - the mhcrun command line ---------------------------------===//
//
// mhcrun ARTIFACT [--backend auto|cpu|cuda] [--steps N] [--data PATH] ...
//
// Prints one Megatron-style line per iteration (lm loss, mtp loss, grad norm,
// num zeros, tokens/s, time), a progress bar when stderr is a terminal, and
// JSON lines with --metrics. Every failure is one line and a non-zero exit.
//
//===----------------------------------------------------------------------===//
#include "runtime/cli/Mhcrun.h"

#include "runtime/cli/TensorDump.h"
#include "runtime/cuda/GpuTrainer.h"
#include "runtime/dist/ProcessGroup.h"
#include "runtime/gpu/Gpus.h"
#include "runtime/train/Trainer.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <unistd.h>

namespace mhcc::runtime {
namespace {

int fail(const std::string &message) {
  std::cerr << "mhcrun: " << message << "\n";
  return 1;
}

std::string timestamp() {
  std::time_t now = std::time(nullptr);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  return buffer;
}

std::string formatLine(const StepResult &r, int64_t steps, int64_t samplesPerStep, double flopsPerToken,
                       double peakTflops) {
  char line[1024];
  double peakMiB = 0;
  for (int64_t bytes : r.peakBytes)
    peakMiB = std::max(peakMiB, bytes / 1048576.0);
  std::snprintf(line, sizeof line,
                " [%s] iteration %8lld/%8lld | consumed samples: %12lld | elapsed time per iteration "
                "(ms): %.1f | learning rate: %.6E | global batch size: %5lld | lm loss: %.6E |%s "
                "grad norm: %.3f | num zeros: %lld | tokens per second: %.1f | TFLOP/s: %.3f |%s peak "
                "memory per rank (MiB): %.1f |",
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
                peakMiB);
  return line;
}

void progress(int64_t done, int64_t total, double lmLoss) {
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

} // namespace

int runMhcrun(int argc, char **argv) {
  prepareCudaEnvironment(); // before any CUDA call
  CLI::App app{"mhcrun: trains a compiled mhcc artifact on GPUs (one process per pipeline rank) or on the CPU reference backend"};
  std::string artifactPath, backend = "auto", dataPath, metricsPath, optimizer = "adamw";
  int64_t steps = 20;
  TrainOptions options;
  bool noProgress = false, inProcess = false;
  double peakTflops = 0;
  int64_t gpusFlag = -1;
  std::string memoryPlan = "static";
  std::string dumpDir;
  app.add_option("artifact", artifactPath, "Artifact written by 'mhcc --emit=artifact'")->required();
  app.add_option("--backend", backend, "auto, cpu or cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--steps", steps, "Training iterations")->check(CLI::PositiveNumber);
  app.add_option("--data", dataPath, "Text file (byte tokens) or Megatron indexed dataset prefix")->required();
  app.add_option("--data-seed", options.dataSeed, "Seed of the microbatch sampler");
  app.add_option("--lr", options.lr, "Learning rate")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", options.optimizer, "adamw or sgd")->check(CLI::IsMember({"adamw", "sgd"}));
  app.add_option("--clip-grad", options.clipGrad, "Global gradient-norm clip (0: off)")->check(CLI::NonNegativeNumber);
  app.add_option("--weight-decay", options.weightDecay, "AdamW weight decay")->check(CLI::NonNegativeNumber);
  app.add_option("--warmup-steps", options.warmupSteps, "Linear learning-rate warmup")->check(CLI::NonNegativeNumber);
  app.add_option("--metrics", metricsPath, "Write one JSON line per iteration here");
  app.add_option("--recv-timeout", options.recvTimeoutSeconds, "Seconds a receive may wait")->check(CLI::PositiveNumber);
  app.add_flag("--no-progress", noProgress, "No progress bar, even on a terminal");
  app.add_option("--gpus", gpusFlag,
                 "Start one process per GPU on this host (must equal the artifact's pp; the default for the CUDA "
                 "backend). Under mpirun or srun the launcher starts the ranks instead")
      ->check(CLI::PositiveNumber);
  CLI::Option *memoryPlanOption = app.add_option("--memory-plan", memoryPlan,
                 "CUDA backend: 'static' (the default: the first step is recorded, later steps use fixed offsets in one "
                 "arena, no allocation inside a step) or 'pool' (stream-ordered pool every step)")
      ->check(CLI::IsMember({"pool", "static"}));
  app.add_flag("--in-process", inProcess,
               "CUDA backend: every rank in this process, one host thread each, instead of one process per GPU "
               "(debugging)");
  app.add_flag("--profile", options.profile,
               "Print where the time goes, per iteration after the first: time per rank and primitive (device time "
               "on the CUDA backend, thread time on the CPU) and the host phases");
  app.add_option("--peak-tflops", peakTflops,
                 "Peak TFLOP/s per device (all ranks together are counted) for MFU; 0: not printed")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--dump-tensors", dumpDir,
                 "CPU backend: write DIR/init.safetensors (initial weights, every microbatch's tokens and labels) "
                 "and DIR/step<k>.safetensors (gradients before clipping, updated weights, losses) for "
                 "tools/reference");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e);
  }

  options.staticMemoryPlan = memoryPlan == "static";
  options.recordTaps = options.recordTaps || !dumpDir.empty(); // the dump needs the reduced gradients
  std::string error;
  std::optional<ProcessPlacement> placement = detectPlacement(error);
  if (!error.empty())
    return fail(error);
  const std::string rankPrefix = placement ? "rank " + std::to_string(placement->rank) + ": " : "";
  std::optional<Artifact> artifact = readArtifact(artifactPath, error);
  if (!artifact)
    return fail(rankPrefix + error);
  GpuInventory gpus = queryGpus();
  if (placement) {
    if (backend == "cpu")
      return fail(rankPrefix + placement->launcher + " started " + std::to_string(placement->size) +
                  " processes, but the CPU backend runs every rank in one process; start one process");
    backend = "cuda";
  }
  if (gpusFlag > 0) {
    if (backend == "cpu")
      return fail("--gpus starts one process per GPU for the CUDA backend; drop --backend cpu or --gpus");
    backend = "cuda";
  }
  if (backend == "auto") {
    backend = static_cast<int64_t>(gpus.gpus.size()) >= artifact->pp ? "cuda" : "cpu";
    if (backend == "cpu" && !gpus.gpus.empty())
      std::cerr << "mhcrun: " << gpus.gpus.size() << " GPU(s) visible, fewer than the artifact's " << artifact->pp
                << " pipeline ranks: using the CPU backend\n";
    if (backend == "cuda" && !artifact->deviceCode) {
      backend = "cpu";
      std::cerr << "mhcrun: the artifact carries no CUDA kernels (compiled with --cuda-arch none, or where nvcc "
                   "was not found): using the CPU backend; recompile with 'mhcc --cuda-arch sm_90' for the GPUs\n";
    }
  }
  std::optional<TokenDataset> data = TokenDataset::open(dataPath, error);
  if (!data)
    return fail(rankPrefix + error);
  std::string problem = data->check(artifact->model.vocab, artifact->model.seqLen);
  if (!problem.empty())
    return fail(rankPrefix + problem);
  if (gpusFlag > 0 && gpusFlag != artifact->pp)
    return fail("--gpus " + std::to_string(gpusFlag) + ": the artifact has pp = " + std::to_string(artifact->pp) +
                " pipeline ranks, one per GPU; pass --gpus " + std::to_string(artifact->pp) +
                " or recompile with --pp " + std::to_string(gpusFlag));
  if (backend == "cuda" && !placement) {
    if (std::string missing = missingGpus(gpus, artifact->pp); !missing.empty())
      return fail(missing);
    if (artifact->pp > 1 && !inProcess)
      return launchRanks(artifact->pp, "/proc/self/exe", argv, std::cerr) == 0 ? 0 : 1;
  }
  // In a multi-process run rank 0 speaks for all (every rank has the step's
  // numbers after the all-reduce); the others report only errors.
  const bool speaker = !placement || placement->rank == 0;
  if (!speaker) {
    metricsPath.clear();
    noProgress = true;
  }

  std::ofstream metrics;
  if (!metricsPath.empty()) {
    metrics.open(metricsPath, std::ios::trunc);
    if (!metrics)
      return fail("cannot write the metrics file " + metricsPath);
  }
  const Artifact &a = *artifact;
  if (speaker)
    std::cout << "mhcrun: " << a.model.name << " (model " << a.modelHash << "), backend " << backend << ", pp = " << a.pp
            << ", vpp = " << a.vpp << ", layout " << a.layout << ", schedule " << a.scheduleKind
            << (backend == "cuda" ? ", memory plan " + memoryPlan : std::string()) << ", " << a.microbatches << " microbatches of " << a.model.tokens() << " tokens, data "
            << data->source() << " (" << data->size() << " tokens)\n";
  const int64_t samplesPerStep = a.microbatches * a.model.microBatch;
  const double flopsPerToken = a.model.trainingFlopsPerToken;
  const double totalPeak = peakTflops * a.pp; // MFU over every device the run uses
  std::unique_ptr<CpuTrainer> cpu;
  std::unique_ptr<GpuTrainer> gpu;
  std::unique_ptr<Bootstrap> bootstrap;
  if (placement) {
    bootstrap = makeBootstrap(*placement, options.recvTimeoutSeconds, error);
    if (!bootstrap)
      return fail(rankPrefix + error);
    gpu = GpuTrainer::createRank(std::move(*artifact), *data, options, *placement, *bootstrap, error);
    if (!gpu)
      return fail(error);
  } else if (backend == "cuda") {
    gpu = GpuTrainer::create(std::move(*artifact), *data, options, error);
    if (!gpu)
      return fail(error);
  } else {
    if (memoryPlanOption->count() > 0)
      std::cerr << "mhcrun: --memory-plan applies to the CUDA backend; the CPU backend ignores it\n";
    cpu = std::make_unique<CpuTrainer>(std::move(*artifact), *data, options);
  }
  if (!dumpDir.empty() && (!cpu || !dumpTensors(dumpDir, *cpu, *data, options, steps, nullptr, error)))
    return fail(cpu ? error : "--dump-tensors needs the CPU backend (--backend cpu)");
  bool bar = !noProgress && isatty(STDERR_FILENO);
  std::optional<double> first, last;
  std::map<std::string, double> profileMs; // over the iterations after the first (warm-up)
  for (int64_t s = 0; s < steps; ++s) {
    std::optional<StepResult> result = gpu ? gpu->step(error) : cpu->step(error);
    if (!result)
      return fail(rankPrefix + "iteration " + std::to_string(s + 1) + ": " + error);
    if (!std::isfinite(result->lmLoss))
      return fail("iteration " + std::to_string(s + 1) + ": the loss is " + std::to_string(result->lmLoss) +
                  "; lower --lr or check the data");
    if (!dumpDir.empty() && !dumpTensors(dumpDir, *cpu, *data, options, steps, &*result, error))
      return fail(error);
    if (!speaker)
      continue;
    if (bar)
      std::fprintf(stderr, "\r%80s\r", "");
    std::cout << formatLine(*result, steps, samplesPerStep, flopsPerToken, totalPeak) << std::endl;
    if (bar)
      progress(s + 1, steps, result->lmLoss);
    if (metrics) {
      nlohmann::json line = {{"iteration", result->step},        {"lm loss", result->lmLoss},
                             {"grad norm", result->gradNorm},    {"num-zeros", result->numZeros},
                             {"tokens per second", result->tokens / result->seconds},
                             {"tflops", result->tokens / result->seconds * flopsPerToken / 1e12},
                             {"elapsed ms", result->seconds * 1e3}, {"learning rate", result->learningRate},
                             {"peak bytes per rank", result->peakBytes}};
      if (result->mtpLoss)
        line["mtp loss"] = *result->mtpLoss;
      if (!result->deviceReservedBytes.empty())
        line["device reserved bytes per rank"] = result->deviceReservedBytes;
      metrics << line.dump() << "\n";
      metrics.flush();
    }
    if (s > 0 || steps == 1)
      for (auto &[name, ms] : result->profileMs)
        profileMs[name] += ms;
    if (!first)
      first = result->lmLoss;
    last = result->lmLoss;
  }
  if (bar)
    std::fprintf(stderr, "\n");
  if (!speaker)
    return 0;
  if (options.profile)
    printProfile(profileMs, steps > 1 ? steps - 1 : 1);
  std::printf("mhcrun: trained %lld iterations; lm loss %.4f -> %.4f\n", (long long)steps, *first, *last);
  return 0;
}

} // namespace mhcc::runtime
