//===- IndexedWriter.cpp - a Megatron indexed dataset, streamed and renamed into place ===//
#include "tools/prep/IndexedWriter.h"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace mhcc::prep {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr Dtype kUint8{1, "uint8", 1, 255};
constexpr Dtype kUint16{8, "uint16", 2, 65535};
constexpr Dtype kInt32{4, "int32", 4, INT32_MAX};

std::string systemError() { return std::strerror(errno); }

/// A temporary file beside `path`, created with the permissions a new file
/// gets (mkstemp's are 0600).
int makeTemp(const std::string &path, std::string &tmp) {
  std::string name = path + ".tmp-XXXXXX";
  int fd = ::mkstemp(name.data());
  if (fd < 0)
    return fd;
  mode_t mask = ::umask(0);
  ::umask(mask);
  ::fchmod(fd, 0666 & ~mask);
  tmp = name;
  return fd;
}

std::string folderOf(const std::string &path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

template <typename T> void put(std::string &out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) // little-endian, as Megatron writes
    out.push_back(static_cast<char>((static_cast<uint64_t>(value) >> (8 * i)) & 0xff));
}

} // namespace

std::optional<Dtype> dtypeNamed(const std::string &name) {
  for (const Dtype &d : {kUint8, kUint16, kInt32})
    if (name == d.name)
      return d;
  return std::nullopt;
}

Dtype dtypeForVocab(int64_t vocab) {
  if (vocab <= 256)
    return kUint8;
  return vocab < 65500 ? kUint16 : kInt32;
}

bool IndexedWriter::open(const std::string &prefix, Dtype dtype, std::string &error) {
  abort();
  prefix_ = prefix;
  dtype_ = dtype;
  int fd = makeTemp(prefix + ".bin", tmpBin_);
  if (fd < 0) {
    error = "cannot create a temporary file beside " + prefix + ".bin: " + systemError();
    return false;
  }
  bin_ = ::fdopen(fd, "wb");
  if (!bin_) {
    error = "cannot write " + tmpBin_ + ": " + systemError();
    ::close(fd);
    abort();
    return false;
  }
  lengths_.clear();
  pointers_.clear();
  tokens_ = offset_ = 0;
  return true;
}

bool IndexedWriter::addDocument(const int32_t *tokens, size_t count, std::string &error) {
  if (!bin_) {
    error = "the dataset is not open";
    return false;
  }
  if (count > size_t(INT32_MAX)) {
    error = "a document of " + std::to_string(count) + " tokens; a sequence holds at most " +
            std::to_string(INT32_MAX);
    return false;
  }
  const int width = dtype_.width;
  buffer_.resize(count * width);
  char *out = buffer_.data();
  for (size_t i = 0; i < count; ++i) {
    int32_t t = tokens[i];
    if (t < 0 || t > dtype_.max) {
      error = "token id " + std::to_string(t) + " does not fit the dtype " + dtype_.name + " (0 to " +
              std::to_string(dtype_.max) + ")";
      return false;
    }
    uint32_t v = static_cast<uint32_t>(t);
    for (int b = 0; b < width; ++b)
      *out++ = static_cast<char>((v >> (8 * b)) & 0xff);
  }
  if (count && std::fwrite(buffer_.data(), 1, buffer_.size(), bin_) != buffer_.size()) {
    error = "cannot write " + tmpBin_ + ": " + systemError();
    return false;
  }
  lengths_.push_back(static_cast<int32_t>(count));
  pointers_.push_back(offset_);
  offset_ += static_cast<int64_t>(buffer_.size());
  tokens_ += static_cast<int64_t>(count);
  return true;
}

bool IndexedWriter::commit(std::string &error) {
  if (!bin_) {
    error = "the dataset is not open";
    return false;
  }
  std::FILE *bin = bin_;
  bin_ = nullptr;
  bool ok = std::fflush(bin) == 0 && ::fsync(::fileno(bin)) == 0;
  ok = std::fclose(bin) == 0 && ok;
  if (!ok) {
    error = "cannot write " + tmpBin_ + ": " + systemError();
    abort();
    return false;
  }
  const uint64_t count = lengths_.size();
  std::string idx(kMagic, sizeof kMagic);
  idx.reserve(34 + count * 20 + 8);
  put<uint64_t>(idx, 1); // version
  idx.push_back(static_cast<char>(dtype_.code));
  put<uint64_t>(idx, count);
  put<uint64_t>(idx, count + 1); // document indices: 0, then one per document
  for (int32_t length : lengths_)
    put<uint32_t>(idx, static_cast<uint32_t>(length));
  for (int64_t pointer : pointers_)
    put<uint64_t>(idx, static_cast<uint64_t>(pointer));
  for (uint64_t d = 0; d <= count; ++d)
    put<uint64_t>(idx, d);
  int fd = makeTemp(prefix_ + ".idx", tmpIdx_);
  if (fd < 0) {
    error = "cannot create a temporary file beside " + prefix_ + ".idx: " + systemError();
    abort();
    return false;
  }
  for (size_t done = 0; done < idx.size();) {
    ssize_t n = ::write(fd, idx.data() + done, idx.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      error = "cannot write " + tmpIdx_ + ": " + systemError();
      ::close(fd);
      abort();
      return false;
    }
    done += size_t(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    error = "cannot write " + tmpIdx_ + ": " + systemError();
    abort();
    return false;
  }
  // The .idx last: a reader takes PREFIX for a dataset by its .idx.
  if (::rename(tmpBin_.c_str(), (prefix_ + ".bin").c_str()) != 0) {
    error = "cannot rename " + tmpBin_ + " to " + prefix_ + ".bin: " + systemError();
    abort();
    return false;
  }
  tmpBin_.clear();
  if (::rename(tmpIdx_.c_str(), (prefix_ + ".idx").c_str()) != 0) {
    error = "cannot rename " + tmpIdx_ + " to " + prefix_ + ".idx: " + systemError();
    ::unlink((prefix_ + ".bin").c_str()); // not a .bin without its .idx
    abort();
    return false;
  }
  tmpIdx_.clear();
  // The renames are durable once the folder is.
  int dir = ::open(folderOf(prefix_).c_str(), O_RDONLY | O_DIRECTORY);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
  return true;
}

void IndexedWriter::abort() {
  if (bin_) {
    std::fclose(bin_);
    bin_ = nullptr;
  }
  if (!tmpBin_.empty())
    ::unlink(tmpBin_.c_str());
  if (!tmpIdx_.empty())
    ::unlink(tmpIdx_.c_str());
  tmpBin_.clear();
  tmpIdx_.clear();
}

} // namespace mhcc::prep
