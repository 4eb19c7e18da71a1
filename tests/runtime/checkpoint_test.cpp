// Checkpoints resume bit-exactly, under the same layout and under others:
// - 10 + 10 iterations under PP2/VPP2 (saved, loaded by a fresh trainer) ≡ 20
//   uninterrupted: lm loss, mtp loss and grad norm of every step and the
//   final weights, by memcmp;
// - saved under PP2/VPP2 after 3, resumed under PP1 and PP4/VPP2 for 3 more
//   ≡ 6 uninterrupted under that layout;
// - the comparison can fail: resuming with the Adam moments zeroed differs;
// - a corrupt, truncated or foreign checkpoint is refused naming the file;
// - two processes' shards of pieces (tensor-rank blocks, optimizer parts)
//   load as the whole state, bit for bit; missing or doubled pieces are
//   refused naming the tensor.
//
// usage: checkpoint_test DATA PP1 PP2_VPP2 PP4_VPP2 OTHER_MODEL
#include "runtime/artifact/TensorSplit.h"
#include "runtime/cpu/CpuDevice.h"
#include "runtime/io/Checkpoint.h"
#include "runtime/io/Safetensors.h"
#include "runtime/train/Trainer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <cstring>
#include <functional>
#include <filesystem>
#include <fstream>

namespace mhcc::runtime {
namespace {

std::string gData, gPp1, gPp2Vpp2, gPp4Vpp2, gOther, gBf16;

struct Trained {
  std::vector<StepResult> steps;
  std::vector<std::vector<float>> weights;
};

std::string tempDir(const std::string &name) {
  const char *root = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(root ? root : "/tmp") + "/" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

const TokenDataset &data() {
  static std::optional<TokenDataset> d = [] {
    std::string error;
    auto opened = TokenDataset::open(gData, error);
    EXPECT_TRUE(opened) << error;
    return opened;
  }();
  return *d;
}

std::unique_ptr<Trainer> makeTrainer(const std::string &path, const TrainOptions &options = TrainOptions()) {
  std::string error;
  std::optional<Artifact> artifact = readArtifact(path, error);
  EXPECT_TRUE(artifact) << error;
  auto trainer = Trainer::create(std::move(*artifact), data(), options, cpuDevices(), error);
  EXPECT_TRUE(trainer) << error;
  return trainer;
}

/// Trains until iteration `until` with `options`; first loads `loadDir` (if
/// given, with `mutate` applied to the loaded state); saves into `saveDir` at
/// the end.
Trained train(const std::string &path, int64_t until, const std::string &loadDir = "",
          const std::string &saveDir = "",
          const std::function<void(ParameterState &)> &mutate = nullptr,
          const TrainOptions &options = TrainOptions()) {
  std::unique_ptr<Trainer> trainer = makeTrainer(path, options);
  std::string error;
  Trained run;
  if (!trainer)
    return run;
  if (!loadDir.empty()) {
    ParameterState state;
    int64_t iteration = 0;
    EXPECT_TRUE(loadCheckpoint(loadDir, trainer->artifact(), state, iteration, error)) << error;
    if (mutate)
      mutate(state);
    EXPECT_TRUE(trainer->loadState(state, iteration, error)) << error;
  }
  while (trainer->stepsDone() < until) {
    std::optional<StepResult> result = trainer->step(error);
    EXPECT_TRUE(result) << error;
    if (!result)
      return run;
    run.steps.push_back(*result);
  }
  if (!saveDir.empty()) {
    ParameterState state;
    EXPECT_TRUE(trainer->saveState(state, error)) << error;
    EXPECT_TRUE(saveCheckpoint(saveDir, trainer->stepsDone(), trainer->artifact(), options, state, {}, error))
        << error;
  }
  run.weights = trainer->parameters();
  return run;
}

bool same(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

/// `tail` continues `full` from step full.size() - tail.size() + 1, bit for bit.
bool continuesExactly(const Trained &full, const Trained &tail, std::string &why) {
  const size_t offset = full.steps.size() - tail.steps.size();
  for (size_t k = 0; k < tail.steps.size(); ++k) {
    const StepResult &a = full.steps[offset + k], &b = tail.steps[k];
    if (a.step != b.step || !same(a.lmLoss, b.lmLoss) || !same(a.gradNorm, b.gradNorm) ||
        a.mtpLoss.has_value() != b.mtpLoss.has_value() || (a.mtpLoss && !same(*a.mtpLoss, *b.mtpLoss))) {
      why = "iteration " + std::to_string(a.step) + " differs";
      return false;
    }
  }
  if (full.weights.size() != tail.weights.size())
    return why = "parameter count", false;
  for (size_t p = 0; p < full.weights.size(); ++p)
    if (full.weights[p].size() != tail.weights[p].size() ||
        std::memcmp(full.weights[p].data(), tail.weights[p].data(), full.weights[p].size() * 4) != 0)
      return why = "final weights of parameter " + std::to_string(p), false;
  return true;
}

TEST(Checkpoint, TenPlusTenIsTwentyBitForBit) {
  const std::string dir = tempDir("ten_plus_ten");
  Trained full = train(gPp2Vpp2, 20);
  ASSERT_EQ(full.steps.size(), 20u);
  train(gPp2Vpp2, 10, "", dir);
  Trained tail = train(gPp2Vpp2, 20, dir);
  ASSERT_EQ(tail.steps.size(), 10u);
  EXPECT_EQ(tail.steps.front().step, 11);
  std::string why;
  EXPECT_TRUE(continuesExactly(full, tail, why)) << why;
}

TEST(Checkpoint, SavedUnderPp2Vpp2ResumesUnderPp1AndPp4Vpp2) {
  const std::string dir = tempDir("cross_layout");
  train(gPp2Vpp2, 3, "", dir);
  for (const std::string &layout : {gPp1, gPp4Vpp2}) {
    Trained full = train(layout, 6);
    Trained tail = train(layout, 6, dir);
    ASSERT_EQ(tail.steps.size(), 3u) << layout;
    std::string why;
    EXPECT_TRUE(continuesExactly(full, tail, why)) << layout << ": " << why;
  }
}

// A bf16 model's masters kept as remainders (--store-param-remainders,
// settled off bf16 ties on the CPU as on the GPU) resume bit for bit.
TEST(Checkpoint, SettledMastersResumeBitForBit) {
  const std::string dir = tempDir("remainders");
  TrainOptions remainders;
  remainders.storeParamRemainders = true;
  Trained full = train(gBf16, 4, "", "", nullptr, remainders);
  train(gBf16, 2, "", dir, nullptr, remainders);
  Trained tail = train(gBf16, 4, dir, "", nullptr, remainders);
  ASSERT_EQ(tail.steps.size(), 2u);
  std::string why;
  EXPECT_TRUE(continuesExactly(full, tail, why)) << why;
}

// The comparison above is able to fail: without the moments (as if the save
// dropped optim.safetensors' contents) the resumed run must differ.
TEST(Checkpoint, ResumingWithoutTheMomentsDiffers) {
  const std::string dir = tempDir("no_moments");
  Trained full = train(gPp2Vpp2, 6);
  train(gPp2Vpp2, 3, "", dir);
  Trained tail = train(gPp2Vpp2, 6, dir, "", [](ParameterState &state) {
    for (auto &m : state.adamM)
      std::fill(m.begin(), m.end(), 0.0f);
    for (auto &v : state.adamV)
      std::fill(v.begin(), v.end(), 0.0f);
  });
  std::string why;
  EXPECT_FALSE(continuesExactly(full, tail, why));
}

/// Loads `dir` into the PP1 artifact (or `artifact`) and returns the error.
std::string loadError(const std::string &dir, const std::string &artifactPath = gPp1) {
  std::string error;
  std::optional<Artifact> artifact = readArtifact(artifactPath, error);
  EXPECT_TRUE(artifact) << error;
  ParameterState state;
  int64_t iteration = 0;
  EXPECT_FALSE(loadCheckpoint(dir, *artifact, state, iteration, error));
  return error;
}

TEST(Checkpoint, RefusesCorruptTruncatedMissingAndForeignCheckpoints) {
  const std::string dir = tempDir("refusals");
  train(gPp1, 1, "", dir);
  const std::string folder = checkpointFolder(dir, 1);
  const std::string model = folder + "/model.safetensors", optim = folder + "/optim.safetensors";
  const std::string backup = tempDir("refusals_backup");
  std::filesystem::copy(folder, backup, std::filesystem::copy_options::recursive);
  auto restore = [&] {
    std::filesystem::remove_all(folder);
    std::filesystem::copy(backup, folder, std::filesystem::copy_options::recursive);
  };
  { // one flipped byte in the tensor data
    std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-100, std::ios::end);
    f.put('\x7f');
  }
  std::string error = loadError(dir);
  EXPECT_NE(error.find(model), std::string::npos) << error;
  EXPECT_NE(error.find("corrupt"), std::string::npos) << error;
  restore();
  std::filesystem::resize_file(optim, std::filesystem::file_size(optim) / 2);
  error = loadError(dir);
  EXPECT_NE(error.find(optim), std::string::npos) << error;
  EXPECT_NE(error.find("truncated"), std::string::npos) << error;
  restore();
  std::filesystem::remove(model);
  error = loadError(dir);
  EXPECT_NE(error.find(model + ": missing"), std::string::npos) << error;
  restore();
  { // an edited iteration in meta.json
    std::ifstream in(folder + "/meta.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    text.replace(text.find("\"iteration\": 1"), 14, "\"iteration\": 7");
    std::ofstream(folder + "/meta.json") << text;
  }
  error = loadError(dir);
  EXPECT_NE(error.find("meta.json: corrupt"), std::string::npos) << error;
  restore();
  error = loadError(dir, gOther);
  EXPECT_NE(error.find("saved for model tiny"), std::string::npos) << error;
  error = loadError(tempDir("nothing_here"));
  EXPECT_NE(error.find("no checkpoint there"), std::string::npos) << error;
  // Intact again: it loads.
  std::optional<Artifact> artifact = readArtifact(gPp1, error);
  ParameterState state;
  int64_t iteration = 0;
  EXPECT_TRUE(loadCheckpoint(dir, *artifact, state, iteration, error)) << error;
  EXPECT_EQ(iteration, 1);
}

// meta.json edited and resealed (its checksum recomputed, as anyone can):
// a missing or mistyped member, or a file name outside the folder, is one
// line, never an uncaught exception (libFuzzer found the missing
// "iteration": tests/fuzz/checkpoint_fuzz.cpp) nor a read of /dev/zero.
TEST(Checkpoint, RefusesResealedMalformedMeta) {
  const std::string dir = tempDir("resealed");
  train(gPp1, 1, "", dir);
  const std::string metaPath = checkpointFolder(dir, 1) + "/meta.json";
  std::ifstream in(metaPath);
  const nlohmann::json saved = nlohmann::json::parse(in);
  auto reseal = [&](nlohmann::json meta) {
    meta.erase("meta_xxh3");
    const std::string body = meta.dump();
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH3_64bits(body.data(), body.size()));
    meta["meta_xxh3"] = hex;
    std::ofstream(metaPath, std::ios::trunc) << meta.dump(1) + "\n";
  };
  auto resealAndLoad = [&](const nlohmann::json &meta) {
    reseal(meta);
    return loadError(dir);
  };
  nlohmann::json meta = saved;
  meta.erase("iteration");
  std::string error = resealAndLoad(meta);
  EXPECT_NE(error.find("malformed (no non-negative integer \"iteration\")"), std::string::npos) << error;
  meta = saved;
  meta["files"] = 5;
  error = resealAndLoad(meta);
  EXPECT_NE(error.find("no \"files\" object"), std::string::npos) << error;
  meta = saved;
  meta["files"]["../../../../../../dev/zero"] = {{"bytes", 1}, {"xxh3", "0"}};
  error = resealAndLoad(meta);
  EXPECT_NE(error.find("is not a plain name"), std::string::npos) << error;
  meta = saved;
  meta["files"]["model.safetensors"]["bytes"] = "212";
  error = resealAndLoad(meta);
  EXPECT_NE(error.find("needs \"bytes\" and \"xxh3\""), std::string::npos) << error;
  meta = saved;
  meta["format"] = 1;
  error = resealAndLoad(meta);
  EXPECT_NE(error.find("not an mhcc checkpoint"), std::string::npos) << error;
  // The reseal above is faithful: the saved members load again.
  reseal(saved);
  std::optional<Artifact> artifact = readArtifact(gPp1, error);
  ParameterState state;
  int64_t iteration = 0;
  EXPECT_TRUE(loadCheckpoint(dir, *artifact, state, iteration, error)) << error;
}

/// into's piece of a parameter = from's (the weights, or both moments),
/// named in into's list of pieces.
void holdPiece(const ParamInfo &info, size_t p, const TensorPiece &piece, const ParameterState &from,
               ParameterState &into, bool moments) {
  auto copy = [&](const std::vector<float> &source, std::vector<float> &target) {
    scatterPiece(info, piece, gatherPiece(info, piece, source.data()).data(), target);
  };
  if (moments) {
    copy(from.adamM[p], into.adamM[p]);
    copy(from.adamV[p], into.adamV[p]);
    into.momentPieces[p].push_back(piece);
  } else {
    copy(from.weights[p], into.weights[p]);
    into.weightPieces[p].push_back(piece);
  }
}

/// What rank `rank` of two processes would hold of `whole`: tensor rank
/// `rank`'s block of each weight that splits over tp 2 (rank 0 the others
/// whole), and half of every moment (of both blocks where split), as pieces.
ParameterState processShare(const Artifact &a, const ParameterState &whole, int64_t rank, int &splitTensors) {
  ParameterState share;
  share.clear(a.params.size());
  for (size_t p = 0; p < a.params.size(); ++p) {
    const ParamInfo &info = a.params[p];
    const bool split = splitProblem(info, 2).empty() && shardCount(info, 2) < info.count();
    const int64_t tp = split ? 2 : 1, block = shardCount(info, tp), half = block / 2;
    splitTensors += split;
    if (split || rank == 0)
      holdPiece(info, p, {tp, split ? rank : 0, 0, block}, whole, share, false);
    for (int64_t t = 0; t < tp; ++t)
      if (const TensorPiece piece{tp, t, rank == 0 ? 0 : half, rank == 0 ? half : block}; piece.begin < piece.end)
        holdPiece(info, p, piece, whole, share, true);
  }
  return share;
}

bool sameState(const ParameterState &x, const ParameterState &y, std::string &why) {
  for (auto [a, b] : {std::pair{&x.weights, &y.weights}, {&x.adamM, &y.adamM}, {&x.adamV, &y.adamV}})
    for (size_t p = 0; p < a->size(); ++p)
      if ((*a)[p].size() != (*b)[p].size() || std::memcmp((*a)[p].data(), (*b)[p].data(), (*a)[p].size() * 4) != 0)
        return why = "parameter " + std::to_string(p), false;
  return true;
}

TEST(Checkpoint, TwoProcessesPiecesLoadAsTheWholeState) {
  std::unique_ptr<Trainer> trainer = makeTrainer(gPp1);
  ASSERT_TRUE(trainer);
  std::string error;
  ASSERT_TRUE(trainer->step(error)) << error;
  ParameterState whole;
  ASSERT_TRUE(trainer->saveState(whole, error)) << error;
  const Artifact &a = trainer->artifact();
  int splitTensors = 0;
  const ParameterState share0 = processShare(a, whole, 0, splitTensors), share1 = processShare(a, whole, 1, splitTensors);
  ASSERT_GT(splitTensors, 0); // the model has tensor-split weights: the blocks are exercised
  auto saveBoth = [&](const std::string &dir, const ParameterState &second, const ParameterState *first = nullptr) {
    std::string why;
    EXPECT_TRUE(saveCheckpoint(dir, 1, a, TrainOptions(), second, {1, 2, 10}, why)) << why; // rank 1 first: rank 0 waits for it
    EXPECT_TRUE(saveCheckpoint(dir, 1, a, TrainOptions(), first ? *first : share0, {0, 2, 10}, why)) << why;
  };
  auto load = [&](const std::string &dir, ParameterState &state) {
    int64_t iteration = 0;
    return loadCheckpoint(dir, a, state, iteration, error);
  };
  const std::string dir = tempDir("pieces");
  saveBoth(dir, share1);
  { // rank 1's files hold pieces, listed with their places
    std::map<std::string, SafetensorsTensor> tensors;
    std::map<std::string, std::string> metadata;
    ASSERT_TRUE(readSafetensors(checkpointFolder(dir, 1) + "/optim-rank1.safetensors", tensors, metadata, error))
        << error;
    EXPECT_NE(metadata["mhcc_pieces"].find("\"tensor_rank\":1"), std::string::npos) << metadata["mhcc_pieces"];
    EXPECT_FALSE(tensors.count(a.params[0].name + ".exp_avg")); // no whole moment there
  }
  ParameterState loaded;
  ASSERT_TRUE(load(dir, loaded)) << error;
  std::string why;
  EXPECT_TRUE(sameState(whole, loaded, why)) << why;

  // A piece missing, or held twice: refused, naming the tensor.
  ParameterState lacking = share1;
  const size_t p = a.params.size() - 1;
  lacking.momentPieces[p].clear();
  lacking.adamM[p].clear();
  lacking.adamV[p].clear();
  const std::string missing = tempDir("pieces_missing");
  saveBoth(missing, lacking);
  EXPECT_FALSE(load(missing, loaded));
  EXPECT_NE(error.find("the pieces of '" + a.params[p].name + ".exp_avg' do not make up"), std::string::npos) << error;
  EXPECT_NE(error.find("in no piece"), std::string::npos) << error;
  ParameterState doubled = share1; // rank 1 holds one element of rank 0's part too
  TensorPiece overlap = share1.momentPieces[p].front();
  ASSERT_GT(overlap.begin, 0);
  overlap.begin -= 1;
  doubled.momentPieces[p].push_back(overlap);
  doubled.adamM[p] = whole.adamM[p];
  doubled.adamV[p] = whole.adamV[p];
  const std::string twice = tempDir("pieces_twice");
  saveBoth(twice, doubled);
  EXPECT_FALSE(load(twice, loaded));
  EXPECT_NE(error.find("in two pieces"), std::string::npos) << error;
  // A tp no tensor splits over (3 tp would overflow): refused, not allocated.
  ParameterState absurd0 = share0, absurd1 = share1;
  for (ParameterState *absurd : {&absurd0, &absurd1})
    for (size_t q = 0; q < a.params.size(); ++q)
      for (TensorPiece &piece : absurd->weightPieces[q])
        if (piece.tp == 2)
          piece.tp = 6148914691236517206;
  const std::string huge = tempDir("pieces_huge_tp");
  saveBoth(huge, absurd1, &absurd0);
  EXPECT_FALSE(load(huge, loaded));
  EXPECT_NE(error.find("tensor ranks, which its shape does not allow"), std::string::npos) << error;
  doubled.momentPieces[p].back() = share0.momentPieces[p].front(); // now rank 1 holds all of it, rank 0 a piece
  const std::string both = tempDir("pieces_both");
  saveBoth(both, doubled);
  EXPECT_FALSE(load(both, loaded));
  EXPECT_NE(error.find("both whole and in pieces"), std::string::npos) << error;

  // One process holding every rank's pieces writes whole tensors, and
  // refuses a state its ranks left incomplete.
  ParameterState together = share0;
  for (size_t q = 0; q < a.params.size(); ++q) {
    for (const TensorPiece &piece : share1.weightPieces[q])
      holdPiece(a.params[q], q, piece, share1, together, false);
    for (const TensorPiece &piece : share1.momentPieces[q])
      holdPiece(a.params[q], q, piece, share1, together, true);
  }
  const std::string single = tempDir("pieces_single");
  ASSERT_TRUE(saveCheckpoint(single, 1, a, TrainOptions(), together, {}, error)) << error;
  std::map<std::string, SafetensorsTensor> tensors;
  std::map<std::string, std::string> metadata;
  ASSERT_TRUE(readSafetensors(checkpointFolder(single, 1) + "/optim.safetensors", tensors, metadata, error)) << error;
  EXPECT_TRUE(tensors.count(a.params[0].name + ".exp_avg"));
  EXPECT_FALSE(metadata.count("mhcc_pieces"));
  ASSERT_TRUE(load(single, loaded)) << error;
  EXPECT_TRUE(sameState(whole, loaded, why)) << why;
  EXPECT_FALSE(saveCheckpoint(tempDir("pieces_incomplete"), 1, a, TrainOptions(), share0, {}, error));
  EXPECT_NE(error.find("internal: the ranks' state of"), std::string::npos) << error;
}

} // namespace
} // namespace mhcc::runtime

int main(int argc, char **argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s DATA PP1 PP2_VPP2 PP4_VPP2 OTHER_MODEL BF16_PP1\n", argv[0]);
    return 2;
  }
  using namespace mhcc::runtime;
  gData = argv[1];
  gPp1 = argv[2];
  gPp2Vpp2 = argv[3];
  gPp4Vpp2 = argv[4];
  gOther = argv[5];
  gBf16 = argv[6];
  return RUN_ALL_TESTS();
}
