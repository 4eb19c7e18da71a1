//===- TensorDump.cpp - mhcrun --dump-tensors --------------------------------===//
#include "runtime/cli/TensorDump.h"

#include "runtime/io/Safetensors.h"

#include <cstdio>
#include <filesystem>

namespace mhcc::runtime {
namespace {

void addRunMetadata(SafetensorsWriter &w, const Artifact &a, const TrainOptions &o, int64_t steps) {
  auto number = [](double v) {
    char b[64];
    std::snprintf(b, sizeof b, "%.17g", v);
    return std::string(b);
  };
  w.setMetadata("model", a.model.name);
  // The global batch: with dp replicas, microbatch k is replica k % dp's k / dp-th.
  w.setMetadata("microbatches", std::to_string(a.microbatches * a.dp));
  w.setMetadata("steps", std::to_string(steps));
  w.setMetadata("optimizer", o.optimizer);
  w.setMetadata("lr", number(o.lr));
  w.setMetadata("beta1", number(o.beta1));
  w.setMetadata("beta2", number(o.beta2));
  w.setMetadata("adam_eps", number(o.adamEps));
  w.setMetadata("weight_decay", number(o.weightDecay));
  w.setMetadata("clip_grad", number(o.clipGrad));
  w.setMetadata("warmup_steps", std::to_string(o.warmupSteps));
  w.setMetadata("data_seed", std::to_string(o.dataSeed));
  w.setMetadata("reset_position_ids", o.resetPositionIds ? "1" : "0");
  w.setMetadata("reset_attention_mask", o.resetAttentionMask ? "1" : "0");
}

} // namespace

bool dumpTensors(const std::string &dir, Trainer &trainer, const TokenDataset &data,
                 const TrainOptions &options, int64_t steps, const StepResult *result, std::string &error) {
  const Artifact &a = trainer.artifact();
  const ModelInfo &m = a.model;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    error = "--dump-tensors: cannot create " + dir + ": " + ec.message();
    return false;
  }
  SafetensorsWriter w;
  addRunMetadata(w, a, options, steps);
  for (size_t p = 0; p < a.params.size(); ++p)
    w.addF32("weight." + a.params[p].name, {a.params[p].rows, a.params[p].cols}, trainer.parameters()[p].data());
  std::string path;
  if (!result) {
    path = dir + "/init.safetensors";
    // The trainer samples step s (0-based) microbatch mb exactly like this.
    std::vector<int32_t> tokens(m.tokens()), labels(m.tokens()), positions(m.tokens()), firstKeys(m.tokens());
    const TokenDataset::SampleBuffers buffers{tokens.data(), labels.data(),
                                              options.resetPositionIds ? positions.data() : nullptr,
                                              options.resetAttentionMask ? firstKeys.data() : nullptr};
    for (int64_t s = 0; s < steps; ++s)
      for (int64_t mb = 0; mb < a.microbatches * a.dp; ++mb) {
        data.sample(options.dataSeed, s, mb, m.seqLen, m.microBatch, buffers);
        const std::string key = ".step" + std::to_string(s + 1) + ".mb" + std::to_string(mb);
        w.addI32("tokens" + key, {m.microBatch, m.seqLen}, tokens.data());
        w.addI32("labels" + key, {m.microBatch, m.seqLen}, labels.data());
        if (buffers.positions)
          w.addI32("positions" + key, {m.microBatch, m.seqLen}, positions.data());
        if (buffers.firstKeys)
          w.addI32("first_keys" + key, {m.microBatch, m.seqLen}, firstKeys.data());
      }
  } else {
    path = dir + "/step" + std::to_string(result->step) + ".safetensors";
    for (const ParamInfo &info : a.params) {
      auto it = result->paramGrads.find(info.name);
      if (it == result->paramGrads.end()) {
        error = "--dump-tensors: no gradient recorded for " + info.name;
        return false;
      }
      w.addF32("grad." + info.name, {info.rows, info.cols}, it->second.data());
    }
    w.addF64("lm_loss", {}, &result->lmLoss);
    if (result->mtpLoss)
      w.addF64("mtp_loss", {}, &*result->mtpLoss);
    w.addF64("grad_norm", {}, &result->gradNorm);
    w.addF64("learning_rate", {}, &result->learningRate);
  }
  return w.write(path, error);
}

} // namespace mhcc::runtime
