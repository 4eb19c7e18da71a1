// libFuzzer target: the tensor files of a checkpoint (model.safetensors and
// optim.safetensors, read by runtime/io/Checkpoint.cpp through the
// safetensors reader). meta.json records each file's size and XXH3, so a
// mutated file would stop at the checksum; the harness records the mutated
// file's own size and checksum and reseals meta.json, so the fuzzer reaches
// what lies behind: the header, the tensor table against the parameter
// table, shapes, dtypes, offsets. The input's first byte picks the file
// (even: model, odd: optim); the rest is the file.
#include "tests/fuzz/checkpoint_fuzz_base.h"

#include <fstream>
#include <iterator>
#include <map>
#include <string>

using namespace checkpoint_fuzz;

namespace {
std::string folder;
nlohmann::json baseMeta;
std::map<std::string, std::string> baseFiles; // model / optim .safetensors
} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  folder = saveBaseCheckpoint("checkpoint_tensors_fuzz");
  std::ifstream in(folder + "/meta.json");
  baseMeta = nlohmann::json::parse(in);
  // MHCC_FUZZ_WRITE_SEEDS=DIR writes the two corpus seeds there.
  for (const char *name : {"model.safetensors", "optim.safetensors"}) {
    std::ifstream file(folder + "/" + name, std::ios::binary);
    baseFiles[name].assign(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
  }
  // MHCC_FUZZ_WRITE_SEEDS=DIR writes the two corpus seeds there.
  if (const char *dir = std::getenv("MHCC_FUZZ_WRITE_SEEDS")) {
    put(std::string(dir) + "/model", std::string(1, '\0') + baseFiles["model.safetensors"]);
    put(std::string(dir) + "/optim", std::string(1, '\1') + baseFiles["optim.safetensors"]);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  const std::string name = (data[0] & 1) ? "optim.safetensors" : "model.safetensors";
  const std::string bytes(reinterpret_cast<const char *>(data) + 1, size - 1);
  nlohmann::json meta = baseMeta;
  meta["files"][name] = {{"xxh3", hex64(XXH3_64bits(bytes.data(), bytes.size()))}, {"bytes", bytes.size()}};
  put(folder + "/" + name, bytes);
  put(folder + "/meta.json", reseal(meta));
  loadAndCheck(folder);
  put(folder + "/" + name, baseFiles[name]); // the next input starts from the base
  return 0;
}
