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
  /// indexed dataset prefix; "W1 PATH1 W2 PATH2 ..." (Megatron's
  /// --data-path blend) several of them mixed by weight (blend()).
  static std::optional<TokenDataset> open(const std::string &path, std::string &error);
  /// Datasets mixed by weight: each sequence of a microbatch picks its
  /// dataset by a counter hash of its (seed, step, microbatch, sequence),
  /// with probability weight / sum of weights, then its window there as that
  /// dataset alone would. (Megatron assigns samples greedily to track the
  /// weights exactly; the expected shares are the same, and a hash needs no
  /// state, so any step of any replica samples alone.)
  static TokenDataset blend(std::vector<std::pair<double, TokenDataset>> parts, std::string source);

  /// Splits the stream as Megatron's --split does, by weight: the first
  /// train / (train + valid) of the tokens for training, the rest for
  /// validation, the cut moved to the next document start of an indexed
  /// dataset (to the last one past its last start; a one-document dataset is
  /// cut inside it). Without a split (the default) every window trains.
  void setSplit(int64_t train, int64_t valid);
  bool hasValidation() const; // a blend: every dataset has a validation part

  /// Checks the data fits a model: every id below `vocab`, enough tokens for
  /// one window of `seqLen + 1` (in each part of a split).
  std::string check(int64_t vocab, int64_t seqLen) const;

  /// Where sample() writes a microbatch, microBatch x seqLen entries each.
  /// positions and firstKeys (optional) describe the documents packed into
  /// each window, as StepInputs defines them: a token's offset in its
  /// document and its document's start in the window (a document cut by the
  /// window's start begins at 0, as Megatron resets positions).
  struct SampleBuffers {
    int32_t *tokens = nullptr, *labels = nullptr;
    int32_t *positions = nullptr, *firstKeys = nullptr;
  };
  /// Fills `microBatch` sequences of `seqLen` tokens and their next-token
  /// labels for (step, microbatch), from the training part, or from the
  /// validation part with `validation` (the same draws under another key).
  void sample(uint64_t seed, int64_t step, int64_t microbatch, int64_t seqLen, int64_t microBatch,
              const SampleBuffers &out, bool validation = false) const;
  void sample(uint64_t seed, int64_t step, int64_t microbatch, int64_t seqLen, int64_t microBatch,
              int32_t *tokens, int32_t *labels, bool validation = false) const {
    sample(seed, step, microbatch, seqLen, microBatch, SampleBuffers{tokens, labels}, validation);
  }
  /// Whether the stream knows its document boundaries (an indexed dataset,
  /// or a blend of them); a text file is one document.
  bool hasDocuments() const;

  size_t size() const { return count_; } // a blend: its datasets' tokens together
  const std::string &source() const { return source_; }
  /// Token `i` of the stream (of a blend: of its datasets one after another).
  int32_t token(size_t i) const;
  /// Whether the ids are read from a mapping of the .bin (not copied in).
  bool mapped() const { return mapping_ != nullptr; }

private:
  struct Mapping; // an mmap of a .bin, unmapped with the last dataset sharing it

  /// One sequence (seqLen tokens, their labels and documents) from the
  /// window `key` picks; `out` points at the sequence's first entries.
  void sampleWindow(uint64_t key, int64_t seqLen, const SampleBuffers &out, bool validation) const;

  std::vector<TokenDataset> parts_;              // a blend's datasets (then nothing else is set)
  std::vector<double> cumulative_;               // their weights' running sums, normalized to 1
  std::vector<int32_t> tokens_;                  // owned ids, or empty when mapped
  std::vector<uint64_t> documentStarts_;         // an indexed dataset's sequence starts in the stream
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
