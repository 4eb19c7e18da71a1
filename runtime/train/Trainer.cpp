//===- Trainer.cpp - training steps over any backend ------------------------===//
#include "runtime/train/Trainer.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace mhcc::runtime {

using Clock = std::chrono::steady_clock;

Trainer::Trainer(Artifact artifact, const TokenDataset &data, TrainOptions options)
    : artifact_(std::move(artifact)), data_(data), options_(std::move(options)) {}

Trainer::~Trainer() {
  if (broken_)
    for (auto &device : devices_)
      device->abort();
}

std::unique_ptr<Trainer> Trainer::create(Artifact artifact, const TokenDataset &data, TrainOptions options,
                                         const DeviceFactory &devices, std::string &error) {
  std::unique_ptr<Trainer> trainer(new Trainer(std::move(artifact), data, std::move(options)));
  trainer->devices_ = devices(trainer->artifact_, trainer->options_, trainer->failed_, error);
  if (trainer->devices_.empty())
    return nullptr;
  const Clock::time_point epoch = Clock::now(); // of every rank's and step's trace
  trainer->traceEpoch_ = epoch;
  for (auto &device : trainer->devices_) {
    trainer->executors_.push_back(std::make_unique<Executor>(trainer->artifact_, trainer->options_, *device));
    trainer->executors_.back()->setTraceEpoch(epoch);
  }
  return trainer;
}

/// The first error that is not just "another rank failed".
std::string Trainer::firstError() const {
  std::string fallback;
  for (const std::string &e : errors_) {
    if (e.empty())
      continue;
    if (e.find("another rank failed") == std::string::npos)
      return e;
    if (fallback.empty())
      fallback = e;
  }
  return fallback.empty() ? "unknown failure" : fallback;
}

bool Trainer::runRanks(const std::vector<StepInputs> &inputs, int64_t stepNumber, std::vector<StepResult> &results,
                       std::vector<double> &pipelineMs) {
  const auto start = Clock::now();
  auto body = [&](size_t k) {
    Device &device = *devices_[k];
    Executor &executor = *executors_[k];
    const std::string rank = "rank " + std::to_string(device.rank());
    bool ok = false;
    if (!device.beginStep(inputs[device.replica()]))
      errors_[k] = rank + " start of step: " + device.error();
    else if (!executor.runPipeline())
      errors_[k] = executor.error();
    else {
      const auto optimizerStart = Clock::now();
      pipelineMs[k] = std::chrono::duration<double, std::milli>(optimizerStart - start).count();
      ok = device.optimizerStep(stepNumber, executor.losses(), results[k]);
      if (!ok)
        errors_[k] = rank + " optimizer: " + device.error();
      else if (options_.trace)
        executor.traceOptimizer(optimizerStart, Clock::now());
    }
    if (!ok)
      failed_ = true;
    return ok;
  };
  if (devices_.size() == 1)
    return body(0);
  // Ranks block on each other (receives, collectives): one thread each.
  std::vector<char> ok(devices_.size(), 0);
  std::vector<std::thread> threads;
  for (size_t k = 0; k < devices_.size(); ++k)
    threads.emplace_back([&, k] { ok[k] = body(k); });
  for (std::thread &t : threads)
    t.join();
  return std::all_of(ok.begin(), ok.end(), [](char v) { return v != 0; });
}

bool Trainer::runStep(const std::vector<StepInputs> &inputs, int64_t stepNumber, std::vector<StepResult> &results,
                      std::vector<double> &pipelineMs, std::string &error) {
  if (broken_) {
    error = "the trainer failed before and cannot continue";
    return false;
  }
  results.assign(devices_.size(), StepResult());
  pipelineMs.assign(devices_.size(), 0.0);
  errors_.assign(devices_.size(), "");
  if (runRanks(inputs, stepNumber, results, pipelineMs))
    return true;
  broken_ = true;
  for (auto &device : devices_)
    device->abort();
  error = firstError();
  return false;
}

std::optional<StepResult> Trainer::step(std::string &error) {
  const ModelInfo &m = artifact_.model;
  const auto start = Clock::now();
  std::vector<StepResult> results;
  std::vector<double> pipelineMs;
  if (!runStep(sampleInputs(stepsDone_, false), stepsDone_ + 1, results, pipelineMs, error))
    return std::nullopt;
  StepResult result = std::move(results[0]);
  for (size_t k = 0; k < devices_.size(); ++k) {
    // Devices report disjoint parts of a gradient (a tensor-parallel
    // rank's block, zero elsewhere): the parts add up to the whole.
    for (auto &[name, part] : results[k].paramGrads) {
      if (k == 0) // results[0] is `result`
        break;
      auto [it, inserted] = result.paramGrads.try_emplace(name, std::move(part));
      if (!inserted)
        for (size_t e = 0; e < part.size() && e < it->second.size(); ++e)
          it->second[e] += part[e];
    }
    if (options_.recordTaps)
      result.taps.merge(executors_[k]->takeTaps());
    if (options_.profile)
      devices_[k]->takeProfile(result.profileMs);
    for (TraceSlice &slice : executors_[k]->takeTrace()) {
      slice.step = stepsDone_ + 1;
      result.trace.push_back(std::move(slice));
    }
  }
  const auto end = Clock::now();
  result.step = ++stepsDone_;
  result.seconds = std::chrono::duration<double>(end - start).count();
  result.tokens = artifact_.microbatches * artifact_.dp * m.tokens();
  if (options_.profile) {
    const double pipeline = *std::max_element(pipelineMs.begin(), pipelineMs.end());
    result.profileMs["host: pipeline (all ranks, wall)"] = pipeline;
    result.profileMs["host: gradient reduction and optimizer"] =
        std::chrono::duration<double, std::milli>(end - start).count() - pipeline;
  }
  return result;
}

std::vector<StepInputs> Trainer::sampleInputs(int64_t batch, bool validation) const {
  const ModelInfo &m = artifact_.model;
  // Each replica's share of the global batch (Artifact::globalMicrobatch).
  std::vector<StepInputs> inputs(artifact_.dp);
  for (int64_t d = 0; d < artifact_.dp; ++d) {
    inputs[d].evaluateOnly = validation;
    StepInputs &in = inputs[d];
    in.tokens.assign(artifact_.microbatches, std::vector<int32_t>(m.tokens()));
    in.labels.assign(artifact_.microbatches, std::vector<int32_t>(m.tokens()));
    if (options_.resetPositionIds)
      in.positions.assign(artifact_.microbatches, std::vector<int32_t>(m.tokens()));
    if (options_.resetAttentionMask)
      in.firstKeys.assign(artifact_.microbatches, std::vector<int32_t>(m.tokens()));
    for (int64_t mb = 0; mb < artifact_.microbatches; ++mb) {
      auto entries = [mb](std::vector<std::vector<int32_t>> &v) { return v.empty() ? nullptr : v[mb].data(); };
      data_.sample(options_.dataSeed, batch, artifact_.globalMicrobatch(mb, d), m.seqLen, m.microBatch,
                   {entries(in.tokens), entries(in.labels), entries(in.positions), entries(in.firstKeys)},
                   validation);
    }
  }
  return inputs;
}

std::optional<StepResult> Trainer::evaluate(int64_t iterations, std::string &error) {
  if (!data_.hasValidation()) {
    error = "the data has no validation part (--split)";
    return std::nullopt;
  }
  StepResult mean;
  mean.step = stepsDone_;
  std::vector<StepResult> results;
  std::vector<double> pipelineMs;
  for (int64_t batch = 0; batch < iterations; ++batch) {
    // Validation batches follow each other over the evaluations, as Megatron's
    // validation iterator does: evaluation e's batch k is e x iterations + k.
    if (!runStep(sampleInputs(stepsDone_ * iterations + batch, true), stepsDone_, results, pipelineMs, error))
      return std::nullopt;
    // The pass's device times and trace are not a training step's.
    std::map<std::string, double> discarded;
    for (size_t k = 0; k < devices_.size(); ++k) {
      if (options_.profile)
        devices_[k]->takeProfile(discarded);
      executors_[k]->takeTrace();
      executors_[k]->takeTaps();
    }
    mean.lmLoss += results[0].lmLoss / double(iterations);
    if (results[0].mtpLoss) // every batch has one when the model has MTP
      mean.mtpLoss = mean.mtpLoss.value_or(0.0) + *results[0].mtpLoss / double(iterations);
    mean.stopSignal = std::max(mean.stopSignal, results[0].stopSignal);
  }
  return mean;
}

bool Trainer::saveState(ParameterState &state, std::string &error) {
  state.clear(artifact_.params.size());
  for (auto &device : devices_)
    if (!device->saveState(state)) {
      error = "rank " + std::to_string(device->rank()) + " saving its state: " + device->error();
      return false;
    }
  return true;
}

bool Trainer::loadState(const ParameterState &state, int64_t stepsDone, std::string &error) {
  if (broken_) {
    error = "the trainer failed before and cannot continue";
    return false;
  }
  for (auto &device : devices_)
    if (!device->loadState(state)) {
      error = "rank " + std::to_string(device->rank()) + " loading a state: " + device->error();
      return false;
    }
  stepsDone_ = stepsDone;
  return true;
}

const std::vector<std::vector<float>> &Trainer::parameters() {
  weights_.assign(artifact_.params.size(), {});
  for (auto &device : devices_)
    device->downloadParameters(weights_);
  return weights_;
}

} // namespace mhcc::runtime
