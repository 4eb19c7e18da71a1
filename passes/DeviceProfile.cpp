//===- DeviceProfile.cpp - the rates the schedule simulator assumes --------===//
#include "passes/DeviceProfile.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include <sys/stat.h>

namespace mhcc {
namespace {

constexpr const char kFormat[] = "mhcc-device-profile-v1";

constexpr UnitKind kUnitKinds[] = {UnitKind::Embedding,   UnitKind::Expand,   UnitKind::AttentionSublayer,
                                   UnitKind::GdnSublayer, UnitKind::MlpSublayer, UnitKind::Contract,
                                   UnitKind::FinalNorm,   UnitKind::LmHead,   UnitKind::Loss,
                                   UnitKind::Mtp,         UnitKind::MhcMixing};

/// A unit's rates in the JSON form, for the reader and the writer alike.
constexpr std::pair<const char *, double UnitRates::*> kRateKeys[] = {
    {"forward_tflops", &UnitRates::forwardTflops},           {"backward_tflops", &UnitRates::backwardTflops},
    {"forward_ns_per_token", &UnitRates::forwardNsPerToken}, {"backward_ns_per_token", &UnitRates::backwardNsPerToken},
    {"forward_overhead_us", &UnitRates::forwardOverheadUs},  {"backward_overhead_us", &UnitRates::backwardOverheadUs}};

std::optional<UnitKind> parseUnitKind(const std::string &name) {
  for (UnitKind k : kUnitKinds)
    if (name == unitKindName(k))
      return k;
  return std::nullopt;
}

/// The built-in profiles: `mhcrun --profile --device-profile-out` output,
/// recorded with its source (docs/benchmarks.md, docs/gpu_results.md).
#include "passes/DeviceProfiles.inc"

double unitMs(const DeviceProfile &p, UnitKind kind, double flops, int64_t tokens, bool forward) {
  auto it = p.units.find(kind);
  if (it == p.units.end())
    return flops / (p.defaultTflops * 1e9);
  const UnitRates &r = it->second;
  const double tflops = forward ? r.forwardTflops : r.backwardTflops;
  const double nsPerToken = forward ? r.forwardNsPerToken : r.backwardNsPerToken;
  const double overheadUs = forward ? r.forwardOverheadUs : r.backwardOverheadUs;
  return (tflops > 0 ? flops / (tflops * 1e9) : 0) + tokens * nsPerToken * 1e-6 + overheadUs * 1e-3;
}

bool positiveFinite(const nlohmann::json &value) {
  return value.is_number() && std::isfinite(value.get<double>()) && value.get<double>() > 0;
}

bool nonNegativeFinite(const nlohmann::json &value) {
  return value.is_number() && std::isfinite(value.get<double>()) && value.get<double>() >= 0;
}

/// One measured time of a unit kind: its size (FLOPs, or tokens where the
/// cost model counts none) and milliseconds.
struct Point {
  double size, ms;
  bool perToken; // the size is tokens (a unit without FLOPs)
};

/// Reads one {"measured_on", "unit_ms"} object into points per unit kind
/// and direction (forward 0, backward 1).
bool readMeasurement(const nlohmann::json &j, std::map<UnitKind, std::vector<Point>> (&points)[2],
                     std::string &error) {
  const nlohmann::json &on = j.contains("measured_on") ? j["measured_on"] : nlohmann::json();
  ModelInfo dims;
  for (auto [key, field] : {std::pair<const char *, int64_t *>{"vocab", &dims.vocab}, {"hidden", &dims.hidden},
                            {"heads", &dims.heads}, {"ffn_hidden", &dims.ffnHidden}, {"seq_len", &dims.seqLen},
                            {"micro_batch", &dims.microBatch}, {"streams", &dims.streams},
                            {"sinkhorn_iterations", &dims.sinkhornIterations}}) {
    if (!on.is_object() || !on.contains(key) || !on[key].is_number_integer() || on[key].get<int64_t>() < 1 ||
        on[key].get<int64_t>() > (int64_t(1) << 24)) {
      error = std::string("\"measured_on\" needs the model's \"") + key + "\" (an integer from 1 to 2^24)";
      return false;
    }
    *field = on[key].get<int64_t>();
  }
  // The storage, where given: an fp32 residual beside bf16 activations
  // changes n = 1's mixing (CostModel: u is a copy of the stream).
  for (auto [key, field] : {std::pair<const char *, std::string *>{"dtype", &dims.dtype},
                            {"residual_dtype", &dims.residualDtype}}) {
    if (!on.contains(key))
      continue;
    if (!on[key].is_string() || (on[key] != "f32" && on[key] != "bf16")) {
      error = std::string("\"measured_on\": \"") + key + "\" must be \"f32\" or \"bf16\"";
      return false;
    }
    *field = on[key].get<std::string>();
  }
  if (!j.contains("unit_ms") || !j["unit_ms"].is_object()) {
    error = "\"unit_ms\" must be an object of unit kinds";
    return false;
  }
  // Where the mixing was measured apart, the other units' times exclude it.
  const bool apart = j["unit_ms"].contains(unitKindName(UnitKind::MhcMixing));
  for (const auto &[name, times] : j["unit_ms"].items()) {
    std::optional<UnitKind> kind = parseUnitKind(name);
    if (!kind) {
      error = "unit_ms: \"" + name + "\" is not a unit kind";
      return false;
    }
    if (!times.is_object() || !times.contains("forward") || !times.contains("backward") ||
        !positiveFinite(times["forward"]) || !positiveFinite(times["backward"])) {
      error = "unit_ms." + name + " needs positive, finite \"forward\" and \"backward\" milliseconds";
      return false;
    }
    const UnitCost cost = unitCost(*kind, dims);
    const double flops = (cost.forwardFlopsPerToken - (apart ? cost.mixingFlopsPerToken : 0)) * dims.tokens();
    const double size = flops > 0 ? flops : double(dims.tokens());
    points[0][*kind].push_back({size, times["forward"].get<double>(), flops == 0});
    points[1][*kind].push_back({flops > 0 ? 2 * flops : size, times["backward"].get<double>(), flops == 0});
  }
  return true;
}

/// ms = a x size + b over the points, least squares with a > 0 and b >= 0;
/// one point, or sizes too close to separate a from b: b = 0.
std::pair<double, double> fitLine(const std::vector<Point> &points) {
  double n = double(points.size()), sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const Point &p : points)
    sx += p.size, sy += p.ms, sxx += p.size * p.size, sxy += p.size * p.ms;
  const double det = n * sxx - sx * sx;
  if (points.size() >= 2 && det > 1e-6 * sxx * n) {
    const double a = (n * sxy - sx * sy) / det, b = (sy - a * sx) / n;
    if (a > 0 && b >= 0)
      return {a, b};
  }
  return {sy / sx, 0}; // through the origin
}

/// Measured times (one "unit_ms" or several "measurements") into rates.
bool readMeasuredTimes(const nlohmann::json &j, DeviceProfile &p, std::string &error) {
  std::map<UnitKind, std::vector<Point>> points[2];
  if (j.contains("measurements")) {
    if (!j["measurements"].is_array() || j["measurements"].empty()) {
      error = "\"measurements\" must be a non-empty list of {\"measured_on\", \"unit_ms\"}";
      return false;
    }
    // A unit's time either includes its mixing or not, in every measurement of a fit.
    const char *mixing = unitKindName(UnitKind::MhcMixing);
    std::optional<bool> apart; // as the first measurement has it
    for (const nlohmann::json &m : j["measurements"]) {
      if (!readMeasurement(m, points, error))
        return false;
      const bool mine = m["unit_ms"].contains(mixing);
      if (apart && *apart != mine) {
        error = std::string("\"measurements\" disagree on \"") + mixing +
                "\": measure every model with the mixing apart (mhcrun writes it), or none";
        return false;
      }
      apart = mine;
    }
  } else if (!readMeasurement(j, points, error)) {
    return false;
  }
  for (const auto &[kind, forward] : points[0]) {
    if (p.units.count(kind)) {
      error = std::string("\"") + unitKindName(kind) + "\" is both measured and in \"units\"";
      return false;
    }
    const bool perToken = forward.front().perToken;
    UnitRates r;
    for (int direction = 0; direction < 2; ++direction) {
      auto [a, b] = fitLine(direction == 0 ? forward : points[1][kind]);
      double &rate = direction == 0 ? (perToken ? r.forwardNsPerToken : r.forwardTflops)
                                    : (perToken ? r.backwardNsPerToken : r.backwardTflops);
      rate = perToken ? a * 1e6 : 1 / (a * 1e9); // ms per token -> ns; ms per FLOP -> TFLOP/s
      (direction == 0 ? r.forwardOverheadUs : r.backwardOverheadUs) = b * 1e3;
    }
    p.units[kind] = r;
  }
  return true;
}

} // namespace

double DeviceProfile::forwardMs(UnitKind kind, double flops, int64_t tokens) const {
  return unitMs(*this, kind, flops, tokens, true);
}

double DeviceProfile::backwardMs(UnitKind kind, double flops, int64_t tokens) const {
  return unitMs(*this, kind, flops, tokens, false);
}

namespace {
/// One of `tp` tensor-parallel ranks: a split unit's FLOPs (and tokens, for
/// per-token rates) divided by tp, replicated work over the rank's rows (all,
/// or 1 / tp under sequence parallelism), the mixing replicated too and
/// priced at its own rate where the profile measured it ("mhc"), else at the
/// unit's; every launch's fixed overhead is every rank's, whole.
double costMs(const DeviceProfile &p, const UnitCost &cost, int64_t tokens, int64_t tp, bool sequenceParallel,
              bool forward) {
  const double scale = forward ? 1 : 2, flops = scale * cost.forwardFlopsPerToken * tokens;
  const double mixing = scale * cost.mixingFlopsPerToken * tokens;
  // The embedding's masked lookup writes every row on every rank, SP or not
  // (then a reduce-scatter); the rest of the replicated work shards under SP.
  const int64_t rows = sequenceParallel && cost.kind != UnitKind::Embedding ? tokens / tp : tokens;
  const double rowShare = double(rows) / double(tokens);
  const bool split = splitByTensorParallelism(cost.kind);
  const bool mixingApart = p.units.count(UnitKind::MhcMixing) && cost.mixings > 0;
  // The unit's own work: its FLOPs less the mixing where that is priced apart.
  double own = mixingApart ? flops - mixing : flops;
  if (tp > 1) // (at tp = 1 this expression, the one before tensor parallelism, keeps its bits)
    own = split ? (flops - mixing) / double(tp) + (mixingApart ? 0 : mixing * rowShare) : own * rowShare;
  const double ms = unitMs(p, cost.kind, own, split ? tokens / tp : rows, forward);
  if (!mixingApart)
    return ms;
  const double mixingEach = mixing / double(cost.mixings) * double(rows) / double(tokens);
  return ms + double(cost.mixings) * unitMs(p, UnitKind::MhcMixing, mixingEach, rows, forward);
}
} // namespace

double DeviceProfile::forwardMs(const UnitCost &cost, int64_t tokens, int64_t tp, bool sequenceParallel) const {
  return costMs(*this, cost, tokens, tp, sequenceParallel, true);
}

double DeviceProfile::backwardMs(const UnitCost &cost, int64_t tokens, int64_t tp, bool sequenceParallel) const {
  return costMs(*this, cost, tokens, tp, sequenceParallel, false);
}

std::string DeviceProfile::describe() const {
  char text[200];
  if (units.empty()) {
    std::snprintf(text, sizeof text, "nominal rates: %.2f TFLOP/s and %.2f GB/s P2P", defaultTflops, linkGBps);
    return text;
  }
  std::snprintf(text, sizeof text, "%.2f GB/s P2P", linkGBps);
  if (sharedCores > 0)
    std::snprintf(text + std::strlen(text), sizeof text - std::strlen(text), "; ranks share %lld cores",
                  static_cast<long long>(sharedCores));
  return "device profile " + name + " (" + (source.empty() ? "no source given" : source) + "; " + text + ")";
}

DeviceProfile nominalProfile(double tflops, double linkGBps) {
  DeviceProfile p;
  p.defaultTflops = tflops;
  p.linkGBps = linkGBps;
  return p;
}

std::vector<std::string> builtinDeviceProfileNames() {
  std::vector<std::string> names;
  for (const auto &entry : kBuiltinProfiles)
    names.push_back(entry.name);
  return names;
}

std::optional<DeviceProfile> builtinDeviceProfile(const std::string &name) {
  for (const auto &entry : kBuiltinProfiles)
    if (name == entry.name) {
      std::string error;
      std::optional<DeviceProfile> profile = parseDeviceProfile(entry.json, error);
      if (!profile)
        std::fprintf(stderr, "mhcc: internal error: built-in device profile %s: %s\n", entry.name, error.c_str());
      return profile;
    }
  return std::nullopt;
}

std::optional<DeviceProfile> parseDeviceProfile(const std::string &text, std::string &error) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    error = "not a JSON object";
    return std::nullopt;
  }
  if (!j.contains("format") || j["format"] != kFormat) {
    error = std::string("\"format\" must be \"") + kFormat + "\"";
    return std::nullopt;
  }
  DeviceProfile p;
  for (const char *key : {"name", "source", "dtype"})
    if (j.contains(key) && !j[key].is_string()) {
      error = std::string("\"") + key + "\" must be a string";
      return std::nullopt;
    }
  p.name = j.value("name", std::string("unnamed"));
  p.source = j.value("source", std::string());
  p.dtype = j.value("dtype", std::string());
  auto number = [&](const char *key, double &field, bool positive) {
    if (!j.contains(key))
      return true;
    if (!(positive ? positiveFinite(j[key]) : nonNegativeFinite(j[key]))) {
      error = std::string("\"") + key + "\" must be a " + (positive ? "positive" : "non-negative") +
              " finite number";
      return false;
    }
    field = j[key].get<double>();
    return true;
  };
  if (!number("default_tflops", p.defaultTflops, true) || !number("link_gbps", p.linkGBps, false) ||
      !number("link_latency_us", p.linkLatencyUs, false) ||
      !number("optimizer_ns_per_param", p.optimizerNsPerParam, false))
    return std::nullopt;
  if (j.contains("shared_cores")) {
    const nlohmann::json &cores = j["shared_cores"];
    if (!cores.is_number_integer() || cores.get<int64_t>() < 0 || cores.get<int64_t>() > 65536) {
      error = "\"shared_cores\" must be an integer from 0 (a device per rank) to 65536";
      return std::nullopt;
    }
    p.sharedCores = cores.get<int64_t>();
  }
  if (j.contains("units")) {
    if (!j["units"].is_object()) {
      error = "\"units\" must be an object of unit kinds";
      return std::nullopt;
    }
    for (const auto &[name, rates] : j["units"].items()) {
      std::optional<UnitKind> kind = parseUnitKind(name);
      if (!kind) {
        error = "unknown unit kind \"" + name + "\" in \"units\"";
        return std::nullopt;
      }
      UnitRates r;
      bool ok = rates.is_object();
      for (auto [key, field] : kRateKeys)
        if (ok && rates.contains(key)) {
          ok = nonNegativeFinite(rates[key]);
          if (ok)
            r.*field = rates[key].get<double>();
        }
      if (!ok || (r.forwardTflops <= 0 && r.forwardNsPerToken <= 0) ||
          (r.backwardTflops <= 0 && r.backwardNsPerToken <= 0)) {
        error = "units." + name + " needs non-negative, finite rates, with \"forward_tflops\" or "
                "\"forward_ns_per_token\" and \"backward_tflops\" or \"backward_ns_per_token\" positive";
        return std::nullopt;
      }
      p.units[*kind] = r;
    }
  }
  if ((j.contains("unit_ms") || j.contains("measurements")) && !readMeasuredTimes(j, p, error))
    return std::nullopt;
  return p;
}

std::optional<DeviceProfile> loadDeviceProfile(const std::string &nameOrPath, std::string &error) {
  if (std::optional<DeviceProfile> builtin = builtinDeviceProfile(nameOrPath))
    return builtin;
  // A regular file of bounded size: a device or a FIFO named here must not
  // be read forever (issue 14).
  struct stat info;
  if (::stat(nameOrPath.c_str(), &info) == 0 && (!S_ISREG(info.st_mode) || info.st_size > (1 << 20))) {
    error = nameOrPath + ": not a regular file of at most 1 MiB (a device profile is a small JSON file)";
    return std::nullopt;
  }
  std::ifstream in(nameOrPath);
  if (!in) {
    std::string names;
    for (const std::string &name : builtinDeviceProfileNames())
      names += (names.empty() ? "" : ", ") + name;
    error = "'" + nameOrPath + "' is neither a built-in profile (" + names + ") nor a readable file";
    return std::nullopt;
  }
  std::ostringstream text;
  text << in.rdbuf();
  std::optional<DeviceProfile> profile = parseDeviceProfile(text.str(), error);
  if (!profile)
    error = nameOrPath + ": " + error;
  return profile;
}

std::string formatDeviceProfile(const DeviceProfile &p) {
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["name"] = p.name;
  j["source"] = p.source;
  j["dtype"] = p.dtype;
  nlohmann::ordered_json units = nlohmann::ordered_json::object();
  for (UnitKind kind : kUnitKinds)
    if (auto it = p.units.find(kind); it != p.units.end())
    {
      nlohmann::ordered_json rates = nlohmann::ordered_json::object();
      for (auto [key, field] : kRateKeys)
        if (it->second.*field > 0) // 0: not given
          rates[key] = it->second.*field;
      units[unitKindName(kind)] = rates;
    }
  j["units"] = units;
  j["default_tflops"] = p.defaultTflops;
  j["link_gbps"] = p.linkGBps;
  j["link_latency_us"] = p.linkLatencyUs;
  j["optimizer_ns_per_param"] = p.optimizerNsPerParam;
  if (p.sharedCores > 0)
    j["shared_cores"] = p.sharedCores;
  return j.dump(1) + "\n";
}

} // namespace mhcc
