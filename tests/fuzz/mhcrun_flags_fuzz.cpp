// libFuzzer target: mhcrun's command line (runtime/cli/RunFlags.cpp), CLI11
// and the flag checks. The input is the argument list, one argument per line.
// Any outcome is fine but a crash; an accepted command line must satisfy what
// the rest of mhcrun relies on.
#include "runtime/cli/RunFlags.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::vector<std::string> args = {"mhcrun"};
  std::string current;
  for (size_t i = 0; i < size && args.size() < 64; ++i) {
    if (data[i] == '\n') {
      args.push_back(current);
      current.clear();
    } else if (data[i] != 0) {
      current += char(data[i]);
    }
  }
  if (!current.empty())
    args.push_back(current);
  std::vector<char *> argv;
  for (std::string &a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);

  mhcc::runtime::RunFlags f;
  if (mhcc::runtime::parseRunFlags(int(args.size()), argv.data(), f) != -1)
    return 0;
  const mhcc::runtime::TrainOptions &o = f.options;
  const bool sane = !f.artifactPath.empty() && !f.dataPath.empty() && f.steps >= 1 && std::isfinite(o.lr) &&
                    o.lr > 0 && std::isfinite(o.clipGrad) && o.clipGrad >= 0 && std::isfinite(o.weightDecay) &&
                    std::isfinite(o.recvTimeoutSeconds) && o.recvTimeoutSeconds > 0 &&
                    std::isfinite(f.peakTflops) && f.peakTflops >= 0 && (f.gpus == -1 || f.gpus > 0) &&
                    f.processes >= 0 && f.saveInterval >= 0 && (f.memoryPlan == "static" || f.memoryPlan == "pool");
  if (!sane)
    __builtin_trap();
  return 0;
}
