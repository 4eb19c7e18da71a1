//===- TraceParts.cpp - one trace from the processes of a run -------------===//
#include "runtime/cli/TraceParts.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

namespace mhcc::runtime {
namespace {

std::string partPath(const std::string &path, int64_t rank) { return path + ".rank" + std::to_string(rank); }

} // namespace

bool writeTracePart(const std::string &path, int64_t rank, const std::vector<TraceSlice> &slices, double epochUs,
                    std::string &error) {
  nlohmann::json rows = nlohmann::json::array();
  for (const TraceSlice &s : slices)
    rows.push_back({s.rank, s.name, s.category, s.startUs + epochUs, s.durationUs, s.step});
  const std::string part = partPath(path, rank), tmp = part + ".tmp";
  std::ofstream out(tmp, std::ios::trunc);
  out << rows.dump();
  out.close();
  std::error_code ec;
  if (!out || (std::filesystem::rename(tmp, part, ec), ec)) {
    std::filesystem::remove(tmp, ec);
    error = "--trace: cannot write " + part;
    return false;
  }
  return true;
}

bool mergeTraceParts(const std::string &path, int64_t world, double waitSeconds, std::vector<TraceSlice> &slices,
                     std::string &error) {
  slices.clear();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(waitSeconds);
  for (int64_t rank = 0; rank < world; ++rank) {
    const std::string part = partPath(path, rank);
    while (!std::filesystem::exists(part)) {
      if (std::chrono::steady_clock::now() > deadline) {
        error = "--trace: rank " + std::to_string(rank) + "'s part " + part + " did not appear within " +
                std::to_string(int(waitSeconds)) + " s (the ranks write FILE.rank<R> beside FILE: one host, or " +
                "a folder every rank shares)";
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::ifstream in(part);
    const nlohmann::json rows = nlohmann::json::parse(in, nullptr, false);
    bool ok = rows.is_array();
    for (size_t k = 0; ok && k < rows.size(); ++k) {
      const nlohmann::json &r = rows[k];
      ok = r.is_array() && r.size() == 6 && r[0].is_number_integer() && r[1].is_string() && r[2].is_string() &&
           r[3].is_number() && r[4].is_number() && r[5].is_number_integer();
      if (ok)
        slices.push_back({r[0].get<int64_t>(), r[1].get<std::string>(), r[2].get<std::string>(), r[3].get<double>(),
                          r[4].get<double>(), r[5].get<int64_t>()});
    }
    if (!ok) {
      error = "--trace: " + part + " is not a trace part (written by another program?)";
      return false;
    }
  }
  double first = std::numeric_limits<double>::infinity();
  for (const TraceSlice &s : slices)
    first = std::min(first, s.startUs);
  for (TraceSlice &s : slices)
    s.startUs -= first;
  std::ofstream out(path, std::ios::trunc);
  out << chromeTrace(slices, world, "measured by mhcrun");
  if (!out.flush()) {
    error = "--trace: cannot write " + path;
    return false;
  }
  std::error_code ec;
  for (int64_t rank = 0; rank < world; ++rank)
    std::filesystem::remove(partPath(path, rank), ec);
  return true;
}

} // namespace mhcc::runtime
