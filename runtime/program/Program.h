//===- Program.h - compiled stage programs ------------------------*- C++ -*-===//
//
// What one virtual stage runs for one microbatch: a forward list of kernel
// calls over numbered values, and the backward list the compiler's autodiff
// derived from it. The compiler writes these into the artifact; the runtime
// backends interpret them. Plain data, no MLIR.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_PROGRAM_PROGRAM_H
#define MHCC_RUNTIME_PROGRAM_PROGRAM_H

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mhcc::runtime {

/// Kernel primitives (runtime/cpu/Kernels.h has their math).
enum class Prim {
  Identity,     // copy (an empty stage forwards its input into a fresh buffer)
  Embed,        // params: table [V, C]; attr shift (MTP reads tokens ahead)
  Expand,       // [T, C] -> [T, n*C]
  MhcCoeffs,    // x [T, n*C]; params W_map, b, alpha -> [T, n^2 + 2n]
  MhcPre,       // x, coef -> u [T, C]
  RmsNorm,      // params gain [1, C]
  Attention,    // params W_qkv [C, 3C], W_o [C, C]
  SwiGlu,       // params W_gate [C, F], W_up [C, F], W_down [F, C]
  MhcPostRes,   // x, coef, y -> x' [T, n*C]
  Residual,     // x, y -> x + y (n = 1)
  Contract,     // [T, n*C] -> [T, C]
  LmHead,       // params W [C, V]
  ConcatProj,   // a, b [T, C]; params W [2C, C]
  CrossEntropy, // logits, labels -> scalar loss (value [1, 1]); attr shift
  GatedDeltaNet, // params W_qkv [C, 3C], conv [4, 3C], W_ab [C, 2H], a_log [1, H], dt_bias [1, H],
                 // out_norm [1, C/H], W_gate [C, C], W_o [C, C]; attrs heads, eps (the head norm's)
};

const char *primName(Prim prim);
std::optional<Prim> parsePrim(const std::string &name);

struct ValueInfo {
  int64_t rows = 0, cols = 0;
  /// Non-empty for the output of a model-graph node (or "grad:<node>" for
  /// its gradient): what parity tests compare across pipeline layouts.
  std::string tap;
  /// How the value is stored between kernels: "f32", or "bf16" (rounded to
  /// nearest even when written; docs/precision.md lists which values are
  /// which). A gradient is stored as its value is.
  std::string dtype = "f32";
};

struct ForwardInstr {
  Prim op = Prim::Identity;
  std::vector<int> inputs; // value ids
  std::vector<int> params; // parameter slot ids of this stage
  int output = -1;         // value id
  int64_t auxSize = 0;     // scratch floats kept from forward to backward
  // Attributes (meaningful per op).
  int64_t streams = 1, heads = 0, ffn = 0, shift = 0, sinkhornIterations = 0, seqLen = 1;
  double eps = 0;
  int loss = -1;           // CrossEntropy: index into StageProgram::losses
};

struct BackwardInstr {
  int forward = -1;           // the forward instruction it differentiates
  int gradOutput = -1;        // gradient of that instruction's output (-1: loss seed)
  std::vector<int> gradInputs; // per forward input: gradient value id it adds into, or -1
};

struct ParamSlot {
  int param = -1;          // index into the artifact's parameter table
  int64_t useOrder = 0;    // position of the use in the whole model, forward order
};

struct LossInfo {
  std::string name; // "lm loss", "mtp loss"
  double weight = 1;
};

struct StageProgram {
  int64_t stage = 0;
  int input = -1;      // value received from the previous stage (-1 for stage 0)
  int output = -1;     // value sent to the next stage (-1 for the last)
  int gradInput = -1;  // gradient of `input`, sent back
  int gradOutput = -1; // gradient of `output`, received
  std::vector<ValueInfo> values;
  std::vector<ForwardInstr> forward;
  std::vector<BackwardInstr> backward;
  std::vector<ParamSlot> params;
  std::vector<LossInfo> losses;
};

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_PROGRAM_PROGRAM_H
