// libFuzzer target: the artifact decoder (runtime/artifact/Artifact.cpp and
// Validate.cpp). A mutated file almost never passes the XXH3 checksum, so
// each input is decoded twice: as it is (header checks), and resealed (the
// header's payload size and checksum recomputed over the payload), the way
// an attacker who edits an artifact would, so the fuzzer reaches the JSON
// reader and the semantic validation behind the checksum.
#include "runtime/artifact/Artifact.h"

#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace {
constexpr size_t kHeaderSize = 32; // magic 8, version 4, reserved 4, size 8, checksum 8

// An input that starts with the magic keeps its header (version and
// reserved bytes stay fuzzed); any other input is taken as the payload.
std::string reseal(const uint8_t *data, size_t size) {
  using mhcc::runtime::kArtifactMagic;
  std::string out;
  std::string payload;
  if (size >= kHeaderSize && std::memcmp(data, kArtifactMagic, 8) == 0) {
    out.assign(reinterpret_cast<const char *>(data), 16);
    payload.assign(reinterpret_cast<const char *>(data + kHeaderSize), size - kHeaderSize);
  } else {
    out.assign(kArtifactMagic, 8);
    uint32_t version = mhcc::runtime::kArtifactVersion, reserved = 0;
    out.append(reinterpret_cast<const char *>(&version), 4);
    out.append(reinterpret_cast<const char *>(&reserved), 4);
    payload.assign(reinterpret_cast<const char *>(data), size);
  }
  uint64_t n = payload.size(), sum = XXH3_64bits(payload.data(), payload.size());
  out.append(reinterpret_cast<const char *>(&n), 8);
  out.append(reinterpret_cast<const char *>(&sum), 8);
  return out + payload;
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string error;
  (void)mhcc::runtime::decodeArtifact(std::string(reinterpret_cast<const char *>(data), size), error);
  error.clear();
  auto artifact = mhcc::runtime::decodeArtifact(reseal(data, size), error);
  if (!artifact)
    return 0;
  // What the decoder accepts, it must be able to write and read back.
  std::string again;
  if (!mhcc::runtime::decodeArtifact(mhcc::runtime::encodeArtifact(*artifact), again))
    __builtin_trap();
  return 0;
}
