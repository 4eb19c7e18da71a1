//===- Instructions.h - per-rank schedule instructions ------------*- C++ -*-===//
//
// One rank's step is a static list of these: compute (FWD, BWD, or the
// zero-bubble halves B and W), communication (SEND, RECV), FREE, the
// data-parallel gradient all-reduce (ALLREDUCE), OPTIM, and the tensor- and
// context-parallel collectives a compute instruction issues (COLLECTIVE:
// listed right after it, in the order its kernels issue them).
// The compiler's schedule builder produces them; the runtime executes them.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_PROGRAM_INSTRUCTIONS_H
#define MHCC_RUNTIME_PROGRAM_INSTRUCTIONS_H

#include <cstdint>
#include <optional>
#include <string>

namespace mhcc::runtime {

enum class OpKind {
  Forward,        // FWD(stage, mb)
  Backward,       // BWD(stage, mb): input and weight gradients together
  BackwardInput,  // B(stage, mb) of the zero-bubble split: input gradient
  BackwardWeight, // W(stage, mb): weight gradient
  Send,
  Recv,
  Free,           // pseudo-deallocation of out(stage, mb) once its send completed
  Optimizer,
  AllReduce,      // a stage's gradients summed over the rank's data-parallel group (width: their floats;
                  // collective ReduceScatter under the distributed optimizer: each member keeps its part)
  Collective,     // one tp / cp collective issued inside the compute instruction it follows
};

const char *opKindName(OpKind kind);
std::optional<OpKind> parseOpKind(const std::string &name);

enum class Payload { Activation, Gradient };

/// The collectives of a tensor- or context-parallel group, as the kernels
/// issue them (Megatron's all-gather before a column-parallel GEMM,
/// reduce-scatter or all-reduce after a row-parallel one, the
/// vocabulary-parallel loss's statistics, context parallelism's K/V gathers).
enum class CollectiveOp { AllGather, ReduceScatter, AllReduce, AllReduceMax };
/// The group a collective spans: the rank's tensor-parallel ranks or its
/// context-parallel ranks.
enum class MeshAxis { Tensor, Context };

/// "all_gather", "reduce_scatter", "all_reduce", "all_reduce_max"; "tp", "cp".
const char *collectiveOpName(CollectiveOp op);
std::optional<CollectiveOp> parseCollectiveOp(const std::string &name);
const char *meshAxisName(MeshAxis axis);
std::optional<MeshAxis> parseMeshAxis(const std::string &name);

/// Which half of a backward to run: both (BWD), the input gradients only
/// (the zero-bubble B), or the weight gradients only (W, after B, from what
/// B left in place).
enum class BackwardPart { Both, Input, Weight };

struct Instr {
  OpKind kind = OpKind::Forward;
  int64_t stage = -1; // virtual stage
  int64_t mb = -1;    // microbatch
  // SEND / RECV only.
  Payload payload = Payload::Activation;
  int64_t peer = -1;
  int64_t srcStage = -1, dstStage = -1; // the message's edge
  int64_t tokens = 0, width = 0;        // shape [tokens, width]
  int64_t group = -1;                   // instructions of one group share it
  int64_t order = -1; // position in this rank's FIFO to/from `peer`, per direction
  // COLLECTIVE (stage and mb: the compute instruction's; [tokens x width]:
  // what this rank puts in, i.e. its rows for an all-gather, the whole
  // tensor for a reduce-scatter or an all-reduce); ALLREDUCE's all_reduce
  // or reduce_scatter.
  CollectiveOp collective = CollectiveOp::AllReduce;
  MeshAxis axis = MeshAxis::Tensor;

  bool isComm() const { return kind == OpKind::Send || kind == OpKind::Recv; }
  bool isCompute() const {
    return kind == OpKind::Forward || kind == OpKind::Backward ||
           kind == OpKind::BackwardInput || kind == OpKind::BackwardWeight;
  }
  /// `FWD(s2,mb3)`, `SEND act s0->s1 mb3 to r1 [TxW]`, `ALLREDUCE grads s2 dp [N]` (or REDUCESCATTER),
  /// `tp all_gather in (s2,mb3) [TxW]`.
  std::string describe() const;
};

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_PROGRAM_INSTRUCTIONS_H
