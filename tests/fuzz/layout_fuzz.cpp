// libFuzzer target: the layout-string parser (passes/pipeline/Layout.cpp),
// which reads `--layout` from the command line. The first bytes pick pp, vpp
// and the model's sizes so the validator sees varied shapes; the rest is the
// layout text.
#include "passes/pipeline/Layout.h"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4)
    return 0;
  const int64_t pp = 1 + data[0] % 8, vpp = 1 + data[1] % 4;
  mhcc::pipeline::ModelShape model;
  model.layers = data[2] % 64;
  model.mtpModules = data[3] % 3;
  std::string text(reinterpret_cast<const char *>(data + 4), size - 4);

  std::string error;
  (void)mhcc::pipeline::expandLayout(text, error);
  error.clear();
  auto layout = mhcc::pipeline::parseLayout(text, pp, vpp, model, error);
  if (!layout)
    return 0;
  // An accepted layout has p*v stages and prints to a string that parses
  // back to the same stages.
  if (int64_t(layout->stages.size()) != pp * vpp)
    __builtin_trap();
  std::string again;
  auto reparsed = mhcc::pipeline::parseLayout(layout->toString(), pp, vpp, model, again);
  if (!reparsed || reparsed->stages != layout->stages)
    __builtin_trap();
  return 0;
}
