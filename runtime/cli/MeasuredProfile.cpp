//===- MeasuredProfile.cpp - a device profile from mhcrun --profile --------===//
#include "runtime/cli/MeasuredProfile.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <sstream>

namespace mhcc::runtime {
namespace {

/// Calls of each primitive per microbatch, over the whole model.
std::map<Prim, int64_t> callsPerMicrobatch(const Artifact &a) {
  std::map<Prim, int64_t> calls;
  for (const StageProgram &stage : a.stages)
    for (const ForwardInstr &f : stage.forward)
      ++calls[f.op];
  return calls;
}

/// One "rank R PHASE PRIM" key of the devices' profile times (PHASE: fwd,
/// bwd, bwd-weight); nullopt for the trainer's "host: ..." keys.
struct ProfileKey {
  int64_t rank = -1;
  std::string phase, prim;
};

std::optional<ProfileKey> parseProfileKey(const std::string &key) {
  std::istringstream words(key);
  std::string rankWord;
  ProfileKey k;
  if (!(words >> rankWord >> k.rank >> k.phase >> k.prim) || rankWord != "rank")
    return std::nullopt;
  return k;
}

/// Milliseconds per microbatch of each primitive's forward and backward
/// (B and W together), summed over ranks. Instructions a device fused
/// ("mhc_coeffs+pre") count as the first one's: the units sum them anyway.
void primitiveMs(const std::map<std::string, double> &profileMs, double microbatchSteps,
                 std::map<Prim, double> &forward, std::map<Prim, double> &backward) {
  for (const auto &[key, ms] : profileMs) {
    std::optional<ProfileKey> k = parseProfileKey(key);
    std::optional<Prim> p = k ? parsePrim(k->prim.substr(0, k->prim.find('+'))) : std::nullopt;
    if (p)
      (k->phase == "fwd" ? forward : backward)[*p] += ms / microbatchSteps;
  }
}

using Composition = std::vector<std::pair<Prim, int64_t>>;

/// What each unit kind's forward calls, as compiler/Lowering.cpp emits it;
/// `mixer` is the sublayer's own primitive (Attention, GatedDeltaNet, SwiGlu).
/// The residual mixing around it is a unit of its own (mixing()).
Composition sublayer(Prim mixer) { return {{Prim::RmsNorm, 1}, {mixer, 1}}; }

/// The residual stream's mixing around one sublayer: mHC's coefficients,
/// pre-mix and post/res mix, or the plain residual add (n = 1).
Composition mixing(bool mhc, bool roundsU) {
  if (mhc)
    return {{Prim::MhcCoeffs, 1}, {Prim::MhcPre, 1}, {Prim::MhcPostRes, 1}};
  if (roundsU) // n = 1 with an fp32 residual: u is the one-stream contract of it
    return {{Prim::Residual, 1}, {Prim::Contract, 1}};
  return {{Prim::Residual, 1}};
}

/// The unit kinds, by the names passes/CostModel.cpp gives them.
enum Unit { Embedding, Expand, Attention, Gdn, Mlp, Contract, FinalNorm, LmHead, Loss, Mtp, Mixing, kUnits };
constexpr std::array<const char *, kUnits> kUnitNames = {"embedding", "expand",     "attention", "gdn",
                                                         "mlp",       "contract",   "final_norm", "lm_head",
                                                         "loss",      "mtp",        "mhc"};

Composition compositionOf(Unit unit, bool mhc, bool roundsU) {
  switch (unit) {
  case Embedding: return {{Prim::Embed, 1}};
  case Expand: return {{Prim::Expand, 1}};
  case Attention: return sublayer(Prim::Attention);
  case Gdn: return sublayer(Prim::GatedDeltaNet);
  case Mlp: return sublayer(Prim::SwiGlu);
  case Mixing: return mixing(mhc, roundsU);
  case Contract: return {{Prim::Contract, 1}};
  case FinalNorm: return {{Prim::RmsNorm, 1}};
  case LmHead: return {{Prim::LmHead, 1}};
  case Loss: return {{Prim::CrossEntropy, 1}};
  case Mtp: {
    // Contract, two norms, the shifted embedding, ConcatProj, expand, one
    // attention and one MLP sublayer (their mixing counted as Mixing units),
    // contract, final norm, head, loss.
    Composition c = {{Prim::Contract, 2}, {Prim::RmsNorm, 3},   {Prim::Embed, 1},   {Prim::ConcatProj, 1},
                     {Prim::Expand, 1},   {Prim::LmHead, 1},    {Prim::CrossEntropy, 1}};
    for (Prim mixer : {Prim::Attention, Prim::SwiGlu})
      for (const auto &entry : sublayer(mixer))
        c.push_back(entry);
    return c;
  }
  default: return {};
  }
}

} // namespace

std::optional<std::string> measuredDeviceProfile(const Artifact &a, const std::map<std::string, double> &profileMs,
                                                 int64_t iterations, const std::string &name,
                                                 const std::string &source, int64_t sharedCores,
                                                 std::string &error) {
  std::map<Prim, int64_t> calls = callsPerMicrobatch(a);
  const bool mhc = a.model.streams > 1;
  const bool roundsU = a.model.roundsSublayerInput();
  // Units per model, from the calls that only one unit kind besides MTP makes.
  const int64_t mtp = calls[Prim::ConcatProj];
  std::array<int64_t, kUnits> units{};
  units[Embedding] = calls[Prim::Embed] - mtp;
  units[Expand] = calls[Prim::Expand] - mtp;
  units[Attention] = calls[Prim::Attention] - mtp;
  units[Gdn] = calls[Prim::GatedDeltaNet];
  units[Mlp] = calls[Prim::SwiGlu] - mtp;
  units[LmHead] = calls[Prim::LmHead] - mtp;
  units[Loss] = calls[Prim::CrossEntropy] - mtp;
  units[Mtp] = mtp;
  units[FinalNorm] = calls[Prim::RmsNorm] - units[Attention] - units[Gdn] - units[Mlp] - 5 * mtp;
  units[Mixing] = units[Attention] + units[Gdn] + units[Mlp] + 2 * mtp;
  units[Contract] = calls[Prim::Contract] - 2 * mtp - (roundsU ? units[Mixing] : 0);
  // The composition must account for every call, or the lowering changed.
  std::map<Prim, int64_t> composed;
  for (int u = 0; u < kUnits; ++u)
    for (const auto &[prim, count] : compositionOf(Unit(u), mhc, roundsU))
      composed[prim] += count * units[u];
  for (const auto &[prim, count] : calls)
    if (composed[prim] != count || units[FinalNorm] < 0) {
      error = std::string("the artifact's ") + primName(prim) + " calls (" + std::to_string(count) +
              " per microbatch) do not compose into its units as the lowering builds them (" +
              std::to_string(composed[prim]) + "): runtime/cli/MeasuredProfile.cpp needs updating";
      return std::nullopt;
    }

  std::map<Prim, double> forwardMs, backwardMs;
  primitiveMs(profileMs, double(iterations) * a.microbatches * a.dp, forwardMs, backwardMs); // every replica's
  nlohmann::ordered_json unitMs = nlohmann::ordered_json::object();
  for (int u = 0; u < kUnits; ++u) {
    if (units[u] == 0)
      continue;
    double fwd = 0, bwd = 0; // ms per unit and microbatch
    for (const auto &[prim, count] : compositionOf(Unit(u), mhc, roundsU)) {
      fwd += count * forwardMs[prim] / calls[prim];
      bwd += count * backwardMs[prim] / calls[prim];
    }
    if (fwd > 0 && bwd > 0) // else not timed in any profiled step
      unitMs[kUnitNames[u]] = {{"forward", fwd}, {"backward", bwd}};
  }
  const ModelInfo &m = a.model;
  nlohmann::ordered_json j;
  j["format"] = "mhcc-device-profile-v1";
  j["name"] = name;
  j["source"] = source;
  j["dtype"] = m.dtype;
  j["measured_on"] = {{"model", m.name},          {"vocab", m.vocab},         {"hidden", m.hidden},
                      {"heads", m.heads},         {"ffn_hidden", m.ffnHidden}, {"seq_len", m.seqLen},
                      {"micro_batch", m.microBatch}, {"streams", m.streams},
                      {"sinkhorn_iterations", m.sinkhornIterations}, {"dtype", m.dtype}};
  if (m.residualStorage() != m.dtype)
    j["measured_on"]["residual_dtype"] = m.residualStorage();
  j["unit_ms"] = unitMs;
  int64_t params = 0;
  for (const ParamInfo &info : a.params)
    params += info.count();
  if (auto it = profileMs.find("host: gradient reduction and optimizer"); it != profileMs.end() && params > 0)
    j["optimizer_ns_per_param"] = it->second / iterations * 1e6 / params;
  if (sharedCores > 0)
    j["shared_cores"] = sharedCores;
  return j.dump(1) + "\n";
}

/// "; predicted ... (ratio ...)" for a measured step of `stepMs`.
static std::string predictionBeside(const Artifact &a, double stepMs) {
  if (!a.prediction)
    return "; the artifact records no prediction (compiled before mhcc recorded one)";
  char line[512];
  std::snprintf(line, sizeof line, "; predicted %.3f ms, %.4f with %s (ratio %.2f)", a.prediction->stepMs,
                a.prediction->bubbleFraction, a.prediction->profile.c_str(),
                a.prediction->stepMs > 0 ? stepMs / a.prediction->stepMs : 0.0);
  return line;
}

std::string measuredStepLine(const Artifact &a, const std::map<std::string, double> &profileMs,
                             int64_t iterations) {
  auto wall = profileMs.find("host: pipeline (all ranks, wall)");
  if (wall == profileMs.end() || wall->second <= 0 || iterations < 1)
    return "mhcrun: no pipeline time measured";
  // The step as the simulator counts it: the pipeline and the optimizer,
  // which every rank runs (or waits for) after its list.
  auto optimizer = profileMs.find("host: gradient reduction and optimizer");
  const double optimizerMs = optimizer == profileMs.end() ? 0 : optimizer->second / iterations;
  const double stepMs = wall->second / iterations + optimizerMs;
  std::map<int64_t, double> busyMs; // by rank
  for (const auto &[key, ms] : profileMs)
    if (std::optional<ProfileKey> k = parseProfileKey(key))
      busyMs[k->rank] += ms / iterations;
  double busy = 0;
  for (auto &[rank, ms] : busyMs)
    busy += (ms += optimizerMs);
  const double ranks = double(busyMs.size());
  const double bubble = ranks > 0 ? std::max(0.0, 1 - busy / (ranks * stepMs)) : 0;
  char line[512];
  std::snprintf(line, sizeof line,
                "mhcrun: measured step %.3f ms (pipeline and optimizer, wall), bubble fraction %.4f (idle / "
                "(ranks x step), %lld rank(s) profiled)",
                stepMs, bubble, (long long)busyMs.size());
  return line + predictionBeside(a, stepMs);
}

std::string tracedStepLine(const Artifact &a, const std::vector<TraceSlice> &slices) {
  std::vector<StepTiming> timings = stepTimings(slices, a.worldSize());
  if (timings.empty())
    return "mhcrun: the trace holds no step";
  if (timings.size() > 1) // the first step records the memory plan and loads the kernels
    timings.erase(timings.begin());
  auto median = [&](double StepTiming::*field) {
    std::vector<double> v;
    for (const StepTiming &t : timings)
      v.push_back(t.*field);
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  const double stepMs = median(&StepTiming::spanMs);
  char line[512];
  std::snprintf(line, sizeof line,
                "mhcrun: traced step %.3f ms, bubble fraction %.4f (idle / (ranks x step), medians of steps %lld-%lld "
                "from --trace's slices)",
                stepMs, median(&StepTiming::bubble), (long long)timings.front().step, (long long)timings.back().step);
  return line + predictionBeside(a, stepMs);
}

} // namespace mhcc::runtime
