//===- RunSettings.cpp - what every process of a run must share ------------===//
#include "runtime/cli/RunSettings.h"

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <xxhash.h>

namespace mhcc::runtime {
namespace {

/// The shortest decimal that reads back as `value` (so 0.003, not
/// 0.0030000000000000001), hence exact.
std::string number(double value) {
  char text[32];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, value);
    if (std::strtod(text, nullptr) == value)
      break;
  }
  return text;
}

std::string flag(bool on) { return on ? "on" : "off"; }

} // namespace

std::vector<std::pair<std::string, std::string>> sharedRunSettings(const RunFlags &f, const Artifact &a,
                                                                   const std::string &backend,
                                                                   const std::string &dataFingerprint,
                                                                   const std::string &environment) {
  const TrainOptions &o = f.options;
  char checksum[24];
  std::snprintf(checksum, sizeof checksum, "%016llx", static_cast<unsigned long long>(a.checksum));
  return {
      {"mhcrun (version)", kMhccVersion},
      {"the artifact (checksum)", checksum},
      {"--backend", backend},
      {"--data (tokens, sampled XXH3)", dataFingerprint},
      {"the MHCC_ environment", environment},
      {"--steps", std::to_string(f.steps)},
      {"--data-seed", std::to_string(o.dataSeed)},
      {"--split", std::to_string(f.splitTrain) + "," + std::to_string(f.splitValid)},
      {"--eval-interval", std::to_string(f.evalInterval)},
      {"--eval-iters", std::to_string(f.evalIters)},
      {"--reset-position-ids", flag(o.resetPositionIds)},
      {"--reset-attention-mask", flag(o.resetAttentionMask)},
      {"--recompute-sublayers", flag(o.recompute)},
      {"--recompute-num-sublayers", std::to_string(o.recomputeNumSublayers)},
      {"--optimizer", o.optimizer},
      {"--lr", number(o.lr)},
      {"--warmup-steps", std::to_string(o.warmupSteps)},
      {"--clip-grad", number(o.clipGrad)},
      {"--weight-decay", number(o.weightDecay)},
      {"--adam-beta1", number(o.beta1)},
      {"--adam-beta2", number(o.beta2)},
      {"--adam-eps", number(o.adamEps)},
      {"--store-param-remainders", flag(o.storeParamRemainders)},
      {"--trace", flag(!f.tracePath.empty())},
      {"--save", f.saveDir},
      {"--save-interval", std::to_string(f.saveInterval)},
      {"--load", flag(!f.loadDir.empty())},
      {"--init-from", flag(!f.initFrom.empty())},
  };
}

std::string dataFingerprint(const TokenDataset &data, uint64_t seed, int64_t seqLen) {
  // What the ranks would train on: the first windows the sampler draws
  // (blend weights, split and order included), read whole and few.
  constexpr int64_t kWindows = 8;
  std::vector<int32_t> tokens(seqLen * kWindows), labels(seqLen * kWindows);
  for (int64_t k = 0; k < kWindows; ++k)
    data.sample(seed, k / 2, k % 2, seqLen, 1, tokens.data() + k * seqLen, labels.data() + k * seqLen);
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(tokens.data(), tokens.size() * sizeof(int32_t)) ^
                                                XXH3_64bits(labels.data(), labels.size() * sizeof(int32_t)) * 3));
  return std::to_string(data.size()) + " " + hash;
}

std::string mhccEnvironment() {
  // The kernel choices (they may change bits, and the tensor-parallel ranks
  // compute the mixing redundantly); the rest may differ between hosts
  // (MHCC_CPU_THREADS) or keep the bits (MHCC_PDL, the debugging switches).
  std::string joined;
  for (const char *name : {"MHCC_ATTENTION", "MHCC_MHC_BACKWARD", "MHCC_MHC_FORWARD"})
    if (const char *value = std::getenv(name))
      joined += std::string(joined.empty() ? "" : " ") + name + "=" + value;
  return joined;
}

std::string encodeRunSettings(const std::vector<std::pair<std::string, std::string>> &settings) {
  std::string out;
  for (const auto &[name, value] : settings)
    out += name + "=" + value + "\n";
  return out;
}

std::string runSettingsDifference(const std::string &rank0,
                                  const std::vector<std::pair<std::string, std::string>> &mine) {
  std::istringstream lines(rank0);
  std::string line;
  for (const auto &[name, value] : mine) {
    if (!std::getline(lines, line) || line.compare(0, name.size() + 1, name + "=") != 0)
      return "rank 0 sent settings this mhcrun does not read (the ranks run different mhcrun versions?): "
             "start every rank with the same mhcrun";
    const std::string theirs = line.substr(name.size() + 1);
    if (theirs != value) {
      auto shown = [](const std::string &v) { return v.empty() ? std::string("(not given)") : "'" + v + "'"; };
      return name + " is " + shown(value) + " here but " + shown(theirs) +
             " on rank 0: every process of a run must be started with the same mhcrun flags and artifact "
             "(mpirun and srun pass one command line to all)";
    }
  }
  return std::getline(lines, line) ? "rank 0 sent more settings than this mhcrun reads (the ranks run different "
                                     "mhcrun versions?): start every rank with the same mhcrun"
                                   : "";
}

} // namespace mhcc::runtime
