// passes/DeviceProfile: the rates the schedule simulator assumes. Measured
// times become rates through the cost model, hand-written rates are read as
// they are, every built-in profile parses, and bad files are one error each.
#include "passes/DeviceProfile.h"

#include <gtest/gtest.h>

#include <cmath>

namespace mhcc {
namespace {

constexpr const char kMeasured[] = R"({"format": "mhcc-device-profile-v1", "name": "m", "source": "a run",
  "dtype": "f32",
  "measured_on": {"vocab": 256, "hidden": 64, "heads": 4, "ffn_hidden": 176, "seq_len": 128,
                  "micro_batch": 1, "streams": 4, "sinkhorn_iterations": 20},
  "unit_ms": {"attention": {"forward": 2.0, "backward": 5.0}, "expand": {"forward": 0.1, "backward": 0.2}},
  "link_gbps": 50, "link_latency_us": 5, "optimizer_ns_per_param": 3})";

/// The sizes the profiles below say they were measured on (tiny's).
ModelInfo measuredDims() {
  ModelInfo dims;
  dims.vocab = 256, dims.hidden = 64, dims.heads = 4, dims.ffnHidden = 176, dims.seqLen = 128;
  dims.streams = 4, dims.sinkhornIterations = 20;
  return dims;
}

TEST(DeviceProfile, MeasuredTimesBecomeRatesThatGiveTheTimesBack) {
  std::string error;
  std::optional<DeviceProfile> p = parseDeviceProfile(kMeasured, error);
  ASSERT_TRUE(p) << error;
  ModelInfo dims = measuredDims();
  const double flops = unitCost(UnitKind::AttentionSublayer, dims).forwardFlopsPerToken * 128;
  ASSERT_GT(flops, 0);
  // The measured model costs what was measured; twice the FLOPs, twice the time.
  EXPECT_NEAR(p->forwardMs(UnitKind::AttentionSublayer, flops, 128), 2.0, 1e-12);
  EXPECT_NEAR(p->backwardMs(UnitKind::AttentionSublayer, 2 * flops, 128), 5.0, 1e-12);
  EXPECT_NEAR(p->forwardMs(UnitKind::AttentionSublayer, 2 * flops, 128), 4.0, 1e-12);
  // Expand has no FLOPs in the cost model: time per token.
  EXPECT_NEAR(p->forwardMs(UnitKind::Expand, 0, 256), 0.2, 1e-12);
  // Units not measured fall back to the default rate.
  EXPECT_NEAR(p->forwardMs(UnitKind::LmHead, 400e9, 128), 1.0, 1e-12);
  EXPECT_EQ(p->linkGBps, 50);
  EXPECT_EQ(p->linkLatencyUs, 5);
  EXPECT_EQ(p->optimizerNsPerParam, 3);
  EXPECT_NE(p->describe().find("device profile m (a run; 50.00 GB/s P2P)"), std::string::npos) << p->describe();
}

// A profile that measured the residual mixing ("mhc") apart: a sublayer's
// time is its own FLOPs at its rate plus its mixing at the mixing's, so a
// model with a cheaper mixing (n = 1) is priced by what it leaves out, not by
// its 1% fewer FLOPs.
TEST(DeviceProfile, TheMixingMeasuredApartIsPricedAtItsOwnRate) {
  const std::string measured = R"({"format": "mhcc-device-profile-v1", "name": "m", "source": "a run",
    "measured_on": {"vocab": 256, "hidden": 64, "heads": 4, "ffn_hidden": 176, "seq_len": 128,
                    "micro_batch": 1, "streams": 4, "sinkhorn_iterations": 20},
    "unit_ms": {"attention": {"forward": 2.0, "backward": 5.0}, "mhc": {"forward": 1.0, "backward": 3.0}}})";
  std::string error;
  std::optional<DeviceProfile> p = parseDeviceProfile(measured, error);
  ASSERT_TRUE(p) << error;
  ASSERT_TRUE(p->units.count(UnitKind::MhcMixing));
  ModelInfo dims = measuredDims();
  const UnitCost n4 = unitCost(UnitKind::AttentionSublayer, dims);
  EXPECT_EQ(n4.mixings, 1);
  ASSERT_GT(n4.mixingFlopsPerToken, 0);
  ASSERT_LT(n4.mixingFlopsPerToken, n4.forwardFlopsPerToken);
  // The measured model gives the measured sums back.
  EXPECT_NEAR(p->forwardMs(n4, 128), 3.0, 1e-12);
  EXPECT_NEAR(p->backwardMs(n4, 128), 8.0, 1e-12);
  // n = 1: the same attention, a mixing of C FLOPs a token (the residual add) at the mixing's rate.
  dims.streams = 1;
  const UnitCost n1 = unitCost(UnitKind::AttentionSublayer, dims);
  const double attentionFlops = n4.forwardFlopsPerToken - n4.mixingFlopsPerToken;
  EXPECT_NEAR(n1.forwardFlopsPerToken - n1.mixingFlopsPerToken, attentionFlops, 1e-9 * attentionFlops);
  const double mixingShare = n1.mixingFlopsPerToken / n4.mixingFlopsPerToken;
  EXPECT_NEAR(p->forwardMs(n1, 128), 2.0 + 1.0 * mixingShare, 1e-12);
  EXPECT_LT(p->forwardMs(n1, 128), 2.1);
  // Without a measured mixing, the whole unit is priced at the unit's rate (profiles written before "mhc").
  std::optional<DeviceProfile> whole = parseDeviceProfile(kMeasured, error);
  ASSERT_TRUE(whole) << error;
  dims.streams = 4;
  EXPECT_NEAR(whole->forwardMs(unitCost(UnitKind::AttentionSublayer, dims), 128), 2.0, 1e-12);
  // An MTP module holds two mixings, priced at the mixing's rate; the rest (not measured) at the default rate.
  const UnitCost mtp = unitCost(UnitKind::Mtp, dims);
  EXPECT_EQ(mtp.mixings, 2);
  EXPECT_NEAR(mtp.mixingFlopsPerToken, 2 * n4.mixingFlopsPerToken, 1e-9 * n4.mixingFlopsPerToken);
  const double rest = (mtp.forwardFlopsPerToken - mtp.mixingFlopsPerToken) * 128 / (p->defaultTflops * 1e9);
  EXPECT_NEAR(p->forwardMs(mtp, 128), rest + 2 * 1.0, 1e-9);
}

// Under tensor parallelism a rank does 1 / tp of a sublayer's GEMMs and
// heads but mixes every row of the residual (replicated over the group),
// unless sequence parallelism gives it 1 / tp of the rows.
TEST(DeviceProfile, TensorParallelRanksSplitTheSublayerNotTheMixing) {
  const std::string measured = R"({"format": "mhcc-device-profile-v1", "name": "m", "source": "a run",
    "measured_on": {"vocab": 256, "hidden": 64, "heads": 4, "ffn_hidden": 176, "seq_len": 128,
                    "micro_batch": 1, "streams": 4, "sinkhorn_iterations": 20},
    "unit_ms": {"attention": {"forward": 2.0, "backward": 5.0}, "mhc": {"forward": 1.0, "backward": 3.0}}})";
  std::string error;
  std::optional<DeviceProfile> p = parseDeviceProfile(measured, error);
  ASSERT_TRUE(p) << error;
  ModelInfo dims = measuredDims();
  const UnitCost sublayer = unitCost(UnitKind::AttentionSublayer, dims);
  // One measurement: the attention's time is all rate (no fixed part to keep whole).
  EXPECT_NEAR(p->forwardMs(sublayer, 128, 2), 2.0 / 2 + 1.0, 1e-12);
  EXPECT_NEAR(p->backwardMs(sublayer, 128, 2), 5.0 / 2 + 3.0, 1e-12);
  EXPECT_NEAR(p->forwardMs(sublayer, 128, 2, true), 2.0 / 2 + 1.0 / 2, 1e-12);
  EXPECT_NEAR(p->backwardMs(sublayer, 128, 4, true), 5.0 / 4 + 3.0 / 4, 1e-12);
  // A profile without the mixing apart prices it inside the unit's rate,
  // but still whole on every rank: only the rest of the FLOPs splits.
  std::optional<DeviceProfile> whole = parseDeviceProfile(kMeasured, error);
  ASSERT_TRUE(whole) << error;
  const double F = sublayer.forwardFlopsPerToken, M = sublayer.mixingFlopsPerToken;
  EXPECT_NEAR(whole->forwardMs(sublayer, 128, 2), 2.0 * ((F - M) / 2 + M) / F, 1e-12);
  EXPECT_NEAR(whole->forwardMs(sublayer, 128, 2, true), 2.0 * ((F - M) / 2 + M / 2) / F, 1e-12);
  EXPECT_GT(whole->forwardMs(sublayer, 128, 2), 2.0 / 2);
  // An MTP module: its GEMMs split, its two mixings whole.
  const UnitCost mtp = unitCost(UnitKind::Mtp, dims);
  const double mtpRest = (mtp.forwardFlopsPerToken - mtp.mixingFlopsPerToken) * 128 / (p->defaultTflops * 1e9);
  EXPECT_NEAR(p->forwardMs(mtp, 128, 2), mtpRest / 2 + 2 * 1.0, 1e-9);
  EXPECT_NEAR(p->forwardMs(mtp, 128, 2, true), mtpRest / 2 + 2 * 0.5, 1e-9);
}

// The replicated units (expand, contract, the final norm) cost every rank
// their whole time unless sequence parallelism shards their rows, the
// embedding's masked lookup its whole time either way, and a unit's fixed
// overhead (launch latency) is every rank's: it does not divide.
TEST(DeviceProfile, TensorParallelRanksKeepReplicatedWorkAndOverheadsWhole) {
  DeviceProfile p;
  UnitRates attentionRates, expandRates, normRates;
  attentionRates.forwardTflops = attentionRates.backwardTflops = 100;
  attentionRates.forwardOverheadUs = 50, attentionRates.backwardOverheadUs = 80;
  expandRates.forwardNsPerToken = 10, expandRates.backwardNsPerToken = 20;
  normRates.forwardTflops = normRates.backwardTflops = 1;
  p.units[UnitKind::AttentionSublayer] = attentionRates;
  p.units[UnitKind::Expand] = expandRates;
  p.units[UnitKind::FinalNorm] = normRates;
  p.units[UnitKind::Embedding] = expandRates;
  ModelInfo dims = measuredDims();
  const UnitCost attention = unitCost(UnitKind::AttentionSublayer, dims);
  const double flopsMs = attention.forwardFlopsPerToken * 128 / (100 * 1e9);
  EXPECT_NEAR(p.forwardMs(attention, 128), flopsMs + 0.05, 1e-12);
  const double M = attention.mixingFlopsPerToken * 128 / (100 * 1e9); // the mixing, at the unit's rate
  EXPECT_NEAR(p.forwardMs(attention, 128, 2), (flopsMs - M) / 2 + M + 0.05, 1e-12);
  EXPECT_NEAR(p.backwardMs(attention, 128, 4), 2 * ((flopsMs - M) / 4 + M) + 0.08, 1e-12);
  const UnitCost expand = unitCost(UnitKind::Expand, dims), norm = unitCost(UnitKind::FinalNorm, dims);
  ASSERT_FALSE(splitByTensorParallelism(UnitKind::Expand));
  ASSERT_TRUE(splitByTensorParallelism(UnitKind::LmHead));
  EXPECT_NEAR(p.forwardMs(expand, 128, 2), p.forwardMs(expand, 128), 1e-12);
  EXPECT_NEAR(p.forwardMs(expand, 128, 2, true), p.forwardMs(expand, 128) / 2, 1e-12);
  EXPECT_NEAR(p.backwardMs(norm, 128, 4), p.backwardMs(norm, 128), 1e-12);
  EXPECT_NEAR(p.backwardMs(norm, 128, 4, true), p.backwardMs(norm, 128) / 4, 1e-12);
  // The embedding's masked lookup writes every row on every rank, SP or not.
  const UnitCost embed = unitCost(UnitKind::Embedding, dims);
  ASSERT_GT(p.forwardMs(embed, 128), 0);
  EXPECT_NEAR(p.forwardMs(embed, 128, 2, true), p.forwardMs(embed, 128), 1e-12);
}

// An n = 1 model with an fp32 residual beside bf16 activations mixes twice
// C a token (the add and the copy that rounds u): the profile it measured
// says so in "measured_on", and the mixing's rate is fitted to those FLOPs.
TEST(DeviceProfile, MeasuredOnCarriesTheResidualStorage) {
  const std::string measured = R"({"format": "mhcc-device-profile-v1", "name": "m", "source": "a run",
    "measured_on": {"vocab": 256, "hidden": 64, "heads": 4, "ffn_hidden": 176, "seq_len": 128,
                    "micro_batch": 1, "streams": 1, "sinkhorn_iterations": 20, "dtype": "bf16",
                    "residual_dtype": "f32"},
    "unit_ms": {"attention": {"forward": 2.0, "backward": 5.0}, "mhc": {"forward": 1.0, "backward": 3.0}}})";
  std::string error;
  std::optional<DeviceProfile> p = parseDeviceProfile(measured, error);
  ASSERT_TRUE(p) << error;
  ModelInfo dims = measuredDims();
  dims.streams = 1, dims.dtype = "bf16", dims.residualDtype = "f32";
  const UnitCost copied = unitCost(UnitKind::AttentionSublayer, dims);
  EXPECT_EQ(copied.mixingFlopsPerToken, 2.0 * 64);
  EXPECT_NEAR(p->forwardMs(copied, 128), 3.0, 1e-12); // the measured sum back
  dims.residualDtype = "";
  EXPECT_NEAR(p->forwardMs(unitCost(UnitKind::AttentionSublayer, dims), 128), 2.5, 1e-12); // half the mixing
  std::string bad = measured;
  bad.replace(bad.find("\"f32\""), 5, "\"f16\"");
  EXPECT_FALSE(parseDeviceProfile(bad, error));
  EXPECT_NE(error.find("\"residual_dtype\" must be \"f32\" or \"bf16\""), std::string::npos) << error;
}

TEST(DeviceProfile, RatesRoundTripThroughTheFormat) {
  std::string error;
  std::optional<DeviceProfile> p = parseDeviceProfile(kMeasured, error);
  ASSERT_TRUE(p) << error;
  std::optional<DeviceProfile> q = parseDeviceProfile(formatDeviceProfile(*p), error);
  ASSERT_TRUE(q) << error;
  for (UnitKind kind : {UnitKind::AttentionSublayer, UnitKind::Expand}) {
    EXPECT_DOUBLE_EQ(q->forwardMs(kind, 1e9, 100), p->forwardMs(kind, 1e9, 100));
    EXPECT_DOUBLE_EQ(q->backwardMs(kind, 1e9, 100), p->backwardMs(kind, 1e9, 100));
  }
  EXPECT_EQ(q->name, "m");
  EXPECT_EQ(q->linkGBps, 50);
  EXPECT_EQ(q->sharedCores, 0); // a device per rank unless the profile says otherwise
  p->sharedCores = 6;
  q = parseDeviceProfile(formatDeviceProfile(*p), error);
  ASSERT_TRUE(q) << error;
  EXPECT_EQ(q->sharedCores, 6);
  EXPECT_NE(q->describe().find("ranks share 6 cores"), std::string::npos) << q->describe();
}

TEST(DeviceProfile, TheCpuProfileSharesItsHostsCores) {
  EXPECT_EQ(builtinDeviceProfile("cpu")->sharedCores, 2);
  EXPECT_EQ(builtinDeviceProfile("h200-bf16")->sharedCores, 0);
}

TEST(DeviceProfile, EveryBuiltinProfileParsesAndNamesItsSource) {
  ASSERT_FALSE(builtinDeviceProfileNames().empty());
  for (const std::string &name : builtinDeviceProfileNames()) {
    std::optional<DeviceProfile> p = builtinDeviceProfile(name);
    ASSERT_TRUE(p) << name;
    EXPECT_EQ(p->name, name);
    EXPECT_FALSE(p->source.empty()) << name;
    EXPECT_FALSE(p->units.empty()) << name << ": a built-in profile is a measurement";
    EXPECT_TRUE(p->units.count(UnitKind::AttentionSublayer) && p->units.count(UnitKind::MlpSublayer)) << name;
  }
}

TEST(DeviceProfile, BadProfilesAreOneErrorEach) {
  const std::pair<const char *, const char *> cases[] = {
      {"[]", "not a JSON object"},
      {R"({"format": "v0"})", "\"format\""},
      {R"({"format": "mhcc-device-profile-v1", "link_gbps": -1})", "link_gbps"},
      {R"({"format": "mhcc-device-profile-v1", "default_tflops": 0})", "default_tflops"},
      {R"({"format": "mhcc-device-profile-v1", "units": {"warp": {"forward_tflops": 1, "backward_tflops": 1}}})",
       "unknown unit kind \"warp\""},
      {R"({"format": "mhcc-device-profile-v1", "units": {"mlp": {"forward_tflops": 1}}})", "units.mlp"},
      {R"({"format": "mhcc-device-profile-v1", "unit_ms": {"mlp": {"forward": 1, "backward": 1}}})",
       "measured_on"},
      {R"({"format": "mhcc-device-profile-v1", "measured_on": {"vocab": 2, "hidden": 2, "heads": 1,
          "ffn_hidden": 2, "seq_len": 2, "micro_batch": 1, "streams": 1, "sinkhorn_iterations": 1},
          "unit_ms": {"mlp": {"forward": 0, "backward": 1}}})",
       "unit_ms.mlp"},
      {R"({"format": "mhcc-device-profile-v1", "measurements": [
          {"measured_on": {"vocab": 2, "hidden": 2, "heads": 1, "ffn_hidden": 2, "seq_len": 2, "micro_batch": 1,
                           "streams": 4, "sinkhorn_iterations": 1},
           "unit_ms": {"mlp": {"forward": 1, "backward": 1}, "mhc": {"forward": 1, "backward": 1}}},
          {"measured_on": {"vocab": 2, "hidden": 4, "heads": 1, "ffn_hidden": 2, "seq_len": 2, "micro_batch": 1,
                           "streams": 4, "sinkhorn_iterations": 1},
           "unit_ms": {"mlp": {"forward": 2, "backward": 2}}}]})",
       "\"measurements\" disagree on \"mhc\""},
      {R"({"format": "mhcc-device-profile-v1", "name": 3})", "\"name\" must be a string"},
      {R"({"format": "mhcc-device-profile-v1", "shared_cores": -2})", "\"shared_cores\""},
      {R"({"format": "mhcc-device-profile-v1", "shared_cores": 1.5})", "\"shared_cores\""},
  };
  for (const auto &[text, expected] : cases) {
    std::string error;
    EXPECT_FALSE(parseDeviceProfile(text, error)) << text;
    EXPECT_NE(error.find(expected), std::string::npos) << text << " -> " << error;
  }
  std::string error;
  EXPECT_FALSE(loadDeviceProfile("/dev/zero", error));
  EXPECT_NE(error.find("not a regular file"), std::string::npos) << error;
  EXPECT_FALSE(loadDeviceProfile("no-such-profile", error));
  EXPECT_NE(error.find("neither a built-in profile"), std::string::npos) << error;
}

} // namespace
} // namespace mhcc
