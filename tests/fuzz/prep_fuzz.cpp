// libFuzzer target: mhc-prep's document reader and writer (tools/prep),
// which reads text and JSONL that users collect from anywhere. The input's
// first byte picks the format (even: JSONL, odd: text) and whether an
// end-of-document id is asked for (bit 1; the byte tokenizer must refuse
// it); the rest is the input file. Byte tokens, so every id is in range.
// A conversion either writes a dataset the runtime reads back with exactly
// the tokens it reported, or refuses with a line and leaves no file.
#include "runtime/data/Dataset.h"
#include "tools/prep/Prep.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <sys/stat.h>
#include <unistd.h>

namespace {
std::string folder;

bool exists(const std::string &path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}
} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  // tmpfs where there is one: every conversion syncs its files, which on a
  // disk would make a million inputs take hours.
  const char *tmp = std::getenv("TMPDIR");
  std::string base = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (tmp && *tmp ? tmp : "/tmp");
  std::string tmpl = base + "/mhcc_prep_fuzz.XXXXXX";
  if (!mkdtemp(tmpl.data()))
    std::abort();
  folder = tmpl;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  mhcc::prep::PrepOptions options;
  options.format = (data[0] & 1) ? "text" : "jsonl";
  options.appendEod = (data[0] & 2) != 0;
  const std::string input = folder + "/in", prefix = folder + "/out";
  FILE *f = std::fopen(input.c_str(), "wb");
  if (!f || std::fwrite(data + 1, 1, size - 1, f) != size - 1 || std::fclose(f) != 0)
    std::abort(); // the harness, not the tool
  options.inputs = {input};
  options.outputPrefix = prefix;
  mhcc::prep::PrepSummary summary;
  std::string error;
  if (mhcc::prep::prepare(options, summary, error)) {
    if (options.appendEod) // the byte tokenizer has no end-of-document id
      __builtin_trap();
    std::optional<mhcc::runtime::TokenDataset> read = mhcc::runtime::TokenDataset::fromIndexed(prefix, error);
    if (!read || int64_t(read->size()) != summary.tokens)
      __builtin_trap(); // written, but not what it reported, or unreadable
  } else if (error.empty() || exists(prefix + ".bin") || exists(prefix + ".idx")) {
    __builtin_trap(); // a refusal says why and leaves nothing
  }
  std::remove((prefix + ".bin").c_str());
  std::remove((prefix + ".idx").c_str());
  return 0;
}
