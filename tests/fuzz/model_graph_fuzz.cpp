// libFuzzer target: the model-graph JSON reader (compiler/ModelGraph.cpp).
// Model files come from users and other tools; any input must give either a
// graph or one ModelError, never a crash, hang or uncaught exception.
#include "compiler/ModelGraph.h"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string text(reinterpret_cast<const char *>(data), size);
  mhcc::ModelError error;
  auto graph = mhcc::parseModelGraph(text, error);
  if (!graph) {
    // The CLI prints this line; building it must not crash either.
    (void)mhcc::formatModelError("fuzz.json", error);
    return 0;
  }
  // An accepted graph promises inputs that precede their users.
  for (size_t i = 0; i < graph->nodes.size(); ++i)
    for (int in : graph->nodes[i].inputs)
      if (in < 0 || size_t(in) >= i)
        __builtin_trap();
  (void)graph->numLayers();
  return 0;
}
