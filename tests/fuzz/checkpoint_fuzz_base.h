// What the two checkpoint harnesses share: one real checkpoint of a
// two-parameter artifact, saved under $TMPDIR at start-up (tools/fuzz.sh
// points TMPDIR into its output folder and removes it), file writing, and
// resealing meta.json the way Checkpoint.cpp's sealMeta does (the XXH3 of the
// compact dump without "meta_xxh3"; the file is the one-space-indented dump).
#ifndef MHCC_TESTS_FUZZ_CHECKPOINT_FUZZ_BASE_H
#define MHCC_TESTS_FUZZ_CHECKPOINT_FUZZ_BASE_H

#include "runtime/io/Checkpoint.h"

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace checkpoint_fuzz {

inline const mhcc::runtime::Artifact &artifact() {
  static mhcc::runtime::Artifact a = [] {
    mhcc::runtime::Artifact a;
    a.model.name = "fuzz";
    a.modelHash = "0123456789abcdef";
    a.params = {{"w", 2, 3, "normal", 0.02, true}, {"b", 1, 3, "zeros", 0, false}};
    return a;
  }();
  return a;
}

inline void put(const std::string &path, const std::string &bytes) {
  FILE *f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0)
    std::abort(); // the harness, not the loader, failed
}

inline std::string hex64(uint64_t v) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)v);
  return hex;
}

inline std::string reseal(nlohmann::json meta) {
  meta.erase("meta_xxh3");
  const std::string body = meta.dump();
  meta["meta_xxh3"] = hex64(XXH3_64bits(body.data(), body.size()));
  return meta.dump(1) + "\n";
}

/// Saves the base checkpoint (iteration 7) and returns its folder.
inline std::string saveBaseCheckpoint(const char *harness) {
  const char *tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/mhcc_" + harness + ".XXXXXX";
  if (!mkdtemp(tmpl.data()))
    std::abort();
  mhcc::runtime::ParameterState state;
  for (const mhcc::runtime::ParamInfo &p : artifact().params) {
    state.weights.emplace_back(p.count(), 0.5f);
    state.adamM.emplace_back(p.count(), 0.25f);
    state.adamV.emplace_back(p.count(), 0.125f);
  }
  std::string error;
  if (!mhcc::runtime::saveCheckpoint(tmpl, 7, artifact(), mhcc::runtime::TrainOptions{}, state,
                                     mhcc::runtime::CheckpointShard{}, error)) {
    std::fprintf(stderr, "%s: cannot save the base checkpoint: %s\n", harness, error.c_str());
    std::abort();
  }
  return mhcc::runtime::checkpointFolder(tmpl, 7);
}

/// Loads the folder; a load must fill every parameter's three vectors, and a
/// refusal must say why.
inline void loadAndCheck(const std::string &folder) {
  mhcc::runtime::ParameterState state;
  int64_t iteration = -1;
  std::string error;
  if (mhcc::runtime::loadCheckpoint(folder, artifact(), state, iteration, error)) {
    for (size_t p = 0; p < artifact().params.size(); ++p)
      if (state.weights[p].size() != size_t(artifact().params[p].count()) ||
          state.adamM[p].size() != state.weights[p].size() || state.adamV[p].size() != state.weights[p].size())
        __builtin_trap();
  } else if (error.empty()) {
    __builtin_trap();
  }
}

} // namespace checkpoint_fuzz

#endif // MHCC_TESTS_FUZZ_CHECKPOINT_FUZZ_BASE_H
