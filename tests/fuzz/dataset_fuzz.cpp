// libFuzzer target: the Megatron .bin/.idx reader (runtime/data/Dataset.cpp).
// The reader takes a path prefix, so each input is split into an .idx and a
// .bin file in a private temporary folder: the first two bytes (little
// endian) give the .idx length, the rest after it is the .bin.
#include "runtime/data/Dataset.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

namespace {
std::string folder() {
  static std::string dir = [] {
        // Under $TMPDIR: tools/fuzz.sh points it into out/fuzz and removes it.
    const char *tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/mhcc_dataset_fuzz.XXXXXX";
    if (!mkdtemp(tmpl.data()))
      std::abort();
    return tmpl;
  }();
  return dir;
}

void put(const std::string &path, const uint8_t *data, size_t size) {
  FILE *f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0)
    std::abort(); // the harness, not the reader, failed
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2)
    return 0;
  size_t idxSize = data[0] | size_t(data[1]) << 8;
  if (idxSize > size - 2)
    idxSize = size - 2;
  const std::string prefix = folder() + "/data";
  put(prefix + ".idx", data + 2, idxSize);
  put(prefix + ".bin", data + 2 + idxSize, size - 2 - idxSize);

  std::string error;
  auto dataset = mhcc::runtime::TokenDataset::fromIndexed(prefix, error);
  if (!dataset)
    return 0;
  // Every token read lies in the .bin, at least one byte each, and none
  // twice (the reader refuses overlapping sequences).
  if (dataset->size() > size)
    __builtin_trap();
  // Sample the way the trainer does, once the data passes its check.
  if (dataset->check(1 << 20, 4).empty()) {
    int32_t tokens[8], labels[8];
    dataset->sample(1, 0, 0, 4, 2, tokens, labels);
  }
  return 0;
}
