// mhc-prep's library (issue 16): the dtype choice, IndexedWriter's bytes
// against the MMIDIDX layout and the runtime's reader for every dtype, the
// refusal of an id its dtype cannot hold, and that nothing reaches PREFIX
// before commit (an old dataset there stays as it was; abort leaves no file).
#include "runtime/data/Dataset.h"
#include "tools/prep/IndexedWriter.h"
#include "tools/prep/Prep.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <set>
#include <sstream>

namespace mhcc::prep {
namespace {

std::string tempFolder(const std::string &name) {
  const char *dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
  std::string command = "rm -rf '" + path + "' && mkdir -p '" + path + "'";
  EXPECT_EQ(std::system(command.c_str()), 0);
  return path;
}

std::set<std::string> filesIn(const std::string &folder) {
  std::set<std::string> names;
  if (DIR *d = ::opendir(folder.c_str())) {
    while (dirent *e = ::readdir(d))
      if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, ".."))
        names.insert(e->d_name);
    ::closedir(d);
  }
  return names;
}

std::string readAll(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

template <typename T> T at(const std::string &bytes, size_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

TEST(PrepDtype, SmallestMegatronDtypeForTheVocabulary) {
  EXPECT_STREQ(dtypeForVocab(1).name, "uint8");
  EXPECT_STREQ(dtypeForVocab(256).name, "uint8");
  EXPECT_STREQ(dtypeForVocab(257).name, "uint16");
  EXPECT_STREQ(dtypeForVocab(32000).name, "uint16");
  EXPECT_STREQ(dtypeForVocab(65499).name, "uint16");
  EXPECT_STREQ(dtypeForVocab(65500).name, "int32"); // Megatron's optimal_dtype cut-off
  EXPECT_STREQ(dtypeForVocab(128256).name, "int32");
  EXPECT_EQ(dtypeForVocab(256).code, 1);
  EXPECT_EQ(dtypeForVocab(300).code, 8);
  EXPECT_EQ(dtypeForVocab(100000).code, 4);
  EXPECT_FALSE(dtypeNamed("int64"));
  EXPECT_EQ(dtypeNamed("uint16")->max, 65535);
}

TEST(PrepWriter, WritesMMIDIDXThatTheRuntimeReadsForEveryDtype) {
  const std::string folder = tempFolder("writer");
  const std::vector<std::vector<int32_t>> docs = {{1, 2, 3}, {255, 0}, {7}, {9, 9, 9, 9}};
  for (const char *name : {"uint8", "uint16", "int32"}) {
    const Dtype dtype = *dtypeNamed(name);
    const std::string prefix = folder + "/" + name;
    IndexedWriter w;
    std::string error;
    ASSERT_TRUE(w.open(prefix, dtype, error)) << error;
    for (const auto &doc : docs)
      ASSERT_TRUE(w.addDocument(doc.data(), doc.size(), error)) << error;
    ASSERT_TRUE(w.commit(error)) << error;
    EXPECT_EQ(filesIn(folder).count(std::string(name) + ".bin"), 1u);

    const std::string idx = readAll(prefix + ".idx"), bin = readAll(prefix + ".bin");
    ASSERT_EQ(idx.size(), 34u + 4 * 4 + 4 * 8 + 5 * 8);
    EXPECT_EQ(std::memcmp(idx.data(), "MMIDIDX\0\0", 9), 0);
    EXPECT_EQ(at<uint64_t>(idx, 9), 1u);
    EXPECT_EQ(static_cast<unsigned char>(idx[17]), dtype.code);
    EXPECT_EQ(at<uint64_t>(idx, 18), 4u); // sequences
    EXPECT_EQ(at<uint64_t>(idx, 26), 5u); // document indices
    int64_t offset = 0;
    for (size_t s = 0; s < docs.size(); ++s) {
      EXPECT_EQ(at<int32_t>(idx, 34 + 4 * s), int32_t(docs[s].size()));
      EXPECT_EQ(at<int64_t>(idx, 34 + 16 + 8 * s), offset);
      offset += int64_t(docs[s].size()) * dtype.width;
    }
    for (size_t d = 0; d <= docs.size(); ++d)
      EXPECT_EQ(at<int64_t>(idx, 34 + 16 + 32 + 8 * d), int64_t(d));
    EXPECT_EQ(int64_t(bin.size()), offset);

    std::optional<runtime::TokenDataset> data = runtime::TokenDataset::fromIndexed(prefix, error);
    ASSERT_TRUE(data) << error;
    ASSERT_EQ(data->size(), 10u);
    std::vector<int32_t> tokens(9), labels(9);
    data->sample(0, 0, 0, 9, 1, tokens.data(), labels.data()); // the one window: the whole stream
    EXPECT_EQ(tokens, (std::vector<int32_t>{1, 2, 3, 255, 0, 7, 9, 9, 9}));
    EXPECT_EQ(labels.back(), 9);
  }
}

TEST(PrepWriter, RefusesAnIdItsDtypeCannotHold) {
  const std::string folder = tempFolder("range");
  std::string error;
  IndexedWriter w;
  ASSERT_TRUE(w.open(folder + "/d", *dtypeNamed("uint8"), error)) << error;
  const std::vector<int32_t> fits = {0, 255}, over = {3, 256}, negative = {-1};
  EXPECT_TRUE(w.addDocument(fits.data(), fits.size(), error)) << error;
  EXPECT_FALSE(w.addDocument(over.data(), over.size(), error));
  EXPECT_EQ(error, "token id 256 does not fit the dtype uint8 (0 to 255)");
  EXPECT_FALSE(w.addDocument(negative.data(), negative.size(), error));
  EXPECT_EQ(w.documents(), 1); // the refused documents left nothing
  EXPECT_EQ(w.tokens(), 2);
  IndexedWriter w16;
  ASSERT_TRUE(w16.open(folder + "/e", *dtypeNamed("uint16"), error)) << error;
  const std::vector<int32_t> big = {65535}, bigger = {65536};
  EXPECT_TRUE(w16.addDocument(big.data(), 1, error)) << error;
  EXPECT_FALSE(w16.addDocument(bigger.data(), 1, error));
}

TEST(PrepWriter, NothingReachesThePrefixBeforeCommit) {
  const std::string folder = tempFolder("atomic");
  const std::string prefix = folder + "/d";
  std::string error;
  const std::vector<int32_t> doc = {1, 2, 3};
  {
    IndexedWriter old;
    ASSERT_TRUE(old.open(prefix, *dtypeNamed("uint8"), error));
    ASSERT_TRUE(old.addDocument(doc.data(), doc.size(), error));
    ASSERT_TRUE(old.commit(error)) << error;
  }
  const std::string oldIdx = readAll(prefix + ".idx"), oldBin = readAll(prefix + ".bin");
  const std::set<std::string> before = filesIn(folder);
  EXPECT_EQ(before, (std::set<std::string>{"d.bin", "d.idx"}));
  {
    IndexedWriter w;
    ASSERT_TRUE(w.open(prefix, *dtypeNamed("int32"), error));
    ASSERT_TRUE(w.addDocument(doc.data(), doc.size(), error));
    EXPECT_EQ(filesIn(folder).size(), 3u); // the temporary .bin beside the old files
    EXPECT_EQ(readAll(prefix + ".bin"), oldBin);
    w.abort();
    EXPECT_EQ(filesIn(folder), before);
    ASSERT_TRUE(w.open(prefix, *dtypeNamed("int32"), error));
    ASSERT_TRUE(w.addDocument(doc.data(), doc.size(), error));
  } // the destructor aborts too
  EXPECT_EQ(filesIn(folder), before);
  EXPECT_EQ(readAll(prefix + ".idx"), oldIdx);
  EXPECT_EQ(readAll(prefix + ".bin"), oldBin);
}

TEST(Prep, ByteTokenizerIsTheUtf8Bytes) {
  std::unique_ptr<Tokenizer> bytes = makeByteTokenizer();
  std::vector<int32_t> ids;
  std::string error;
  ASSERT_TRUE(bytes->encode("a\xc3\xa9\n", ids, error));
  EXPECT_EQ(ids, (std::vector<int32_t>{97, 0xc3, 0xa9, 10}));
  EXPECT_EQ(bytes->vocab(), 256);
  EXPECT_EQ(bytes->eod(), -1);
}

} // namespace
} // namespace mhcc::prep
