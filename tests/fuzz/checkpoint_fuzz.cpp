// libFuzzer target: the checkpoint loader (runtime/io/Checkpoint.cpp), whose
// meta.json names the files, checksums and iteration of a checkpoint folder
// another run (or another user) wrote. The harness saves one real checkpoint
// of a two-parameter artifact at start-up; each input then replaces its
// meta.json, resealed (meta.json carries the XXH3 of its own members, which
// a mutation would almost never match), so the fuzzer reaches the checks
// behind the seal: format, model hash, parameter table, the files' list.
// checkpoint_tensors_fuzz.cpp does the same for the tensor files.
#include "tests/fuzz/checkpoint_fuzz_base.h"

#include <string>

using namespace checkpoint_fuzz;

namespace {
std::string folder;
} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  folder = saveBaseCheckpoint("checkpoint_fuzz");
  // MHCC_FUZZ_PRINT_META=1 prints the saved meta.json: the corpus seed.
  if (std::getenv("MHCC_FUZZ_PRINT_META"))
    std::system(("cat " + folder + "/meta.json").c_str());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string text(reinterpret_cast<const char *>(data), size);
  nlohmann::json meta = nlohmann::json::parse(text, nullptr, false);
  // Inputs that are not JSON objects go in as they are (the seal check
  // refuses them; only an object can carry a seal).
  put(folder + "/meta.json", meta.is_object() ? reseal(meta) : text);
  loadAndCheck(folder);
  return 0;
}
