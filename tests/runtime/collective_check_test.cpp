// CollectiveCheck: the collectives a compute step's kernels issue against the
// COLLECTIVE instructions the schedule lists after it (both backends use it,
// so a runtime that disagrees with the compiler fails with both named), and a
// recomputed forward's list interposed inside a backward's.
#include "runtime/exec/CollectiveCheck.h"

#include <gtest/gtest.h>

#include <vector>

namespace mhcc::runtime {
namespace {

Instr collective(MeshAxis axis, CollectiveOp op, int64_t tokens, int64_t width) {
  Instr i;
  i.kind = OpKind::Collective;
  i.axis = axis;
  i.collective = op;
  i.tokens = tokens;
  i.width = width;
  return i;
}

TEST(CollectiveCheck, AcceptsTheListedCollectivesInOrder) {
  std::vector<Instr> listed = {collective(MeshAxis::Tensor, CollectiveOp::AllGather, 64, 32),
                               collective(MeshAxis::Tensor, CollectiveOp::ReduceScatter, 128, 32)};
  CollectiveCheck check;
  check.expect(listed.data(), listed.size());
  EXPECT_EQ(check.issue(MeshAxis::Tensor, CollectiveOp::AllGather, 64, 32), "");
  EXPECT_NE(check.finished(), ""); // one still to come
  EXPECT_EQ(check.issue(MeshAxis::Tensor, CollectiveOp::ReduceScatter, 128, 32), "");
  EXPECT_EQ(check.finished(), "");
}

TEST(CollectiveCheck, AnAllReduceComparesElementsOnly) {
  std::vector<Instr> listed = {collective(MeshAxis::Tensor, CollectiveOp::AllReduce, 128, 32)};
  CollectiveCheck check;
  check.expect(listed.data(), listed.size());
  EXPECT_EQ(check.issue(MeshAxis::Tensor, CollectiveOp::AllReduce, 128 * 32, 1), "");
  EXPECT_EQ(check.finished(), "");
}

TEST(CollectiveCheck, ADifferentCollectiveNamesBoth) {
  std::vector<Instr> listed = {collective(MeshAxis::Tensor, CollectiveOp::AllGather, 64, 32)};
  CollectiveCheck check;
  check.expect(listed.data(), listed.size());
  const std::string wrongOp = check.issue(MeshAxis::Tensor, CollectiveOp::ReduceScatter, 64, 32);
  EXPECT_NE(wrongOp.find("collective #1"), std::string::npos) << wrongOp;
  EXPECT_NE(wrongOp.find(listed[0].describe()), std::string::npos) << wrongOp;
  // The same elements in another shape: an all-gather's rows must match.
  EXPECT_NE(check.issue(MeshAxis::Tensor, CollectiveOp::AllGather, 32, 64), "");
  EXPECT_NE(check.issue(MeshAxis::Context, CollectiveOp::AllGather, 64, 32), "");
  EXPECT_EQ(check.issue(MeshAxis::Tensor, CollectiveOp::AllGather, 64, 32), "");
  const std::string extra = check.issue(MeshAxis::Tensor, CollectiveOp::AllReduce, 1, 1);
  EXPECT_NE(extra.find("no more"), std::string::npos) << extra;
}

TEST(CollectiveCheck, NothingListedAcceptsNothing) {
  CollectiveCheck check;
  check.expect(nullptr, 0);
  EXPECT_EQ(check.finished(), "");
  EXPECT_NE(check.issue(MeshAxis::Tensor, CollectiveOp::AllReduce, 4, 1), "");
}

TEST(CollectiveCheck, AnInterposedListRunsInsideAndTheOuterResumes) {
  std::vector<Instr> backward = {collective(MeshAxis::Tensor, CollectiveOp::AllGather, 64, 32),
                                 collective(MeshAxis::Tensor, CollectiveOp::ReduceScatter, 128, 32)};
  std::vector<Instr> recomputed = {collective(MeshAxis::Context, CollectiveOp::AllGather, 128, 16)};
  CollectiveCheck check;
  check.expect(backward.data(), backward.size());
  EXPECT_EQ(check.issue(MeshAxis::Tensor, CollectiveOp::AllGather, 64, 32), "");
  check.interpose(recomputed.data(), recomputed.size());
  // The backward's next is not what the recomputed forward lists.
  EXPECT_NE(check.issue(MeshAxis::Tensor, CollectiveOp::ReduceScatter, 128, 32), "");
  EXPECT_EQ(check.issue(MeshAxis::Context, CollectiveOp::AllGather, 128, 16), "");
  EXPECT_EQ(check.resume(), "");
  EXPECT_EQ(check.issue(MeshAxis::Tensor, CollectiveOp::ReduceScatter, 128, 32), "");
  EXPECT_EQ(check.finished(), "");
}

TEST(CollectiveCheck, AnInterposedListLeftShortFailsAndStillResumes) {
  std::vector<Instr> backward = {collective(MeshAxis::Tensor, CollectiveOp::AllReduce, 8, 1)};
  std::vector<Instr> recomputed = {collective(MeshAxis::Tensor, CollectiveOp::AllGather, 64, 32)};
  CollectiveCheck check;
  check.expect(backward.data(), backward.size());
  check.interpose(recomputed.data(), recomputed.size());
  const std::string problem = check.resume();
  EXPECT_NE(problem.find("a recomputed forward: its kernels issued 0 of the 1 collectives the recomputed segment's "
                         "list"),
            std::string::npos)
      << problem;
  EXPECT_EQ(check.issue(MeshAxis::Tensor, CollectiveOp::AllReduce, 8, 1), "");
  EXPECT_EQ(check.finished(), "");
}

} // namespace
} // namespace mhcc::runtime
