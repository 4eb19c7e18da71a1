//===- Dataset.cpp - token streams and deterministic sampling ---------------===//
#include "runtime/data/Dataset.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace mhcc::runtime {
namespace {

constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};

bool readFile(const std::string &path, std::string &bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return false;
  std::ostringstream s;
  s << in.rdbuf();
  bytes = s.str();
  return true;
}

size_t dtypeSize(int code) {
  switch (code) {
  case 1: case 2: return 1;      // uint8, int8
  case 3: case 8: return 2;      // int16, uint16
  case 4: case 7: return 4;      // int32, float32
  case 5: case 6: return 8;      // int64, float64
  default: return 0;
  }
}

int64_t readToken(const char *p, int code) {
  switch (code) {
  case 1: return *reinterpret_cast<const uint8_t *>(p);
  case 2: return *reinterpret_cast<const int8_t *>(p);
  case 3: { int16_t v; std::memcpy(&v, p, 2); return v; }
  case 8: { uint16_t v; std::memcpy(&v, p, 2); return v; }
  case 4: { int32_t v; std::memcpy(&v, p, 4); return v; }
  case 5: { int64_t v; std::memcpy(&v, p, 8); return v; }
  default: return -1; // float token types are not token ids
  }
}

} // namespace

struct TokenDataset::Mapping {
  void *base = MAP_FAILED;
  size_t bytes = 0;
  ~Mapping() {
    if (base != MAP_FAILED)
      munmap(base, bytes);
  }
};

int32_t TokenDataset::token(size_t i) const {
  for (const TokenDataset &part : parts_) {
    if (i < part.size())
      return part.token(i);
    i -= part.size();
  }
  if (!mappedIds_)
    return tokens_[i];
  return static_cast<int32_t>(readToken(mappedIds_ + i * dtypeSize(dtypeCode_), dtypeCode_));
}

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::optional<TokenDataset> TokenDataset::fromText(const std::string &path, std::string &error) {
  std::string bytes;
  if (!readFile(path, bytes)) {
    error = path + ": cannot open the data file";
    return std::nullopt;
  }
  std::vector<int32_t> tokens(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i)
    tokens[i] = static_cast<unsigned char>(bytes[i]);
  return TokenDataset(std::move(tokens), path);
}

std::optional<TokenDataset> TokenDataset::fromIndexed(const std::string &prefix, std::string &error) {
  std::string idx;
  auto mapping = std::make_shared<Mapping>();
  const int fd = ::open((prefix + ".bin").c_str(), O_RDONLY | O_CLOEXEC);
  struct stat binStat {};
  if (!readFile(prefix + ".idx", idx) || fd < 0 || fstat(fd, &binStat) != 0) {
    if (fd >= 0)
      ::close(fd);
    error = prefix + ".idx/.bin: cannot open the indexed dataset";
    return std::nullopt;
  }
  mapping->bytes = size_t(binStat.st_size);
  if (mapping->bytes > 0)
    mapping->base = mmap(nullptr, mapping->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapping->bytes > 0 && mapping->base == MAP_FAILED) {
    error = prefix + ".bin: cannot map it into memory (" + std::strerror(errno) + ")";
    return std::nullopt;
  }
  const char *bin = mapping->bytes > 0 ? static_cast<const char *>(mapping->base) : "";
  const size_t binBytes = mapping->bytes;
  const size_t header = 9 + 8 + 1 + 8 + 8;
  if (idx.size() < header || std::memcmp(idx.data(), kIndexMagic, 9) != 0) {
    error = prefix + ".idx: not a Megatron indexed dataset (bad magic; expected MMIDIDX)";
    return std::nullopt;
  }
  uint64_t version, count, docs;
  std::memcpy(&version, idx.data() + 9, 8);
  int code = static_cast<unsigned char>(idx[17]);
  std::memcpy(&count, idx.data() + 18, 8);
  std::memcpy(&docs, idx.data() + 26, 8);
  size_t width = dtypeSize(code);
  if (version != 1 || width == 0 || code == 6 || code == 7) {
    error = prefix + ".idx: unsupported version " + std::to_string(version) + " or token dtype " +
            std::to_string(code);
    return std::nullopt;
  }
  // Both counts bounded by the file first, so the size sum cannot wrap.
  if (count > idx.size() || docs > idx.size() || idx.size() < header + count * 4 + count * 8 + docs * 8) {
    error = prefix + ".idx: truncated (the header lists " + std::to_string(count) + " sequences)";
    return std::nullopt;
  }
  const char *sizes = idx.data() + header;
  const char *pointers = sizes + count * 4;
  auto sequence = [&](uint64_t s) { // its token count and byte offset in the .bin
    int32_t length;
    int64_t offset;
    std::memcpy(&length, sizes + s * 4, 4);
    std::memcpy(&offset, pointers + s * 8, 8);
    return std::pair<int32_t, int64_t>(length, offset);
  };
  std::vector<uint64_t> starts; // each sequence's first token in the stream
  uint64_t total = 0;       // tokens listed so far
  bool contiguous = true;   // each sequence starts where the one before ended
  int64_t first = 0;        // the first sequence's byte offset
  for (uint64_t s = 0; s < count; ++s) {
    const auto [length, offset] = sequence(s);
    if (length < 0 || offset < 0 || static_cast<uint64_t>(offset) + uint64_t(length) * width > binBytes) {
      error = prefix + ".bin: sequence " + std::to_string(s) + " lies outside the file";
      return std::nullopt;
    }
    if (s == 0)
      first = offset;
    contiguous = contiguous && uint64_t(offset) == uint64_t(first) + total * width;
    if (length > 0)
      starts.push_back(total);
    // Megatron's sequences tile the .bin; overlapping ones could list the
    // whole file once per index entry (found by tests/fuzz/dataset_fuzz.cpp:
    // memory without bound), so no more tokens than the .bin holds.
    total += uint64_t(length);
    if (total * width > binBytes) {
      error = prefix + ".idx: its sequences list more tokens than " + prefix + ".bin holds (" +
              std::to_string(binBytes / width) + "); the .idx and .bin do not belong together";
      return std::nullopt;
    }
  }
  // Signed and 32-bit dtypes can hold ids no vocabulary has (negative, or
  // past int32): one pass over the listed ids refuses them; uint8 and uint16 cannot.
  const bool canBeInvalid = code == 2 || code == 3 || code == 4 || code == 5;
  std::vector<int32_t> tokens;
  for (uint64_t s = 0; s < count && (canBeInvalid || !contiguous); ++s) {
    const auto [length, offset] = sequence(s);
    for (int32_t k = 0; k < length; ++k) {
      int64_t token = readToken(bin + offset + k * width, code);
      if (token < 0 || token > INT32_MAX) {
        error = prefix + ".bin: sequence " + std::to_string(s) + " holds the invalid token " +
                std::to_string(token);
        return std::nullopt;
      }
      if (!contiguous)
        tokens.push_back(static_cast<int32_t>(token));
    }
  }
  if (!contiguous) {
    TokenDataset copied(std::move(tokens), prefix); // copied in, in index order
    copied.documentStarts_ = std::move(starts);
    return copied;
  }
  TokenDataset data({}, prefix);
  data.documentStarts_ = std::move(starts);
  data.mapping_ = std::move(mapping);
  data.mappedIds_ = bin + first;
  data.dtypeCode_ = code;
  data.count_ = size_t(total);
  return data;
}

TokenDataset TokenDataset::blend(std::vector<std::pair<double, TokenDataset>> parts, std::string source) {
  TokenDataset data({}, std::move(source));
  double total = 0, running = 0;
  for (const auto &[weight, part] : parts)
    total += weight;
  for (auto &[weight, part] : parts) {
    running += weight / total;
    data.cumulative_.push_back(running);
    data.count_ += part.size();
    data.parts_.push_back(std::move(part));
  }
  data.cumulative_.back() = 1.0; // no sequence falls past the last dataset by rounding
  return data;
}

std::optional<TokenDataset> TokenDataset::open(const std::string &path, std::string &error) {
  // "W1 PATH1 W2 PATH2 ...": a blend (a plain path has no number first).
  std::istringstream words(path);
  std::vector<std::string> items{std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
  char *end = nullptr;
  if (items.size() > 1 && (std::strtod(items[0].c_str(), &end), end && *end == '\0')) {
    if (items.size() % 2 != 0) {
      error = "--data '" + path + "': a blend lists WEIGHT PATH pairs (e.g. '0.3 data/a 0.7 data/b'); " +
              "the last weight has no path";
      return std::nullopt;
    }
    std::vector<std::pair<double, TokenDataset>> parts;
    for (size_t k = 0; k < items.size(); k += 2) {
      const double weight = std::strtod(items[k].c_str(), &end);
      if (!end || *end != '\0' || !(weight > 0) || !std::isfinite(weight)) {
        error = "--data '" + path + "': weight '" + items[k] + "' of " + items[k + 1] +
                " is not a positive number";
        return std::nullopt;
      }
      std::optional<TokenDataset> part = open(items[k + 1], error);
      if (!part)
        return std::nullopt;
      parts.emplace_back(weight, std::move(*part));
    }
    return blend(std::move(parts), path);
  }
  std::ifstream idx(path + ".idx");
  if (idx.good())
    return fromIndexed(path, error);
  return fromText(path, error);
}

bool TokenDataset::hasValidation() const {
  if (!parts_.empty())
    return std::all_of(parts_.begin(), parts_.end(), [](const TokenDataset &p) { return p.hasValidation(); });
  return validStart_ < count_;
}

void TokenDataset::setSplit(int64_t train, int64_t valid) {
  for (TokenDataset &part : parts_) // Megatron splits each dataset of a blend
    part.setSplit(train, valid);
  if (!parts_.empty())
    return;
  if (valid <= 0) {
    trainEnd_ = validStart_ = SIZE_MAX;
    return;
  }
  size_t cut = size_t(double(count_) * double(train) / double(train + valid));
  if (!documentStarts_.empty()) {
    auto next = std::lower_bound(documentStarts_.begin(), documentStarts_.end(), uint64_t(cut));
    if (next == documentStarts_.end())
      --next; // the last document validates
    if (*next > 0)
      cut = size_t(*next);
  }
  trainEnd_ = validStart_ = cut;
}

std::string TokenDataset::check(int64_t vocab, int64_t seqLen) const {
  for (const TokenDataset &part : parts_)
    if (std::string problem = part.check(vocab, seqLen); !problem.empty())
      return problem;
  if (!parts_.empty())
    return "";
  if (static_cast<int64_t>(count_) < seqLen + 2)
    return source_ + ": " + std::to_string(count_) + " tokens, fewer than one window of " +
           std::to_string(seqLen + 1) + "; use more data or a shorter seq_len";
  if (hasValidation()) {
    const int64_t trainTokens = int64_t(trainEnd_), validTokens = int64_t(count_ - validStart_);
    if (std::min(trainTokens, validTokens) < seqLen + 2)
      return source_ + ": the --split leaves " + std::to_string(trainTokens) + " training and " +
             std::to_string(validTokens) + " validation tokens, and each part needs one window of " +
             std::to_string(seqLen + 1) + "; give the smaller part more weight, or use more data";
  }
  for (size_t i = 0; i < count_; ++i)
    if (const int32_t id = token(i); id >= vocab)
      return source_ + ": token " + std::to_string(id) + " at position " + std::to_string(i) +
             " does not fit the model's vocabulary of " + std::to_string(vocab);
  return "";
}

void TokenDataset::sample(uint64_t seed, int64_t step, int64_t microbatch, int64_t seqLen,
                          int64_t microBatch, const SampleBuffers &out, bool validation) const {
  const uint64_t salt = validation ? 0x76616c6964ull : 0; // "valid": other draws than training's
  auto at = [&](int32_t *p, int64_t b) { return p ? p + b * seqLen : nullptr; };
  for (int64_t b = 0; b < microBatch; ++b) {
    const uint64_t key =
        mix64((seed ^ salt) ^ mix64((uint64_t(step) << 40) ^ (uint64_t(microbatch) << 20) ^ uint64_t(b)));
    sampleWindow(key, seqLen,
                 SampleBuffers{at(out.tokens, b), at(out.labels, b), at(out.positions, b), at(out.firstKeys, b)},
                 validation);
  }
}

bool TokenDataset::hasDocuments() const {
  if (!parts_.empty())
    return std::all_of(parts_.begin(), parts_.end(), [](const TokenDataset &p) { return p.hasDocuments(); });
  return !documentStarts_.empty();
}

void TokenDataset::sampleWindow(uint64_t key, int64_t seqLen, const SampleBuffers &out, bool validation) const {
  if (!parts_.empty()) {
    // The dataset: a uniform draw in [0, 1) against the cumulative weights,
    // from a hash of the key (the window then comes from the key itself).
    const double u = double(mix64(key ^ 0x626c656e64ull) >> 11) * 0x1.0p-53; // "blend"
    size_t d = 0;
    while (d + 1 < parts_.size() && u >= cumulative_[d])
      ++d;
    parts_[d].sampleWindow(key, seqLen, out, validation);
    return;
  }
  // A part's windows start at [begin, end - seqLen - 1]; no split: the whole stream.
  const size_t begin = validation ? validStart_ : 0, end = validation || !hasValidation() ? count_ : trainEnd_;
  const uint64_t windows = end - begin - seqLen - 1;
  const uint64_t offset = begin + key % (windows + 1);
  for (int64_t t = 0; t < seqLen; ++t) {
    out.tokens[t] = token(offset + t);
    out.labels[t] = token(offset + t + 1);
  }
  if (!out.positions && !out.firstKeys)
    return;
  // The documents starting inside the window (the first one: the window's start).
  auto next = std::upper_bound(documentStarts_.begin(), documentStarts_.end(), uint64_t(offset));
  int64_t start = 0;
  for (int64_t t = 0; t < seqLen; ++t) {
    if (next != documentStarts_.end() && *next == offset + uint64_t(t)) {
      start = t;
      ++next;
    }
    if (out.positions)
      out.positions[t] = int32_t(t - start);
    if (out.firstKeys)
      out.firstKeys[t] = int32_t(start);
  }
}

bool writeIndexedDataset(const std::string &prefix, const std::vector<std::vector<int32_t>> &documents,
                         int dtypeCode, std::string &error) {
  size_t width = dtypeSize(dtypeCode);
  if (width == 0 || dtypeCode == 6 || dtypeCode == 7) {
    error = "unsupported dtype code " + std::to_string(dtypeCode);
    return false;
  }
  std::string bin, idx(kIndexMagic, 9);
  auto put = [&](std::string &out, const void *p, size_t n) { out.append(static_cast<const char *>(p), n); };
  uint64_t version = 1, count = documents.size(), docs = documents.size() + 1;
  put(idx, &version, 8);
  idx.push_back(static_cast<char>(dtypeCode));
  put(idx, &count, 8);
  put(idx, &docs, 8);
  std::vector<int64_t> pointers;
  for (const auto &doc : documents) {
    int32_t length = static_cast<int32_t>(doc.size());
    put(idx, &length, 4);
  }
  for (const auto &doc : documents) {
    pointers.push_back(static_cast<int64_t>(bin.size()));
    for (int32_t token : doc) {
      int64_t wide = token;
      put(bin, &wide, width); // little-endian: the low bytes
    }
  }
  for (int64_t p : pointers)
    put(idx, &p, 8);
  for (uint64_t d = 0; d < docs; ++d) {
    int64_t index = static_cast<int64_t>(d);
    put(idx, &index, 8);
  }
  std::ofstream b(prefix + ".bin", std::ios::binary), i(prefix + ".idx", std::ios::binary);
  if (!b.write(bin.data(), bin.size()) || !i.write(idx.data(), idx.size())) {
    error = "cannot write " + prefix + ".bin/.idx";
    return false;
  }
  return true;
}

} // namespace mhcc::runtime
