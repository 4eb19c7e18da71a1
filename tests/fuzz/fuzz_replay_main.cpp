// A main for the libFuzzer targets that builds with any compiler (Bazel's
// toolchain, the ASan configuration): it runs the target over every file
// given (seed corpora, found crashes) and over a fixed number of mutants of
// each, made by a deterministic mutator (bit flips, byte changes to ASCII
// punctuation and digits, insertions, deletions, truncations, duplicated
// spans). The suite's smoke run of the MLIR targets, whose libFuzzer builds
// (tools/fuzz.sh) need Bazel's generated headers.
//
//   TARGET_replay [--mutants N] FILE_OR_DIR...
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

namespace {

struct Rng { // xorshift64*: the same mutants on every machine
  uint64_t state;
  uint64_t next() {
    state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
    return state * 2685821657736338717ull;
  }
  size_t below(size_t n) { return n ? size_t(next() % n) : 0; }
};

std::string mutate(std::string input, Rng &rng) {
  static const char kBytes[] = "0123456789-+.eE{}[]():,\"'=|*<>%@#xX \n\t\\/";
  for (int edits = 1 + int(rng.below(4)); edits > 0; --edits) {
    size_t at = rng.below(input.size() + 1);
    switch (rng.below(6)) {
    case 0:
      if (at < input.size()) input[at] ^= char(1u << rng.below(8));
      break;
    case 1:
      if (at < input.size()) input[at] = kBytes[rng.below(sizeof(kBytes) - 1)];
      break;
    case 2:
      input.insert(at, 1, kBytes[rng.below(sizeof(kBytes) - 1)]);
      break;
    case 3:
      input.erase(at, std::min<size_t>(1 + rng.below(16), input.size() - std::min(at, input.size())));
      break;
    case 4:
      input.resize(at);
      break;
    default: { // duplicate a span (repeated keys, ops, flags)
      size_t from = rng.below(input.size() + 1), length = std::min<size_t>(rng.below(64), input.size() - from);
      input.insert(at, input.substr(from, length));
    }
    }
  }
  return input;
}

void collect(const std::filesystem::path &path, std::vector<std::filesystem::path> &files) {
  if (std::filesystem::is_directory(path)) {
    std::vector<std::filesystem::path> entries;
    for (const auto &entry : std::filesystem::directory_iterator(path))
      entries.push_back(entry.path());
    std::sort(entries.begin(), entries.end());
    for (const auto &entry : entries)
      collect(entry, files);
  } else {
    files.push_back(path);
  }
}

} // namespace

int main(int argc, char **argv) {
  if (LLVMFuzzerInitialize)
    LLVMFuzzerInitialize(&argc, &argv);
  long mutants = 100;
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--mutants") && i + 1 < argc)
      mutants = std::atol(argv[++i]);
    else
      collect(argv[i], files);
  }
  if (files.empty()) {
    std::fprintf(stderr, "%s: no inputs (give seed files or folders)\n", argv[0]);
    return 2;
  }
  long runs = 0;
  for (const auto &file : files) {
    std::ifstream in(file, std::ios::binary);
    std::string seed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t *>(seed.data()), seed.size()), ++runs;
    uint64_t name = 1469598103934665603ull; // FNV-1a of the file name seeds its mutants
    for (char c : file.filename().string())
      name = (name ^ uint8_t(c)) * 1099511628211ull;
    Rng rng{name | 1};
    for (long m = 0; m < mutants; ++m, ++runs) {
      std::string mutant = mutate(seed, rng);
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t *>(mutant.data()), mutant.size());
    }
  }
  std::printf("%s: %ld inputs from %zu seeds, no crash\n", argv[0], runs, files.size());
  return 0;
}
