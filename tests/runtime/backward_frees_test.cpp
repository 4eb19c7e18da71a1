// backwardFrees (runtime/program/BackwardFrees.h) and the executor's use of
// it. On compiled programs (each layout given): every value but the stage's
// boundary and every aux buffer is released exactly once, after its last
// backward reader and never before one, whole or split into B and W (B
// keeps what W reads); a device's extra reads hold a value until they ran.
// End to end on the CPU backend, whole (PP1) and split (ZB-H1): training
// gives the same bits as with nothing released before the backward's end
// (a device that declares every value read by the last instruction, and
// MHCC_BACKWARD_RELEASE=end, which holds aux buffers too), with a lower
// peak, and every backward call finds what it reads, its declared extras
// too.
//
// usage: backward_frees_test DATA PP1_ARTIFACT ZB_ARTIFACT ARTIFACT...
#include "runtime/cpu/CpuDevice.h"
#include "runtime/program/BackwardFrees.h"
#include "runtime/train/Trainer.h"
#include "tests/runtime/ForwardingDevice.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <set>

namespace mhcc::runtime {
namespace {

std::optional<TokenDataset> gData;
std::string gWholeArtifact, gSplitArtifact;
std::vector<std::string> gArtifacts;

std::vector<StageProgram> programs(const std::string &path) {
  std::string error;
  std::optional<Artifact> a = readArtifact(path, error);
  EXPECT_TRUE(a) << path << ": " << error;
  return a ? a->stages : std::vector<StageProgram>{};
}

bool boundary(const StageProgram &p, int id) {
  return id == p.input || id == p.output || id == p.gradInput || id == p.gradOutput;
}

/// Where each value is released: -1 before the first instruction, k after
/// instruction k; missing when never.
std::map<int, long> releasePoints(const BackwardFrees &f) {
  std::map<int, long> at;
  for (int id : f.valuesUnread)
    EXPECT_TRUE(at.emplace(id, -1).second) << "value " << id << " released twice";
  for (size_t k = 0; k < f.valuesAfter.size(); ++k)
    for (int id : f.valuesAfter[k])
      EXPECT_TRUE(at.emplace(id, long(k)).second) << "value " << id << " released twice";
  return at;
}

TEST(BackwardFrees, EachValueOnceAfterItsLastReader) {
  ASSERT_FALSE(gArtifacts.empty());
  for (const std::string &path : gArtifacts)
    for (const StageProgram &p : programs(path)) {
      SCOPED_TRACE(path + " stage " + std::to_string(p.stage));
      const BackwardFrees f = backwardFrees(p, {});
      ASSERT_EQ(f.valuesAfter.size(), p.backward.size());
      const std::map<int, long> at = releasePoints(f);
      for (size_t v = 0; v < p.values.size(); ++v)
        EXPECT_EQ(at.count(int(v)), boundary(p, int(v)) ? 0u : 1u) << "value " << v;
      for (size_t k = 0; k < p.backward.size(); ++k)
        for (int id : ownBackwardReads(p, p.backward[k])) {
          if (id >= 0 && at.count(id))
            EXPECT_GE(at.at(id), long(k)) << "value " << id << " released before instruction " << k << " reads it";
        }
      std::multiset<size_t> aux(f.auxUnread.begin(), f.auxUnread.end());
      for (size_t k = 0; k < f.auxAfter.size(); ++k)
        for (size_t j : f.auxAfter[k]) {
          aux.insert(j);
          for (size_t later = k + 1; later < p.backward.size(); ++later)
            EXPECT_NE(size_t(p.backward[later].forward), j) << "aux " << j << " released before its backward";
        }
      EXPECT_EQ(aux.size(), p.forward.size());
      EXPECT_EQ(std::set<size_t>(aux.begin(), aux.end()).size(), p.forward.size());
      // Something is released before the end, or the whole point is lost.
      if (p.backward.size() > 2) {
        size_t early = f.valuesUnread.size();
        for (size_t k = 0; k + 1 < f.valuesAfter.size(); ++k)
          early += f.valuesAfter[k].size();
        EXPECT_GT(early, 0u);
      }
    }
}

/// Where each value and aux buffer is released: B's lists, then W's
/// (positions offset past B's).
TEST(BackwardFrees, SplitBKeepsWhatWReadsAndWReleasesIt) {
  for (const std::string &path : gArtifacts)
    for (const StageProgram &p : programs(path)) {
      SCOPED_TRACE(path + " stage " + std::to_string(p.stage));
      const BackwardFrees b = backwardFrees(p, {}, BackwardPart::Input);
      const BackwardFrees w = backwardFrees(p, {}, BackwardPart::Weight);
      const std::map<int, long> inB = releasePoints(b), inW = releasePoints(w);
      std::set<int> readByW;
      for (const BackwardInstr &instr : p.backward)
        for (int id : weightHalfReads(p, instr))
          readByW.insert(id);
      for (size_t v = 0; v < p.values.size(); ++v) {
        const int id = int(v);
        EXPECT_EQ(inB.count(id) + inW.count(id), boundary(p, id) ? 0u : 1u) << "value " << v;
        if (readByW.count(id))
          EXPECT_EQ(inB.count(id), 0u) << "B releases value " << v << ", which W reads";
      }
      for (size_t k = 0; k < p.backward.size(); ++k) {
        for (int id : ownBackwardReads(p, p.backward[k]))
          if (id >= 0 && inB.count(id))
            EXPECT_GE(inB.at(id), long(k)) << "B releases value " << id << " before instruction " << k;
        for (int id : weightHalfReads(p, p.backward[k]))
          if (id >= 0 && inW.count(id))
            EXPECT_GE(inW.at(id), long(k)) << "W releases value " << id << " before instruction " << k;
      }
      size_t aux = b.auxUnread.size() + w.auxUnread.size();
      for (size_t k = 0; k < p.backward.size(); ++k) {
        aux += b.auxAfter[k].size() + w.auxAfter[k].size();
        for (size_t j : b.auxAfter[k])
          EXPECT_TRUE(p.forward[j].params.empty()) << "B releases the aux of " << j << ", which W reads";
      }
      EXPECT_EQ(aux, p.forward.size());
    }
}

TEST(BackwardFrees, AnExtraReadHoldsAValueUntilItRan) {
  for (const StageProgram &p : programs(gArtifacts.at(0))) {
    const BackwardFrees plain = backwardFrees(p, {});
    const std::map<int, long> at = releasePoints(plain);
    for (size_t k = 0; k + 1 < p.backward.size(); ++k)
      if (!plain.valuesAfter[k].empty()) {
        const int id = plain.valuesAfter[k].front();
        std::vector<std::vector<int>> extra(p.backward.size());
        extra.back() = {id, p.input}; // a boundary value stays unlisted
        const std::map<int, long> moved = releasePoints(backwardFrees(p, extra));
        EXPECT_EQ(moved.at(id), long(p.backward.size() - 1));
        EXPECT_EQ(moved.count(p.input), 0u);
        EXPECT_EQ(moved.size(), at.size());
        return;
      }
  }
  ADD_FAILURE() << "no value released early in " << gArtifacts.at(0);
}

// ---- end to end --------------------------------------------------------------

std::atomic<int64_t> gChecked{0}, gMissing{0};

/// Declares extra reads: every value for the last backward instruction
/// (`keepAll`: nothing released early but aux), or instruction k - 1's own
/// reads for instruction k; checks at each backward call that what it reads
/// is there (missingBackwardReads).
class DeclaringDevice final : public ForwardingDevice {
public:
  DeclaringDevice(std::unique_ptr<Device> inner, const Artifact &a, bool keepAll)
      : ForwardingDevice(std::move(inner)), a_(a), keepAll_(keepAll) {}
  std::vector<int> backwardReads(int64_t stage, size_t index) const override {
    const StageProgram &p = a_.stages[stage];
    if (keepAll_) {
      std::vector<int> all;
      for (size_t v = 0; index + 1 == p.backward.size() && v < p.values.size(); ++v)
        all.push_back(int(v));
      return all;
    }
    return index == 0 ? std::vector<int>{} : ownBackwardReads(p, p.backward[index - 1]);
  }
  bool backward(int64_t stage, int64_t mb, size_t index, BackwardPart part, StageState &state,
                const std::vector<int> &fresh) override {
    for (int id : missingBackwardReads(a_.stages[stage], index, part, backwardReads(stage, index), state)) {
      ++gMissing;
      ADD_FAILURE() << "stage " << stage << " backward " << index << ": value " << id << " released";
    }
    ++gChecked;
    return inner_->backward(stage, mb, index, part, state, fresh);
  }

private:
  const Artifact &a_;
  const bool keepAll_;
};

DeviceFactory declaring(bool keepAll) {
  return wrappedCpuDevices([keepAll](std::unique_ptr<Device> inner, const Artifact &a) -> std::unique_ptr<Device> {
    return std::make_unique<DeclaringDevice>(std::move(inner), a, keepAll);
  });
}

std::vector<StepResult> train(const std::string &path, const DeviceFactory &devices) {
  return trainSteps(path, *gData, devices, 2);
}

void expectSameBitsWithALowerPeak(const std::string &path) {
  SCOPED_TRACE(path);
  gChecked = gMissing = 0;
  const std::vector<StepResult> early = train(path, cpuDevices());
  const std::vector<StepResult> kept = train(path, declaring(true));
  const std::vector<StepResult> checked = train(path, declaring(false));
  setenv("MHCC_BACKWARD_RELEASE", "end", 1); // the diagnostic switch: hold everything to the end
  const std::vector<StepResult> held = train(path, cpuDevices());
  unsetenv("MHCC_BACKWARD_RELEASE");
  ASSERT_EQ(early.size(), 2u);
  ASSERT_EQ(kept.size(), 2u);
  ASSERT_EQ(checked.size(), 2u);
  ASSERT_EQ(held.size(), 2u);
  EXPECT_GT(gChecked.load(), 0);
  EXPECT_EQ(gMissing.load(), 0);
  for (const std::vector<StepResult> *other : {&kept, &checked, &held})
    expectSameStepBits(early, *other);
  ASSERT_FALSE(early[1].peakBytes.empty());
  for (size_t r = 0; r < early[1].peakBytes.size(); ++r) {
    EXPECT_LT(early[1].peakBytes[r], held[1].peakBytes[r]) << "rank " << r;
    EXPECT_LE(early[1].peakBytes[r], kept[1].peakBytes[r]) << "rank " << r;
    EXPECT_LE(checked[1].peakBytes[r], held[1].peakBytes[r]) << "rank " << r;
    EXPECT_LE(kept[1].peakBytes[r], held[1].peakBytes[r]) << "rank " << r; // kept: aux still released
    std::printf("peak bytes of rank %zu, released as read / values kept to the last instruction / all held to the "
                "backward's end: %lld / %lld / %lld\n",
                r, static_cast<long long>(early[1].peakBytes[r]), static_cast<long long>(kept[1].peakBytes[r]),
                static_cast<long long>(held[1].peakBytes[r]));
  }
}

TEST(BackwardFrees, WholeBackwardKeepsItsBitsWithALowerPeak) { expectSameBitsWithALowerPeak(gWholeArtifact); }

TEST(BackwardFrees, SplitBackwardKeepsItsBitsWithALowerPeak) { expectSameBitsWithALowerPeak(gSplitArtifact); }

} // namespace
} // namespace mhcc::runtime

int main(int argc, char **argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc < 5) {
    std::fprintf(stderr, "usage: backward_frees_test DATA PP1_ARTIFACT ZB_ARTIFACT ARTIFACT...\n");
    return 2;
  }
  std::string error;
  mhcc::runtime::gData = mhcc::runtime::TokenDataset::open(argv[1], error);
  if (!mhcc::runtime::gData) {
    std::fprintf(stderr, "backward_frees_test: %s\n", error.c_str());
    return 2;
  }
  mhcc::runtime::gWholeArtifact = argv[2];
  mhcc::runtime::gSplitArtifact = argv[3];
  for (int i = 4; i < argc; ++i)
    mhcc::runtime::gArtifacts.push_back(argv[i]);
  return RUN_ALL_TESTS();
}
