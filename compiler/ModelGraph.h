//===- ModelGraph.h - model graph JSON: parse and validate --------*- C++ -*-===//
//
// The model graph is the user's input format (docs/model_format.md). This file
// reads it into a validated, topologically ordered ModelGraph. It does not
// depend on MLIR: the importer lowers a ModelGraph into the mhc dialect.
//
// Every problem is reported as one ModelError naming a JSON pointer into the
// file (RFC 6901) and what is wrong, so the CLI prints `FILE: /pointer: msg`.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_COMPILER_MODELGRAPH_H
#define MHCC_COMPILER_MODELGRAPH_H

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mhcc {

/// The format tag every model file carries in "format".
inline constexpr const char *kModelFormatTag = "mhcc-model-v1";

struct ModelConfig {
  int64_t vocab = 0;
  int64_t hidden = 0;      // C
  int64_t heads = 0;
  int64_t ffnHidden = 0;   // F
  int64_t seqLen = 0;
  int64_t microBatch = 1;  // sequences per microbatch
  int64_t streams = 4;     // n; 1 is a plain residual model
  int64_t sinkhornIterations = 20;
  double gatingFactor = 0.01;
  double normEps = 1e-6;
  std::string dtype = "f32";
  /// The residual stream's storage where it differs from dtype: "f32" in a
  /// bf16 model (Megatron's fp32-residual-connection; docs/precision.md);
  /// empty: as dtype. Read it through residualStorage().
  std::string residualDtype;
  int64_t seed = 1234;

  const std::string &residualStorage() const { return residualDtype.empty() ? dtype : residualDtype; }

  int64_t tokens() const { return seqLen * microBatch; }
  int64_t residualWidth() const { return streams * hidden; }
  int64_t headDim() const { return hidden / heads; }
};

enum class NodeOp {
  Embedding,
  MhcExpand,
  MhcSublayer,
  MhcContract,
  RmsNorm,
  LmHead,
  CrossEntropy,
  Mtp,
};

/// A layer's token mixer (attention, or a Gated DeltaNet in hybrid stacks)
/// and its MLP.
enum class SublayerKind { Attention, Gdn, Mlp };

/// What a node's output is, by width.
enum class ValueKind {
  None,     // no input (embedding reads the token ids)
  Hidden,   // tensor<T x C>
  Residual, // tensor<T x n*C>
  Logits,   // tensor<T x V>
  Loss,     // scalar
};

struct ModelNode {
  std::string name;
  NodeOp op = NodeOp::Embedding;
  std::vector<int> inputs; // indices into ModelGraph::nodes
  std::string pointer;     // JSON pointer of the node, e.g. "/nodes/3"

  // Attributes; only those of `op` are meaningful.
  SublayerKind sublayer = SublayerKind::Attention; // mhc_sublayer
  int64_t layer = -1;      // mhc_sublayer: transformer layer index
  double eps = 0;          // rmsnorm
  std::string lossName;    // cross_entropy
  int64_t depth = 1;       // mtp
  double lossWeight = 0.1; // mtp
};

struct ModelGraph {
  std::string name;
  std::string description;
  ModelConfig config;
  /// Topologically ordered; inputs always precede their users.
  std::vector<ModelNode> nodes;

  int64_t numLayers() const;
};

struct ModelError {
  std::string pointer; // JSON pointer, or "line L, column C" for syntax errors
  std::string message;
};

/// Parses and validates a model graph from JSON text. Returns nullopt and
/// fills `error` with the first problem found.
std::optional<ModelGraph> parseModelGraph(const std::string &text,
                                          ModelError &error);

/// Reads `path` and parses it; a missing file is an error too.
std::optional<ModelGraph> loadModelGraph(const std::string &path,
                                         ModelError &error);

/// `FILE: POINTER: MESSAGE`, the one line a bad model produces.
std::string formatModelError(const std::string &file, const ModelError &error);

const char *nodeOpName(NodeOp op);
const char *valueKindName(ValueKind kind);
ValueKind outputKind(NodeOp op);

} // namespace mhcc

#endif // MHCC_COMPILER_MODELGRAPH_H
