//===- Dataset.h - token streams and deterministic sampling ---------*- C++ -*-===//
//
// Training data as one stream of token ids: byte-level text (every byte a
// token, vocabulary 256) or a Megatron indexed dataset (.bin/.idx, the
// MMIDIDX format Megatron-LM's preprocess_data.py writes), documents
// concatenated. A .bin whose sequences tile it in index order (what Megatron
// and mhc-prep write) is read through mmap, its ids in their stored dtype,
// so a corpus larger than memory trains; other layouts are copied in. Microbatches are windows at offsets drawn from a counter-
// based hash of (seed, step, microbatch, sequence): the same seed gives the
// same data on every rank and every pipeline layout.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_DATA_DATASET_H
#define MHCC_RUNTIME_DATA_DATASET_H

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mhcc::runtime {

class TokenDataset {
public:
  explicit TokenDataset(std::vector<int32_t> tokens, std::string source = "memory")
      : tokens_(std::move(tokens)), count_(tokens_.size()), source_(std::move(source)) {}

  /// A text file, one token per byte.
  static std::optional<TokenDataset> fromText(const std::string &path, std::string &error);
  /// A Megatron indexed dataset: `prefix.bin` and `prefix.idx`.
  static std::optional<TokenDataset> fromIndexed(const std::string &prefix, std::string &error);
  /// `.txt` (or any other file) as bytes; a path whose `.idx` exists as an
  /// indexed dataset prefix.
  static std::optional<TokenDataset> open(const std::string &path, std::string &error);

  /// Splits the stream as Megatron's --split does, by weight: the first
  /// train / (train + valid) of the tokens for training, the rest for
  /// validation. Without a split (the default) every window trains.
  void setSplit(int64_t train, int64_t valid);
  bool hasValidation() const { return validStart_ < count_; }

  /// Checks the data fits a model: every id below `vocab`, enough tokens for
  /// one window of `seqLen + 1` (in each part of a split).
  std::string check(int64_t vocab, int64_t seqLen) const;

  /// Fills `microBatch` sequences of `seqLen` tokens and their next-token
  /// labels for (step, microbatch), from the training part, or from the
  /// validation part with `validation` (the same draws under another key).
  void sample(uint64_t seed, int64_t step, int64_t microbatch, int64_t seqLen, int64_t microBatch,
              int32_t *tokens, int32_t *labels, bool validation = false) const;

  size_t size() const { return count_; }
  const std::string &source() const { return source_; }
  /// Token `i` of the stream.
  int32_t token(size_t i) const;
  /// Whether the ids are read from a mapping of the .bin (not copied in).
  bool mapped() const { return mapping_ != nullptr; }

private:
  struct Mapping; // an mmap of a .bin, unmapped with the last dataset sharing it

  std::vector<int32_t> tokens_;                  // owned ids, or empty when mapped
  std::shared_ptr<const Mapping> mapping_;
  const char *mappedIds_ = nullptr;             // the stream's first id in the mapping
  int dtypeCode_ = 0;                            // Megatron's code of the mapped ids
  size_t count_ = 0;
  std::string source_;
  size_t trainEnd_ = SIZE_MAX, validStart_ = SIZE_MAX; // the split; SIZE_MAX: none
};

/// Writes a Megatron indexed dataset (dtype: 1 uint8, 4 int32, 8 uint16) of
/// the given documents; for tests and for converting text.
bool writeIndexedDataset(const std::string &prefix, const std::vector<std::vector<int32_t>> &documents,
                         int dtypeCode, std::string &error);

/// splitmix64: the counter-based hash behind sampling and initialization.
uint64_t mix64(uint64_t x);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_DATA_DATASET_H
