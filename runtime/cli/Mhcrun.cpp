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

#include "runtime/cli/Checkpointing.h"
#include "runtime/cli/HostMemory.h"
#include "runtime/cli/MeasuredProfile.h"
#include "runtime/cli/RunFlags.h"
#include "runtime/cli/RunLines.h"
#include "runtime/cli/RunSettings.h"
#include "runtime/cli/TensorDump.h"
#include "runtime/cli/TraceParts.h"
#include "runtime/cpu/CpuDevice.h"
#include "runtime/cpu/CpuProcessDevice.h"
#include "runtime/cuda/CudaDevice.h"
#include "runtime/cuda/Gpus.h"
#include "runtime/dist/ProcessGroup.h"
#include "runtime/dist/StopSignal.h"
#include "runtime/train/Trainer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <unistd.h>

namespace mhcc::runtime {
namespace {

// One line on stderr and exit status 1 (RunFlags.h).
constexpr auto fail = failLine;

/// Resolves --backend auto / launchers / --gpus into "cpu" or "cuda"; "" and
/// `error` when the combination is impossible.
std::string chooseBackend(const RunFlags &f, const Artifact &a, const std::optional<ProcessPlacement> &placement,
                          const GpuInventory &gpus, std::string &error) {
  std::string backend = f.backend;
  if (placement) // --backend cpu: one CPU rank per process; else the GPUs
    return backend == "cpu" || f.processes > 0 ? "cpu" : "cuda";
  if (f.processes > 0) {
    if (backend == "cuda") {
      error = "--processes starts CPU ranks; for the CUDA backend use --gpus";
      return "";
    }
    return "cpu";
  }
  if (f.gpus > 0) {
    if (backend == "cpu") {
      error = "--gpus starts one process per GPU for the CUDA backend; drop --backend cpu or --gpus";
      return "";
    }
    if (f.ranksPerGpu > 1) {
      error = "--gpus starts one process per GPU, --ranks-per-gpu runs every rank in this process; drop one";
      return "";
    }
    backend = "cuda";
  }
  if (f.ranksPerGpu > 1 && backend == "auto")
    backend = "cuda"; // sharing GPUs is asked for: a missing GPU is an error, not the CPU backend
  if (backend != "auto")
    return backend;
  backend = static_cast<int64_t>(gpus.gpus.size()) >= a.worldSize() ? "cuda" : "cpu";
  if (backend == "cpu" && !gpus.gpus.empty())
    std::cerr << "mhcrun: " << gpus.gpus.size() << " GPU(s) visible, fewer than the artifact's " << a.worldSize()
              << " ranks: using the CPU backend\n";
  if (backend == "cuda" && !a.deviceCode) {
    std::cerr << "mhcrun: the artifact carries no CUDA kernels (compiled with --cuda-arch none, or where nvcc "
                 "was not found): using the CPU backend; recompile with 'mhcc --cuda-arch sm_90' for the GPUs\n";
    backend = "cpu";
  }
  return backend;
}

/// Where the CPU ranks of a multi-process run meet (SocketMesh): the --processes
/// parent's bootstrap folder, or under mpirun / srun a folder rank 0 makes
/// and broadcasts, removed by rank 0 at the end (the sockets are connected
/// and their files unlinked by then).
struct SocketFolder {
  std::string path;
  bool owned = false;
  ~SocketFolder() {
    std::error_code ignored;
    if (owned)
      std::filesystem::remove_all(path, ignored);
  }
  static std::unique_ptr<SocketFolder> agree(const ProcessPlacement &placement, Bootstrap &bootstrap,
                                             std::string &error) {
    auto folder = std::make_unique<SocketFolder>();
    if (const char *dir = std::getenv("MHCC_BOOTSTRAP_DIR"); dir && placement.launcher == "mhcrun --gpus") {
      folder->path = dir;
      return folder;
    }
    if (placement.rank == 0) {
      const char *tmp = std::getenv("TMPDIR");
      std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/mhcrun-cpu.XXXXXX";
      if (!mkdtemp(pattern.data())) {
        error = "cannot create a socket folder " + pattern + " for the CPU ranks";
        return nullptr;
      }
      folder->path = pattern;
      folder->owned = true;
    }
    if (!bootstrap.broadcast(folder->path, error))
      return nullptr;
    return folder;
  }
};

constexpr const char *kExportNeedsOneProcess =
    "--export-safetensors needs every rank in one process; export from the checkpoint of a --save run with "
    "'mhcrun ART --data D --backend cpu --load DIR --export-safetensors FILE'";

/// --export-safetensors: one file of every weight, so only a process that
/// holds them all writes it (one process a GPU would need a gather, which
/// placeRanks refuses at start-up).
bool exportAll(Trainer &trainer, const std::string &path, std::string &error) {
  ParameterState state;
  return trainer.saveState(state, error) &&
         exportWeights(path, trainer.artifact(), state, trainer.stepsDone(), error);
}

/// --load or --init-from, before the first step.
bool restore(Trainer &trainer, const RunFlags &f, bool speaker, std::string &error) {
  ParameterState state;
  int64_t iteration = 0;
  if (!f.loadDir.empty()) {
    if (!loadCheckpoint(f.loadDir, trainer.artifact(), state, iteration, error))
      return false;
  } else if (!f.initFrom.empty()) {
    if (!importWeights(f.initFrom, trainer.artifact(), state, error))
      return false;
  } else {
    return true;
  }
  if (!trainer.loadState(state, iteration, error))
    return false;
  if (speaker)
    std::cout << "mhcrun: " << (f.loadDir.empty() ? "weights from " + f.initFrom + ", iteration 0, fresh optimizer"
                                                   : "resumed from " + f.loadDir + " at iteration " +
                                                         std::to_string(iteration))
              << std::endl;
  return true;
}

/// What this process does in a run of one or several processes.
struct Role {
  bool speaker = true;      // prints the lines and writes --metrics (rank 0)
  std::string rankPrefix;   // "rank R: " in a multi-process run
  CheckpointShard shard;    // how the ranks split a checkpoint: each process writes what it holds
  bool exports = true;      // writes --export-safetensors (a CPU rank > 0 leaves it to rank 0)
  bool agreedStop = false;  // stops on the signal the step's collective agreed on
  std::string backend;      // "cpu" or "cuda": names a measured device profile
  std::optional<int64_t> processRank; // one process a rank: this one's (its --trace is a part)
};

/// After iteration `result.step` of a run asked to stop: the final save (unless
/// the interval save just wrote this iteration), one line, 128 + the signal.
/// `signal` is the one every rank agreed on, so all stop here together.
int stopAfter(Trainer &trainer, const StepResult &result, int signal, const RunFlags &f,
              std::unique_ptr<Checkpointer> &saver, bool speaker, const std::string &rankPrefix) {
  std::string error;
  const bool savedNow = f.saveInterval > 0 && result.step % f.saveInterval == 0;
  if (saver && ((!savedNow && !saver->save(trainer, error)) || !saver->finish(&error)))
    return fail(rankPrefix + "stopping after iteration " + std::to_string(result.step) + ": " + error);
  if (speaker)
    std::cout << "mhcrun: stopped by " << stopSignalName(signal) << " after iteration " << result.step << "; "
              << (saver ? "checkpoint " + checkpointFolder(f.saveDir, result.step)
                        : std::string("no checkpoint (no --save)"))
              << std::endl;
  return 128 + signal;
}

/// --device-profile-out: the rates of this run (MeasuredProfile.h), named
/// after the backend and dtype, atomically.
bool writeDeviceProfile(const Artifact &a, const std::map<std::string, double> &profileMs, int64_t iterations,
                        const std::string &backend, const RunFlags &f, std::string &error) {
  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  const std::string source = "mhcrun --profile, " + a.model.name + " pp " + std::to_string(a.pp) + " vpp " +
                             std::to_string(a.vpp) + " m " + std::to_string(a.microbatches) + ", " + backend +
                             " backend, " + std::to_string(iterations) + " iterations, " + date;
  std::optional<std::string> json =
      measuredDeviceProfile(a, profileMs, iterations, backend + "-" + a.model.dtype, source,
                            backend == "cpu" ? int64_t(std::thread::hardware_concurrency()) : 0, error);
  if (!json) {
    error = "--device-profile-out: " + error;
    return false;
  }
  const std::string tmp = f.deviceProfileOut + ".tmp";
  std::ofstream out(tmp, std::ios::trunc);
  out << *json;
  out.close();
  std::error_code ec;
  if (!out || (std::filesystem::rename(tmp, f.deviceProfileOut, ec), ec)) {
    std::filesystem::remove(tmp, ec);
    error = "--device-profile-out: cannot write " + f.deviceProfileOut;
    return false;
  }
  return true;
}

/// The iterations: one line each (rank 0 speaks for all), metrics, profile.
int trainLoop(Trainer &trainer, const TokenDataset &data, const RunFlags &f, const Role &role) {
  const bool speaker = role.speaker;
  const std::string &rankPrefix = role.rankPrefix;
  const CheckpointShard &shard = role.shard;
  const Artifact &a = trainer.artifact();
  std::ofstream metrics;
  if (speaker && !f.metricsPath.empty()) {
    metrics.open(f.metricsPath, std::ios::trunc);
    if (!metrics)
      return fail("cannot write the metrics file " + f.metricsPath);
  }
  const int64_t samplesPerStep = a.microbatches * a.dp * a.model.microBatch; // the global batch
  const double flopsPerToken = a.model.trainingFlopsPerToken;
  const double totalPeak = f.peakTflops * a.worldSize(); // MFU over every device the run uses
  const bool bar = speaker && !f.noProgress && isatty(STDERR_FILENO);
  std::optional<double> first, last;
  std::map<std::string, double> profileMs; // over the iterations after the first (warm-up)
  std::string error;
  if (!f.dumpDir.empty() && !dumpTensors(f.dumpDir, trainer, data, f.options, f.steps, nullptr, error))
    return fail(error);
  std::unique_ptr<Checkpointer> saver;
  if (!f.saveDir.empty())
    saver = std::make_unique<Checkpointer>(f.saveDir, f.options, shard, speaker);
  // The iteration's line and metrics (and the validation pass after it):
  // before a stop, so the last one is kept.
  auto printIteration = [&](const StepResult &r, const std::optional<StepResult> &validation) {
    if (bar)
      std::fprintf(stderr, "\r%80s\r", "");
    std::cout << iterationLine(r, f.steps, samplesPerStep, flopsPerToken, totalPeak) << std::endl;
    if (validation)
      std::cout << validationLine(*validation) << std::endl;
    if (bar)
      printProgress(r.step, f.steps, r.lmLoss);
    if (metrics) {
      nlohmann::json line = metricsLine(r, flopsPerToken);
      if (validation) {
        line["validation_lm_loss"] = validation->lmLoss;
        if (validation->mtpLoss)
          line["validation_mtp_loss"] = *validation->mtpLoss;
      }
      metrics << line.dump() << "\n";
      metrics.flush();
    }
  };
  std::vector<TraceSlice> trace; // with --trace: every step's instructions
  int64_t trained = 0;
  for (int64_t s = trainer.stepsDone(); s < f.steps; ++s, ++trained) {
    std::optional<StepResult> result = trainer.step(error);
    if (!result)
      return fail(rankPrefix + "iteration " + std::to_string(s + 1) + ": " + error);
    if (!std::isfinite(result->lmLoss))
      return fail("iteration " + std::to_string(s + 1) + ": the loss is " + std::to_string(result->lmLoss) +
                  "; lower --lr or check the data");
    if (!f.dumpDir.empty() && !dumpTensors(f.dumpDir, trainer, data, f.options, f.steps, &*result, error))
      return fail(error);
    trace.insert(trace.end(), result->trace.begin(), result->trace.end());
    if (saver && f.saveInterval > 0 && result->step % f.saveInterval == 0 && result->step < f.steps &&
        !saver->save(trainer, error))
      return fail(rankPrefix + error);
    // Validation (every rank takes part): after every --eval-interval
    // iterations and after the last.
    std::optional<StepResult> validation;
    if (f.evalInterval > 0 && (result->step % f.evalInterval == 0 || result->step == f.steps) &&
        !(validation = trainer.evaluate(f.evalIters, error)))
      return fail(rankPrefix + "validation after iteration " + std::to_string(result->step) + ": " + error);
    // Several processes stop on the signal they agreed on in the step;
    // one process reads its own.
    const int stop = role.agreedStop ? result->stopSignal : stopSignal();
    if (speaker)
      printIteration(*result, validation);
    if (stop && result->step < f.steps)
      return stopAfter(trainer, *result, stop, f, saver, speaker, rankPrefix);
    if (!speaker)
      continue;
    if (trained > 0 || f.steps == 1)
      for (auto &[name, ms] : result->profileMs)
        profileMs[name] += ms;
    if (!first)
      first = result->lmLoss;
    last = result->lmLoss;
  }
  if (bar)
    std::fprintf(stderr, "\n");
  if (saver && trained > 0 && (!saver->save(trainer, error) || !saver->finish(&error)))
    return fail(rankPrefix + error);
  if (!f.exportPath.empty() && role.exports && !exportAll(trainer, f.exportPath, error))
    return fail(rankPrefix + error);
  if (!f.tracePath.empty() && role.processRank) {
    // One process a rank: rank 0 merges every rank's part (TraceParts.h).
    const double epochUs =
        std::chrono::duration<double, std::micro>(trainer.traceEpoch().time_since_epoch()).count();
    if (!writeTracePart(f.tracePath, *role.processRank, trace, epochUs, error) ||
        (*role.processRank == 0 && !mergeTraceParts(f.tracePath, a.worldSize(), 120, trace, error)))
      return fail(rankPrefix + error);
  } else if (!f.tracePath.empty()) {
    std::ofstream out(f.tracePath, std::ios::trunc);
    out << chromeTrace(trace, a.worldSize(), "measured by mhcrun");
    if (!out.flush())
      return fail("--trace: cannot write " + f.tracePath);
  }
  if (!speaker)
    return 0;
  if (!first) {
    std::printf("mhcrun: nothing to train: already at iteration %lld of --steps %lld\n",
                (long long)trainer.stepsDone(), (long long)f.steps);
    return 0;
  }
  const int64_t profiled = trained > 1 ? trained - 1 : 1;
  if (f.options.profile) {
    printProfile(profileMs, profiled);
    std::printf("%s\n", measuredStepLine(a, profileMs, profiled).c_str());
  }
  if (!f.tracePath.empty()) // the speaker is rank 0, which holds every rank's slices (merged above)
    std::printf("%s\n", tracedStepLine(a, trace).c_str());
  if (!f.deviceProfileOut.empty() && !writeDeviceProfile(a, profileMs, profiled, role.backend, f, error))
    return fail(error);
  std::printf("mhcrun: trained %lld iterations; lm loss %.4f -> %.4f\n", (long long)trained, *first, *last);
  return 0;
}

/// Rank 0's random bytes in every process of the run (hex), so that a
/// multi-process save meets in a folder no earlier run used.
bool agreeRunToken(Bootstrap &bootstrap, std::string &token, std::string &error) {
  std::random_device entropy;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%08x%08x", entropy(), entropy());
  token = hex;
  if (!bootstrap.broadcast(token, error))
    return false;
  if (token.size() != 16 || token.find_first_not_of("0123456789abcdef") != std::string::npos) {
    error = "rank 0's run token is malformed (the ranks run different mhcrun versions?)";
    return false;
  }
  return true;
}

/// Rank 0's settings in every process, each compared with its own: a rank
/// started with other flags or another artifact stops here, naming the
/// setting (runtime/cli/RunSettings.h), before it could train another model
/// or wait in a collective the others never issue.
bool agreeRunSettings(Bootstrap &bootstrap, const std::vector<std::pair<std::string, std::string>> &settings,
                      std::string &error) {
  std::string rank0 = encodeRunSettings(settings);
  if (!bootstrap.broadcast(rank0, error))
    return false;
  error = runSettingsDifference(rank0, settings);
  return error.empty();
}

/// What this process does in the training loop: who speaks, which part of
/// a save it writes, whether it exports, and how a multi-process run agrees
/// on stops.
Role roleOf(const std::optional<ProcessPlacement> &placement, const std::string &backend, const RunFlags &f,
            bool speaker, const std::string &rankPrefix, const std::string &runToken) {
  Role role;
  role.speaker = speaker;
  role.rankPrefix = rankPrefix;
  role.agreedStop = placement.has_value();
  role.backend = backend;
  if (placement) {
    role.processRank = placement->rank;
    role.shard.rank = placement->rank;
    role.shard.size = placement->size;
    role.shard.timeoutSeconds = std::max(600.0, f.options.recvTimeoutSeconds);
    role.shard.runToken = runToken;
    // Every CPU rank holds every weight: rank 0 exports them. (A GPU rank
    // holds its stages' weights alone: placeRanks refused the export.)
    role.exports = placement->rank == 0;
  }
  return role;
}

/// Where this process's ranks run, checked against the artifact: nullopt to
/// train here (every rank in this process, or this process one rank of a
/// launcher's); else the exit status, after one line for an impossible
/// combination, or after the ranks this process started (--gpus,
/// --processes) have ended.
std::optional<int> placeRanks(RunFlags &f, const Artifact &a, const std::optional<ProcessPlacement> &placement,
                              const GpuInventory &gpus, const std::string &backend, char **argv,
                              const std::string &rankPrefix) {
  if (f.gpus > 0 && f.gpus != a.worldSize())
    return fail("--gpus " + std::to_string(f.gpus) + ": the artifact has " +
                (a.worldSize() > a.pp ? a.meshDescription() + " ranks"
                                      : "pp = " + std::to_string(a.pp) + " pipeline ranks") +
                ", one per GPU; pass --gpus " + std::to_string(a.worldSize()) + " or recompile with --pp " +
                std::to_string(f.gpus));
  if (placement && backend == "cuda" && !f.exportPath.empty())
    return fail(rankPrefix + kExportNeedsOneProcess); // at start-up, not after the whole run
  if (f.ranksPerGpu > 1) {
    if (placement)
      return fail(rankPrefix + "--ranks-per-gpu shares GPUs between the ranks of one process; run without " +
                  placement->launcher);
    if (backend != "cuda")
      return fail("--ranks-per-gpu " + std::to_string(f.ranksPerGpu) +
                  " shares GPUs between CUDA ranks; the CPU backend runs every rank on the host already");
    f.inProcess = true;
  }
  if (backend == "cuda" && !placement) {
    const int64_t ranks = a.worldSize();
    if (std::string missing = missingGpus(gpus, ranks, f.ranksPerGpu, ranks > a.pp ? a.meshDescription() : "");
        !missing.empty())
      return fail(missing);
    if (ranks > 1 && !f.inProcess && !f.dumpDir.empty())
      return fail("--dump-tensors needs every rank in this process: add --in-process, or use --backend cpu");
    if (ranks > 1 && !f.inProcess)
      return launchRanks(ranks, "/proc/self/exe", argv, std::cerr);
  }
  const int64_t world = a.worldSize();
  const std::string mesh = a.meshDescription();
  if (backend == "cpu" && placement && placement->size != world)
    return fail(rankPrefix + placement->launcher + " started " + std::to_string(placement->size) +
                " processes, but the artifact has " + mesh + "; the CPU backend runs one process per rank: start " +
                std::to_string(world));
  // Every CPU rank on this host: in this process on one copy of the
  // parameters, or in the processes --processes starts here.
  auto hostMemory = [&](bool processes) {
    const int64_t segment = f.options.recompute ? std::max<int64_t>(f.options.recomputeNumSublayers, 1) : 0;
    std::optional<HostMemory> host = availableHostMemory();
    std::string problem = host ? hostMemoryProblem(a, *host, segment, processes) : "";
    return problem.empty() || !gpus.gpus.empty() ? problem
                                                 : problem + " (no GPU visible: " + gpus.unavailableReason + ")";
  };
  if (backend == "cpu" && !placement && f.processes > 0) {
    if (f.processes != world)
      return fail("--processes " + std::to_string(f.processes) + ": the artifact has " + mesh +
                  " ranks, one per process; pass --processes " + std::to_string(world));
    if (!f.dumpDir.empty())
      return fail("--dump-tensors needs every rank in this process: drop --processes");
    if (std::string problem = hostMemory(true); !problem.empty())
      return fail(problem);
    return launchRanks(world, "/proc/self/exe", argv, std::cerr);
  }
  if (backend == "cpu" && f.memoryPlanGiven)
    std::cerr << "mhcrun: --memory-plan applies to the CUDA backend; the CPU backend ignores it\n";
  if (backend == "cpu" && !placement)
    if (std::string problem = hostMemory(false); !problem.empty())
      return fail(problem);
  return std::nullopt;
}

} // namespace

int runMhcrun(int argc, char **argv) {
  prepareCudaEnvironment(); // before any CUDA call
  // A redirected log (Slurm, tee) shows every line as it happens.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  RunFlags f;
  if (int status = parseRunFlags(argc, argv, f); status >= 0)
    return status;
  std::string error;
  std::optional<ProcessPlacement> placement = detectPlacement(error);
  if (!error.empty())
    return fail(error);
  const std::string rankPrefix = placement ? "rank " + std::to_string(placement->rank) + ": " : "";
  if (placement && !f.dumpDir.empty())
    return fail(rankPrefix + "--dump-tensors needs every rank in one process; run without " + placement->launcher +
                " (--backend cpu, or --in-process)");
  std::optional<Artifact> artifact = readArtifact(f.artifactPath, error);
  if (!artifact)
    return fail(rankPrefix + error);
  if (f.options.storeParamRemainders && artifact->model.dtype != "bf16")
    return fail(rankPrefix + "--store-param-remainders: " + f.artifactPath + " holds an " + artifact->model.dtype +
                " model, whose kernels read the fp32 masters themselves; the remainders (a master's low 16 bits "
                "beside its bf16 copy) apply to bf16 models: drop the flag");
  // As the artifact's prediction assumed, unless the command line says otherwise.
  f.options.recompute = !f.noRecompute && (f.options.recompute || artifact->recomputeSublayers);
  if (f.recomputeNumSublayers > 0 && !f.options.recompute)
    return fail(rankPrefix + "--recompute-num-sublayers " + std::to_string(f.recomputeNumSublayers) +
                " sizes the recomputed segments, but nothing is recomputed: add --recompute-sublayers (or compile "
                "with mhcc --recompute-sublayers)");
  f.options.recomputeNumSublayers =
      f.recomputeNumSublayers > 0 ? f.recomputeNumSublayers : artifact->recomputeNumSublayers;
  if (f.options.recompute && !f.deviceProfileOut.empty())
    return fail(rankPrefix + "--device-profile-out: " + f.artifactPath +
                " was compiled with --recompute-sublayers, whose recomputed forwards the profile would count as "
                "forwards; add --no-recompute-sublayers to measure it");
  GpuInventory gpus = queryGpus();
  const std::string backend = chooseBackend(f, *artifact, placement, gpus, error);
  if (backend.empty())
    return fail(rankPrefix + error);
  std::optional<TokenDataset> data = TokenDataset::open(f.dataPath, error);
  if (!data)
    return fail(rankPrefix + error);
  data->setSplit(f.splitTrain, f.splitValid);
  if (std::string problem = data->check(artifact->model.vocab, artifact->model.seqLen); !problem.empty())
    return fail(rankPrefix + problem);
  if ((f.options.resetPositionIds || f.options.resetAttentionMask) && !data->hasDocuments())
    return fail(rankPrefix + std::string(f.options.resetPositionIds ? "--reset-position-ids" : "--reset-attention-mask") +
                ": " + f.dataPath + " has no document boundaries (a text file is one stream); give a Megatron "
                "indexed dataset (tools/mhc-prep turns text or JSONL into one)");
  if (std::optional<int> done = placeRanks(f, *artifact, placement, gpus, backend, argv, rankPrefix))
    return *done;
  // In a multi-process run rank 0 speaks for all (every rank has the step's
  // numbers after the all-reduce); the others report only errors.
  const bool speaker = !placement || placement->rank == 0;
  const Artifact &a = *artifact;
  if (speaker)
    printRunBanner(a, backend, f, *data);
  std::unique_ptr<Bootstrap> bootstrap;
  std::unique_ptr<SocketFolder> sockets;
  // From here on a rank that fails ends the whole run (Bootstrap::abortRun):
  // the others may be waiting for it where no timeout reaches. What this
  // process printed is flushed and its socket folder removed first, as an
  // abort ends it without destructors.
  auto abortRun = [&] {
    if (!bootstrap)
      return;
    std::fflush(stdout);
    sockets.reset();
    bootstrap->abortRun();
  };
  auto failRank = [&](const std::string &message) {
    const int status = fail(rankPrefix + message);
    abortRun();
    return status;
  };
  std::string runToken; // the multi-process saves' meeting folder (CheckpointShard::runToken)
  DeviceFactory devices;
  if (placement) {
    // Start-up (rank 0 preparing what it broadcasts) is not a step: at
    // least the 120 s it always had, whatever --recv-timeout says.
    if (!(bootstrap = makeBootstrap(*placement, std::max(120.0, f.options.recvTimeoutSeconds), error)) ||
        !agreeRunToken(*bootstrap, runToken, error) ||
        !agreeRunSettings(*bootstrap, sharedRunSettings(f, a, backend, dataFingerprint(*data, f.options.dataSeed, a.model.seqLen), mhccEnvironment()), error))
      return failRank(error);
    if (backend == "cpu" && !(sockets = SocketFolder::agree(*placement, *bootstrap, error)))
      return failRank(error);
    devices = backend == "cpu" ? cpuProcessDevice(placement->rank, placement->size, sockets->path)
                               : cudaRankDevice(*placement, *bootstrap);
  } else {
    devices = backend == "cuda" ? cudaDevices(int(f.ranksPerGpu)) : cpuDevices();
  }
  // SIGTERM / SIGINT stop at an iteration boundary. The ranks of a
  // multi-process run agree on it through the step's collective (the CPU
  // ranks' gather, the CUDA ranks' statistics all-reduce), so every rank
  // stops after the same iteration.
  installStopHandler();
  std::unique_ptr<Trainer> trainer = Trainer::create(std::move(*artifact), *data, f.options, devices, error);
  if (!trainer)
    return failRank(error);
  if (!restore(*trainer, f, speaker, error))
    return failRank(error);
  const Role role = roleOf(placement, backend, f, speaker, rankPrefix, runToken);
  const int status = trainLoop(*trainer, *data, f, role);
  if (status == 1)
    abortRun(); // its line printed; a stop by signal (128 + it) is agreed by every rank
  return status;
}

} // namespace mhcc::runtime
