//===- Prep.cpp - mhc-prep: text or JSONL to a Megatron indexed dataset ------===//
#include "tools/prep/Prep.h"

#include "runtime/artifact/Artifact.h"
#include "runtime/cli/FlagChecks.h"
#include "tools/prep/IndexedWriter.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <sentencepiece_processor.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

namespace mhcc::prep {
namespace {

class ByteTokenizer final : public Tokenizer {
public:
  std::string name() const override { return "bytes"; }
  int64_t vocab() const override { return 256; }
  int64_t eod() const override { return -1; }
  bool encode(std::string_view text, std::vector<int32_t> &ids, std::string &) const override {
    for (char c : text)
      ids.push_back(static_cast<unsigned char>(c));
    return true;
  }
};

class SentencePieceTokenizer final : public Tokenizer {
public:
  sentencepiece::SentencePieceProcessor sp;
  std::string name() const override { return "sentencepiece"; }
  int64_t vocab() const override { return sp.GetPieceSize(); }
  int64_t eod() const override { return sp.eos_id(); }
  bool encode(std::string_view text, std::vector<int32_t> &ids, std::string &error) const override {
    std::vector<int> pieces;
    const auto status = sp.Encode(absl::string_view(text.data(), text.size()), &pieces);
    if (!status.ok()) {
      error = std::string("sentencepiece cannot encode it: ") + status.message();
      return false;
    }
    ids.insert(ids.end(), pieces.begin(), pieces.end());
    return true;
  }
};

std::string systemError() { return std::strerror(errno); }

bool endsWith(const std::string &s, const std::string &tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string folderOf(const std::string &path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

/// "" when `path` is a readable regular file, else why not.
std::string checkReadable(const std::string &path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return path + ": cannot open (" + systemError() + ")";
  if (S_ISDIR(st.st_mode))
    return path + ": is a directory; name a file";
  if (::access(path.c_str(), R_OK) != 0)
    return path + ": cannot read (" + systemError() + ")";
  return "";
}

/// nlohmann's parse error without its "[json.exception...]" tag and its
/// line 1 (the file's line is named instead).
std::string jsonProblem(const nlohmann::json::parse_error &e) {
  std::string what = e.what();
  size_t column = what.find("column ");
  size_t detail = column == std::string::npos ? std::string::npos : what.find(": ", column);
  if (detail == std::string::npos)
    return std::string("not JSON: ") + what;
  return "not JSON (column " + std::to_string(e.byte) + ": " + what.substr(detail + 2) + ")";
}

std::string keyList(const nlohmann::json &object) {
  std::string keys;
  int shown = 0;
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (shown++ == 5) {
      keys += ", ...";
      break;
    }
    keys += (keys.empty() ? "\"" : ", \"") + it.key() + "\"";
  }
  return keys.empty() ? "an empty object" : "its keys: " + keys;
}

// The temporaries a signal must not leave behind (IndexedWriter's .bin; the
// .idx exists only inside commit, which runs with the signals blocked).
char gTempBin[4096];

void removeTempsAndDie(int signal) {
  if (gTempBin[0])
    ::unlink(gTempBin);
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

} // namespace

std::unique_ptr<Tokenizer> makeByteTokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> makeSentencePieceTokenizer(const std::string &model, std::string &error) {
  if (std::string problem = checkReadable(model); !problem.empty()) {
    error = "--tokenizer-model " + problem;
    return nullptr;
  }
  auto tokenizer = std::make_unique<SentencePieceTokenizer>();
  const auto status = tokenizer->sp.Load(model);
  if (!status.ok() || tokenizer->sp.GetPieceSize() <= 0) {
    // The library's message starts with its source position: "./src/x.cc(N) [check] detail".
    std::string detail = status.ok() ? "it holds no pieces" : status.message();
    if (size_t check = detail.find("] "); check != std::string::npos && detail.rfind("./src/", 0) == 0)
      detail = detail.substr(check + 2);
    if (detail.empty() || detail.rfind("./src/", 0) == 0)
      detail = "it does not parse as a model";
    error = "--tokenizer-model " + model + ": not a SentencePiece model (" + detail + ")";
    return nullptr;
  }
  return tokenizer;
}

namespace {

/// The tokenizer --tokenizer (and --tokenizer-model) name, checked against
/// --append-eod; null with `error` set.
std::unique_ptr<Tokenizer> tokenizerFor(const PrepOptions &o, std::string &error) {
  std::unique_ptr<Tokenizer> tokenizer;
  if (o.tokenizer == "bytes") {
    if (!o.tokenizerModel.empty()) {
      error = "--tokenizer-model is for --tokenizer sentencepiece; the bytes tokenizer has no model";
      return nullptr;
    }
    tokenizer = makeByteTokenizer();
  } else if (o.tokenizer == "sentencepiece") {
    if (o.tokenizerModel.empty()) {
      error = "--tokenizer sentencepiece needs --tokenizer-model MODEL.model";
      return nullptr;
    }
    if (!(tokenizer = makeSentencePieceTokenizer(o.tokenizerModel, error)))
      return nullptr;
  } else {
    error = "--tokenizer " + o.tokenizer + ": give bytes or sentencepiece";
    return nullptr;
  }
  if (o.appendEod && tokenizer->eod() < 0) {
    error = tokenizer->name() == "bytes"
                ? "--append-eod: the bytes tokenizer has no end-of-document id (all 256 ids are bytes); leave "
                  "it out, or use a sentencepiece model with an eos id"
                : "--append-eod: the model " + o.tokenizerModel +
                      " has no eos id (trained with --eos_id=-1); leave --append-eod out or retrain";
    return nullptr;
  }
  return tokenizer;
}

/// Every input readable, each one's format ("text" or "jsonl", into
/// `formats`), and the outputs writable without overwriting an input.
bool checkFiles(const PrepOptions &o, std::vector<std::string> &formats, std::string &error) {
  for (const std::string &input : o.inputs) {
    if (std::string problem = checkReadable(input); !problem.empty()) {
      error = "--input " + problem;
      return false;
    }
    if (o.format == "auto")
      formats.push_back(endsWith(input, ".jsonl") || endsWith(input, ".json") ? "jsonl" : "text");
    else if (o.format == "text" || o.format == "jsonl")
      formats.push_back(o.format);
    else {
      error = "--format " + o.format + ": give auto, text or jsonl";
      return false;
    }
  }
  std::vector<std::string> readFrom = o.inputs;
  if (!o.tokenizerModel.empty())
    readFrom.push_back(o.tokenizerModel);
  for (const char *suffix : {".bin", ".idx"})
    if (std::string problem = runtime::checkOutputPath("output-prefix", o.outputPrefix + suffix, readFrom);
        !problem.empty()) {
      error = problem;
      return false;
    }
  struct stat folder;
  if (::stat(folderOf(o.outputPrefix).c_str(), &folder) != 0 || !S_ISDIR(folder.st_mode)) {
    error = "--output-prefix " + o.outputPrefix + ": the folder " + folderOf(o.outputPrefix) + " does not exist";
    return false;
  }
  return true;
}

/// A document's text from one input line: the line itself (text; a CR
/// before the newline dropped), or a JSONL object's `key` string (held in
/// `object`). Blank JSONL lines are Skip; a malformed one is Error with
/// `error` naming the place (`where`).
enum class LineText { Text, Skip, Error };
LineText documentText(const std::string &line, bool jsonl, const std::string &key, const std::string &where,
                      nlohmann::json &object, std::string_view &text, std::string &error) {
  text = line;
  if (!jsonl) {
    if (!text.empty() && text.back() == '\r')
      text.remove_suffix(1);
    return LineText::Text;
  }
  if (line.find_first_not_of(" \t\r") == std::string::npos)
    return LineText::Skip;
  try {
    object = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error &e) {
    error = where + jsonProblem(e);
    return LineText::Error;
  } catch (const nlohmann::json::exception &e) {
    // out_of_range: a number literal beyond double's range (found by
    // tests/fuzz/prep_fuzz.cpp), which parse reports apart from syntax.
    error = where + "not JSON: a number out of range (" +
            std::string(e.what()).substr(std::string(e.what()).find(']') + 2) + ")";
    return LineText::Error;
  }
  if (!object.is_object()) {
    error = where + "a JSON " + object.type_name() + ", not an object with a \"" + key + "\" string";
    return LineText::Error;
  }
  auto value = object.find(key);
  if (value == object.end()) {
    error = where + "no \"" + key + "\" key (" + keyList(object) + "); pick one with --json-key";
    return LineText::Error;
  }
  if (!value->is_string()) {
    error = where + "\"" + key + "\" is a " + value->type_name() + ", not a string";
    return LineText::Error;
  }
  text = value->get_ref<const std::string &>();
  return LineText::Text;
}

/// The .bin and .idx renamed into place with the signals blocked (no signal
/// between the two renames).
bool commitBlockingSignals(IndexedWriter &writer, std::string &error) {
  sigset_t block, previous;
  sigemptyset(&block);
  for (int s : kSignals)
    sigaddset(&block, s);
  sigprocmask(SIG_BLOCK, &block, &previous);
  const bool committed = writer.commit(error);
  gTempBin[0] = '\0';
  sigprocmask(SIG_SETMASK, &previous, nullptr);
  return committed;
}

} // namespace

bool prepare(const PrepOptions &o, PrepSummary &summary, std::string &error) {
  const auto start = std::chrono::steady_clock::now();
  // Everything that can be checked before a file is created.
  if (o.inputs.empty()) {
    error = "--input: give at least one text or JSONL file";
    return false;
  }
  if (o.outputPrefix.empty() || endsWith(o.outputPrefix, "/")) {
    error = "--output-prefix '" + o.outputPrefix + "': give a path without the .bin/.idx suffix, e.g. data/corpus";
    return false;
  }
  std::unique_ptr<Tokenizer> tokenizer = tokenizerFor(o, error);
  if (!tokenizer)
    return false;
  Dtype dtype = dtypeForVocab(tokenizer->vocab());
  if (o.dtype != "auto") {
    std::optional<Dtype> named = dtypeNamed(o.dtype);
    if (!named) {
      error = "--dtype " + o.dtype + ": give auto, uint8, uint16 or int32";
      return false;
    }
    dtype = *named;
  }
  std::vector<std::string> formats;
  if (!checkFiles(o, formats, error))
    return false;

  IndexedWriter writer;
  if (!writer.open(o.outputPrefix, dtype, error))
    return false;
  std::snprintf(gTempBin, sizeof gTempBin, "%s", writer.tempBin().c_str());
  for (int s : kSignals)
    std::signal(s, removeTempsAndDie);
  auto done = [&](bool ok) {
    writer.abort();
    gTempBin[0] = '\0';
    return ok;
  };

  std::vector<int32_t> ids;
  std::string line;
  const int64_t eod = o.appendEod ? tokenizer->eod() : -1;
  for (size_t f = 0; f < o.inputs.size(); ++f) {
    const std::string &input = o.inputs[f];
    std::ifstream in(input, std::ios::binary);
    if (!in) {
      error = input + ": cannot open (" + systemError() + ")";
      return done(false);
    }
    for (int64_t number = 1; std::getline(in, line); ++number) {
      const std::string where = input + ":" + std::to_string(number) + ": ";
      nlohmann::json object;
      std::string_view text;
      const LineText read = documentText(line, formats[f] == "jsonl", o.jsonKey, where, object, text, error);
      if (read == LineText::Error)
        return done(false);
      if (read == LineText::Skip)
        continue;
      ids.clear();
      if (!tokenizer->encode(text, ids, error)) {
        error = where + error;
        return done(false);
      }
      if (ids.empty()) {
        ++summary.skipped;
        continue;
      }
      if (eod >= 0)
        ids.push_back(static_cast<int32_t>(eod));
      if (!writer.addDocument(ids.data(), ids.size(), error)) {
        error = where + error + (o.dtype == "auto" ? "" : "; use --dtype auto");
        return done(false);
      }
    }
    if (in.bad()) {
      error = input + ": read error (" + systemError() + ")";
      return done(false);
    }
  }
  if (writer.documents() == 0) {
    error = "no documents: the inputs hold no non-empty " +
            std::string(formats.size() == 1 && formats[0] == "jsonl" ? "\"" + o.jsonKey + "\" value" : "line") +
            " (" + std::to_string(summary.skipped) + " empty skipped); nothing written";
    return done(false);
  }
  summary.documents = writer.documents();
  summary.tokens = writer.tokens();
  if (!commitBlockingSignals(writer, error))
    return done(false);
  summary.dtype = dtype.name;
  summary.tokenizer = tokenizer->name();
  summary.vocab = tokenizer->vocab();
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return done(true);
}

namespace {

int fail(std::string message) {
  // One line, whatever the input held.
  for (char &c : message)
    if (static_cast<unsigned char>(c) < 0x20)
      c = '?';
  const std::string line = "mhc-prep: " + message + "\n";
  std::fflush(stdout);
  if (::write(STDERR_FILENO, line.data(), line.size()) < 0)
    std::cerr << line;
  return 1;
}

} // namespace

int runPrep(int argc, char **argv) {
  CLI::App app{"mhc-prep: tokenizes text or JSONL into a Megatron indexed dataset (PREFIX.bin + PREFIX.idx, "
               "the MMIDIDX format of Megatron-LM's preprocess_data.py) for 'mhcrun --data PREFIX'"};
  app.option_defaults()->always_capture_default();
  app.set_version_flag("--version", std::string("mhc-prep ") + runtime::kMhccVersion);
  PrepOptions o;
  app.add_option("--input", o.inputs,
                 "Input file (repeat for more, read in order): text (each line one document) or JSONL (each "
                 "line a JSON object; the --json-key string is one document)")
      ->required();
  app.add_option("--output-prefix", o.outputPrefix, "Write PREFIX.bin and PREFIX.idx (replaced only on success)")
      ->required();
  app.add_option("--format", o.format, "auto (.jsonl and .json files are JSONL, others text), text or jsonl")
      ->check(CLI::IsMember({"auto", "text", "jsonl"}));
  app.add_option("--json-key", o.jsonKey, "JSONL: the key holding each document's text");
  app.add_option("--tokenizer", o.tokenizer,
                 "bytes (each UTF-8 byte one token, vocabulary 256) or sentencepiece (--tokenizer-model)")
      ->check(CLI::IsMember({"bytes", "sentencepiece"}));
  app.add_option("--tokenizer-model", o.tokenizerModel, "The SentencePiece .model file");
  app.add_flag("--append-eod", o.appendEod,
               "End each document with the tokenizer's end-of-document id (sentencepiece: the model's eos id; "
               "the bytes tokenizer has none and refuses it)");
  app.add_option("--dtype", o.dtype,
                 "Token dtype of the .bin: auto (uint8 up to 256 ids, uint16 below 65500, else int32), uint8, "
                 "uint16 or int32")
      ->check(CLI::IsMember({"auto", "uint8", "uint16", "int32"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp &e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp &e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion &e) {
    return app.exit(e);
  } catch (const CLI::ParseError &e) {
    return fail(std::string(e.what()) + " (mhc-prep --help lists the flags)");
  }
  PrepSummary s;
  std::string error;
  if (!prepare(o, s, error))
    return fail(error);
  std::ostringstream line;
  line << "mhc-prep: " << s.documents << " documents";
  if (s.skipped)
    line << " (" << s.skipped << " empty skipped)";
  line << ", " << s.tokens << " tokens, dtype " << s.dtype << " (" << s.tokenizer << ", vocabulary " << s.vocab
       << "), " << static_cast<int64_t>(s.seconds > 0 ? s.tokens / s.seconds : 0) << " tokens/s: wrote "
       << o.outputPrefix << ".bin, " << o.outputPrefix << ".idx\n";
  std::cout << line.str() << std::flush;
  return 0;
}

} // namespace mhcc::prep
