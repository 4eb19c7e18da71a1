//===- FlagChecks.cpp - numbers and output paths a command line may not take ---===//
#include "runtime/cli/FlagChecks.h"

#include <cmath>
#include <sstream>
#include <sys/stat.h>

namespace mhcc::runtime {

std::string checkNumber(const std::string &flag, double value, double min, double max, bool positive) {
  if (std::isfinite(value) && value <= max && (positive ? value > min : value >= min))
    return "";
  std::ostringstream os;
  os << "--" << flag << ": must be a finite number " << (positive ? "above " : "from ") << min << " to " << max
     << ", got " << value;
  return os.str();
}

std::string checkOutputPath(const std::string &flag, const std::string &path, const std::vector<std::string> &inputs) {
  struct stat out;
  if (path.empty() || path == "/dev/null" || ::stat(path.c_str(), &out) != 0)
    return ""; // nothing there yet: it will be created
  const std::string what = "--" + flag + " " + path + ": ";
  if (S_ISDIR(out.st_mode))
    return what + "is a directory; name a file";
  if (!S_ISREG(out.st_mode))
    return what + "is not a regular file (a device or a pipe); name a file";
  for (const std::string &input : inputs) {
    struct stat in;
    if (!input.empty() && ::stat(input.c_str(), &in) == 0 && in.st_dev == out.st_dev && in.st_ino == out.st_ino)
      return what + "is the input " + input + "; writing there would destroy it: name another file";
  }
  return "";
}

} // namespace mhcc::runtime
