//===- Instructions.h - per-rank schedule instructions ------------*- C++ -*-===//
//
// One rank's step is a static list of these: compute (FWD, BWD, or the
// zero-bubble halves B and W), communication (SEND, RECV), FREE, the
// data-parallel gradient all-reduce (ALLREDUCE) and OPTIM.
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
  AllReduce,      // a stage's gradients summed over the rank's data-parallel group (width: their floats)
};

const char *opKindName(OpKind kind);
std::optional<OpKind> parseOpKind(const std::string &name);

enum class Payload { Activation, Gradient };

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

  bool isComm() const { return kind == OpKind::Send || kind == OpKind::Recv; }
  bool isCompute() const {
    return kind == OpKind::Forward || kind == OpKind::Backward ||
           kind == OpKind::BackwardInput || kind == OpKind::BackwardWeight;
  }
  /// `FWD(s2,mb3)`, `SEND act s0->s1 mb3 to r1 [TxW]`, `ALLREDUCE grads s2 dp [N]`.
  std::string describe() const;
};

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_PROGRAM_INSTRUCTIONS_H
