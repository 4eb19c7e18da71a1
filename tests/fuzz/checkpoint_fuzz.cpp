// libFuzzer target: the checkpoint loader (runtime/io/Checkpoint.cpp), whose
// meta.json names the files, checksums and iteration of a checkpoint folder
// another run (or another user) wrote. The harness saves one real checkpoint
// of a two-parameter artifact at start-up; each input then replaces its
// meta.json, resealed (meta.json carries the XXH3 of its own members, which
// a mutation would almost never match), so the fuzzer reaches the checks
// behind the seal: format, model hash, parameter table, the files' list.
#include "runtime/io/Checkpoint.h"

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <cstdio>
#include <cstdlib>
#include <string>

using namespace mhcc::runtime;

namespace {
Artifact &artifact() {
  static Artifact a = [] {
    Artifact a;
    a.model.name = "fuzz";
    a.modelHash = "0123456789abcdef";
    a.params = {{"w", 2, 3, "normal", 0.02, true}, {"b", 1, 3, "zeros", 0, false}};
    return a;
  }();
  return a;
}

std::string folder;

void put(const std::string &path, const std::string &bytes) {
  FILE *f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0)
    std::abort(); // the harness, not the loader, failed
}

// What Checkpoint.cpp's sealMeta does: the XXH3 of the compact dump without
// "meta_xxh3", and the file is the one-space-indented dump.
std::string reseal(nlohmann::json meta) {
  meta.erase("meta_xxh3");
  const std::string body = meta.dump();
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH3_64bits(body.data(), body.size()));
  meta["meta_xxh3"] = hex;
  return meta.dump(1) + "\n";
}
} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    // Under $TMPDIR: tools/fuzz.sh points it into out/fuzz and removes it.
  const char *tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/mhcc_checkpoint_fuzz.XXXXXX";
  if (!mkdtemp(tmpl.data()))
    std::abort();
  ParameterState state;
  for (const ParamInfo &p : artifact().params) {
    state.weights.emplace_back(p.count(), 0.5f);
    state.adamM.emplace_back(p.count(), 0.25f);
    state.adamV.emplace_back(p.count(), 0.125f);
  }
  std::string error;
  if (!saveCheckpoint(tmpl, 7, artifact(), TrainOptions{}, state, CheckpointShard{}, error)) {
    std::fprintf(stderr, "checkpoint_fuzz: cannot save the base checkpoint: %s\n", error.c_str());
    std::abort();
  }
  folder = checkpointFolder(tmpl, 7);
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
  ParameterState state;
  int64_t iteration = -1;
  std::string error;
  if (loadCheckpoint(folder, artifact(), state, iteration, error)) {
    // A loaded checkpoint fills every parameter's three vectors.
    for (size_t p = 0; p < artifact().params.size(); ++p)
      if (state.weights[p].size() != size_t(artifact().params[p].count()) ||
          state.adamV[p].size() != state.weights[p].size())
        __builtin_trap();
  } else if (error.empty()) {
    __builtin_trap(); // a refusal always says why
  }
  return 0;
}
