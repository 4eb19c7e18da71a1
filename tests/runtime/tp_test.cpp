// Tensor parallelism on the CPU backend (issue 13): tp ranks split every
// layer as Megatron-LM does (column-parallel q/k/v and gate/up, row-parallel
// output and down projections, vocabulary-parallel embedding, LM head and
// cross-entropy; runtime/cpu/TensorParallel.h) and train the same batch as
// one rank per layer.
//
// What must hold, and why:
// - The row-parallel GEMMs leave partial sums that the group adds in
//   tensor-rank order, and the cross-entropy adds its shards' sums of
//   exponentials: the sums run in another order than at tp 1, so the bits
//   move, and only there. The lm loss over 5 steps agrees to 1e-6 relative in
//   fp32 (1e-4 in bf16, where a master one fp32 ulp away can round to another
//   bf16 copy), the gradient norm to 1e-5 (1e-3), and step 1's gradients to
//   1e-5 of their parameter's largest (or of 1e-4 of the global gradient
//   norm where that is larger: the mHC gates' gradients are sums that nearly
//   cancel). In bf16 a partial sum rounds to its bf16 activation only after
//   the group's sum, so an activation can land one bf16 step (2^-8 relative)
//   away: step 1's gradients agree to 1e-2 of their parameter's largest.
// - Sequence parallelism (each rank holds seq_len / tp of every sequence
//   outside the GEMMs) adds one more reordering: the replicated parameters'
//   gradients are summed per rank, then over the ranks. The same bounds hold.
// - The same at tp 4, at dp 2 x pp 2 x tp 2 with sequence parallelism and
//   MTP (8 ranks; the replicas split the microbatches), at tp 2 x cp 2
//   (attention exchanging q, k, v within the context group, with this
//   rank's heads), at tp 2 with sequence parallelism x cp 2 x pp 2 (each
//   context-parallel rank's rows split again over its tensor-parallel
//   ranks), and on packed documents (--reset-position-ids
//   --reset-attention-mask).
// - A tensor-parallel run gives the same bits run to run, and the split is
//   real: some gradient differs from tp 1's in its bits.
//
// - The hybrid stack's Gated DeltaNet layers split their heads as
//   attention does (tp 2, and tp 2 x pp 2 with sequence parallelism).
//
// usage: tp_test DATA TP1.mhcc TP2.mhcc TP2_SP.mhcc TP4_SP.mhcc TP2_SP_DP2_PP2.mhcc BF16_TP1.mhcc
//                BF16_TP2_SP_PP2.mhcc TP2_CP2.mhcc HYBRID_TP1.mhcc HYBRID_TP2.mhcc HYBRID_TP2_SP_PP2.mhcc
//                TP2_SP_CP2_PP2.mhcc
#include "runtime/artifact/TensorSplit.h"
#include "tests/runtime/TrainingCompare.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <set>

namespace mhcc::runtime {
namespace {

std::string gDataPath;
std::vector<std::string> gArtifacts;

constexpr int64_t kSteps = 5;

/// `other` trained the same batch as `reference` with the layers split over tensor-parallel ranks.
void expectSameTraining(const TrainingRun &reference, const TrainingRun &other, const std::string &what,
                        double lossTolerance = 1e-6, double normTolerance = 1e-5, double gradTolerance = 1e-5) {
  ASSERT_EQ(reference.steps.size(), size_t(kSteps)) << what;
  ASSERT_EQ(other.steps.size(), size_t(kSteps)) << what;
  const GradientComparison c = expectCloseGradients(reference.steps[0], other.steps[0], what, gradTolerance,
                                                    [](const std::string &) { return false; });
  EXPECT_GT(c.differing, 0) << what << ": no gradient summed in another order: is tensor parallelism on?";
  std::printf("%s: step 1 gradients within %.1e of their parameter's largest (bound %.0e), %lld of %lld elements "
              "differ in their bits\n",
              what.c_str(), c.worst, gradTolerance, static_cast<long long>(c.differing),
              static_cast<long long>(c.compared));
  expectCloseLosses(reference, other, what, lossTolerance, normTolerance);
}

TEST(TensorParallel, SplitLayersTrainAsOneRankDoes) {
  std::string error;
  std::optional<TokenDataset> text = TokenDataset::open(gDataPath, error);
  ASSERT_TRUE(text) << error;
  std::optional<TokenDataset> packed = packedCorpus(gDataPath, error);
  ASSERT_TRUE(packed) << error;
  ASSERT_EQ(gArtifacts.size(), 12u);
  for (const std::string &path : gArtifacts) {
    std::optional<Artifact> a = readArtifact(path, error);
    ASSERT_TRUE(a) << error;
    std::printf("%s: tp %lld%s x dp %lld x pp %lld, %lld tokens of each microbatch a rank outside the GEMMs\n",
                path.c_str(), static_cast<long long>(a->tp), a->sequenceParallel ? " (sequence parallel)" : "",
                static_cast<long long>(a->dp), static_cast<long long>(a->pp),
                static_cast<long long>(a->rowsPerRank()));
  }
  const TrainingRun tp1 = train(gArtifacts[0], *text, kSteps);
  const TrainingRun tp2 = train(gArtifacts[1], *text, kSteps);
  expectSameTraining(tp1, tp2, "tp 2");
  const TrainingRun sp2 = train(gArtifacts[2], *text, kSteps);
  expectSameTraining(tp1, sp2, "tp 2, sequence parallel");
  expectSameTraining(tp1, train(gArtifacts[3], *text, kSteps), "tp 4, sequence parallel");
  expectSameTraining(tp1, train(gArtifacts[4], *text, kSteps), "tp 2 x dp 2 x pp 2, sequence parallel");
  expectSameTraining(tp1, train(gArtifacts[7], *text, kSteps), "tp 2 x cp 2");
  expectSameTraining(tp1, train(gArtifacts[11], *text, kSteps), "tp 2 x cp 2 x pp 2, sequence parallel");
  TrainOptions documents;
  documents.resetPositionIds = documents.resetAttentionMask = true;
  expectSameTraining(train(gArtifacts[0], *packed, kSteps, cpuDevices(), documents),
                     train(gArtifacts[2], *packed, kSteps, cpuDevices(), documents),
                     "tp 2, sequence parallel, packed documents");
  expectSameTraining(train(gArtifacts[5], *text, kSteps), train(gArtifacts[6], *text, kSteps),
                     "bf16 tp 2 x pp 2, sequence parallel", 1e-4, 1e-3, 1e-2);
  // Run to run: the same bits.
  expectIdentical(tp2, train(gArtifacts[1], *text, kSteps), "tp 2 (rerun)");
  expectIdentical(sp2, train(gArtifacts[2], *text, kSteps), "tp 2, sequence parallel (rerun)");
}

TEST(TensorParallel, GatedDeltaNetHeadsSplitAsAttentionsDo) {
  // The hybrid stack: each rank runs its Gated DeltaNet heads (their q, k,
  // v columns, conv channels, gate logits and decays, gate columns; W_o
  // row-parallel) as it does attention's.
  std::string error;
  std::optional<TokenDataset> text = TokenDataset::open(gDataPath, error);
  ASSERT_TRUE(text) << error;
  const TrainingRun tp1 = train(gArtifacts[8], *text, kSteps);
  expectSameTraining(tp1, train(gArtifacts[9], *text, kSteps), "hybrid tp 2");
  expectSameTraining(tp1, train(gArtifacts[10], *text, kSteps), "hybrid tp 2 x pp 2, sequence parallel");
}

/// The position of the first instruction of `kind` in `list`.
size_t firstOf(const std::vector<Instr> &list, OpKind kind) {
  return size_t(std::find_if(list.begin(), list.end(), [kind](const Instr &i) { return i.kind == kind; }) -
                list.begin());
}

TEST(TensorParallel, EachCollectiveIsListedAndChecked) {
  // tp 2 with sequence parallelism x cp 2 x pp 2: each compute step lists
  // the tp and cp collectives it issues right after it. An artifact whose
  // lists differ from its stage programs is refused when read; one that
  // reaches the device anyway (built in memory) stops at the first
  // collective its kernels issue otherwise, naming both.
  std::string error;
  std::optional<TokenDataset> text = TokenDataset::open(gDataPath, error);
  ASSERT_TRUE(text) << error;
  std::optional<Artifact> original = readArtifact(gArtifacts[11], error);
  ASSERT_TRUE(original) << error;
  const std::vector<Instr> &list = original->ranks[0];
  const size_t fwd = firstOf(list, OpKind::Forward);
  ASSERT_LT(fwd + 1, list.size());
  ASSERT_EQ(list[fwd + 1].kind, OpKind::Collective);
  std::set<std::pair<MeshAxis, CollectiveOp>> kinds;
  for (const Instr &i : list)
    if (i.kind == OpKind::Collective)
      kinds.insert({i.axis, i.collective});
  EXPECT_TRUE(kinds.count({MeshAxis::Tensor, CollectiveOp::AllGather}) &&
              kinds.count({MeshAxis::Tensor, CollectiveOp::ReduceScatter}) &&
              kinds.count({MeshAxis::Context, CollectiveOp::AllGather}))
      << "sequence-parallel gathers and scatters and context-parallel gathers";

  auto edited = [&](const std::function<void(std::vector<Instr> &)> &edit) {
    Artifact a = *original;
    edit(a.ranks[0]);
    return a;
  };
  auto widen = [&](std::vector<Instr> &l) { l[fwd + 1].width += 1; };
  auto drop = [&](std::vector<Instr> &l) { l.erase(l.begin() + long(fwd) + 1); };
  auto duplicate = [&](std::vector<Instr> &l) { l.insert(l.begin() + long(fwd) + 1, l[fwd + 1]); };
  auto stray = [&](std::vector<Instr> &l) { l.insert(l.end() - 1, l[fwd + 1]); }; // before OPTIM
  size_t last = fwd + 1;
  while (list[last + 1].kind == OpKind::Collective)
    ++last;
  auto appendOne = [&](std::vector<Instr> &l) { l.insert(l.begin() + long(last) + 1, l[last]); };
  EXPECT_EQ(validateArtifact(*original), "");
  EXPECT_NE(validateArtifact(edited(widen)).find("collective #1 of FWD(s0,mb0) is"), std::string::npos);
  EXPECT_NE(validateArtifact(edited(drop)).find("collective #1 of FWD(s0,mb0) is"), std::string::npos);
  EXPECT_NE(validateArtifact(edited(duplicate)).find("collective #2 of FWD(s0,mb0) is"), std::string::npos);
  EXPECT_NE(validateArtifact(edited(stray)).find("follows no compute step"), std::string::npos);
  EXPECT_NE(validateArtifact(edited(appendOne))
                .find("FWD(s0,mb0) issues " + std::to_string(last - fwd) + " collectives, this is #" +
                      std::to_string(last - fwd + 1)),
            std::string::npos);

  auto stepError = [&](Artifact a) {
    std::unique_ptr<Trainer> trainer = Trainer::create(std::move(a), *text, TrainOptions(), cpuDevices(), error);
    EXPECT_TRUE(trainer) << error;
    if (!trainer)
      return std::string();
    std::string stepError;
    EXPECT_FALSE(trainer->step(stepError)) << "a schedule the kernels do not follow trained";
    return stepError;
  };
  const std::string first = std::string(meshAxisName(list[fwd + 1].axis)) + " " +
                            collectiveOpName(list[fwd + 1].collective);
  const std::string wider = stepError(edited(widen));
  EXPECT_NE(wider.find("its kernels issued collective #1 as " + first), std::string::npos) << wider;
  EXPECT_NE(wider.find("where the schedule lists " + first + " in (s0,mb0)"), std::string::npos) << wider;
  const std::string twice = stepError(edited(duplicate));
  EXPECT_NE(twice.find("its kernels issued collective #2"), std::string::npos) << twice;
  const std::string more = stepError(edited(appendOne));
  const std::string listed = std::to_string(last - fwd);
  EXPECT_NE(more.find("its kernels issued " + listed + " of the " + std::to_string(last - fwd + 1) +
                      " collectives the schedule lists"),
            std::string::npos)
      << more;
}

TEST(TensorParallel, BlocksCoverEveryElementOnce) {
  // Each split's blocks, scattered back, rebuild the whole tensor, and the
  // q, k and v blocks of a rank hold the same heads of each.
  for (const char *split : {"rows", "cols", "qkv", "ab"}) {
    ParamInfo info{"w", 8, 24, "normal", 0.02, true, split};
    for (int64_t tp : {1, 2, 4}) {
      ASSERT_EQ(splitProblem(info, tp), "") << split << " tp " << tp;
      std::vector<float> whole(info.count()), rebuilt(info.count(), -1.0f), block(shardCount(info, tp));
      std::iota(whole.begin(), whole.end(), 0.0f);
      for (int64_t t = 0; t < tp; ++t) {
        gatherShard(info, tp, t, whole.data(), block.data());
        scatterShard(info, tp, t, block.data(), rebuilt.data());
      }
      EXPECT_EQ(whole, rebuilt) << split << " tp " << tp;
      // A block placed in parts (the distributed optimizer's replicas'),
      // in any order, gives the same tensor.
      std::vector<float> parts;
      for (int64_t t = tp - 1; t >= 0; --t) {
        gatherShard(info, tp, t, whole.data(), block.data());
        const int64_t n = int64_t(block.size());
        for (auto [begin, end] : {std::pair<int64_t, int64_t>{n / 3, n}, {0, n / 3}})
          scatterShardPart(info, tp, t, block.data(), begin, end, parts);
      }
      EXPECT_EQ(whole, parts) << split << " tp " << tp << " in parts";
    }
  }
  ParamInfo qkv{"w_qkv", 1, 12, "normal", 0.02, true, "qkv"};
  std::vector<float> whole(12), block(6);
  std::iota(whole.begin(), whole.end(), 0.0f);
  gatherShard(qkv, 2, 1, whole.data(), block.data());
  EXPECT_EQ(block, (std::vector<float>{2, 3, 6, 7, 10, 11})); // the second half of each of q, k and v
  EXPECT_NE(splitProblem(ParamInfo{"w", 6, 10, "normal", 0.02, true, "cols"}, 4), "");
  EXPECT_NE(splitProblem(ParamInfo{"w", 6, 12, "normal", 0.02, true, "qkv"}, 3), "");
  EXPECT_NE(splitProblem(ParamInfo{"w", 6, 12, "normal", 0.02, true, "diagonal"}, 2), "");
}

} // namespace
} // namespace mhcc::runtime

int main(int argc, char **argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc != 14) {
    std::fprintf(stderr,
                 "usage: %s DATA TP1 TP2 TP2_SP TP4_SP TP2_SP_DP2_PP2 BF16_TP1 BF16_TP2_SP_PP2 TP2_CP2 HYBRID_TP1 "
                 "HYBRID_TP2 HYBRID_TP2_SP_PP2 TP2_SP_CP2_PP2\n",
                 argv[0]);
    return 2;
  }
  mhcc::runtime::gDataPath = argv[1];
  mhcc::runtime::gArtifacts.assign(argv + 2, argv + argc);
  return RUN_ALL_TESTS();
}
