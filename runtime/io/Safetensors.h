//===- Safetensors.h - a minimal safetensors writer ---------------*- C++ -*-===//
//
// Writes the safetensors format (an 8-byte little-endian header length, a
// JSON header naming each tensor's dtype, shape and byte range, then the raw
// little-endian tensors) so that tools outside mhcc (NumPy, PyTorch) can read
// mhcrun's tensors without a reader of ours. The reader serves checkpoints
// and --init-from: it checks every byte range and shape against the file.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_IO_SAFETENSORS_H
#define MHCC_RUNTIME_IO_SAFETENSORS_H

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mhcc::runtime {

class SafetensorsWriter {
public:
  /// Each add copies the data; `shape` may be empty (a scalar, one element).
  /// A name added twice keeps the last tensor.
  void addF32(const std::string &name, std::vector<int64_t> shape, const float *data);
  void addF64(const std::string &name, std::vector<int64_t> shape, const double *data);
  void addI32(const std::string &name, std::vector<int64_t> shape, const int32_t *data);
  /// Free-form string pairs, stored under the header's "__metadata__".
  void setMetadata(const std::string &key, const std::string &value) { metadata_[key] = value; }

  /// Writes the file; false and `error` (naming the path) on failure.
  bool write(const std::string &path, std::string &error) const;

private:
  struct Tensor {
    std::string dtype;
    std::vector<int64_t> shape;
    std::vector<char> bytes;
  };
  void add(const std::string &name, const char *dtype, std::vector<int64_t> shape, const void *data,
           size_t elementSize);
  std::map<std::string, Tensor> tensors_; // written in name order
  std::map<std::string, std::string> metadata_;
};

/// One tensor of a safetensors file: dtype ("F32", ...), shape, raw bytes.
struct SafetensorsTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<char> bytes;
};

/// Reads a whole safetensors file; false and `error` (naming the path and
/// what is wrong: truncated, a bad header, a range outside the data) on failure.
bool readSafetensors(const std::string &path, std::map<std::string, SafetensorsTensor> &tensors,
                     std::map<std::string, std::string> &metadata, std::string &error);
/// The same over bytes already in memory; `path` names them in errors.
bool parseSafetensors(const std::string &path, const std::vector<char> &bytes,
                      std::map<std::string, SafetensorsTensor> &tensors, std::map<std::string, std::string> &metadata,
                      std::string &error);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_IO_SAFETENSORS_H
