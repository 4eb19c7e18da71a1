// prep_dataset_dump PREFIX: reads PREFIX.bin/.idx with the runtime's reader
// (TokenDataset::fromIndexed, what mhcrun --data uses) and prints the token
// count, then every token of the stream on one line; one line and exit 1 if
// the reader refuses it. For tests/tools/prep_test.sh.
#include "runtime/data/Dataset.h"

#include <cstdio>
#include <vector>

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: prep_dataset_dump PREFIX\n");
    return 2;
  }
  std::string error;
  auto data = mhcc::runtime::TokenDataset::fromIndexed(argv[1], error);
  if (!data) {
    std::fprintf(stderr, "prep_dataset_dump: %s\n", error.c_str());
    return 1;
  }
  const int64_t n = static_cast<int64_t>(data->size());
  std::printf("%lld\n", static_cast<long long>(n));
  if (n >= 2) {
    // One window as long as the stream starts at offset 0: the tokens are
    // the stream less its last token, the labels the stream less its first.
    std::vector<int32_t> tokens(n - 1), labels(n - 1);
    data->sample(0, 0, 0, n - 1, 1, tokens.data(), labels.data());
    for (int64_t i = 0; i < n; ++i)
      std::printf(i ? " %d" : "%d", i < n - 1 ? tokens[i] : labels[n - 2]);
  } else if (n == 1) {
    std::printf("?"); // one token cannot be sampled; the tests never write one
  }
  std::printf("\n");
  return 0;
}
