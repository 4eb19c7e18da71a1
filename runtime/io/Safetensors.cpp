//===- Safetensors.cpp - a minimal safetensors writer and reader -------------===//
#include "runtime/io/Safetensors.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace mhcc::runtime {

void SafetensorsWriter::add(const std::string &name, const char *dtype, std::vector<int64_t> shape,
                            const void *data, size_t elementSize) {
  int64_t count = 1;
  for (int64_t d : shape)
    count *= d;
  Tensor &t = tensors_[name];
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.resize(size_t(count) * elementSize);
  if (!t.bytes.empty())
    std::memcpy(t.bytes.data(), data, t.bytes.size());
}

void SafetensorsWriter::addF32(const std::string &name, std::vector<int64_t> shape, const float *data) {
  add(name, "F32", std::move(shape), data, sizeof(float));
}
void SafetensorsWriter::addF64(const std::string &name, std::vector<int64_t> shape, const double *data) {
  add(name, "F64", std::move(shape), data, sizeof(double));
}
void SafetensorsWriter::addI32(const std::string &name, std::vector<int64_t> shape, const int32_t *data) {
  add(name, "I32", std::move(shape), data, sizeof(int32_t));
}

bool SafetensorsWriter::write(const std::string &path, std::string &error) const {
  // The format stores little-endian values; the hosts mhcrun runs on (x86-64,
  // aarch64 Linux) are little-endian, so the bytes go out as they are.
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors wants little-endian data");
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto &[name, t] : tensors_) {
    header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  if (!metadata_.empty())
    header["__metadata__"] = metadata_;
  std::string text = header.dump();
  // Pad with spaces (the format allows them) so that the data starts 8-byte
  // aligned and readers may map it in place.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    error = "cannot write " + path;
    return false;
  }
  const uint64_t length = text.size();
  out.write(reinterpret_cast<const char *>(&length), sizeof length);
  out.write(text.data(), text.size());
  for (const auto &[name, t] : tensors_)
    out.write(t.bytes.data(), t.bytes.size());
  out.close();
  if (!out) {
    error = "error while writing " + path;
    return false;
  }
  return true;
}

namespace {
size_t dtypeSize(const std::string &dtype) {
  if (dtype == "F32" || dtype == "I32")
    return 4;
  if (dtype == "F64" || dtype == "I64")
    return 8;
  return 0;
}
/// JSON integers only: nlohmann casts a float to an integer type with no
/// range check, and 3.3e40 into an int64_t is undefined behaviour (the class
/// tests/fuzz/artifact_fuzz.cpp found; replayed here under UBSan).
std::vector<int64_t> integerList(const nlohmann::json &j) {
  if (!j.is_array())
    throw std::runtime_error(j.dump() + " is not a list");
  std::vector<int64_t> out;
  for (const nlohmann::json &v : j) {
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)))
      throw std::runtime_error(v.dump() + " is not an integer");
    out.push_back(v.get<int64_t>());
  }
  return out;
}

} // namespace

bool readSafetensors(const std::string &path, std::map<std::string, SafetensorsTensor> &tensors,
                     std::map<std::string, std::string> &metadata, std::string &error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = path + ": cannot be opened";
    return false;
  }
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parseSafetensors(path, bytes, tensors, metadata, error);
}

bool parseSafetensors(const std::string &path, const std::vector<char> &bytes,
                      std::map<std::string, SafetensorsTensor> &tensors, std::map<std::string, std::string> &metadata,
                      std::string &error) {
  uint64_t length = 0;
  if (bytes.size() < 8 || (std::memcpy(&length, bytes.data(), 8), length > bytes.size() - 8)) {
    error = path + ": truncated (shorter than its safetensors header says)";
    return false;
  }
  nlohmann::json header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + length, nullptr, false);
  if (!header.is_object()) {
    error = path + ": the safetensors header is not a JSON object";
    return false;
  }
  const uint64_t dataSize = bytes.size() - 8 - length;
  const char *data = bytes.data() + 8 + length;
  tensors.clear();
  metadata.clear();
  try {
    for (const auto &[name, entry] : header.items()) {
      if (name == "__metadata__") {
        for (const auto &[key, value] : entry.items())
          metadata[key] = value.get<std::string>();
        continue;
      }
      SafetensorsTensor t;
      t.dtype = entry.at("dtype").get<std::string>();
      t.shape = integerList(entry.at("shape"));
      const std::vector<int64_t> offsets = integerList(entry.at("data_offsets"));
      if (offsets.size() == 2 && (offsets[0] < 0 || offsets[1] < 0))
        throw std::runtime_error("negative data_offsets");
      const std::vector<uint64_t> range(offsets.begin(), offsets.end());
      // A negative dimension, or a product that wraps around (2^32 x 2^32),
      // used to pass with an empty byte range; no count may exceed the data.
      uint64_t count = 1;
      bool shapeOk = true;
      for (int64_t d : t.shape) {
        shapeOk = shapeOk && d >= 0 && (d == 0 || count <= dataSize / uint64_t(d));
        count = shapeOk ? count * uint64_t(d) : 0;
      }
      if (!shapeOk || range.size() != 2 || range[0] > range[1] || range[1] > dataSize ||
          dtypeSize(t.dtype) == 0 || range[1] - range[0] != count * dtypeSize(t.dtype)) {
        error = path + ": tensor '" + name + "' has a bad dtype, shape or byte range (truncated or corrupt)";
        return false;
      }
      t.bytes.assign(data + range[0], data + range[1]);
      tensors[name] = std::move(t);
    }
  } catch (const std::exception &e) {
    error = path + ": malformed safetensors header (" + e.what() + ")";
    return false;
  }
  return true;
}

} // namespace mhcc::runtime
