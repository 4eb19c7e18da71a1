// Activation recomputation (runtime/program/Recompute.h, mhcrun
// --recompute-sublayers). On compiled programs, with one-instruction spans
// and with the CUDA backend's fused spans (a post-res mix with the next
// sublayer's coefficients and pre-mix), one, two and three sublayers a
// segment (--recompute-num-sublayers): the segments cover the forward in
// order on span boundaries, each but the last with that many residual
// updates; the last drops nothing; no dropped value is read by a later
// segment's forward. End to
// end on the CPU backend, whole (PP1), interleaved (PP2/VPP2), split
// (ZB-H1) and hybrid with an empty chunk: the same bits as without it, a
// forward run again for every dropped segment, a lower peak (but under
// ZB-H1, whose pending W halves keep their inputs either way), and every
// backward finds what it reads. Under tensor, sequence and context
// parallelism too: a segment run again issues its forward's collectives
// inside the backward, which the device checks against the list derived
// for it (Device::interposeCollectives). Two sublayers a segment
// (--recompute-num-sublayers 2): the same bits, a peak no higher than
// without recomputation, and lower than one a segment's at PP1 (half the
// checkpoints against one more sublayer's working set).
//
// usage: recompute_test DATA ARTIFACT...
#include "runtime/program/BackwardFrees.h"
#include "runtime/program/MixGroups.h"
#include "runtime/program/Recompute.h"
#include "tests/runtime/ForwardingDevice.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <set>

namespace mhcc::runtime {
namespace {

std::optional<TokenDataset> gData;
std::vector<std::string> gArtifacts;

/// The CUDA backend's grouping: a post-res mix with the next sublayer's
/// coefficients and pre-mix.
size_t fusedSpan(const StageProgram &p, size_t i) {
  const std::vector<ForwardInstr> &f = p.forward;
  return f[i].op == Prim::MhcPostRes && i + 2 < f.size() && f[i + 1].op == Prim::MhcCoeffs &&
                 f[i + 2].op == Prim::MhcPre
             ? 3
             : 1;
}

std::vector<size_t> spanStarts(const StageProgram &p, bool fused) {
  std::vector<size_t> starts;
  for (size_t i = 0; i < p.forward.size(); i += fused ? fusedSpan(p, i) : 1)
    starts.push_back(i);
  return starts;
}

TEST(Recompute, SegmentsCoverTheForwardOnSpanBoundaries) {
  ASSERT_FALSE(gArtifacts.empty());
  int64_t dropping = 0;
  for (const std::string &path : gArtifacts) {
    std::string error;
    std::optional<Artifact> a = readArtifact(path, error);
    ASSERT_TRUE(a) << path << ": " << error;
    for (const StageProgram &p : a->stages)
      for (int64_t k = 1; k <= 3; ++k)
      for (bool fused : {false, true}) {
        SCOPED_TRACE(path + " stage " + std::to_string(p.stage) + (fused ? " fused" : "") + ", " +
                     std::to_string(k) + " sublayers a segment");
        const std::vector<size_t> starts = spanStarts(p, fused);
        const RecomputePlan plan = recomputePlan(p, starts, {}, k);
        ASSERT_FALSE(plan.segments.empty());
        EXPECT_EQ(plan.segments.front().first, 0u);
        EXPECT_EQ(plan.segments.back().second, p.forward.size());
        size_t updates = 0;
        for (size_t g = 0; g < plan.segments.size(); ++g) {
          const auto [begin, end] = plan.segments[g];
          EXPECT_LT(begin, end);
          if (g > 0) {
            EXPECT_EQ(plan.segments[g - 1].second, begin);
          }
          EXPECT_TRUE(std::count(starts.begin(), starts.end(), begin)) << "segment " << g << " cuts a span";
          int64_t own = 0;
          for (size_t j = begin; j < end; ++j) {
            EXPECT_EQ(plan.segmentOf[j], g);
            own += p.forward[j].op == Prim::MhcPostRes || p.forward[j].op == Prim::Residual;
          }
          updates += own;
          if (g + 1 < plan.segments.size()) {
            EXPECT_EQ(own, k) << "segment " << g;
          } else {
            EXPECT_LE(own, k) << "the last segment";
          }
        }
        // k residual updates a segment, and the tail after the last.
        EXPECT_GE(plan.segments.size(), (updates + k - 1) / k);
        EXPECT_LE(plan.segments.size(), (updates + k - 1) / k + 1);
        EXPECT_TRUE(plan.dropped.back().empty());
        for (size_t g = 0; g < plan.dropped.size(); ++g)
          for (int id : plan.dropped[g]) {
            ++dropping;
            EXPECT_NE(id, p.output);
            bool produced = false;
            for (size_t j = plan.segments[g].first; j < plan.segments[g].second; ++j)
              produced = produced || p.forward[j].output == id;
            EXPECT_TRUE(produced) << "value " << id << " dropped by segment " << g << ", which does not write it";
            for (size_t j = plan.segments[g].second; j < p.forward.size(); ++j)
              EXPECT_EQ(std::count(p.forward[j].inputs.begin(), p.forward[j].inputs.end(), id), 0)
                  << "value " << id << " dropped, but instruction " << j << " of a later segment reads it";
          }
        for (size_t k = 0; k < p.backward.size(); ++k) {
          const size_t own = plan.segmentOf[p.backward[k].forward];
          if (plan.drops(own)) {
            EXPECT_TRUE(std::count(plan.needs[k].begin(), plan.needs[k].end(), own)) << "backward " << k;
          }
        }
      }
  }
  EXPECT_GT(dropping, 0) << "nothing dropped anywhere";
}

TEST(Recompute, AnExtraReadNeedsItsSegment) {
  std::string error;
  std::optional<Artifact> a = readArtifact(gArtifacts.at(0), error);
  ASSERT_TRUE(a) << error;
  const StageProgram &p = a->stages.at(0);
  const RecomputePlan plain = recomputePlan(p, spanStarts(p, false), {});
  ASSERT_GT(plain.segments.size(), 2u);
  ASSERT_FALSE(plain.dropped[0].empty());
  // The first backward instruction (the last segment's) declares a read of
  // a value the first segment drops: it needs that segment run again.
  std::vector<std::vector<int>> extra(p.backward.size());
  extra[0] = {plain.dropped[0].front()};
  const RecomputePlan declared = recomputePlan(p, spanStarts(p, false), extra);
  EXPECT_EQ(std::count(plain.needs[0].begin(), plain.needs[0].end(), 0u), 0);
  EXPECT_EQ(std::count(declared.needs[0].begin(), declared.needs[0].end(), 0u), 1);
}

// ---- end to end --------------------------------------------------------------

std::atomic<int64_t> gForwards{0}, gMissing{0};

/// The CUDA backend's shape: fused forward spans (run here one by one) and
/// the extra reads of its mixing passes (mixGroupReads, CudaRank's); checks
/// every backward call finds what it reads.
class FusingDevice final : public ForwardingDevice {
public:
  FusingDevice(std::unique_ptr<Device> inner, const Artifact &a) : ForwardingDevice(std::move(inner)), a_(a) {
    for (const StageProgram &p : a.stages)
      groups_.push_back(findMixGroups(p));
  }
  size_t forwardSpan(int64_t stage, size_t index) const override { return fusedSpan(a_.stages[stage], index); }
  bool forward(int64_t stage, int64_t mb, size_t index, StageState &state) override {
    for (size_t j = index; j < index + forwardSpan(stage, index); ++j) {
      ++gForwards;
      if (!inner_->forward(stage, mb, j, state))
        return false;
    }
    return true;
  }
  std::vector<int> backwardReads(int64_t stage, size_t index) const override {
    return mixGroupReads(groups_.at(stage), index); // CudaRank's
  }
  bool backward(int64_t stage, int64_t mb, size_t index, BackwardPart part, StageState &state,
                const std::vector<int> &fresh) override {
    for (int id : missingBackwardReads(a_.stages[stage], index, part, backwardReads(stage, index), state)) {
      ++gMissing;
      ADD_FAILURE() << "stage " << stage << " backward " << index << ": value " << id << " missing";
    }
    return inner_->backward(stage, mb, index, part, state, fresh);
  }

private:
  const Artifact &a_;
  std::vector<std::vector<MixGroup>> groups_; // by stage
};

struct RecomputeRun {
  std::vector<StepResult> steps;
  int64_t forwards = 0;
};

RecomputeRun train(const std::string &path, bool recompute, int64_t sublayersPerSegment = 1) {
  TrainOptions options;
  options.recompute = recompute;
  options.recomputeNumSublayers = sublayersPerSegment;
  gForwards = 0;
  const DeviceFactory fusing =
      wrappedCpuDevices([](std::unique_ptr<Device> inner, const Artifact &a) -> std::unique_ptr<Device> {
        return std::make_unique<FusingDevice>(std::move(inner), a);
      });
  RecomputeRun run;
  run.steps = trainSteps(path, *gData, fusing, 2, options);
  run.forwards = gForwards.load();
  return run;
}

TEST(Recompute, TrainingKeepsItsBitsWithALowerPeak) {
  for (const std::string &path : gArtifacts) {
    SCOPED_TRACE(path);
    gMissing = 0;
    const RecomputeRun plain = train(path, false), again = train(path, true), paired = train(path, true, 2);
    ASSERT_EQ(plain.steps.size(), 2u);
    ASSERT_EQ(again.steps.size(), 2u);
    ASSERT_EQ(paired.steps.size(), 2u);
    EXPECT_EQ(gMissing.load(), 0);
    EXPECT_GT(again.forwards, plain.forwards) << "no segment was run again";
    EXPECT_GT(paired.forwards, plain.forwards) << "no segment of two was run again";
    expectSameStepBits(plain.steps, again.steps);
    expectSameStepBits(plain.steps, paired.steps);
    int64_t plainMax = 0, againMax = 0, pairedMax = 0;
    for (size_t r = 0; r < plain.steps[1].peakBytes.size(); ++r) {
      plainMax = std::max(plainMax, plain.steps[1].peakBytes[r]);
      againMax = std::max(againMax, again.steps[1].peakBytes[r]);
      pairedMax = std::max(pairedMax, paired.steps[1].peakBytes[r]);
    }
    // Under ZB-H1 the last stage's peak is its pending W halves, which
    // keep their inputs either way: only the bits are asked there.
    if (path.find("_zb") == std::string::npos) {
      EXPECT_LT(againMax, plainMax);
      EXPECT_LE(pairedMax, plainMax);
    }
    // On one stage of eight sublayers or more, half the checkpoints outweigh
    // one more sublayer's working set (a chunk of one layer instead holds
    // both its sublayers as its last segment, whole).
    std::string error;
    std::optional<Artifact> a = readArtifact(path, error);
    ASSERT_TRUE(a) << error;
    if (a->pp == 1 && a->vpp == 1) {
      EXPECT_LT(pairedMax, againMax);
    }
    std::printf("%s: peak bytes (largest rank) %lld without, %lld recomputing, %lld two sublayers a segment; "
                "forward calls %lld / %lld / %lld\n",
                path.c_str(), static_cast<long long>(plainMax), static_cast<long long>(againMax),
                static_cast<long long>(pairedMax), static_cast<long long>(plain.forwards),
                static_cast<long long>(again.forwards), static_cast<long long>(paired.forwards));
  }
}

/// Interposes one collective fewer than a recomputed segment issues.
class ShortListDevice final : public ForwardingDevice {
public:
  using ForwardingDevice::ForwardingDevice;
  bool interposeCollectives(const Instr *first, size_t count) override {
    return inner_->interposeCollectives(first, count > 0 ? count - 1 : 0);
  }
};

TEST(Recompute, ARecomputedForwardsCollectivesAreChecked) {
  // The first artifact under tensor parallelism; its recomputed segments
  // issue collectives, and one left out of their list stops the step.
  const std::string path = "tiny_tp2_cp2_m4_pp1";
  auto found = std::find_if(gArtifacts.begin(), gArtifacts.end(),
                            [&](const std::string &a) { return a.find(path) != std::string::npos; });
  ASSERT_NE(found, gArtifacts.end());
  std::string error;
  std::optional<Artifact> artifact = readArtifact(*found, error);
  ASSERT_TRUE(artifact) << error;
  TrainOptions options;
  options.recompute = true;
  // The ranks the failed ones leave waiting stop on the failure (a rank
  // that gave up on a collective no longer counts as arrived: before, its
  // partner could pass alone and wait for it at the collective's end until
  // this limit, one run in six); a rank only slow must not be declared stuck.
  options.recvTimeoutSeconds = 20;
  const DeviceFactory shortList =
      wrappedCpuDevices([](std::unique_ptr<Device> inner, const Artifact &) -> std::unique_ptr<Device> {
        return std::make_unique<ShortListDevice>(std::move(inner));
      });
  auto trainer = Trainer::create(std::move(*artifact), *gData, options, shortList, error);
  ASSERT_TRUE(trainer) << error;
  EXPECT_FALSE(trainer->step(error));
  EXPECT_NE(error.find("where the recomputed segment's list (derived from its stage program) lists no more"),
            std::string::npos)
      << error;
}

} // namespace
} // namespace mhcc::runtime

int main(int argc, char **argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc < 3) {
    std::fprintf(stderr, "usage: recompute_test DATA ARTIFACT...\n");
    return 2;
  }
  std::string error;
  mhcc::runtime::gData = mhcc::runtime::TokenDataset::open(argv[1], error);
  if (!mhcc::runtime::gData) {
    std::fprintf(stderr, "recompute_test: %s\n", error.c_str());
    return 2;
  }
  for (int i = 2; i < argc; ++i)
    mhcc::runtime::gArtifacts.push_back(argv[i]);
  return RUN_ALL_TESTS();
}
