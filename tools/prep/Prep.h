//===- Prep.h - mhc-prep: text or JSONL to a Megatron indexed dataset -*- C++ -*-===//
//
// mhc-prep (issue 16) does what Megatron-LM's preprocess_data.py does without
// sentence splitting: every document of the inputs tokenized, one sequence
// per document, written as PREFIX.bin + PREFIX.idx (IndexedWriter.h) for
// `mhcrun --data PREFIX`.
//
// Documents: in a text file each line (without its "\n" or "\r\n") is one
// document; in a JSONL file each line is a JSON object whose string under
// --json-key (default "text") is one document, and blank lines are skipped.
// A document with no tokens (an empty line, an empty string) is skipped and
// counted. Tokenizers: `bytes` (each UTF-8 byte one token, vocabulary 256,
// no end-of-document id: --append-eod is refused) and `sentencepiece` (a
// .model file; --append-eod appends its eos id). Any bad input is one line
// naming the file and line, and nothing is written.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_TOOLS_PREP_PREP_H
#define MHCC_TOOLS_PREP_PREP_H

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mhcc::prep {

class Tokenizer {
public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;
  /// Ids are below this.
  virtual int64_t vocab() const = 0;
  /// The end-of-document id, or -1 where the tokenizer has none.
  virtual int64_t eod() const = 0;
  /// Appends the ids of `text` to `ids`; false with `error` set on failure.
  virtual bool encode(std::string_view text, std::vector<int32_t> &ids, std::string &error) const = 0;
};

/// Every byte one token (vocabulary 256).
std::unique_ptr<Tokenizer> makeByteTokenizer();
/// A SentencePiece model file; nullptr with `error` naming the file.
std::unique_ptr<Tokenizer> makeSentencePieceTokenizer(const std::string &model, std::string &error);

struct PrepOptions {
  std::vector<std::string> inputs;
  std::string outputPrefix;
  std::string format = "auto"; // auto (by extension), text or jsonl
  std::string jsonKey = "text";
  std::string tokenizer = "bytes";
  std::string tokenizerModel;
  std::string dtype = "auto"; // auto, uint8, uint16 or int32
  bool appendEod = false;
};

struct PrepSummary {
  int64_t documents = 0, tokens = 0, skipped = 0;
  std::string dtype, tokenizer;
  int64_t vocab = 0;
  double seconds = 0;
};

/// The whole conversion; false with a one-line `error` and no file written.
bool prepare(const PrepOptions &options, PrepSummary &summary, std::string &error);

/// mhc-prep's command line: 0, or 1 after one line on stderr.
int runPrep(int argc, char **argv);

} // namespace mhcc::prep

#endif // MHCC_TOOLS_PREP_PREP_H
