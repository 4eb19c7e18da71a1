//===- CostModel.h - parameters, FLOPs and bytes per model unit ---*- C++ -*-===//
//
// Plain C++ (no MLIR): the cost of each pipeline-cuttable unit of an mHC
// model (embedding, expand, one mHC-wrapped sublayer, contract, final norm,
// LM head, loss, MTP). The summary, the automatic partitioner and the schedule
// simulator all read these numbers, so they are computed in one place.
//
// FLOP conventions: a multiply-add is 2 FLOPs; causal attention counts the
// keys each query actually sees, (s + 1) / 2 on average; backward is twice
// forward (input and weight gradients), so training is 3x forward.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_PASSES_COSTMODEL_H
#define MHCC_PASSES_COSTMODEL_H

#include "runtime/program/Model.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mhcc {

/// The model's sizes: the one struct the lowering writes into the artifact
/// and the runtime reads back.
using runtime::ModelInfo;

enum class UnitKind {
  Embedding,
  Expand,
  AttentionSublayer,
  GdnSublayer,
  MlpSublayer,
  Contract,
  FinalNorm,
  LmHead,
  Loss,
  Mtp,
  /// Not a unit of the graph: the residual stream's mixing around one
  /// sublayer (mHC's coefficients, pre-mix and post/res mix, or n = 1's
  /// residual add), inside the sublayers' (and MTP's) costs. A device
  /// profile that measured it apart prices it at its own rate: it moves the
  /// n*C residual several times for about 1% of a layer's FLOPs, so a FLOP
  /// rate fitted with it inside the sublayers misprices other n or C.
  MhcMixing,
};

const char *unitKindName(UnitKind kind);

struct UnitCost {
  UnitKind kind = UnitKind::Embedding;
  std::string name;          // the model-graph node name
  int64_t layer = -1;        // transformer layer, for sublayers
  int64_t params = 0;        // trainable parameters
  /// Of params: the GEMM weights tensor parallelism splits over its ranks
  /// (runtime/artifact/TensorSplit.h); the rest is replicated.
  int64_t splitParams = 0;
  double forwardFlopsPerToken = 0;
  /// Of forwardFlopsPerToken: the residual mixing (MhcMixing) of `mixings`
  /// sublayers (1 for a sublayer, 2 for an MTP module, else 0).
  double mixingFlopsPerToken = 0;
  int64_t mixings = 0;
  /// Width per token of the unit's output (n*C for residual-producing units).
  int64_t outputWidth = 0;
  /// Bytes per token kept from forward to backward (without recompute).
  int64_t savedBytesPerToken = 0;
  /// Of savedBytesPerToken: what every tensor-parallel rank keeps whole (the
  /// residual, u, normed u, the LM head's input), unless sequence
  /// parallelism shards its rows; the rest (projections, attention and FFN
  /// internals, logits) splits over the group.
  int64_t replicatedSavedBytesPerToken = 0;
  /// Under activation recomputation (--recompute-sublayers): what a
  /// sublayer keeps from its forward to its backward, its input residual
  /// (and at n > 1 the u and coefficients a fused GPU span carries across;
  /// replicated like the residual); the rest of savedBytesPerToken is dropped and
  /// computed again, one more forward, before its backward. 0: a unit the
  /// recomputation leaves alone (everything but the three sublayers).
  int64_t checkpointBytesPerToken = 0;
};

/// Whether tensor parallelism splits a unit's compute over the group (the
/// sublayers' and MTP's GEMMs and heads, the vocabulary of the LM head and
/// loss); expand, contract, the final norm and the mixing run on every
/// rank's rows (all of them, or 1 / tp under sequence parallelism), and the
/// embedding on all rows either way (every rank writes every row of its
/// masked lookup, then the group sums or reduce-scatters them).
bool splitByTensorParallelism(UnitKind kind);

/// Cost of one unit of `kind` for a model of size `dims`.
UnitCost unitCost(UnitKind kind, const ModelInfo &dims);

/// An MTP module in program order, as activation recomputation cuts it
/// (runtime/program/Recompute.h): its prelude (contract, the two input
/// norms, the embedding of the token ahead, the 2C -> C projection), its
/// attention and MLP sublayers (each ending in a residual update), and its
/// tail (contract, final norm, the shared head, the loss). unitCost(Mtp) is
/// their sum.
std::vector<UnitCost> mtpPieces(const ModelInfo &dims);

/// Parameters of the mHC mapping around one sublayer: W_map [nC, n^2 + 2n],
/// b [n^2 + 2n] and the three gating scalars; zero for a plain model (n = 1).
int64_t mhcMappingParams(const ModelInfo &dims);

struct ModelTotals {
  int64_t params = 0;
  double forwardFlopsPerToken = 0;
  double trainingFlopsPerToken() const { return 3 * forwardFlopsPerToken; }
  int64_t layers = 0;
  int64_t mhcParams = 0; // of params: the W_map, b and alphas
};

ModelTotals totalCost(const std::vector<UnitCost> &units, const ModelInfo &dims);

/// "8.0 MiB": bytes in binary units with one decimal.
std::string humanBytes(double bytes);

} // namespace mhcc

#endif // MHCC_PASSES_COSTMODEL_H
