//===- Checkpoint.cpp - Megatron-style checkpoints by parameter name --------===//
#include "runtime/io/Checkpoint.h"

#include "runtime/io/Safetensors.h"

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <thread>
#include <unistd.h>

namespace mhcc::runtime {
namespace fs = std::filesystem;
namespace {

constexpr const char *kPointer = "latest_checkpointed_iteration.txt";
constexpr const char *kFormat = "mhcc-checkpoint-1";

/// fsync a file or a folder by path: a rename is durable only once the
/// renamed file's data and the folder holding the new name are.
bool syncPath(const std::string &path, std::string &error) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) {
    if (fd >= 0)
      ::close(fd);
    error = "cannot fsync " + path;
    return false;
  }
  ::close(fd);
  return true;
}

bool writeSynced(const std::string &path, const std::string &text, std::string &error) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) {
      error = "cannot write " + path;
      return false;
    }
  }
  return syncPath(path, error);
}

bool readBytes(const std::string &path, std::vector<char> &bytes) {
  // Only regular files: a FIFO or a device (/dev/zero) would never end.
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    return false;
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return false;
  bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", (unsigned long long)v);
  return b;
}

std::string fileChecksum(const std::vector<char> &bytes) { return hex64(XXH3_64bits(bytes.data(), bytes.size())); }

/// Test hook: MHCC_TEST_SAVE_PAUSE_S=<seconds> stalls every save between its
/// two files, so a test can SIGKILL the process in the middle of a save.
void pauseForTests() {
  if (const char *pause = std::getenv("MHCC_TEST_SAVE_PAUSE_S"))
    std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(pause)));
}

nlohmann::json paramTable(const Artifact &a) {
  nlohmann::json table = nlohmann::json::array();
  for (const ParamInfo &p : a.params)
    table.push_back({{"name", p.name}, {"shape", {p.rows, p.cols}}, {"weight_decay", p.decay}});
  return table;
}

/// meta.json carries the checksum of its own other members, so a flipped
/// byte in it (the iteration, say) is caught like one in the tensor files.
std::string sealMeta(nlohmann::json meta) {
  meta.erase("meta_xxh3");
  const std::string body = meta.dump();
  meta["meta_xxh3"] = hex64(XXH3_64bits(body.data(), body.size()));
  return meta.dump(1) + "\n";
}

/// The metadata key under which a shard file lists its pieces: tensor name
/// -> {"of": whole tensor's name, "tp", "tensor_rank", "begin", "end"}.
constexpr const char *kPiecesKey = "mhcc_pieces";

/// Adds one entry of the state to `file`: the whole tensor where this
/// process holds all of it (its pieces make it up, or it named none), else
/// each piece as a tensor of its own, listed in `pieces`.
bool addHeld(SafetensorsWriter &file, nlohmann::json &pieces, const ParamInfo &info, const std::string &name,
             const std::vector<float> &values, const std::vector<TensorPiece> &held, bool wholeRun,
             std::string &error) {
  if (values.size() != size_t(info.count()))
    return true; // not held here
  const std::string problem = held.empty() ? "" : piecesProblem(info, held);
  if (problem.empty()) {
    file.addF32(name, {info.rows, info.cols}, values.data());
    return true;
  }
  if (wholeRun) { // every rank in this process: its ranks missed a piece
    error = "internal: the ranks' state of " + name + " is incomplete (" + problem + ")";
    return false;
  }
  for (const TensorPiece &piece : held) {
    const std::string pieceName = name + "@tp" + std::to_string(piece.tp) + "." + std::to_string(piece.tensorRank) +
                                  "[" + std::to_string(piece.begin) + ":" + std::to_string(piece.end) + "]";
    file.addF32(pieceName, {piece.count()}, gatherPiece(info, piece, values.data()).data());
    pieces[pieceName] = {{"of", name},
                         {"tp", piece.tp},
                         {"tensor_rank", piece.tensorRank},
                         {"begin", piece.begin},
                         {"end", piece.end}};
  }
  return true;
}

bool writeShardFiles(const std::string &tmp, const CheckpointShard &shard, const Artifact &a,
                     const ParameterState &state, std::string &error) {
  const std::string suffix = shard.size == 1 ? "" : "-rank" + std::to_string(shard.rank);
  const bool wholeRun = shard.size == 1;
  SafetensorsWriter model, optim;
  nlohmann::json modelPieces = nlohmann::json::object(), optimPieces = nlohmann::json::object();
  static const std::vector<TensorPiece> kWhole;
  auto piecesOf = [](const std::vector<std::vector<TensorPiece>> &lists, size_t p) -> const std::vector<TensorPiece> & {
    return p < lists.size() ? lists[p] : kWhole;
  };
  for (size_t p = 0; p < a.params.size(); ++p) {
    const ParamInfo &info = a.params[p];
    const std::vector<TensorPiece> &weightPieces = piecesOf(state.weightPieces, p),
                                   &momentPieces = piecesOf(state.momentPieces, p);
    if (!addHeld(model, modelPieces, info, info.name, state.weights[p], weightPieces, wholeRun, error) ||
        !addHeld(optim, optimPieces, info, info.name + ".exp_avg", state.adamM[p], momentPieces, wholeRun, error) ||
        !addHeld(optim, optimPieces, info, info.name + ".exp_avg_sq", state.adamV[p], momentPieces, wholeRun, error))
      return false;
  }
  model.setMetadata("format", "mhcc fp32 master weights");
  optim.setMetadata("format", "mhcc Adam moments");
  if (!modelPieces.empty())
    model.setMetadata(kPiecesKey, modelPieces.dump());
  if (!optimPieces.empty())
    optim.setMetadata(kPiecesKey, optimPieces.dump());
  const std::string modelPath = tmp + "/model" + suffix + ".safetensors";
  const std::string optimPath = tmp + "/optim" + suffix + ".safetensors";
  if (!model.write(modelPath, error) || !syncPath(modelPath, error))
    return false;
  pauseForTests();
  return optim.write(optimPath, error) && syncPath(optimPath, error);
}

/// Rank 0 of a multi-process save: waits until every rank announced its shard.
bool waitForShards(const std::string &tmp, const CheckpointShard &shard, std::string &error) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(shard.timeoutSeconds);
  for (int64_t r = 1; r < shard.size; ++r)
    while (!fs::exists(tmp + "/shard-rank" + std::to_string(r) + ".done")) {
      if (std::chrono::steady_clock::now() > deadline) {
        error = tmp + ": rank " + std::to_string(r) + " did not write its shard within " +
                std::to_string(int(shard.timeoutSeconds)) + " s; the previous checkpoint stays the latest";
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  return true;
}

/// Renames the finished folder into place, then moves the pointer.
bool publish(const std::string &dir, const std::string &tmp, const std::string &folder, int64_t iteration,
             std::string &error) {
  std::error_code ec;
  const std::string old = folder + ".old";
  if (fs::exists(folder)) { // saving an iteration again (a rerun): keep it until the new one is in place
    fs::remove_all(old, ec);
    fs::rename(folder, old, ec);
  }
  fs::rename(tmp, folder, ec);
  if (ec) {
    error = "cannot rename " + tmp + " to " + folder + ": " + ec.message();
    return false;
  }
  if (!syncPath(dir, error))
    return false;
  fs::remove_all(old, ec);
  const std::string pointer = dir + "/" + kPointer;
  if (!writeSynced(pointer + ".tmp", std::to_string(iteration) + "\n", error))
    return false;
  fs::rename(pointer + ".tmp", pointer, ec);
  if (ec) {
    error = "cannot replace " + pointer + ": " + ec.message();
    return false;
  }
  return syncPath(dir, error);
}

} // namespace

std::string checkpointFolder(const std::string &dir, int64_t iteration) {
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07lld", (long long)iteration);
  return dir + "/" + name;
}

bool saveCheckpoint(const std::string &dir, int64_t iteration, const Artifact &a, const TrainOptions &options,
                    const ParameterState &state, const CheckpointShard &shard, std::string &error) {
  const std::string folder = checkpointFolder(dir, iteration);
  const std::string tmp = folder + ".tmp" + (shard.size > 1 && !shard.runToken.empty() ? "-" + shard.runToken : "");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (shard.size == 1)
    fs::remove_all(tmp, ec); // what a killed save left
  fs::create_directories(tmp, ec);
  if (ec || !fs::is_directory(tmp)) {
    error = "cannot create " + tmp + (ec ? ": " + ec.message() : "");
    return false;
  }
  if (!writeShardFiles(tmp, shard, a, state, error))
    return false;
  if (shard.size > 1) {
    const std::string done = tmp + "/shard-rank" + std::to_string(shard.rank) + ".done";
    if (!writeSynced(done + ".tmp", "", error))
      return false;
    fs::rename(done + ".tmp", done, ec);
    if (shard.rank != 0)
      return true; // rank 0 publishes
    if (!waitForShards(tmp, shard, error))
      return false;
  }
  nlohmann::json files = nlohmann::json::object();
  for (int64_t r = 0; r < shard.size; ++r)
    for (const char *kind : {"model", "optim"}) {
      const std::string name =
          std::string(kind) + (shard.size == 1 ? "" : "-rank" + std::to_string(r)) + ".safetensors";
      std::vector<char> bytes;
      if (!readBytes(tmp + "/" + name, bytes)) {
        error = "cannot read back " + tmp + "/" + name;
        return false;
      }
      files[name] = {{"xxh3", fileChecksum(bytes)}, {"bytes", bytes.size()}};
    }
  nlohmann::json meta = {
      {"format", kFormat},
      {"iteration", iteration},
      {"model", a.model.name},
      {"model_hash", a.modelHash},
      {"layout", {{"pp", a.pp}, {"vpp", a.vpp}, {"dp", a.dp}, {"cp", a.cp}, {"layout", a.layout}}},
      {"params", paramTable(a)},
      {"optimizer",
       {{"kind", options.optimizer}, {"lr", options.lr}, {"beta1", options.beta1}, {"beta2", options.beta2},
        {"eps", options.adamEps}, {"weight_decay", options.weightDecay}, {"clip_grad", options.clipGrad},
        {"warmup_steps", options.warmupSteps}, {"store_param_remainders", options.storeParamRemainders}}},
      {"data_seed", options.dataSeed},
      {"reset_position_ids", options.resetPositionIds},
      {"reset_attention_mask", options.resetAttentionMask},
      {"files", files}};
  if (!writeSynced(tmp + "/meta.json", sealMeta(meta), error) || !syncPath(tmp, error) ||
      !publish(dir, tmp, folder, iteration, error))
    return false;
  // What killed saves of this iteration left (their own iter_N.tmp-TOKEN).
  const std::string stale = fs::path(folder).filename().string() + ".tmp";
  std::vector<fs::path> left;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename().string().rfind(stale, 0) == 0)
      left.push_back(it->path());
  for (const fs::path &path : left)
    fs::remove_all(path, ec);
  return true;
}

namespace {

/// Finds the folder to load: DIR itself, or the one DIR's pointer names.
bool resolveFolder(const std::string &dir, std::string &folder, std::string &error) {
  if (fs::exists(dir + "/meta.json")) {
    folder = dir;
    return true;
  }
  std::ifstream in(dir + "/" + kPointer);
  long long iteration = -1;
  if (!in || !(in >> iteration) || iteration < 0) {
    error = "--load " + dir + ": no checkpoint there (neither " + kPointer +
            " nor meta.json); pass the --save folder of an earlier run, or one of its iter_* folders";
    return false;
  }
  folder = checkpointFolder(dir, iteration);
  if (!fs::exists(folder + "/meta.json")) {
    error = folder + "/meta.json: missing (" + kPointer + " names iteration " + std::to_string(iteration) +
            "); pass an earlier iter_* folder to --load";
    return false;
  }
  return true;
}

bool readMeta(const std::string &path, const Artifact &a, nlohmann::json &meta, std::string &error) {
  std::vector<char> bytes;
  if (!readBytes(path, bytes)) {
    error = path + ": cannot be read; pass an earlier iter_* folder to --load";
    return false;
  }
  meta = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
  if (!meta.is_object() || !meta.contains("meta_xxh3") || sealMeta(meta) != std::string(bytes.begin(), bytes.end())) {
    error = path + ": corrupt (its checksum does not match); pass an earlier iter_* folder to --load";
    return false;
  }
  // The seal proves the bytes are what a save wrote, not that a save wrote
  // them: an edited and resealed meta.json must still be refused with one
  // line, never an exception from a missing or mistyped member.
  if (!meta["format"].is_string() || meta["format"] != kFormat) {
    error = path + ": not an mhcc checkpoint of format " + kFormat;
    return false;
  }
  std::string problem;
  if (!meta["iteration"].is_number_unsigned() || meta["iteration"].get<uint64_t>() > uint64_t(INT64_MAX))
    problem = "no non-negative integer \"iteration\"";
  else if (!meta["files"].is_object() || meta["files"].empty())
    problem = "no \"files\" object";
  // (Only over an object: items() of a number yields no key and throws.)
  static const nlohmann::json kNoFiles = nlohmann::json::object();
  const nlohmann::json &files = problem.empty() ? meta["files"] : kNoFiles;
  for (const auto &[name, entry] : files.items()) {
    if (!problem.empty())
      break;
    // Plain names inside the folder: a path could read any file on the machine.
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
      problem = "the file name '" + name + "' is not a plain name in the checkpoint folder";
    else if (!entry.is_object() || !entry.contains("bytes") || !entry["bytes"].is_number_unsigned() ||
             !entry.contains("xxh3") || !entry["xxh3"].is_string()) // const []: key must exist
      problem = "the entry of file '" + name + "' needs \"bytes\" and \"xxh3\"";
  }
  if (!problem.empty()) {
    error = path + ": malformed (" + problem + "); pass an earlier iter_* folder to --load";
    return false;
  }
  if (!meta["model_hash"].is_string() || meta["model_hash"] != a.modelHash || meta["params"] != paramTable(a)) {
    auto text = [&](const char *key) { return meta[key].is_string() ? meta[key].get<std::string>() : "?"; };
    error = path + ": saved for model " + text("model") + " (hash " + text("model_hash") +
            "), but the artifact is " + a.model.name + " (hash " + a.modelHash +
            "); load it with an artifact of the same model, or start without --load";
    return false;
  }
  return true;
}

/// A piece of a whole tensor from a shard file: where it goes, its values.
struct HeldPiece {
  TensorPiece piece;
  std::vector<float> values;
};
using PieceMap = std::map<std::string, std::vector<HeldPiece>>; // by "model:" or "optim:" + the whole's name
constexpr size_t kMaxPieces = size_t(1) << 16;                  // of one tensor

/// Moves the pieces a shard file lists (kPiecesKey) from `tensors` into
/// `pieces`; false and `error` (naming the file) when the list or a piece
/// is malformed.
bool listPieces(const std::string &path, const std::map<std::string, std::string> &metadata,
                std::map<std::string, SafetensorsTensor> &tensors, const std::string &kind, PieceMap &pieces,
                std::string &error) {
  auto listed = metadata.find(kPiecesKey);
  if (listed == metadata.end())
    return true;
  auto malformed = [&](const std::string &what) {
    error = path + ": malformed list of pieces (" + what + ")";
    return false;
  };
  const nlohmann::json list = nlohmann::json::parse(listed->second, nullptr, false);
  if (!list.is_object())
    return malformed("not a JSON object");
  for (const auto &[name, entry] : list.items()) {
    auto integer = [&entry](const char *key) { return entry.contains(key) && entry[key].is_number_integer(); };
    if (!entry.is_object() || !entry.contains("of") || !entry["of"].is_string() || !integer("tp") ||
        !integer("tensor_rank") || !integer("begin") || !integer("end"))
      return malformed("piece '" + name + "' needs \"of\", \"tp\", \"tensor_rank\", \"begin\" and \"end\"");
    HeldPiece held{{entry["tp"].get<int64_t>(), entry["tensor_rank"].get<int64_t>(), entry["begin"].get<int64_t>(),
                    entry["end"].get<int64_t>()},
                   {}};
    auto tensor = tensors.find(name);
    const bool counted = held.piece.begin >= 0 && held.piece.end > held.piece.begin; // end - begin cannot overflow
    if (tensor == tensors.end() || tensor->second.dtype != "F32" || !counted ||
        tensor->second.bytes.size() % sizeof(float) != 0 ||
        int64_t(tensor->second.bytes.size() / sizeof(float)) != held.piece.count())
      return malformed("piece '" + name + "' has no F32 tensor of its " +
                       (counted ? std::to_string(held.piece.count()) : std::string("(empty)")) + " elements");
    std::vector<HeldPiece> &list = pieces[kind + entry["of"].get<std::string>()];
    if (list.size() >= kMaxPieces) // a run has tp x (dp x cp) at most; more would only slow the assembly
      return malformed("more than " + std::to_string(kMaxPieces) + " pieces of '" + entry["of"].get<std::string>() +
                       "'");
    held.values.resize(size_t(held.piece.count()));
    std::memcpy(held.values.data(), tensor->second.bytes.data(), tensor->second.bytes.size());
    tensors.erase(tensor);
    list.push_back(std::move(held));
  }
  return true;
}

/// out = the whole tensor `name` put together from its pieces; false and
/// `error` when they do not make it up exactly.
bool assemblePieces(const std::string &folder, const std::string &name, const ParamInfo &info,
                    const std::vector<HeldPiece> &held, std::vector<float> &out, std::string &error) {
  std::vector<TensorPiece> list;
  for (const HeldPiece &h : held)
    list.push_back(h.piece);
  if (const std::string problem = piecesProblem(info, list); !problem.empty()) {
    error = folder + ": the pieces of '" + name + "' do not make up its " + std::to_string(info.count()) +
            " elements (" + problem + "): a rank's shard files are missing or from another save";
    return false;
  }
  out.assign(size_t(info.count()), 0.0f);
  for (const HeldPiece &h : held)
    scatterPiece(info, h.piece, h.values.data(), out);
  return true;
}

} // namespace

bool loadCheckpoint(const std::string &dir, const Artifact &a, ParameterState &state, int64_t &iteration,
                    std::string &error) {
  std::string folder;
  nlohmann::json meta;
  if (!resolveFolder(dir, folder, error) || !readMeta(folder + "/meta.json", a, meta, error))
    return false;
  const std::string fix = "; restore it or pass an earlier iter_* folder to --load";
  std::map<std::string, SafetensorsTensor> tensors; // every file's, "model:" or "optim:" + name
  PieceMap pieces;                                  // by the whole tensor's key, as tensors
  for (const auto &[name, entry] : meta.at("files").items()) {
    const std::string path = folder + "/" + name;
    std::vector<char> bytes;
    if (!readBytes(path, bytes)) {
      error = path + ": missing" + fix;
      return false;
    }
    if (bytes.size() != entry.at("bytes").get<size_t>() || fileChecksum(bytes) != entry.at("xxh3")) {
      error = path + ": truncated or corrupt (" + std::to_string(bytes.size()) + " bytes, checksum mismatch)" + fix;
      return false;
    }
    std::map<std::string, SafetensorsTensor> part;
    std::map<std::string, std::string> metadata;
    if (!parseSafetensors(path, bytes, part, metadata, error))
      return false;
    const std::string kind = name.rfind("model", 0) == 0 ? "model:" : "optim:";
    if (!listPieces(path, metadata, part, kind, pieces, error)) {
      error += fix;
      return false;
    }
    for (auto &[t, tensor] : part)
      if (!tensors.emplace(kind + t, std::move(tensor)).second) {
        error = folder + ": '" + t + "' is in two of its files" + fix;
        return false;
      }
  }
  auto take = [&](const std::string &key, const ParamInfo &info, std::vector<float> &out) {
    auto it = tensors.find(key);
    if (auto held = pieces.find(key); held != pieces.end()) {
      if (it != tensors.end())
        error = folder + ": '" + key.substr(6) + "' is in its files both whole and in pieces" + fix;
      else if (assemblePieces(folder, key.substr(6), info, held->second, out, error))
        return pieces.erase(held), true;
      else
        error += fix;
      return false;
    }
    if (it == tensors.end() || it->second.dtype != "F32" ||
        it->second.bytes.size() != size_t(info.count()) * sizeof(float)) {
      error = folder + ": no F32 tensor '" + key.substr(6) + "' of " + std::to_string(info.count()) +
              " elements in its files" + fix;
      return false;
    }
    out.resize(info.count());
    std::memcpy(out.data(), it->second.bytes.data(), it->second.bytes.size());
    return true;
  };
  const size_t n = a.params.size();
  state.clear(n);
  for (size_t p = 0; p < n; ++p) {
    const ParamInfo &info = a.params[p];
    if (!take("model:" + info.name, info, state.weights[p]) ||
        !take("optim:" + info.name + ".exp_avg", info, state.adamM[p]) ||
        !take("optim:" + info.name + ".exp_avg_sq", info, state.adamV[p]))
      return false;
  }
  if (!pieces.empty()) { // of a tensor the model lacks: a file of another save
    error = folder + ": pieces of '" + pieces.begin()->first.substr(6) + "', which is no tensor of the model" + fix;
    return false;
  }
  iteration = meta.at("iteration").get<int64_t>();
  return true;
}

bool exportWeights(const std::string &path, const Artifact &a, const ParameterState &state, int64_t iteration,
                   std::string &error) {
  SafetensorsWriter out;
  for (size_t p = 0; p < a.params.size(); ++p)
    out.addF32(a.params[p].name, {a.params[p].rows, a.params[p].cols}, state.weights[p].data());
  out.setMetadata("format", "mhcc fp32 master weights");
  out.setMetadata("model", a.model.name);
  out.setMetadata("model_hash", a.modelHash);
  out.setMetadata("iteration", std::to_string(iteration));
  return out.write(path, error);
}

bool importWeights(const std::string &path, const Artifact &a, ParameterState &state, std::string &error) {
  std::map<std::string, SafetensorsTensor> tensors;
  std::map<std::string, std::string> metadata;
  if (!readSafetensors(path, tensors, metadata, error)) {
    error = "--init-from " + error;
    return false;
  }
  const size_t n = a.params.size();
  state.clear(n);
  for (size_t p = 0; p < n; ++p) {
    const ParamInfo &info = a.params[p];
    auto it = tensors.find(info.name);
    const std::vector<int64_t> shape = {info.rows, info.cols};
    if (it == tensors.end() || it->second.dtype != "F32" || it->second.shape != shape) {
      error = "--init-from " + path + ": no F32 tensor '" + info.name + "' of shape [" + std::to_string(info.rows) +
              ", " + std::to_string(info.cols) + "]; export the weights of the same model with --export-safetensors";
      return false;
    }
    state.weights[p].resize(info.count());
    std::memcpy(state.weights[p].data(), it->second.bytes.data(), it->second.bytes.size());
  }
  return true;
}

} // namespace mhcc::runtime
