// The settings every process of a run must share (runtime/cli/RunSettings.h):
// equal settings agree; a differing flag that changes the step, the data
// order or the ranks' meeting points is named with both values; output-only
// flags may differ; an encoding this mhcrun does not read is refused.
#include "runtime/cli/RunSettings.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace mhcc::runtime {
namespace {

struct Rank {
  RunFlags flags;
  Artifact artifact;
  std::string backend = "cpu";
  std::string data = "4096 0123456789abcdef";
  std::string environment = "MHCC_PDL=1";
  std::vector<std::pair<std::string, std::string>> settings() const {
    return sharedRunSettings(flags, artifact, backend, data, environment);
  }
};

TEST(RunSettings, TheSameSettingsAgree) {
  Rank zero, other;
  zero.artifact.checksum = other.artifact.checksum = 0x1234;
  EXPECT_EQ(runSettingsDifference(encodeRunSettings(zero.settings()), other.settings()), "");
}

TEST(RunSettings, ADifferentFlagIsNamedWithBothValues) {
  Rank zero;
  const std::string rank0 = encodeRunSettings(zero.settings());
  {
    Rank other;
    other.flags.options.lr = 1e-3;
    const std::string d = runSettingsDifference(rank0, other.settings());
    EXPECT_NE(d.find("--lr is '0.001' here but '0.003' on rank 0"), std::string::npos) << d;
    EXPECT_NE(d.find("the same mhcrun flags"), std::string::npos) << d;
  }
  {
    Rank other;
    other.flags.options.recompute = true;
    const std::string d = runSettingsDifference(rank0, other.settings());
    EXPECT_NE(d.find("--recompute-sublayers is 'on' here but 'off' on rank 0"), std::string::npos) << d;
  }
  {
    Rank other;
    other.flags.saveDir = "/ckpt";
    const std::string d = runSettingsDifference(rank0, other.settings());
    EXPECT_NE(d.find("--save is '/ckpt' here but (not given) on rank 0"), std::string::npos) << d;
  }
  {
    Rank other;
    other.artifact.checksum = 0xabc;
    const std::string d = runSettingsDifference(rank0, other.settings());
    EXPECT_NE(d.find("the artifact (checksum) is '0000000000000abc' here"), std::string::npos) << d;
  }
  {
    Rank other;
    other.data = "4096 fedcba9876543210";
    EXPECT_NE(runSettingsDifference(rank0, other.settings()).find("--data (tokens, sampled XXH3)"), std::string::npos);
  }
  {
    Rank other; // a kernel choice (it may change bits)
    other.environment = "MHCC_MHC_BACKWARD=passes MHCC_PDL=1";
    EXPECT_NE(runSettingsDifference(rank0, other.settings()).find("the MHCC_ environment is 'MHCC_MHC_BACKWARD"),
              std::string::npos);
  }
  {
    Rank other;
    other.flags.loadDir = "/ckpt";
    EXPECT_NE(runSettingsDifference(rank0, other.settings()).find("--load is 'on' here but 'off'"),
              std::string::npos);
  }
  {
    Rank other; // differs in the 17th digit: still told apart
    other.flags.options.adamEps = 1e-8 * (1 + 1e-15);
    EXPECT_NE(runSettingsDifference(rank0, other.settings()).find("--adam-eps is '1.0000000000000012e-08' here but '1e-08'"),
              std::string::npos)
        << runSettingsDifference(rank0, other.settings());
  }
  {
    Rank other;
    other.flags.steps = 7;
    EXPECT_NE(runSettingsDifference(rank0, other.settings()).find("--steps is '7'"), std::string::npos);
  }
}

TEST(RunSettings, OutputOnlyFlagsMayDiffer) {
  Rank zero, other;
  other.flags.metricsPath = "rank1.jsonl";
  other.flags.noProgress = true;
  other.flags.peakTflops = 989;
  other.flags.options.profile = true;           // each rank times its own
  other.flags.exportPath = "weights.safetensors"; // rank 0 alone exports
  EXPECT_EQ(runSettingsDifference(encodeRunSettings(zero.settings()), other.settings()), "");
  // A checkpoint's path may differ between hosts; whether one is loaded not.
  zero.flags.loadDir = "/a/ckpt";
  other.flags.loadDir = "/b/ckpt";
  EXPECT_EQ(runSettingsDifference(encodeRunSettings(zero.settings()), other.settings()), "");
}

TEST(RunSettings, TheDataFingerprintIsWhatTheSamplerDraws) {
  std::vector<int32_t> ids(100000);
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = int32_t(i % 251);
  const TokenDataset a(ids), b(ids);
  EXPECT_EQ(dataFingerprint(a, 1234, 128), dataFingerprint(b, 1234, 128));
  EXPECT_EQ(dataFingerprint(a, 1234, 128).rfind("100000 ", 0), 0u);
  EXPECT_NE(dataFingerprint(a, 1234, 128), dataFingerprint(a, 99, 128)); // another data order
  // A blend with other weights draws other windows.
  std::vector<int32_t> other(ids.rbegin(), ids.rend());
  std::vector<std::pair<double, TokenDataset>> even, skewed;
  even.push_back({0.5, TokenDataset(ids)});
  even.push_back({0.5, TokenDataset(other)});
  skewed.push_back({0.1, TokenDataset(ids)});
  skewed.push_back({0.9, TokenDataset(other)});
  EXPECT_NE(dataFingerprint(TokenDataset::blend(std::move(even), "even"), 1234, 128),
            dataFingerprint(TokenDataset::blend(std::move(skewed), "skewed"), 1234, 128));
}

TEST(RunSettings, TheEnvironmentComparedIsTheKernelChoices) {
  ::setenv("MHCC_CPU_THREADS", "3", 1); // may differ between hosts
  ::setenv("MHCC_PDL", "0", 1);         // the same bits either way
  ::unsetenv("MHCC_ATTENTION");
  ::unsetenv("MHCC_MHC_FORWARD");
  ::setenv("MHCC_MHC_BACKWARD", "passes", 1);
  EXPECT_EQ(mhccEnvironment(), "MHCC_MHC_BACKWARD=passes");
  ::unsetenv("MHCC_MHC_BACKWARD");
  EXPECT_EQ(mhccEnvironment(), "");
}

TEST(RunSettings, AnotherEncodingIsRefused) {
  Rank zero;
  const std::string rank0 = encodeRunSettings(zero.settings());
  EXPECT_NE(runSettingsDifference("", zero.settings()).find("different mhcrun versions"), std::string::npos);
  EXPECT_NE(runSettingsDifference("--colour=blue\n" + rank0, zero.settings()).find("different mhcrun versions"),
            std::string::npos);
  EXPECT_NE(runSettingsDifference(rank0 + "--more=1\n", zero.settings()).find("more settings"), std::string::npos);
}

} // namespace
} // namespace mhcc::runtime
