// The data readers (byte text, Megatron indexed datasets), deterministic
// sampling, and the artifact's encode / decode / validation.
#include "runtime/artifact/Artifact.h"
#include "runtime/data/Dataset.h"
#include "runtime/train/Trainer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>


#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>

namespace mhcc::runtime {
namespace {

std::string tempPath(const std::string &name) {
  const char *dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

TEST(Dataset, IndexedDatasetRoundTripsEveryDtype) {
  std::vector<std::vector<int32_t>> docs = {{1, 2, 3}, {250, 7}, {}, {9, 9, 9, 9}};
  std::vector<int32_t> flat = {1, 2, 3, 250, 7, 9, 9, 9, 9};
  for (int code : {1, 4, 8}) {
    std::string prefix = tempPath("docs" + std::to_string(code)), error;
    ASSERT_TRUE(writeIndexedDataset(prefix, docs, code, error)) << error;
    std::optional<TokenDataset> data = TokenDataset::open(prefix, error);
    ASSERT_TRUE(data) << error;
    ASSERT_EQ(data->size(), flat.size());
    std::vector<int32_t> tokens(1), labels(1);
    // Every window of one token starts somewhere in the stream.
    for (int64_t step = 0; step < 20; ++step) {
      data->sample(1, step, 0, 1, 1, tokens.data(), labels.data());
      auto it = std::search(flat.begin(), flat.end(), tokens.begin(), tokens.end());
      ASSERT_NE(it, flat.end());
    }
  }
}

// A .bin whose sequences tile it in index order (what Megatron and mhc-prep
// write) is mapped, ids read in their stored dtype; sequences listed in
// another order are copied in, in index order. Both give the listed stream,
// and a mapped int32 id outside int32's ids is refused as a copied one is.
TEST(Dataset, TiledBinsAreMappedOthersCopiedInIndexOrder) {
  std::vector<std::vector<int32_t>> docs = {{1, 2, 3}, {250, 7}, {9, 9, 9, 9}};
  std::vector<int32_t> flat = {1, 2, 3, 250, 7, 9, 9, 9, 9};
  auto stream = [](const TokenDataset &d) {
    std::vector<int32_t> all(d.size());
    for (size_t i = 0; i < d.size(); ++i)
      all[i] = d.token(i);
    return all;
  };
  for (int code : {1, 4, 8}) {
    std::string prefix = tempPath("tiled" + std::to_string(code)), error;
    ASSERT_TRUE(writeIndexedDataset(prefix, docs, code, error)) << error;
    std::optional<TokenDataset> data = TokenDataset::open(prefix, error);
    ASSERT_TRUE(data) << error;
    EXPECT_TRUE(data->mapped()) << "dtype " << code;
    EXPECT_EQ(stream(*data), flat) << "dtype " << code;
  }
  // Swap the first two sequences' pointers: the index lists {250, 7} first.
  std::string prefix = tempPath("reordered"), error;
  ASSERT_TRUE(writeIndexedDataset(prefix, docs, 4, error)) << error;
  std::fstream idx(prefix + ".idx", std::ios::in | std::ios::out | std::ios::binary);
  const int64_t header = 9 + 8 + 1 + 8 + 8;
  int32_t lengths[3];
  int64_t offsets[3];
  idx.seekg(header);
  idx.read(reinterpret_cast<char *>(lengths), sizeof lengths);
  idx.read(reinterpret_cast<char *>(offsets), sizeof offsets);
  std::swap(lengths[0], lengths[1]);
  std::swap(offsets[0], offsets[1]);
  idx.seekp(header);
  idx.write(reinterpret_cast<const char *>(lengths), sizeof lengths);
  idx.write(reinterpret_cast<const char *>(offsets), sizeof offsets);
  idx.close();
  std::optional<TokenDataset> data = TokenDataset::open(prefix, error);
  ASSERT_TRUE(data) << error;
  EXPECT_FALSE(data->mapped());
  EXPECT_EQ(stream(*data), (std::vector<int32_t>{250, 7, 1, 2, 3, 9, 9, 9, 9}));
  // A negative int32 id in a mapped .bin.
  std::string bad = tempPath("negative");
  ASSERT_TRUE(writeIndexedDataset(bad, {{1, 2, 3}}, 4, error)) << error;
  std::fstream bin(bad + ".bin", std::ios::in | std::ios::out | std::ios::binary);
  const int32_t negative = -5;
  bin.seekp(4);
  bin.write(reinterpret_cast<const char *>(&negative), 4);
  bin.close();
  EXPECT_FALSE(TokenDataset::open(bad, error));
  EXPECT_NE(error.find("holds the invalid token -5"), std::string::npos) << error;
}

// A blend draws each sequence from one dataset with probability weight /
// total (4000 sequences: within 0.03 of 0.75, 6 standard deviations), the
// same draws on a repeat; "W1 P1 W2 P2" opens one, and bad lists are refused.
TEST(Dataset, BlendsMixDatasetsByWeight) {
  TokenDataset a(std::vector<int32_t>(1000, 1), "a"), b(std::vector<int32_t>(1000, 2), "b");
  TokenDataset blend = TokenDataset::blend({{0.5, a}, {1.5, b}}, "blend");
  EXPECT_EQ(blend.size(), 2000u);
  std::vector<int32_t> tokens(4000 * 4), labels(tokens.size()), again(tokens.size());
  for (int64_t mb = 0; mb < 40; ++mb) {
    blend.sample(7, 3, mb, 4, 100, tokens.data() + mb * 400, labels.data() + mb * 400);
    blend.sample(7, 3, mb, 4, 100, again.data() + mb * 400, labels.data() + mb * 400);
  }
  EXPECT_EQ(tokens, again);
  int64_t fromB = 0;
  for (size_t s = 0; s < 4000; ++s) {
    EXPECT_EQ(tokens[s * 4], tokens[s * 4 + 3]) << "a sequence mixes datasets";
    fromB += tokens[s * 4] == 2;
  }
  EXPECT_NEAR(double(fromB) / 4000, 0.75, 0.03);

  std::string pathA = tempPath("blend_a.txt"), pathB = tempPath("blend_b.txt"), error;
  std::ofstream(pathA) << std::string(500, 'a');
  std::ofstream(pathB) << std::string(700, 'b');
  std::optional<TokenDataset> opened = TokenDataset::open("0.25 " + pathA + " 0.75 " + pathB, error);
  ASSERT_TRUE(opened) << error;
  EXPECT_EQ(opened->size(), 1200u);
  EXPECT_EQ(opened->check(256, 16), "");
  opened->setSplit(9, 1); // each dataset's last tenth validates
  EXPECT_TRUE(opened->hasValidation());
  EXPECT_FALSE(TokenDataset::open("0.25 " + pathA + " 0.75", error));
  EXPECT_NE(error.find("the last weight has no path"), std::string::npos) << error;
  EXPECT_FALSE(TokenDataset::open("0 " + pathA + " 1 " + pathB, error));
  EXPECT_NE(error.find("is not a positive number"), std::string::npos) << error;
  EXPECT_FALSE(TokenDataset::open("1 " + pathA + " 1 " + pathA + ".missing", error));
  EXPECT_NE(error.find("cannot open the data file"), std::string::npos) << error;
}

// --split cuts an indexed dataset at a document start (Megatron splits
// documents): 9 tokens in documents starting at 0, 3, 7 split 50:50 cut at
// 7, not at token 4, so validation holds only the last document.
TEST(Dataset, SplitsIndexedDatasetsAtDocumentStarts) {
  std::string prefix = tempPath("split_docs"), error;
  ASSERT_TRUE(writeIndexedDataset(prefix, {{1, 2, 3}, {4, 5, 6, 7}, {8, 9}}, 4, error)) << error;
  std::optional<TokenDataset> data = TokenDataset::open(prefix, error);
  ASSERT_TRUE(data) << error;
  data->setSplit(50, 50);
  ASSERT_TRUE(data->hasValidation());
  int32_t token = 0, label = 0;
  for (int64_t step = 0; step < 10; ++step) {
    data->sample(3, step, 0, 1, 1, &token, &label, true);
    EXPECT_EQ(token, 8);
    EXPECT_EQ(label, 9);
    data->sample(3, step, 0, 1, 1, &token, &label, false);
    EXPECT_LT(token, 7) << "a training window reaches the validation document";
  }
  // A text file has no documents: the token cut stands.
  TokenDataset text(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, "text");
  text.setSplit(50, 50);
  text.sample(3, 0, 0, 1, 1, &token, &label, true);
  EXPECT_GE(token, 6);
}

TEST(Dataset, RejectsBadIndexFiles) {
  std::string prefix = tempPath("bad"), error;
  std::ofstream(prefix + ".idx") << "NOTMMIDIDX-------------------------------";
  std::ofstream(prefix + ".bin") << "x";
  EXPECT_FALSE(TokenDataset::open(prefix, error));
  EXPECT_NE(error.find("not a Megatron indexed dataset"), std::string::npos) << error;
  // A valid index whose pointers run past the .bin file.
  ASSERT_TRUE(writeIndexedDataset(prefix, {{1, 2, 3, 4}}, 4, error));
  std::ofstream(prefix + ".bin", std::ios::trunc) << "ab";
  EXPECT_FALSE(TokenDataset::open(prefix, error));
  EXPECT_NE(error.find("lies outside the file"), std::string::npos) << error;
}

// A document count whose 8-byte entries wrap the size sum to a small number
// (2^61 * 8 = 0 mod 2^64) passed the truncation check.
TEST(Dataset, RejectsADocumentCountThatWrapsTheSizeCheck) {
  std::string prefix = tempPath("wrap"), error;
  ASSERT_TRUE(writeIndexedDataset(prefix, {{1, 2, 3, 4}}, 4, error)) << error;
  std::fstream idx(prefix + ".idx", std::ios::in | std::ios::out | std::ios::binary);
  const uint64_t docs = uint64_t(1) << 61;
  idx.seekp(9 + 8 + 1 + 8); // magic, version, dtype, sequence count
  idx.write(reinterpret_cast<const char *>(&docs), 8);
  idx.close();
  EXPECT_FALSE(TokenDataset::open(prefix, error));
  EXPECT_NE(error.find("truncated"), std::string::npos) << error;
}

// Sequences that overlap can list the .bin once per index entry: memory
// without bound for a small pair of files (found by tests/fuzz/dataset_fuzz.cpp).
TEST(Dataset, RejectsOverlappingSequences) {
  std::string prefix = tempPath("overlap"), error;
  ASSERT_TRUE(writeIndexedDataset(prefix, {{1, 2}, {3, 4}}, 4, error)) << error;
  std::fstream idx(prefix + ".idx", std::ios::in | std::ios::out | std::ios::binary);
  const int32_t length = 4; // each sequence claims the whole 4-token .bin
  const int64_t offset = 0;
  idx.seekp(9 + 8 + 1 + 8 + 8);
  idx.write(reinterpret_cast<const char *>(&length), 4);
  idx.write(reinterpret_cast<const char *>(&length), 4);
  idx.write(reinterpret_cast<const char *>(&offset), 8);
  idx.write(reinterpret_cast<const char *>(&offset), 8);
  idx.close();
  EXPECT_FALSE(TokenDataset::open(prefix, error));
  EXPECT_NE(error.find("list more tokens than"), std::string::npos) << error;
}

TEST(Dataset, PackedWindowsKnowTheirDocuments) {
  // Token = 1000 x document + offset in it, so each sampled token says
  // where its document starts; lengths 1 to 13, some shorter than a window.
  std::vector<std::vector<int32_t>> docs;
  for (int32_t d = 0; d < 60; ++d) {
    docs.emplace_back();
    for (int32_t k = 0; k < 1 + (d * 5) % 13; ++k)
      docs.back().push_back(1000 * d + k);
  }
  const std::string prefix = tempPath("packed_docs");
  std::string error;
  ASSERT_TRUE(writeIndexedDataset(prefix, docs, 4, error)) << error;
  std::optional<TokenDataset> data = TokenDataset::open(prefix, error);
  ASSERT_TRUE(data) << error;
  EXPECT_TRUE(data->hasDocuments());
  EXPECT_FALSE(TokenDataset(std::vector<int32_t>(100, 1)).hasDocuments()); // a text stream is one document
  constexpr int64_t kSeq = 16, kBatch = 4;
  std::vector<int32_t> tokens(kSeq * kBatch), labels(tokens.size()), positions(tokens.size()),
      firstKeys(tokens.size()), plain(tokens.size());
  int64_t restarts = 0;
  for (int64_t mb = 0; mb < 20; ++mb) {
    data->sample(3, 1, mb, kSeq, kBatch, {tokens.data(), labels.data(), positions.data(), firstKeys.data()});
    data->sample(3, 1, mb, kSeq, kBatch, plain.data(), labels.data());
    EXPECT_EQ(tokens, plain) << "documents change which tokens are drawn";
    for (int64_t t = 0; t < kSeq * kBatch; ++t) {
      const int64_t inSequence = t % kSeq, offsetInDocument = tokens[t] % 1000;
      // A document cut by the window's start begins at position 0 (Megatron).
      EXPECT_EQ(positions[t], std::min(offsetInDocument, inSequence)) << "token " << t;
      EXPECT_EQ(firstKeys[t], inSequence - positions[t]) << "token " << t;
      restarts += inSequence > 0 && positions[t] == 0;
    }
  }
  EXPECT_GT(restarts, 20); // windows do cross document starts
}

TEST(Dataset, SamplingIsDeterministicAndSeedDependent) {
  std::vector<int32_t> stream(5000);
  for (size_t i = 0; i < stream.size(); ++i)
    stream[i] = static_cast<int32_t>((i * 7919) % 256);
  TokenDataset data(stream);
  std::vector<int32_t> a(64), b(64), c(64), la(64), lb(64), lc(64);
  data.sample(5, 3, 1, 32, 2, a.data(), la.data());
  data.sample(5, 3, 1, 32, 2, b.data(), lb.data());
  data.sample(6, 3, 1, 32, 2, c.data(), lc.data());
  EXPECT_EQ(a, b);
  EXPECT_EQ(la, lb);
  EXPECT_NE(a, c);
  // Labels are the next tokens.
  for (int t = 0; t + 1 < 32; ++t)
    EXPECT_EQ(la[t], a[t + 1]);
  EXPECT_EQ(data.check(256, 32), "");
  EXPECT_NE(data.check(100, 32).find("does not fit the model's vocabulary of 100"), std::string::npos);
}

Artifact smallArtifact() {
  Artifact a;
  a.model = {"m", 16, 8, 2, 24, 4, 1, 1, 3, 0.01, 1e-6, "f32", 7};
  a.params = {{"embed.weight", 16, 8, "normal", 0.02, true}};
  StageProgram p;
  p.values = {{4, 8, "embed"}, {4, 8, "grad:embed"}};
  ForwardInstr embed;
  embed.op = Prim::Embed;
  embed.params = {0};
  embed.output = 0;
  embed.seqLen = 4;
  p.forward = {embed};
  p.params = {{0, 0}};
  a.stages = {p};
  // One microbatch: FWD, BWD, OPTIM (what the validator requires of a rank).
  a.ranks = {{Instr{OpKind::Forward, 0, 0}, Instr{OpKind::Backward, 0, 0}, Instr{}}};
  a.ranks[0][2].kind = OpKind::Optimizer;
  a.ir = "module {}";
  return a;
}

TEST(Artifact, EncodeDecodeRoundTrip) {
  Artifact a = smallArtifact();
  std::string error;
  std::optional<Artifact> b = decodeArtifact(encodeArtifact(a), error);
  ASSERT_TRUE(b) << error;
  EXPECT_EQ(encodeArtifact(*b), encodeArtifact(a));
  EXPECT_EQ(b->params[0].name, "embed.weight");
  EXPECT_EQ(b->stages[0].forward[0].op, Prim::Embed);
  EXPECT_FALSE(b->recomputeSublayers);
  // Activation recomputation is written only when on, so artifacts without
  // it are encoded as they were before it existed; the checksum of what was
  // read comes back with it.
  EXPECT_EQ(encodeArtifact(a).find("recompute_sublayers"), std::string::npos);
  a.recomputeSublayers = true;
  std::optional<Artifact> c = decodeArtifact(encodeArtifact(a), error);
  ASSERT_TRUE(c) << error;
  EXPECT_TRUE(c->recomputeSublayers);
  EXPECT_NE(c->checksum, 0u);
  EXPECT_NE(c->checksum, b->checksum);
}

// An edited, resealed payload whose integer member holds a float: 3.3e40
// into an int64_t was undefined behaviour in the JSON library's cast (found
// by tests/fuzz/artifact_fuzz.cpp under UBSan) and 2.5 silently became 2.
TEST(Artifact, IntegerMembersTakeOnlyIntegersInRange) {
  const std::string bytes = encodeArtifact(smallArtifact());
  auto decodeEdited = [&](const char *key, const nlohmann::json &value, std::string &error) {
    nlohmann::json payload = nlohmann::json::parse(bytes.substr(32));
    payload["pipeline"][key] = value;
    const std::string text = payload.dump();
    std::string resealed = bytes.substr(0, 16);
    const uint64_t size = text.size(), sum = XXH3_64bits(text.data(), text.size());
    resealed.append(reinterpret_cast<const char *>(&size), 8);
    resealed.append(reinterpret_cast<const char *>(&sum), 8);
    return decodeArtifact(resealed + text, error).has_value();
  };
  std::string error;
  ASSERT_TRUE(decodeEdited("microbatches", smallArtifact().microbatches, error)) << error; // the reseal is faithful
  EXPECT_FALSE(decodeEdited("microbatches", 3.3e40, error));
  EXPECT_NE(error.find("microbatches: 3.3e+40 is not an integer in range"), std::string::npos) << error;
  EXPECT_FALSE(decodeEdited("microbatches", 2.5, error));
  EXPECT_NE(error.find("microbatches: 2.5 is not an integer in range"), std::string::npos) << error;
  EXPECT_FALSE(decodeEdited("pp", 18446744073709551615ull, error));
  EXPECT_NE(error.find("pp: 18446744073709551615 is not an integer"), std::string::npos) << error;
  // The mesh: an integer, and a world the validation allows.
  EXPECT_FALSE(decodeEdited("dp", 2.5, error));
  EXPECT_NE(error.find("dp: 2.5 is not an integer in range"), std::string::npos) << error;
  EXPECT_FALSE(decodeEdited("dp", 0, error));
  EXPECT_NE(error.find("bad rank mesh (dp = 0"), std::string::npos) << error;
}

TEST(Artifact, DeviceCodeRoundTripsEveryByteAndIsChecked) {
  Artifact a = smallArtifact();
  DeviceCode code;
  code.arch = "sm_90";
  code.compiler = "nvcc release 13.0";
  code.streams = a.model.streams;
  code.sinkhornIterations = a.model.sinkhornIterations;
  code.source = "constexpr int kStreams = 1;";
  for (int length : {0, 1, 2, 3, 256, 257}) { // every base64 padding case
    code.image.clear();
    for (int i = 0; i < length; ++i)
      code.image += char(i * 37 % 256);
    if (code.image.empty())
      code.image = std::string(1, '\0');
    a.deviceCode = code;
    std::string error;
    std::optional<Artifact> b = decodeArtifact(encodeArtifact(a), error);
    ASSERT_TRUE(b) << error;
    ASSERT_TRUE(b->deviceCode);
    EXPECT_EQ(b->deviceCode->image, code.image) << length << " bytes";
    EXPECT_EQ(b->deviceCode->source, code.source);
    EXPECT_EQ(b->deviceCode->arch, "sm_90");
  }
  Artifact wrongStreams = a;
  wrongStreams.deviceCode->streams = a.model.streams + 1;
  EXPECT_NE(validateArtifact(wrongStreams).find("the CUDA kernels were generated for n = "), std::string::npos)
      << validateArtifact(wrongStreams);
  Artifact noImage = a;
  noImage.deviceCode->image.clear();
  EXPECT_NE(validateArtifact(noImage).find("no image"), std::string::npos) << validateArtifact(noImage);
  // Without kernels (--cuda-arch none): decodes, and says so.
  Artifact none = a;
  none.deviceCode.reset();
  std::string error;
  std::optional<Artifact> c = decodeArtifact(encodeArtifact(none), error);
  ASSERT_TRUE(c) << error;
  EXPECT_FALSE(c->deviceCode);
}

TEST(Artifact, ValidationCatchesBadIndicesAndShapes) {
  Artifact a = smallArtifact();
  EXPECT_EQ(validateArtifact(a), "");
  Artifact badValue = a;
  badValue.stages[0].forward[0].output = 9;
  EXPECT_NE(validateArtifact(badValue).find("the output names no value"), std::string::npos);
  Artifact badShape = a;
  badShape.params[0].cols = 9;
  EXPECT_NE(validateArtifact(badShape).find("expected [16 x 8]"), std::string::npos)
      << validateArtifact(badShape);
  Artifact badRank = a;
  badRank.ranks.push_back({});
  EXPECT_NE(validateArtifact(badRank).find("2 rank lists for pp = 1"), std::string::npos);
  std::string error;
  EXPECT_FALSE(decodeArtifact(encodeArtifact(badValue), error));
  EXPECT_NE(error.find("inconsistent artifact"), std::string::npos) << error;
}

TEST(Artifact, ValidationMatchesEveryReceiveWithASend) {
  // A compiled PP2 artifact whose rank 1 expects its two messages swapped.
  const char *path = std::getenv("PP2_ARTIFACT");
  ASSERT_NE(path, nullptr);
  std::string error;
  std::optional<Artifact> artifact = readArtifact(path, error);
  ASSERT_TRUE(artifact) << error;
  EXPECT_EQ(validateArtifact(*artifact), "");
  std::vector<Instr *> receives;
  for (Instr &i : artifact->ranks[1])
    if (i.kind == OpKind::Recv)
      receives.push_back(&i);
  ASSERT_GE(receives.size(), 2u);
  std::swap(receives[0]->mb, receives[1]->mb);
  EXPECT_NE(validateArtifact(*artifact).find("rank 1's receive #0 from rank 0 matches no send in order"),
            std::string::npos)
      << validateArtifact(*artifact);
  artifact->ranks[1].erase(std::find_if(artifact->ranks[1].begin(), artifact->ranks[1].end(),
                                        [](const Instr &i) { return i.kind == OpKind::Recv; }));
  EXPECT_NE(validateArtifact(*artifact), "");
}

/// The first instruction of `kind` in `list`.
std::vector<Instr>::iterator firstOf(std::vector<Instr> &list, OpKind kind) {
  return std::find_if(list.begin(), list.end(), [kind](const Instr &i) { return i.kind == kind; });
}

/// The compiled artifact the environment variable names (the test's data),
/// or nullopt with `error` set.
std::optional<Artifact> artifactFromEnv(const char *variable, std::string &error) {
  const char *path = std::getenv(variable);
  if (!path) {
    error = std::string(variable) + " is not set";
    return std::nullopt;
  }
  return readArtifact(path, error);
}

TEST(Artifact, ValidationChecksWhatEachRankComputes) {
  // Edits of a compiled PP2 artifact that keep every index valid (as a
  // resealed artifact would) but break what the executor assumes.
  std::string error;
  std::optional<Artifact> original = artifactFromEnv("PP2_ARTIFACT", error);
  ASSERT_TRUE(original) << error;
  auto problemAfter = [&](const std::function<void(Artifact &)> &edit) {
    Artifact a = *original;
    edit(a);
    return validateArtifact(a);
  };
  EXPECT_NE(problemAfter([](Artifact &a) { a.ranks[0].erase(firstOf(a.ranks[0], OpKind::Forward)); })
                .find("comes before its FWD"),
            std::string::npos);
  EXPECT_NE(problemAfter([](Artifact &a) {
              a.ranks[0].erase(firstOf(a.ranks[0], OpKind::Backward));
            }).find("is not computed exactly once (1 FWD, 0 BWD"),
            std::string::npos);
  EXPECT_NE(problemAfter([](Artifact &a) {
              auto bwd = firstOf(a.ranks[1], OpKind::Backward);
              a.ranks[1].insert(bwd, *bwd);
            }).find("runs a second time"),
            std::string::npos);
  EXPECT_NE(problemAfter([](Artifact &a) {
              auto fwd = firstOf(a.ranks[0], OpKind::Forward);
              Instr bwd = *firstOf(a.ranks[0], OpKind::Backward);
              a.ranks[0].insert(fwd, bwd);
            }).find("comes before its FWD"),
            std::string::npos);
  EXPECT_NE(problemAfter([](Artifact &a) {
              auto free = firstOf(a.ranks[0], OpKind::Free);
              free->mb = a.microbatches - 1; // its output is sent only later
            }).find("frees an output that was never sent"),
            std::string::npos);
  EXPECT_NE(problemAfter([](Artifact &a) { a.ranks[1].pop_back(); }).find("one OPTIM"), std::string::npos);
  EXPECT_NE(problemAfter([](Artifact &a) { a.ranks[1].clear(); }), "");
  EXPECT_EQ(problemAfter([](Artifact &) {}), "");
}

TEST(Artifact, ValidationChecksTheResidualStreamsStorage) {
  // tiny_bf16 with an fp32 residual: the expand, post-res and residual
  // outputs must be stored as the model's residual_dtype says, and only such
  // an artifact is written as format 3.
  std::string error;
  std::optional<Artifact> a = artifactFromEnv("RES32_ARTIFACT", error);
  ASSERT_TRUE(a) << error;
  ASSERT_EQ(a->model.residualStorage(), "f32");
  EXPECT_EQ(validateArtifact(*a), "");
  EXPECT_EQ(artifactVersionOf(*a), 3u);
  std::optional<Artifact> decoded = decodeArtifact(encodeArtifact(*a), error);
  ASSERT_TRUE(decoded) << error;
  EXPECT_EQ(decoded->model.residualStorage(), "f32");
  Artifact rounded = *a;
  StageProgram &p = rounded.stages[0];
  int postRes = -1;
  for (const ForwardInstr &f : p.forward)
    if (f.op == Prim::MhcPostRes && postRes < 0)
      postRes = f.output;
  ASSERT_GE(postRes, 0);
  p.values[postRes].dtype = "bf16";
  EXPECT_NE(validateArtifact(rounded).find("(the residual stream) is stored as 'bf16', but the model's residual dtype "
                                           "is 'f32'"),
            std::string::npos)
      << validateArtifact(rounded);
  Artifact forgotten = *a; // what a reader that ignores residual_dtype would see
  forgotten.model.residualDtype = "bf16";
  EXPECT_NE(validateArtifact(forgotten).find("stored as 'f32', but the model's residual dtype is 'bf16'"),
            std::string::npos)
      << validateArtifact(forgotten);
  EXPECT_EQ(artifactVersionOf(forgotten), 2u);
}

TEST(Artifact, ValidationChecksEachStagesGradientAllReduce) {
  // dp 2 x pp 2 x vpp 2: rank 0 reduces stage 2, then stage 0, each after its
  // last backward. Edits that keep every index valid but break that.
  std::string error;
  std::optional<Artifact> original = artifactFromEnv("DP2_VPP2_ARTIFACT", error);
  ASSERT_TRUE(original) << error;
  auto problemAfter = [&](const std::function<void(std::vector<Instr> &)> &edit) {
    Artifact a = *original;
    edit(a.ranks[0]);
    return validateArtifact(a);
  };
  std::vector<Instr> &list = original->ranks[0];
  ASSERT_EQ(std::count_if(list.begin(), list.end(), [](const Instr &i) { return i.kind == OpKind::AllReduce; }), 2);
  EXPECT_EQ(firstOf(list, OpKind::AllReduce)->stage, 2) << "the later chunk is reduced first";
  EXPECT_EQ(problemAfter([](std::vector<Instr> &) {}), "");
  EXPECT_NE(problemAfter([](std::vector<Instr> &l) { l.erase(firstOf(l, OpKind::AllReduce)); })
                .find("stage 2 needs one gradient ALLREDUCE before OPTIM, it has 0"),
            std::string::npos);
  EXPECT_NE(problemAfter([](std::vector<Instr> &l) {
              Instr reduce = *firstOf(l, OpKind::AllReduce);
              l.insert(firstOf(l, OpKind::Backward), reduce);
            }).find("comes before the backward of microbatch 0"),
            std::string::npos);
  EXPECT_NE(problemAfter([](std::vector<Instr> &l) {
              auto reduce = firstOf(l, OpKind::AllReduce);
              l.insert(reduce, *reduce);
            }).find("reduces the stage a second time"),
            std::string::npos);
  EXPECT_NE(problemAfter([](std::vector<Instr> &l) { firstOf(l, OpKind::AllReduce)->stage = 1; })
                .find("no stage of this rank"),
            std::string::npos);
  EXPECT_NE(problemAfter([](std::vector<Instr> &l) {
              // A backward of stage 2 moved behind its ALLREDUCE.
              auto reduce = firstOf(l, OpKind::AllReduce);
              auto last = std::find_if(std::make_reverse_iterator(reduce), l.rend(), [](const Instr &i) {
                            return i.kind == OpKind::Backward && i.stage == 2;
                          }).base() - 1;
              Instr bwd = *last;
              l.erase(last);
              l.insert(firstOf(l, OpKind::AllReduce) + 1, bwd);
            }).find("comes before the backward of microbatch"),
            std::string::npos);
}

TEST(Artifact, DistributedOptimizerReducesByReduceScatter) {
  std::string error;
  std::optional<Artifact> original = artifactFromEnv("DP2_VPP2_ARTIFACT", error);
  ASSERT_TRUE(original) << error;
  Artifact a = *original;
  a.distributedOptimizer = true;
  EXPECT_NE(validateArtifact(a).find("a whole-gradient ALLREDUCE under the distributed optimizer"), std::string::npos)
      << validateArtifact(a);
  for (std::vector<Instr> &list : a.ranks)
    for (Instr &i : list)
      if (i.kind == OpKind::AllReduce)
        i.collective = CollectiveOp::ReduceScatter;
  EXPECT_EQ(validateArtifact(a), "");
  EXPECT_EQ(firstOf(a.ranks[0], OpKind::AllReduce)->describe().rfind("REDUCESCATTER grads s2 dp [", 0), 0u);
  std::optional<Artifact> back = decodeArtifact(encodeArtifact(a), error);
  ASSERT_TRUE(back) << error;
  EXPECT_EQ(firstOf(back->ranks[1], OpKind::AllReduce)->collective, CollectiveOp::ReduceScatter);
  Artifact plain = *original;
  firstOf(plain.ranks[0], OpKind::AllReduce)->collective = CollectiveOp::ReduceScatter;
  EXPECT_NE(validateArtifact(plain).find("a REDUCESCATTER without the distributed optimizer"), std::string::npos);
}

TEST(Artifact, OptimizerPartsAreWholeStatisticsChunksOfTheGradientGroup) {
  Artifact a;
  a.dp = 2;
  a.cp = 3;
  a.tp = 2;
  a.pp = 2;
  EXPECT_EQ(a.optimizerParts(), 1);
  EXPECT_EQ(a.shardOf(1000, 0), (std::pair<int64_t, int64_t>{0, 1000}));
  a.distributedOptimizer = true;
  ASSERT_EQ(a.optimizerParts(), 6);
  for (int64_t count : {int64_t(1), int64_t(255), int64_t(4096), int64_t(65536 * 3 + 5), int64_t(40000000)}) {
    const int64_t chunk = Artifact::gradientChunk(count), chunks = (count + chunk - 1) / chunk;
    EXPECT_EQ(chunk % 256, 0);
    EXPECT_LE(chunks, 256) << count;
    int64_t at = 0, largest = 0;
    for (int64_t m = 0; m < a.optimizerParts(); ++m) {
      const auto [begin, end] = a.shardOf(count, m);
      EXPECT_EQ(begin, at) << "part " << m << " of " << count;
      EXPECT_EQ(begin % chunk, 0) << "part " << m << " of " << count;
      largest = std::max(largest, (end - begin + chunk - 1) / chunk);
      at = end;
    }
    EXPECT_EQ(at, count);
    EXPECT_LE(largest, (chunks + 5) / 6) << "parts of " << count << " differ by more than a chunk";
  }
  // Each member of a gradient group (replica x cp + context rank) updates its
  // part; with one process a rank, that member's pipeline and tensor rank 0.
  for (int64_t part = 0; part < 6; ++part) {
    const int64_t rank = a.optimizerPartRank(part);
    EXPECT_EQ(a.reduceMemberOf(rank), part);
    EXPECT_EQ(a.optimizerShardOf(rank), part);
    EXPECT_EQ(a.optimizerShardOf(rank + 1), -1) << "tensor rank 1 holds no part";
  }
}

TEST(Artifact, InitializationDependsOnNameAndSeedOnly) {
  ParamInfo w{"layer0.attn.w_qkv", 8, 24, "normal", 0.02, true};
  std::vector<float> a = initialParameter(w, 1), b = initialParameter(w, 1), c = initialParameter(w, 2);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  double mean = 0, var = 0;
  for (float v : a)
    mean += v / a.size();
  for (float v : a)
    var += (v - mean) * (v - mean) / a.size();
  EXPECT_NEAR(std::sqrt(var), 0.02, 0.004);
  ParamInfo xavier{"w_map", 32, 24, "xavier_uniform", 0.5, true};
  for (float v : initialParameter(xavier, 3))
    EXPECT_LE(std::abs(v), 0.5f);
  ParamInfo alpha{"alpha", 1, 3, "constant", 0.01, false};
  EXPECT_EQ(initialParameter(alpha, 3), std::vector<float>(3, 0.01f));
}

} // namespace
} // namespace mhcc::runtime
