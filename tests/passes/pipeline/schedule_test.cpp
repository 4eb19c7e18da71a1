// Property tests of the schedule builder and simulator over p in 1..8,
// v in 1..4, m in 1..32: every list verifies, bubbles match the closed forms
// for uniform costs, 1F1B memory is bounded by p, and broken lists (misordered
// messages, deadlocks, FREE before the send, shape mismatches) are rejected.
#include "passes/pipeline/Schedule.h"
#include "passes/pipeline/SharedCores.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <tuple>

namespace mhcc::pipeline {
namespace {

ScheduleSpec uniformSpec(ScheduleKind kind, int64_t p, int64_t v, int64_t m,
                         int64_t width = 2048) {
  ScheduleSpec spec;
  spec.kind = kind;
  spec.pp = p;
  spec.vpp = v;
  spec.microbatches = m;
  spec.tokens = 16;
  for (int64_t s = 0; s < p * v; ++s) {
    StageSpec stage;
    stage.forwardTime = 1;
    stage.backwardTime = 2;
    stage.weightGradTime = 1;
    stage.savedBytes = 1000;
    stage.outputWidth = s + 1 < p * v ? width : 0;
    spec.stages.push_back(stage);
  }
  return spec;
}

struct Built {
  Schedule schedule;
  SimulationResult result;
};

Built buildAndSimulate(const ScheduleSpec &spec) {
  std::string error;
  std::optional<Schedule> schedule = buildSchedule(spec, error);
  EXPECT_TRUE(schedule) << error;
  if (!schedule)
    return {};
  SimulationResult result = simulateSchedule(*schedule, spec);
  for (const ScheduleError &e : result.errors)
    ADD_FAILURE() << scheduleKindName(spec.kind) << " p=" << spec.pp << " v=" << spec.vpp
                  << " m=" << spec.microbatches << ": rank " << e.rank << " #" << e.instr
                  << ": " << e.message;
  return {*schedule, result};
}

void expectForwardBeforeBackward(const Schedule &schedule) {
  for (const auto &list : schedule.ranks) {
    std::vector<std::pair<int64_t, int64_t>> seen;
    for (const Instr &instr : list) {
      if (instr.kind == OpKind::Forward)
        seen.push_back({instr.stage, instr.mb});
      if (instr.kind == OpKind::Backward || instr.kind == OpKind::BackwardInput) {
        EXPECT_NE(std::find(seen.begin(), seen.end(), std::make_pair(instr.stage, instr.mb)),
                  seen.end())
            << instr.describe();
      }
    }
  }
}

TEST(Schedule, OneFOneBAndGPipeAndZeroBubbleOverGrid) {
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::ZeroBubbleH1})
    for (int64_t p = 1; p <= 8; ++p)
      for (int64_t m = 1; m <= 32; ++m) {
        ScheduleSpec spec = uniformSpec(kind, p, 1, m);
        Built built = buildAndSimulate(spec);
        ASSERT_TRUE(built.result.errors.empty());
        expectForwardBeforeBackward(built.schedule);
        if (kind == ScheduleKind::ZeroBubbleH1 && m < p) {
          // Too few microbatches to fill the pipeline: no closed form, but
          // never worse than 1F1B.
          EXPECT_LE(built.result.bubbleOverhead, (p - 1) / double(m) + 1e-9);
        } else {
          double expected = kind == ScheduleKind::ZeroBubbleH1 ? (p - 1) / (3.0 * m)
                                                                 : (p - 1) / double(m);
          EXPECT_NEAR(built.result.bubbleOverhead, expected, 1e-9)
              << scheduleKindName(kind) << " p=" << p << " m=" << m;
        }
        // The fraction is idle time over ranks x makespan: in [0, 1), and
        // with every rank equally busy it is overhead / (1 + overhead).
        EXPECT_GE(built.result.bubbleFraction, 0.0);
        EXPECT_LT(built.result.bubbleFraction, 1.0);
        const double o = built.result.bubbleOverhead;
        EXPECT_NEAR(built.result.bubbleFraction, o / (1 + o), 1e-9)
            << scheduleKindName(kind) << " p=" << p << " m=" << m;
        for (double rank : built.result.rankBubbleFraction) {
          EXPECT_GE(rank, 0.0);
          EXPECT_LT(rank, 1.0);
        }
        if (kind != ScheduleKind::GPipe) {
          // 1F1B and ZB-H1 hold at most p microbatches in flight on rank 0.
          EXPECT_EQ(built.result.peakInFlight[0], std::min(p, m))
              << scheduleKindName(kind) << " p=" << p << " m=" << m;
          for (int64_t r = 0; r < p; ++r)
            EXPECT_LE(built.result.peakInFlight[r], p);
        } else {
          EXPECT_EQ(built.result.peakInFlight[0], m);
        }
      }
}

TEST(Schedule, InterleavedOverGrid) {
  for (int64_t p = 1; p <= 8; ++p)
    for (int64_t v = 1; v <= 4; ++v)
      for (int64_t m = 1; m <= 32; ++m) {
        ScheduleSpec spec = uniformSpec(ScheduleKind::Interleaved, p, v, m);
        std::string error;
        bool valid = m >= p && (m % p == 0 || m % p >= p);
        std::optional<Schedule> schedule = buildSchedule(spec, error);
        ASSERT_EQ(schedule.has_value(), valid) << "p=" << p << " v=" << v << " m=" << m << ": " << error;
        if (!valid)
          continue;
        Built built = buildAndSimulate(spec);
        ASSERT_TRUE(built.result.errors.empty()) << "p=" << p << " v=" << v << " m=" << m;
        expectForwardBeforeBackward(built.schedule);
        EXPECT_NEAR(built.result.bubbleOverhead, (p - 1) / double(v * m), 1e-9)
            << "p=" << p << " v=" << v << " m=" << m;
        EXPECT_LT(built.result.bubbleFraction, 1.0);
      }
}

TEST(Schedule, InterleavedWithLargerGroups) {
  // g > p, including a partial last group of at least p microbatches.
  for (int64_t p = 2; p <= 4; ++p)
    for (int64_t g = p; g <= 2 * p; ++g)
      for (int64_t m = g; m <= 24; ++m) {
        ScheduleSpec spec = uniformSpec(ScheduleKind::Interleaved, p, 2, m);
        spec.groupSize = g;
        std::string error;
        bool valid = m % g == 0 || m % g >= p;
        std::optional<Schedule> schedule = buildSchedule(spec, error);
        ASSERT_EQ(schedule.has_value(), valid) << error;
        if (valid) {
          EXPECT_TRUE(simulateSchedule(*schedule, spec).errors.empty())
              << "p=" << p << " g=" << g << " m=" << m;
        }
      }
}

TEST(Schedule, PeakActivationsDoNotGrowWithMicrobatches) {
  for (ScheduleKind kind : {ScheduleKind::OneFOneB, ScheduleKind::ZeroBubbleH1, ScheduleKind::Interleaved})
    for (int64_t p = 1; p <= 8; ++p) {
      int64_t v = kind == ScheduleKind::Interleaved ? 2 : 1;
      Built few = buildAndSimulate(uniformSpec(kind, p, v, 2 * p));
      Built many = buildAndSimulate(uniformSpec(kind, p, v, 8 * p));
      for (int64_t r = 0; r < p; ++r)
        EXPECT_EQ(few.result.peakBytes[r], many.result.peakBytes[r])
            << scheduleKindName(kind) << " p=" << p << " rank " << r;
    }
}

TEST(Schedule, OneFOneBRankZeroPeakIsPMicrobatches) {
  for (int64_t p = 2; p <= 8; ++p) {
    ScheduleSpec spec = uniformSpec(ScheduleKind::OneFOneB, p, 1, 4 * p);
    Built built = buildAndSimulate(spec);
    // p microbatches of saved activations, plus the output buffers of
    // microbatches whose sends are still waiting for rank 1 (sends do not
    // block the host; each output is freed when its send completes).
    int64_t saved = p * spec.stages[0].savedBytes;
    int64_t oneOutput = spec.tokens * spec.stages[0].outputWidth * spec.elementBytes;
    EXPECT_GE(built.result.peakBytes[0], saved + oneOutput);
    EXPECT_LE(built.result.peakBytes[0], saved + p * oneOutput);
  }
}

/// `spec` (each stage saving 1000 bytes) under recomputation: 800 of them
/// dropped, the largest sublayer's 300, the forward run again.
ScheduleSpec recomputing(ScheduleSpec spec) {
  for (StageSpec &stage : spec.stages) {
    stage.savedBytes = 200;
    stage.recomputedBytes = 800;
    stage.recomputeWorkingBytes = 300;
    stage.backwardTime += stage.forwardTime;
  }
  return spec;
}

TEST(Schedule, RecomputationHoldsCheckpointsAndOneSublayerUnderOneFOneB) {
  // A stage saving 1000 bytes a microbatch, 800 of them recomputed (the
  // largest sublayer's 300): 1F1B holds p microbatches of the 200 checkpoint
  // bytes and, during a backward, one sublayer's working set; the backward
  // gains the forward run again.
  const int64_t p = 4;
  ScheduleSpec plain = uniformSpec(ScheduleKind::OneFOneB, p, 1, 4 * p, 16);
  ScheduleSpec recompute = recomputing(plain);
  const Built a = buildAndSimulate(plain), b = buildAndSimulate(recompute);
  const int64_t oneOutput = plain.tokens * plain.stages[0].outputWidth * plain.elementBytes;
  EXPECT_GE(b.result.peakBytes[0], p * 200 + 300);
  EXPECT_LE(b.result.peakBytes[0], p * 200 + 300 + p * oneOutput);
  EXPECT_LT(b.result.peakBytes[0], a.result.peakBytes[0]);
  EXPECT_GT(b.result.makespan, a.result.makespan);
}

TEST(Schedule, RecomputationLowersEveryRanksPeakUnderGPipeAndInterleaved) {
  // Whatever holds microbatches in flight holds checkpoints instead of
  // activations: every rank's peak falls by what its in-flight microbatches
  // dropped, less at most one working set (where a backward's peak is the
  // rank's; no boundary buffer changes).
  for (auto [kind, v] : {std::pair{ScheduleKind::GPipe, int64_t(1)}, std::pair{ScheduleKind::Interleaved, int64_t(2)}}) {
    SCOPED_TRACE(scheduleKindName(kind));
    const ScheduleSpec plain = uniformSpec(kind, 2, v, 4, 16);
    const Built a = buildAndSimulate(plain), b = buildAndSimulate(recomputing(plain));
    for (size_t r = 0; r < a.result.peakBytes.size(); ++r) {
      const int64_t inFlight = a.result.peakInFlight[r];
      EXPECT_EQ(b.result.peakInFlight[r], inFlight) << "rank " << r;
      const int64_t fell = a.result.peakBytes[r] - b.result.peakBytes[r];
      EXPECT_GE(fell, inFlight * 800 - 300) << "rank " << r;
      EXPECT_LE(fell, inFlight * 800) << "rank " << r;
    }
  }
}

TEST(Schedule, RecomputationUnderZeroBubbleHoldsWhatBRecomputedUntilW) {
  // B computes every dropped activation again and W reads them: between the
  // two a microbatch holds all it saved. The last rank, whose B follows each
  // FWD at once and whose W come later, peaks where it did without (the CPU
  // backend measures no gain either, recompute_test); rank 0 gains.
  const int64_t p = 2;
  ScheduleSpec plain = uniformSpec(ScheduleKind::ZeroBubbleH1, p, 1, 4 * p, 16);
  ScheduleSpec recompute = recomputing(plain);
  const Built a = buildAndSimulate(plain), b = buildAndSimulate(recompute);
  EXPECT_EQ(b.result.peakBytes[p - 1], a.result.peakBytes[p - 1]);
  EXPECT_LT(b.result.peakBytes[0], a.result.peakBytes[0]); // forwards waiting for their B hold checkpoints
}

TEST(Schedule, BoundaryMessagesCarryTheStageWidth) {
  ScheduleSpec spec = uniformSpec(ScheduleKind::Interleaved, 2, 2, 4, 28672);
  Built built = buildAndSimulate(spec);
  int64_t wraparounds = 0;
  for (int64_t r = 0; r < 2; ++r)
    for (const Instr &instr : built.schedule.ranks[r]) {
      if (!instr.isComm())
        continue;
      EXPECT_EQ(instr.width, 28672);
      EXPECT_EQ(instr.tokens, 16);
      // The last rank's chunk 0 sends to rank 0's chunk 1 over the ring.
      if (instr.kind == OpKind::Send && instr.payload == Payload::Activation && r == 1 &&
          instr.srcStage == 1) {
        EXPECT_EQ(instr.peer, 0);
        ++wraparounds;
      }
    }
  EXPECT_EQ(wraparounds, 4);
}

TEST(Schedule, RejectsConfigurationsWithAMessage) {
  std::string error;
  EXPECT_FALSE(buildSchedule(uniformSpec(ScheduleKind::OneFOneB, 2, 2, 4), error));
  EXPECT_NE(error.find("use --schedule interleaved"), std::string::npos);
  ScheduleSpec partial = uniformSpec(ScheduleKind::Interleaved, 4, 2, 10);
  EXPECT_FALSE(buildSchedule(partial, error));
  EXPECT_NE(error.find("m % g = 2"), std::string::npos) << error;
  EXPECT_FALSE(buildSchedule(uniformSpec(ScheduleKind::Interleaved, 4, 2, 3), error));
  EXPECT_NE(error.find("at least p = 4 microbatches"), std::string::npos) << error;
}

/// Swaps the identities of rank r's first two receives from one peer that
/// carry different payloads: the hazard of issuing a batched exchange in the
/// wrong order.
bool misorderReceives(Schedule &schedule, int64_t r) {
  auto &list = schedule.ranks[r];
  for (size_t i = 0; i < list.size(); ++i)
    for (size_t j = i + 1; j < list.size(); ++j)
      if (list[i].kind == OpKind::Recv && list[j].kind == OpKind::Recv &&
          list[i].peer == list[j].peer && list[i].payload != list[j].payload) {
        std::swap(list[i], list[j]);
        std::swap(list[i].group, list[j].group);
        std::swap(list[i].order, list[j].order);
        return true;
      }
  return false;
}

TEST(Schedule, MisorderedSamePeerMessagesAreRejected) {
  ScheduleSpec spec = uniformSpec(ScheduleKind::Interleaved, 2, 2, 4);
  std::string error;
  Schedule schedule = *buildSchedule(spec, error);
  ASSERT_TRUE(misorderReceives(schedule, 1));
  SimulationResult result = simulateSchedule(schedule, spec);
  ASSERT_FALSE(result.errors.empty());
  bool named = false;
  for (const ScheduleError &e : result.errors)
    named |= e.message.find("message order differs between the two ends") != std::string::npos &&
             e.message.find("go unnoticed") != std::string::npos;
  EXPECT_TRUE(named) << result.errors[0].message;
}

TEST(Schedule, DeadlockIsReportedPerRank) {
  ScheduleSpec spec = uniformSpec(ScheduleKind::OneFOneB, 2, 1, 1);
  std::string error;
  Schedule schedule = *buildSchedule(spec, error);
  // Rank 0 waits for mb0's gradient before it sends mb0's activation: rank 1
  // waits for that activation, so neither moves.
  auto &list = schedule.ranks[0];
  auto recv = std::find_if(list.begin(), list.end(), [](const Instr &i) {
    return i.kind == OpKind::Recv && i.payload == Payload::Gradient;
  });
  ASSERT_NE(recv, list.end());
  Instr moved = *recv;
  moved.group = -7;
  list.erase(recv);
  list.insert(list.begin(), moved);
  SimulationResult result = simulateSchedule(schedule, spec);
  ASSERT_EQ(result.errors.size(), 2u);
  EXPECT_EQ(result.errors[0].rank, 0);
  EXPECT_EQ(result.errors[1].rank, 1);
  for (const ScheduleError &e : result.errors)
    EXPECT_NE(e.message.find("deadlock"), std::string::npos) << e.message;
}

TEST(Schedule, FreeBeforeSendIsRejected) {
  ScheduleSpec spec = uniformSpec(ScheduleKind::OneFOneB, 2, 1, 2);
  std::string error;
  Schedule schedule = *buildSchedule(spec, error);
  auto &list = schedule.ranks[0];
  auto send = std::find_if(list.begin(), list.end(), [](const Instr &i) { return i.kind == OpKind::Send; });
  auto free = std::find_if(list.begin(), list.end(), [](const Instr &i) { return i.kind == OpKind::Free; });
  ASSERT_TRUE(send != list.end() && free != list.end());
  Instr moved = *free;
  list.erase(free);
  list.insert(send, moved);
  SimulationResult result = simulateSchedule(schedule, spec);
  ASSERT_FALSE(result.errors.empty());
  EXPECT_NE(result.errors[0].message.find("before its send was issued"), std::string::npos)
      << result.errors[0].message;
}

TEST(Schedule, UseAfterFreeIsRejected) {
  ScheduleSpec spec = uniformSpec(ScheduleKind::OneFOneB, 2, 1, 2);
  std::string error;
  Schedule schedule = *buildSchedule(spec, error);
  auto &list = schedule.ranks[0];
  // Send mb0's output a second time after its FREE.
  auto free = std::find_if(list.begin(), list.end(), [](const Instr &i) { return i.kind == OpKind::Free; });
  auto send = std::find_if(list.begin(), list.end(), [](const Instr &i) { return i.kind == OpKind::Send; });
  ASSERT_TRUE(free != list.end() && send != list.end());
  Instr again = *send;
  again.group = 1000;
  list.insert(free + 1, again);
  SimulationResult result = simulateSchedule(schedule, spec);
  ASSERT_FALSE(result.errors.empty());
  EXPECT_NE(result.errors[0].message.find("use after FREE"), std::string::npos)
      << result.errors[0].message;
}

TEST(Schedule, ShapeMismatchIsRejected) {
  ScheduleSpec spec = uniformSpec(ScheduleKind::OneFOneB, 2, 1, 2);
  std::string error;
  Schedule schedule = *buildSchedule(spec, error);
  for (Instr &instr : schedule.ranks[1])
    if (instr.kind == OpKind::Recv) {
      instr.width = 512; // a C-wide buffer for an n*C-wide message
      break;
    }
  SimulationResult result = simulateSchedule(schedule, spec);
  ASSERT_FALSE(result.errors.empty());
  EXPECT_NE(result.errors[0].message.find("shape mismatch"), std::string::npos);
}

TEST(Schedule, CommunicationTimeAddsToTheCriticalPath) {
  ScheduleSpec spec = uniformSpec(ScheduleKind::OneFOneB, 4, 1, 8);
  double free = buildAndSimulate(spec).result.makespan;
  spec.linkBytesPerTime = 16.0 * 2048 * 4 / 0.5; // each message takes 0.5
  double paid = buildAndSimulate(spec).result.makespan;
  EXPECT_GT(paid, free);
}

// The distributed optimizer over dp 2: each stage's REDUCESCATTER costs half
// the ALLREDUCE's link time, and OPTIM half the update plus the gather of
// the other part at the activations' element size.
TEST(Schedule, DistributedOptimizerPaysHalfTheReductionAndGathersItsParts) {
  ScheduleSpec spec = uniformSpec(ScheduleKind::OneFOneB, 2, 1, 4);
  for (StageSpec &stage : spec.stages)
    stage.params = 1000;
  spec.dp = 2;
  spec.optimizerNsPerParam = 1000; // OPTIM of 1000 parameters: 1 time unit
  const double plain = buildAndSimulate(spec).result.makespan;
  spec.distributedOptimizer = true;
  const Built zero1 = buildAndSimulate(spec);
  for (const std::vector<Instr> &list : zero1.schedule.ranks)
    for (const Instr &i : list)
      if (i.kind == OpKind::AllReduce)
        EXPECT_EQ(i.collective, runtime::CollectiveOp::ReduceScatter) << i.describe();
  EXPECT_NEAR(plain - zero1.result.makespan, 0.5, 1e-9) << "free links: half the update";
  spec.linkBytesPerTime = 4000; // 1000 fp32 gradients all-reduced over 2: 1 time unit
  spec.elementBytes = 2;
  spec.distributedOptimizer = false;
  const double paidPlain = buildAndSimulate(spec).result.makespan;
  spec.distributedOptimizer = true;
  const double paidZero1 = buildAndSimulate(spec).result.makespan;
  // The last stage's reduction (1 -> 0.5) and its OPTIM (1 -> 0.5 + a bf16
  // gather of 0.25) end the step.
  EXPECT_NEAR(paidPlain - paidZero1, 0.75, 1e-9);
}

// A boundary's element size is its own (an fp32 residual stream beside bf16
// activations carries 4 bytes a value): its messages take twice as long and
// its output buffers hold twice the bytes of the spec's 2-byte elements.
TEST(Schedule, BoundariesCarryTheirOwnElementSize) {
  ScheduleSpec spec = uniformSpec(ScheduleKind::OneFOneB, 4, 1, 8);
  spec.elementBytes = 2;
  spec.linkBytesPerTime = 16.0 * 2048 * 2 / 0.5; // a 2-byte message takes 0.5
  const Built half = buildAndSimulate(spec);
  for (StageSpec &stage : spec.stages)
    stage.outputElementBytes = 4;
  const Built full = buildAndSimulate(spec);
  EXPECT_GT(full.result.makespan, half.result.makespan);
  const int64_t saved = 4 * spec.stages[0].savedBytes, output = spec.tokens * spec.stages[0].outputWidth;
  EXPECT_GE(half.result.peakBytes[0], saved + 2 * output);
  EXPECT_GE(full.result.peakBytes[0], saved + 4 * output);
  EXPECT_GT(full.result.peakBytes[0], half.result.peakBytes[0]);
  // 2 bytes named explicitly: the spec's own size, the same schedule.
  for (StageSpec &stage : spec.stages)
    stage.outputElementBytes = 2;
  EXPECT_EQ(buildAndSimulate(spec).result.makespan, half.result.makespan);
}

// The CPU backend's ranks share one host's cores: beyond them, ranks
// computing at once slow each other (processor sharing), never below the
// cores' throughput, and up to the cores nothing changes.
TEST(Schedule, RanksBeyondTheSharedCoresSlowEachOther) {
  for (auto [p, v, m] : {std::tuple<int64_t, int64_t, int64_t>{4, 1, 8}, {4, 2, 8}, {8, 2, 16}}) {
    ScheduleSpec spec = uniformSpec(v > 1 ? ScheduleKind::Interleaved : ScheduleKind::OneFOneB, p, v, m);
    const Built own = buildAndSimulate(spec);
    const double work = std::accumulate(own.result.busy.begin(), own.result.busy.end(), 0.0);
    spec.sharedCores = p;
    EXPECT_EQ(buildAndSimulate(spec).result.makespan, own.result.makespan) << p;
    for (int64_t cores : {p / 2, int64_t(1)}) {
      spec.sharedCores = cores;
      const Built shared = buildAndSimulate(spec);
      ASSERT_TRUE(shared.result.errors.empty());
      EXPECT_GT(shared.result.makespan, own.result.makespan) << p << " ranks on " << cores;
      // Busy counts the work alone (the stretch is waiting for a core). No
      // faster than the cores' throughput, no slower than one rank at a time
      // (within 1%: the fixed point stops once the step moves less than
      // kSharingTolerance an iteration).
      EXPECT_NEAR(std::accumulate(shared.result.busy.begin(), shared.result.busy.end(), 0.0), work, 1e-9 * work);
      EXPECT_GE(shared.result.makespan, work / double(cores) * 0.99) << p << " " << cores;
      EXPECT_LE(shared.result.makespan, work * 1.01) << p << " " << cores;
      for (double bubble : shared.result.rankBubbleFraction)
        EXPECT_TRUE(bubble >= 0 && bubble < 1) << bubble;
    }
  }
}

// On one core, ranks that never compute at the same time (1F1B at m = 1:
// a chain) keep their times; the stretch is only where they overlap.
TEST(Schedule, SharingStretchesOnlyOverlappingWork) {
  ScheduleSpec spec = uniformSpec(ScheduleKind::OneFOneB, 4, 1, 1);
  const double own = buildAndSimulate(spec).result.makespan;
  spec.sharedCores = 1;
  EXPECT_NEAR(buildAndSimulate(spec).result.makespan, own, 1e-9);
}

} // namespace
} // namespace mhcc::pipeline
