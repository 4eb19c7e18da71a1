//===- RunSettings.cpp - what every process of a run must share ------------===//
#include "runtime/cli/RunSettings.h"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <unistd.h>
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
      {"--optimizer", o.optimizer},
      {"--lr", number(o.lr)},
      {"--warmup-steps", std::to_string(o.warmupSteps)},
      {"--clip-grad", number(o.clipGrad)},
      {"--weight-decay", number(o.weightDecay)},
      {"--adam-beta1", number(o.beta1)},
      {"--adam-beta2", number(o.beta2)},
      {"--adam-eps", number(o.adamEps)},
      {"--trace", flag(!f.tracePath.empty())},
      {"--save", f.saveDir},
      {"--save-interval", std::to_string(f.saveInterval)},
      {"--load", flag(!f.loadDir.empty())},
      {"--init-from", flag(!f.initFrom.empty())},
  };
}

std::string dataFingerprint(const TokenDataset &data) {
  constexpr size_t kSamples = 65536;
  const size_t n = data.size(), step = std::max<size_t>(1, n / kSamples);
  std::vector<int32_t> sampled;
  for (size_t i = 0; i < n && sampled.size() < kSamples; i += step)
    sampled.push_back(data.token(i));
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(sampled.data(), sampled.size() * sizeof(int32_t))));
  return std::to_string(n) + " " + hash;
}

std::string mhccEnvironment() {
  std::vector<std::string> entries;
  for (char **e = environ; e && *e; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    if (name.rfind("MHCC_", 0) == 0 && name != "MHCC_RANK" && name != "MHCC_LOCAL_RANK" &&
        name != "MHCC_WORLD_SIZE" && name != "MHCC_BOOTSTRAP_DIR")
      entries.push_back(entry);
  }
  std::sort(entries.begin(), entries.end());
  std::string joined;
  for (const std::string &entry : entries)
    joined += (joined.empty() ? "" : " ") + entry;
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
