// libFuzzer target: the safetensors reader (runtime/io/Safetensors.cpp),
// which reads checkpoints and --init-from files other tools wrote.
#include "runtime/io/Safetensors.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::vector<char> bytes(data, data + size);
  std::map<std::string, mhcc::runtime::SafetensorsTensor> tensors;
  std::map<std::string, std::string> metadata;
  std::string error;
  if (!mhcc::runtime::parseSafetensors("fuzz.safetensors", bytes, tensors, metadata, error))
    return 0;
  // An accepted tensor has no negative dimension and exactly the bytes its
  // dtype and shape say (the product of the dimensions must not wrap).
  for (const auto &[name, tensor] : tensors) {
    unsigned __int128 expected = tensor.dtype == "F64" || tensor.dtype == "I64" ? 8 : 4;
    for (int64_t d : tensor.shape) {
      if (d < 0)
        __builtin_trap();
      expected *= uint64_t(d);
      if (expected > size)
        __builtin_trap();
    }
    if (expected != tensor.bytes.size())
      __builtin_trap();
  }
  return 0;
}
