// The safetensors writer: the byte layout the format specifies (8-byte
// little-endian header length, JSON header, contiguous little-endian data),
// read back here by hand rather than by the writer's own code.
#include "runtime/io/Safetensors.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>

using namespace mhcc::runtime;

namespace {

std::string readAll(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string tempPath(const char *name) {
  const char *dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

TEST(Safetensors, LayoutHeaderAndData) {
  SafetensorsWriter w;
  const float f[6] = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
  const int32_t i[3] = {7, -1, 255};
  const double loss = 5.545177444479562;
  w.addF32("weight.b", {2, 3}, f);
  w.addI32("tokens.step1.mb0", {1, 3}, i);
  w.addF64("lm_loss", {}, &loss);
  w.setMetadata("model", "tiny");
  std::string error;
  const std::string path = tempPath("layout.safetensors");
  ASSERT_TRUE(w.write(path, error)) << error;

  std::string bytes = readAll(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t headerLength = 0;
  for (int k = 7; k >= 0; --k) // little-endian, independent of the host
    headerLength = (headerLength << 8) | uint8_t(bytes[k]);
  EXPECT_EQ(headerLength % 8, 0u) << "data should start 8-byte aligned";
  ASSERT_LE(8 + headerLength, bytes.size());
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, headerLength));
  const std::string data = bytes.substr(8 + headerLength);
  EXPECT_EQ(data.size(), 6 * 4 + 3 * 4 + 8u);
  EXPECT_EQ(header["__metadata__"]["model"], "tiny");

  EXPECT_EQ(header["weight.b"]["dtype"], "F32");
  EXPECT_EQ(header["weight.b"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(header["tokens.step1.mb0"]["dtype"], "I32");
  EXPECT_EQ(header["lm_loss"]["dtype"], "F64");
  EXPECT_EQ(header["lm_loss"]["shape"], nlohmann::json::array());

  // Every tensor's bytes where its offsets say, and the ranges tile the data.
  auto range = [&](const char *name) {
    auto o = header[name]["data_offsets"];
    return std::make_pair(o[0].get<size_t>(), o[1].get<size_t>());
  };
  auto [fb, fe] = range("weight.b");
  auto [ib, ie] = range("tokens.step1.mb0");
  auto [lb, le] = range("lm_loss");
  EXPECT_EQ(fe - fb, sizeof f);
  EXPECT_EQ(ie - ib, sizeof i);
  EXPECT_EQ(le - lb, sizeof loss);
  EXPECT_EQ((fe - fb) + (ie - ib) + (le - lb), data.size());
  EXPECT_EQ(std::memcmp(data.data() + fb, f, sizeof f), 0);
  EXPECT_EQ(std::memcmp(data.data() + ib, i, sizeof i), 0);
  EXPECT_EQ(std::memcmp(data.data() + lb, &loss, sizeof loss), 0);
  // The first float's bytes, spelled out: 1.5f = 0x3FC00000, little-endian.
  EXPECT_EQ(uint8_t(data[fb + 3]), 0x3F);
  EXPECT_EQ(uint8_t(data[fb + 2]), 0xC0);
}

TEST(Safetensors, UnwritablePathIsAnError) {
  SafetensorsWriter w;
  const float f = 1;
  w.addF32("x", {1}, &f);
  std::string error;
  EXPECT_FALSE(w.write("/nonexistent-dir/x.safetensors", error));
  EXPECT_NE(error.find("/nonexistent-dir/x.safetensors"), std::string::npos);
}

// A header whose shape disagrees with its byte range: a negative dimension
// or a product that wraps around 2^64 used to be accepted with zero bytes
// (found with tests/fuzz/safetensors_fuzz.cpp's shape-matches-bytes check).
TEST(Safetensors, ShapesThatDoNotMatchTheirBytesAreRefused) {
  auto parse = [](const nlohmann::json &shape, std::string &error) {
    const std::string header =
        nlohmann::json{{"a", {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {0, 0}}}}}.dump();
    std::vector<char> bytes(8 + header.size());
    const uint64_t length = header.size();
    std::memcpy(bytes.data(), &length, 8);
    std::memcpy(bytes.data() + 8, header.data(), header.size());
    std::map<std::string, SafetensorsTensor> tensors;
    std::map<std::string, std::string> metadata;
    return parseSafetensors("x.safetensors", bytes, tensors, metadata, error);
  };
  std::string error;
  EXPECT_FALSE(parse({-1, 4}, error));
  EXPECT_NE(error.find("tensor 'a' has a bad dtype, shape or byte range"), std::string::npos) << error;
  EXPECT_FALSE(parse({int64_t(1) << 32, int64_t(1) << 32}, error));
  EXPECT_FALSE(parse({int64_t(1) << 62, 4}, error));
  // A float dimension was cast to int64_t unchecked (undefined for 3.3e40).
  EXPECT_FALSE(parse({3.3e40}, error));
  EXPECT_NE(error.find("3.3e+40 is not an integer"), std::string::npos) << error;
  EXPECT_FALSE(parse({2.5, 4}, error));
  EXPECT_TRUE(parse({0, 4}, error)) << error; // empty tensors are fine
}

} // namespace
