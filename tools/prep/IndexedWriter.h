//===- IndexedWriter.h - a Megatron indexed dataset, streamed and renamed into place -*- C++ -*-===//
//
// Writes PREFIX.bin and PREFIX.idx in the MMIDIDX format Megatron-LM's
// preprocess_data.py writes and runtime/data/Dataset.cpp reads: the .idx is
// the magic "MMIDIDX\0\0", version 1 (uint64), the token dtype code (uint8),
// the sequence count and the document count (uint64), then every sequence's
// length (int32), every sequence's byte offset in the .bin (int64) and the
// document indices (int64: 0, then the sequence count after each document).
// One document is one sequence here (Megatron without --split-sentences).
//
// Tokens go to a temporary file beside PREFIX.bin as they come; commit()
// writes the .idx beside it, syncs both and renames them into place (.bin
// first, .idx last: a reader looks for the .idx). Until then the old files at
// PREFIX, if any, are untouched; abort() or the destructor removes the
// temporaries.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_TOOLS_PREP_INDEXEDWRITER_H
#define MHCC_TOOLS_PREP_INDEXEDWRITER_H

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace mhcc::prep {

/// A token dtype of Megatron's table that holds token ids.
struct Dtype {
  int code;         // Megatron's code: 1 uint8, 8 uint16, 4 int32
  const char *name; // "uint8", "uint16", "int32"
  int width;        // bytes per token
  int64_t max;      // the largest id it holds
};

/// uint8, uint16 or int32; nullopt for any other name.
std::optional<Dtype> dtypeNamed(const std::string &name);

/// The smallest dtype for ids below `vocab`: uint8 up to 256 ids, uint16
/// below 65500 (Megatron's DType.optimal_dtype cut-off), int32 above.
Dtype dtypeForVocab(int64_t vocab);

class IndexedWriter {
public:
  IndexedWriter() = default;
  IndexedWriter(const IndexedWriter &) = delete;
  IndexedWriter &operator=(const IndexedWriter &) = delete;
  ~IndexedWriter() { abort(); }

  /// Creates the temporary .bin beside `prefix`.bin.
  bool open(const std::string &prefix, Dtype dtype, std::string &error);

  /// Appends one document. False, writing nothing, when a token is negative
  /// or above the dtype's largest id (`error` names the id and the dtype) or
  /// the document has more tokens than an int32 length holds.
  bool addDocument(const int32_t *tokens, size_t count, std::string &error);

  /// Writes the .idx, syncs, renames both files into place.
  bool commit(std::string &error);

  /// Removes the temporaries (nothing once committed).
  void abort();

  /// The temporaries' paths while open ("" otherwise), for a signal handler.
  const std::string &tempBin() const { return tmpBin_; }
  const std::string &tempIdx() const { return tmpIdx_; }

  int64_t documents() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t tokens() const { return tokens_; }

private:
  std::string prefix_, tmpBin_, tmpIdx_;
  Dtype dtype_{};
  std::FILE *bin_ = nullptr;
  std::vector<char> buffer_;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> pointers_;
  int64_t tokens_ = 0;
  int64_t offset_ = 0; // bytes in the .bin so far
};

} // namespace mhcc::prep

#endif // MHCC_TOOLS_PREP_INDEXEDWRITER_H
