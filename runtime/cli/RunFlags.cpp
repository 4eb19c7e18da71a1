//===- RunFlags.cpp - the mhcrun command line, parsed and checked -----------===//
#include "runtime/cli/RunFlags.h"

#include "runtime/artifact/Artifact.h"
#include "runtime/cli/FlagChecks.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <unistd.h>

namespace mhcc::runtime {

int failLine(const std::string &message) {
  // One write: the ranks of a multi-process run share stderr, and a line
  // written in pieces interleaves with theirs.
  const std::string line = "mhcrun: " + message + "\n";
  std::fflush(stdout);
  if (::write(STDERR_FILENO, line.data(), line.size()) < 0)
    std::cerr << line;
  return 1;
}

namespace {
constexpr auto fail = failLine;
} // namespace

/// The options, declared once; every default is shown by --help.
namespace {

/// What a run trains on and how: steps, data, the optimizer's settings.
void addTrainingFlags(CLI::App &app, RunFlags &f) {
  TrainOptions &o = f.options;
  app.add_option("--steps", f.steps,
                 "The last training iteration (Megatron's --train-iters: resumed from iteration 10, --steps 20 "
                 "trains iterations 11 to 20)")->check(CLI::PositiveNumber);
  app.add_option("--data", f.dataPath, "Text file (byte tokens) or Megatron indexed dataset prefix")->required();
  app.add_option("--data-seed", o.dataSeed, "Seed of the microbatch sampler");
  app.add_flag("--reset-position-ids", o.resetPositionIds,
               "Packed documents (an indexed dataset's): RoPE positions restart at every document start inside a "
               "sequence (Megatron's flag)");
  app.add_flag("--reset-attention-mask", o.resetAttentionMask,
               "Packed documents (an indexed dataset's): a token attends only to the earlier tokens of its own "
               "document (Megatron's flag)");
  app.add_flag("--recompute-sublayers", o.recompute,
               "Activation recomputation (Megatron's full, uniform): keep each sublayer's input, release "
               "the rest after its forward and compute it again before its backward: less memory, one more forward "
               "of every sublayer, the same bits (the default for an artifact compiled with it)");
  app.add_option("--recompute-num-sublayers", f.recomputeNumSublayers,
                 "With recomputation: the sublayers each recomputed segment holds (Megatron's "
                 "--recompute-num-layers): only a segment's input is kept, so fewer checkpoints and a larger working "
                 "set; the same bits (0: as the artifact was compiled, 1 otherwise)")
      ->check(CLI::Range(0, 1024));
  app.add_flag("--no-recompute-sublayers", f.noRecompute,
               "Keep every activation even where the artifact was compiled with --recompute-sublayers (more memory "
               "than its prediction, one forward less)");
  app.add_option("--lr", o.lr, "Learning rate")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", o.optimizer, "adamw or sgd")->check(CLI::IsMember({"adamw", "sgd"}));
  app.add_option("--clip-grad", o.clipGrad, "Global gradient-norm clip (0: off)")->check(CLI::NonNegativeNumber);
  app.add_option("--weight-decay", o.weightDecay, "AdamW weight decay")->check(CLI::NonNegativeNumber);
  app.add_option("--adam-beta1", o.beta1, "AdamW's first-moment decay (Megatron's --adam-beta1)");
  app.add_option("--adam-beta2", o.beta2, "AdamW's second-moment decay (Megatron's --adam-beta2)");
  app.add_option("--adam-eps", o.adamEps,
                 "AdamW's epsilon (Megatron's --adam-eps): the first step moves each weight by about lr x "
                 "g / (|g| + eps), so gradients far below eps move little");
  app.add_option("--warmup-steps", o.warmupSteps, "Linear learning-rate warmup")->check(CLI::NonNegativeNumber);
  app.add_flag("--store-param-remainders", o.storeParamRemainders,
               "bf16 models: keep each fp32 master weight as the bf16 copy the kernels read and its low 16 bits "
               "(Megatron's store_param_remainders): 2 bytes a parameter less on a GPU (2 / parts under the "
               "distributed optimizer); a master exactly halfway "
               "between two bf16 values moves one fp32 ulp toward its rounding (about once in 65,536 updates), "
               "on both backends");
}

/// Where the ranks run: the backend's processes, GPUs and memory; the
/// --memory-plan option (to tell whether it was given).
CLI::Option *addLaunchFlags(CLI::App &app, RunFlags &f) {
  TrainOptions &o = f.options;
  app.add_option("--recv-timeout", o.recvTimeoutSeconds,
                 "Seconds a rank waited on may go without progress before it is declared stuck (the waiting rank "
                 "then fails, naming it); a slow rank that progresses is waited for")
      ->check(CLI::PositiveNumber);
  app.add_option("--gpus", f.gpus,
                 "Start one process per GPU on this host (must equal the artifact's ranks, pp x dp x cp x tp; the "
                 "default for the CUDA backend; -1: as many as the artifact has ranks). Under mpirun or srun the launcher starts the "
                 "ranks instead");
  app.add_option("--processes", f.processes,
                 "CPU backend: one process per rank on this host (must equal the artifact's ranks), "
                 "channels over Unix sockets; the same bits as one process. Under mpirun or srun, --backend cpu "
                 "does the same with the launcher's processes")
      ->check(CLI::PositiveNumber);
  CLI::Option *plan = app.add_option("--memory-plan", f.memoryPlan,
                 "CUDA backend: 'static' (the first step is recorded, later steps use fixed offsets in one "
                 "arena, no allocation inside a step) or 'pool' (stream-ordered pool every step)")
      ->check(CLI::IsMember({"pool", "static"}));
  app.add_flag("--in-process", f.inProcess,
               "CUDA backend: every rank in this process, one host thread each, instead of one process per GPU "
               "(debugging)");
  app.add_option("--ranks-per-gpu", f.ranksPerGpu,
                 "CUDA backend, implies --in-process: N pipeline ranks share each GPU (rank r on GPU r / N), their "
                 "messages device copies instead of NCCL (which needs a GPU a rank): the same bits, for layouts "
                 "with more ranks than GPUs (testing, debugging; not for speed)")
      ->check(CLI::PositiveNumber);
  return plan;
}

/// What a run writes: metrics, profiles, traces, dumps, checkpoints, exports.
void addOutputFlags(CLI::App &app, RunFlags &f) {
  TrainOptions &o = f.options;
  app.add_option("--metrics", f.metricsPath, "Write one JSON line per iteration here");
  app.add_flag("--no-progress", f.noProgress, "No progress bar, even on a terminal");
  app.add_flag("--profile", o.profile,
               "Print where the time goes, per iteration after the first: time per rank and primitive (device time "
               "on the CUDA backend, thread time on the CPU) and the host phases");
  app.add_option("--device-profile-out", f.deviceProfileOut,
                 "With --profile (implied): write the rates this run achieved, per model unit, as a device profile "
                 "for mhcc --device-profile (the schedule simulator's costs)");
  app.add_option("--peak-tflops", f.peakTflops,
                 "Peak TFLOP/s per device (all ranks together are counted) for MFU; 0: not printed")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--dump-tensors", f.dumpDir,
                 "Write DIR/init.safetensors (initial weights, every microbatch's tokens and labels) and "
                 "DIR/step<k>.safetensors (gradients before clipping, updated weights, losses) for "
                 "tools/reference; needs every rank in this process (CPU backend, or --in-process)");
  app.add_option("--save", f.saveDir,
                 "Save checkpoints here (DIR/iter_0000010/, DIR/latest_checkpointed_iteration.txt): every "
                 "--save-interval iterations and after the last");
  app.add_option("--split", f.split,
                 "TRAIN,VALID: split the data by these weights (Megatron's --split, e.g. 98,2): the first part "
                 "trains, the rest is validation data; default with --eval-interval: 98,2");
  app.add_option("--eval-interval", f.evalInterval,
                 "Every N iterations (and after the last) print the validation loss over --eval-iters global "
                 "batches of the validation part (0: never)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--eval-iters", f.evalIters, "Global batches each validation pass averages")
      ->check(CLI::PositiveNumber);
  app.add_option("--save-interval", f.saveInterval, "Iterations between saves (0: only after the last)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--load", f.loadDir,
                 "Resume from DIR's latest checkpoint (or from an iter_* folder), under any pipeline layout");
  app.add_option("--export-safetensors", f.exportPath,
                 "After the last iteration, write the fp32 weights by parameter name to this safetensors file");
  app.add_option("--init-from", f.initFrom,
                 "Start from these weights (a safetensors file by parameter name) at iteration 0 with a fresh "
                 "optimizer");
  app.add_option("--trace", f.tracePath,
                 "Write the measured per-rank timeline here, as Chrome trace events (Perfetto, chrome://tracing), "
                 "with the names 'mhcc --trace' predicts (GPUs: CUDA events on the streams that ran each instruction; "
                 "one process a rank: rank 0 merges the parts)");
}

/// The parsed flags checked against each other, and what they imply filled
/// in: -1 to go on, else the exit status (a message printed).
int checkRunFlags(RunFlags &f, const CLI::Option *plan) {
  TrainOptions &o = f.options;
  // CLI11 takes an empty argument as a value; no file has an empty name.
  if (f.artifactPath.empty())
    return fail("the artifact path is empty: give the file 'mhcc --emit=artifact' wrote");
  if (f.dataPath.empty())
    return fail("--data: the path is empty: give a text file, a Megatron dataset prefix or a blend 'W1 P1 W2 P2'");
  if (f.processes > 0 && f.gpus > 0)
    return fail("--processes starts CPU ranks, --gpus CUDA ranks: pass one of them");
  if (f.gpus == 0 || f.gpus < -1)
    return fail("--gpus " + std::to_string(f.gpus) + ": give a positive number of GPUs");
  if (!f.loadDir.empty() && !f.initFrom.empty())
    return fail("--load resumes weights and optimizer, --init-from only weights: pass one of them");
  if (f.saveInterval > 0 && f.saveDir.empty())
    return fail("--save-interval needs --save DIR");
  if (f.split.empty() && f.evalInterval > 0)
    f.split = "98,2";
  if (!f.split.empty()) {
    long long train = -1, valid = -1;
    char rest = 0;
    if (std::sscanf(f.split.c_str(), "%lld,%lld%c", &train, &valid, &rest) != 2 || train <= 0 || valid < 0 ||
        train > 1000000 || valid > 1000000)
      return fail("--split '" + f.split + "': give two weights TRAIN,VALID, the first positive (e.g. 98,2)");
    f.splitTrain = train;
    f.splitValid = valid;
  }
  if (o.recompute && f.noRecompute)
    return fail("--recompute-sublayers and --no-recompute-sublayers: pass one of them");
  if (f.recomputeNumSublayers > 0 && f.noRecompute)
    return fail("--recompute-num-sublayers with --no-recompute-sublayers: the first sizes the segments the second "
                "turns off; pass one of them");
  if (o.recompute && !f.deviceProfileOut.empty())
    return fail("--device-profile-out with --recompute-sublayers: the profile would count each recomputed forward "
                "as a forward and mhcc --recompute-sublayers would add it again; measure without recomputation");
  if (f.evalInterval > 0 && f.splitValid == 0)
    return fail("--eval-interval needs validation data: give --split a positive second weight (e.g. 98,2)");
  // NaN passes CLI11's range checks (every comparison with it is false).
  for (const std::string &problem :
       {checkNumber("lr", o.lr, 0, 1e3, true), checkNumber("clip-grad", o.clipGrad, 0, 1e30, false),
        checkNumber("weight-decay", o.weightDecay, 0, 1e3, false),
        checkNumber("adam-beta1", o.beta1, 0, 0.999999, false), checkNumber("adam-beta2", o.beta2, 0, 0.999999, false),
        checkNumber("adam-eps", o.adamEps, 0, 1, true),
        // A deadline past ~30 years would overflow the clock's arithmetic.
        checkNumber("recv-timeout", o.recvTimeoutSeconds, 0, 1e9, true),
        checkNumber("peak-tflops", f.peakTflops, 0, 1e9, false)})
    if (!problem.empty())
      return fail(problem);
  const std::vector<std::string> inputs = {f.artifactPath, f.dataPath,        f.dataPath + ".bin",
                                           f.dataPath + ".idx", f.initFrom};
  o.trace = !f.tracePath.empty();
  o.profile = o.profile || !f.deviceProfileOut.empty();
  for (const std::string &problem : {checkOutputPath("metrics", f.metricsPath, inputs),
                                     checkOutputPath("trace", f.tracePath, inputs),
                                     checkOutputPath("device-profile-out", f.deviceProfileOut, inputs),
                                     checkOutputPath("export-safetensors", f.exportPath, inputs)})
    if (!problem.empty())
      return fail(problem);
  o.staticMemoryPlan = f.memoryPlan == "static";
  o.recordTaps = o.recordTaps || !f.dumpDir.empty(); // the dump needs the reduced gradients
  f.memoryPlanGiven = plan->count() > 0;
  return -1; // go on
}

} // namespace

int parseRunFlags(int argc, char **argv, RunFlags &f) {
  CLI::App app{"mhcrun: trains a compiled mhcc artifact on GPUs (one process per rank) or on the CPU "
               "reference backend"};
  app.option_defaults()->always_capture_default();
  app.set_version_flag("--version", std::string("mhcrun ") + kMhccVersion + " (artifact formats " +
                                        std::to_string(kOldestArtifactVersion) + " to " +
                                        std::to_string(kArtifactVersion) + ")");
  app.add_option("artifact", f.artifactPath, "Artifact written by 'mhcc --emit=artifact'")->required();
  app.add_option("--backend", f.backend, "auto, cpu or cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  addTrainingFlags(app, f);
  const CLI::Option *plan = addLaunchFlags(app, f);
  addOutputFlags(app, f);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return checkRunFlags(f, plan);
}

} // namespace mhcc::runtime
