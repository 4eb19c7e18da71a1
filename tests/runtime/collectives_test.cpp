// The tp / cp collectives each compute step lists (runtime/program/Collectives.h),
// spelled out for the cases the rules distinguish. The CPU device checks the
// same lists against its kernels in every tensor- and context-parallel test
// (tp_test, cp_test, parity_test); this names what they are.
#include "runtime/program/Collectives.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace mhcc::runtime {
namespace {

/// "tp all_gather 32x64, ..." for a step's list.
std::string spell(const std::vector<Instr> &list) {
  std::string out;
  for (const Instr &c : list)
    out += std::string(out.empty() ? "" : ", ") + meshAxisName(c.axis) + " " + collectiveOpName(c.collective) + " " +
           std::to_string(c.tokens) + "x" + std::to_string(c.width);
  return out;
}

// tiny's sizes: T = 128 tokens a microbatch, C = 64, 4 heads.
CollectiveMesh mesh(int64_t tp, int64_t cp, bool sp) { return {tp, cp, sp, 128, 64, 4}; }

TEST(Collectives, NoneWithoutTensorOrContextParallelism) {
  EXPECT_EQ(spell(collectivesOf({{Prim::Embed, false}, {Prim::Attention}}, OpKind::Forward, mesh(1, 1, false))), "");
}

TEST(Collectives, RowParallelOutputsAreReducedWithoutSequenceParallelism) {
  const std::vector<CollectiveStep> sublayer = {{Prim::Attention}};
  EXPECT_EQ(spell(collectivesOf(sublayer, OpKind::Forward, mesh(2, 1, false))), "tp all_reduce 128x64");
  // Backward: the column-parallel input gradient; nothing to gather.
  EXPECT_EQ(spell(collectivesOf(sublayer, OpKind::Backward, mesh(2, 1, false))), "tp all_reduce 128x64");
  EXPECT_EQ(spell(collectivesOf(sublayer, OpKind::BackwardWeight, mesh(2, 1, false))), "");
}

TEST(Collectives, SequenceParallelismGathersBeforeAndScattersAfter) {
  const std::vector<CollectiveStep> mlp = {{Prim::SwiGlu}};
  const CollectiveMesh m = mesh(2, 1, true);
  EXPECT_EQ(spell(collectivesOf(mlp, OpKind::Forward, m)), "tp all_gather 64x64, tp reduce_scatter 128x64");
  // BWD gathers the input (for the weights) and the output gradient, then scatters dx;
  // B needs no input, W no dx, and W gathers the output gradient again.
  EXPECT_EQ(spell(collectivesOf(mlp, OpKind::Backward, m)),
            "tp all_gather 64x64, tp all_gather 64x64, tp reduce_scatter 128x64");
  EXPECT_EQ(spell(collectivesOf(mlp, OpKind::BackwardInput, m)), "tp all_gather 64x64, tp reduce_scatter 128x64");
  EXPECT_EQ(spell(collectivesOf(mlp, OpKind::BackwardWeight, m)), "tp all_gather 64x64, tp all_gather 64x64");
}

TEST(Collectives, TheVocabularyParallelEndsAndTheEmbedding) {
  const CollectiveMesh m = mesh(2, 1, true);
  EXPECT_EQ(spell(collectivesOf({{Prim::Embed, false}}, OpKind::Forward, m)), "tp reduce_scatter 128x64");
  EXPECT_EQ(spell(collectivesOf({{Prim::Embed, false}}, OpKind::BackwardInput, m)), "");
  EXPECT_EQ(spell(collectivesOf({{Prim::Embed, false}}, OpKind::BackwardWeight, m)), "tp all_gather 64x64");
  EXPECT_EQ(spell(collectivesOf({{Prim::LmHead}, {Prim::CrossEntropy, true, false}}, OpKind::Forward, m)),
            "tp all_gather 64x64, tp all_reduce_max 128x1, tp all_reduce 128x1, tp all_reduce 128x1");
  // The loss's backward issues nothing; W skips it (no weights) and gathers the head's input.
  EXPECT_EQ(spell(collectivesOf({{Prim::CrossEntropy, true, false}, {Prim::LmHead}}, OpKind::BackwardWeight, m)),
            "tp all_gather 64x64");
}

TEST(Collectives, ContextParallelismExchangesKeysAndValues) {
  // cp 2: 64 rows a rank; attention exchanges k and v forward, q k v, dO and
  // the queries' statistics (lse, rowDot per head) backward, in both halves.
  const CollectiveMesh m = mesh(1, 2, false);
  EXPECT_EQ(spell(collectivesOf({{Prim::Attention}}, OpKind::Forward, m)), "cp all_gather 64x128");
  const std::string backward = "cp all_gather 64x192, cp all_gather 64x64, cp all_gather 64x8";
  EXPECT_EQ(spell(collectivesOf({{Prim::Attention}}, OpKind::BackwardInput, m)), backward);
  EXPECT_EQ(spell(collectivesOf({{Prim::Attention}}, OpKind::BackwardWeight, m)), backward);
  // Gated DeltaNet runs the gathered sequence: its input, and backward its output gradient.
  EXPECT_EQ(spell(collectivesOf({{Prim::GatedDeltaNet}}, OpKind::Forward, m)), "cp all_gather 64x64");
  EXPECT_EQ(spell(collectivesOf({{Prim::GatedDeltaNet}}, OpKind::Backward, m)),
            "cp all_gather 64x64, cp all_gather 64x64");
}

TEST(Collectives, ContextInsideTensorParallelism) {
  // tp 2 with sequence parallelism x cp 2: a context rank's 64 rows, 32 a
  // tensor rank; the mixer gathers its input even for B (it recomputes
  // from it), and the context exchange carries the rank's heads (C / tp).
  const CollectiveMesh m = mesh(2, 2, true);
  EXPECT_EQ(spell(collectivesOf({{Prim::Attention}}, OpKind::Forward, m)),
            "tp all_gather 32x64, cp all_gather 64x64, tp reduce_scatter 64x64");
  EXPECT_EQ(spell(collectivesOf({{Prim::Attention}}, OpKind::BackwardInput, m)),
            "tp all_gather 32x64, tp all_gather 32x64, cp all_gather 64x96, cp all_gather 64x32, cp all_gather 64x4, "
            "tp reduce_scatter 64x64");
}

TEST(Collectives, RingTrafficOfEachKind) {
  Instr gather;
  gather.kind = OpKind::Collective;
  gather.collective = CollectiveOp::AllGather;
  gather.tokens = 64;
  gather.width = 64; // one rank's rows; the whole tensor is 2 x that at g = 2
  const CollectiveTraffic g = ringTraffic(gather, 2, 2);
  EXPECT_DOUBLE_EQ(g.bytes, 0.5 * 128 * 64 * 2);
  EXPECT_EQ(g.latencies, 1);
  Instr reduce = gather;
  reduce.collective = CollectiveOp::AllReduce;
  reduce.tokens = 128;
  const CollectiveTraffic r = ringTraffic(reduce, 4, 4);
  EXPECT_DOUBLE_EQ(r.bytes, 2 * 0.75 * 128 * 64 * 4);
  EXPECT_EQ(r.latencies, 6);
  EXPECT_EQ(ringTraffic(reduce, 1, 4).bytes, 0.0);
}

} // namespace
} // namespace mhcc::runtime
