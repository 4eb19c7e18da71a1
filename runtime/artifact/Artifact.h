//===- Artifact.h - the compiled artifact mhcrun executes ---------*- C++ -*-===//
//
// One versioned file: a fixed header (magic, format version, payload size,
// XXH3-64 checksum of the payload) followed by a JSON payload with the model
// sizes, the parameter table and its initialization, the stage programs
// (forward and backward), every rank's schedule, the final IR and the
// model's compiled CUDA kernels (base64). Readers
// verify the header, the checksum and every index before anything runs, so
// a truncated or corrupt file is one clear error, never a crash.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_RUNTIME_ARTIFACT_ARTIFACT_H
#define MHCC_RUNTIME_ARTIFACT_ARTIFACT_H

#include "runtime/program/Collectives.h"
#include "runtime/program/Instructions.h"
#include "runtime/program/Model.h"
#include "runtime/program/Program.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mhcc::runtime {

inline constexpr char kArtifactMagic[8] = {'M', 'H', 'C', 'C', 'A', 'R', 'T', '\0'};
/// 2: every stage value carries its storage dtype (bf16 models). 3: the
/// model's residual_dtype differs from its dtype (an fp32 residual stream in
/// a bf16 model), which a format-2 reader would ignore and misread. 4:
/// compiled with --recompute-sublayers, which an older reader would ignore
/// (training without the memory the prediction assumed). Every other
/// artifact is still written as 2. This mhcrun reads them all.
inline constexpr uint32_t kArtifactVersion = 5, kOldestArtifactVersion = 2;
/// mhcc's own version, printed by every tool's --version: raise it with
/// every change users must know about (a new artifact format, changed flags).
inline constexpr char kMhccVersion[] = "0.4.0";
/// Limits of the rank mesh (mhcc refuses larger flags; readers, such files).
inline constexpr int64_t kMaxDataParallel = 4096, kMaxContextParallel = 256, kMaxTensorParallel = 64,
                         kMaxWorldSize = 65536;

struct ParamInfo {
  std::string name;
  int64_t rows = 0, cols = 0;
  std::string init;  // "normal", "xavier_uniform", "ones", "zeros", "constant"
  double scale = 0;  // normal: std; constant: the value
  bool decay = true; // AdamW weight decay applies
  /// How tensor parallelism splits it (TensorSplit.h): "" replicated on
  /// every tensor-parallel rank, "rows", "cols", or "qkv" (the columns of
  /// each of q, k and v: whole heads).
  std::string tpSplit;
  int64_t count() const { return rows * cols; }
};

/// The model's CUDA kernels, generated and compiled by mhcc
/// (compiler/codegen): what the CUDA backend loads (runtime/cuda/ModelKernels.h).
struct DeviceCode {
  std::string arch;     // "sm_90": the one architecture the image runs on
  std::string compiler; // nvcc's version line, for the record
  int64_t streams = 0, sinkhornIterations = 0; // the model constants compiled in
  std::string source;   // the CUDA source nvcc compiled (for reading and debugging)
  std::string image;    // the cubin
};

/// What mhcc's schedule simulator predicted for one step, and with which
/// rates (passes/DeviceProfile.h): mhcrun --profile prints its measurement
/// beside it.
struct Prediction {
  double stepMs = 0;
  double bubbleFraction = 0; // idle / (ranks x step)
  std::string profile;       // the rates' description
};

/// The rank mesh (docs/pipeline.md): dp replicas of a pp-rank pipeline,
/// each sequence shared by cp context-parallel ranks, each layer's weights
/// split over tp tensor-parallel ranks; world = pp x dp x cp x tp. Ranks are
/// ordered as Megatron orders them, tensor-parallel fastest, then context-
/// parallel, then data-parallel, then pipeline: global rank = ((pipeline
/// rank x dp + replica) x cp + context rank) x tp + tensor rank.
struct Artifact {
  ModelInfo model;
  std::string modelHash; // of the model graph the artifact was compiled from
  /// microbatches: per replica and step (the global batch is dp x that).
  int64_t pp = 1, vpp = 1, dp = 1, cp = 1, tp = 1, microbatches = 1, groupSize = 0;
  /// Megatron's sequence parallelism (tp > 1): outside the tensor-parallel
  /// GEMMs each tensor-parallel rank holds seq_len / tp of every sequence.
  bool sequenceParallel = false;
  /// Megatron's distributed optimizer (ZeRO-1, dp x cp > 1): each member of the
  /// gradient group (dp x cp, reduceMemberOf) receives only its part of the
  /// summed gradients (a reduce-scatter), keeps Adam's moments of that part
  /// and updates it; the parts are then all-gathered (shardOf).
  bool distributedOptimizer = false;
  /// Compiled with --recompute-sublayers: mhcrun recomputes each sublayer's
  /// activations (TrainOptions::recompute), as the prediction assumed.
  bool recomputeSublayers = false;
  /// With it, the sublayers a recomputed segment holds (mhcc
  /// --recompute-num-sublayers; 1 before format 5).
  int64_t recomputeNumSublayers = 1;
  std::string scheduleKind, layout;
  std::vector<ParamInfo> params;
  std::vector<StageProgram> stages;     // pp * vpp, by virtual stage
  std::vector<std::vector<Instr>> ranks; // pp instruction lists
  std::string ir;                        // the final IR, for debugging
  /// Absent when compiled with --cuda-arch none: the CPU backend only.
  std::optional<DeviceCode> deviceCode;
  /// Absent in artifacts from before the prediction was recorded.
  std::optional<Prediction> prediction;
  /// XXH3-64 of the payload it was decoded from (0 for one built in
  /// memory): what the processes of a run compare (runtime/cli/RunSettings.h).
  uint64_t checksum = 0;

  int64_t rankOf(int64_t stage) const { return stage % pp; }
  /// What the tp / cp collectives' shapes depend on.
  CollectiveMesh collectiveMesh() const {
    return {tp, cp, sequenceParallel, model.tokens(), model.hidden, model.heads};
  }
  int64_t worldSize() const { return pp * dp * cp * tp; }
  /// "pp = 2 x dp = 2 x tp = 2": the mesh's factors above 1 (pp always).
  std::string meshDescription() const {
    std::string mesh = "pp = " + std::to_string(pp);
    for (auto [name, size] : {std::pair<const char *, int64_t>{"dp", dp}, {"cp", cp}, {"tp", tp}})
      if (size > 1)
        mesh += std::string(" x ") + name + " = " + std::to_string(size);
    return mesh;
  }
  int64_t globalRank(int64_t pipelineRank, int64_t replica, int64_t contextRank = 0, int64_t tensorRank = 0) const {
    return ((pipelineRank * dp + replica) * cp + contextRank) * tp + tensorRank;
  }
  int64_t pipelineRankOf(int64_t global) const { return global / (dp * cp * tp); }
  int64_t replicaOf(int64_t global) const { return global / (cp * tp) % dp; }
  int64_t contextRankOf(int64_t global) const { return global / tp % cp; }
  int64_t tensorRankOf(int64_t global) const { return global % tp; }
  /// The global ranks of a rank's tensor-parallel group (its tensor ranks
  /// 0 .. tp - 1) and of its context-parallel group (context ranks 0 .. cp -
  /// 1), in the order their parts are added.
  std::vector<int64_t> tensorGroupOf(int64_t global) const {
    std::vector<int64_t> members;
    for (int64_t t = 0; t < tp; ++t)
      members.push_back(global - tensorRankOf(global) + t);
    return members;
  }
  std::vector<int64_t> contextGroupOf(int64_t global) const {
    std::vector<int64_t> members;
    for (int64_t c = 0; c < cp; ++c)
      members.push_back(globalRank(pipelineRankOf(global), replicaOf(global), c, tensorRankOf(global)));
    return members;
  }
  /// A global rank's index among the dp x cp x tp ranks of its pipeline rank.
  int64_t memberOf(int64_t global) const { return global % (dp * cp * tp); }
  /// The ranks one gradient ALLREDUCE sums over: a pipeline rank's replicas
  /// and their context-parallel ranks (Megatron's data-parallel group with
  /// context parallelism) of one tensor rank; the member index of a global
  /// rank in it.
  int64_t reduceGroupSize() const { return dp * cp; }
  int64_t reduceMemberOf(int64_t global) const { return global / tp % (dp * cp); }
  /// Rows of a microbatch each rank holds outside the tensor-parallel GEMMs:
  /// its context-parallel share, split again over tp under sequence parallelism.
  int64_t rowsPerRank() const { return model.tokens() / cp / (sequenceParallel ? tp : 1); }
  /// The microbatch rows context rank `contextRank` holds (cp > 1): the
  /// load-balanced causal split's chunks contextRank and 2 cp - 1 -
  /// contextRank of each sequence (2 cp chunks of seq_len / 2 cp rows), in
  /// that order; empty for cp = 1.
  std::vector<int64_t> contextRows(int64_t contextRank) const {
    std::vector<int64_t> rows;
    const int64_t seq = model.seqLen, chunk = seq / (2 * cp);
    for (int64_t b = 0; cp > 1 && b < model.microBatch; ++b)
      for (int64_t part : {contextRank, 2 * cp - 1 - contextRank})
        for (int64_t i = 0; i < chunk; ++i)
          rows.push_back(b * seq + part * chunk + i);
    return rows;
  }
  /// The distributed optimizer's parts: one per member of the gradient
  /// group (Megatron shards over the data-parallel group with its context
  /// ranks), 1 without it.
  int64_t optimizerParts() const { return distributedOptimizer ? dp * cp : 1; }
  /// The elements [begin, end) of a parameter (or tensor-parallel block) of
  /// `count` elements that part `part` holds: whole statistics chunks
  /// (gradientChunk), split as evenly as their number allows, so that a
  /// part's partial sums of squares are the whole tensor's.
  std::pair<int64_t, int64_t> shardOf(int64_t count, int64_t part) const {
    const int64_t chunk = gradientChunk(count), chunks = (count + chunk - 1) / chunk, parts = optimizerParts();
    auto at = [&](int64_t k) { return std::min(count, k * chunks / parts * chunk); };
    return {at(part), at(part + 1)};
  }
  /// The elements of one partial sum of a gradient's squares and zeros: a
  /// multiple of 256 giving at most 256 chunks a tensor (the GPU sums each
  /// chunk in one block, the chunks in order; shardOf cuts between them).
  static int64_t gradientChunk(int64_t count) { return 256 * std::max<int64_t>(1, (count + 65535) / 65536); }
  /// With one process a rank, the part (shardOf) a global rank updates
  /// under the distributed optimizer: each gradient-group member's first
  /// rank (pipeline and tensor rank 0) holds its member's; -1 for the
  /// others and without the distributed optimizer.
  int64_t optimizerShardOf(int64_t global) const {
    const bool first = distributedOptimizer && pipelineRankOf(global) == 0 && tensorRankOf(global) == 0;
    return first ? reduceMemberOf(global) : -1;
  }
  /// The global rank that updates part `part` with one process a rank (optimizerShardOf).
  int64_t optimizerPartRank(int64_t part) const { return globalRank(0, part / cp, part % cp, 0); }
  /// Microbatch `mb` of `replica` in the global batch's order (Megatron's
  /// sampler: each group of dp consecutive microbatches goes one to a replica).
  int64_t globalMicrobatch(int64_t mb, int64_t replica) const { return mb * dp + replica; }
};

/// Writes atomically (a temporary file renamed into place).
bool writeArtifact(const std::string &path, const Artifact &artifact, std::string &error);

/// Reads and verifies; on failure `error` is one line naming the file, what
/// is wrong and what to do.
std::optional<Artifact> readArtifact(const std::string &path, std::string &error);

/// The format an artifact is written in: the oldest that holds it.
uint32_t artifactVersionOf(const Artifact &artifact);
/// Serialized bytes (header + payload), and their inverse.
std::string encodeArtifact(const Artifact &artifact);
std::optional<Artifact> decodeArtifact(const std::string &bytes, std::string &error);

/// Checks every index and shape the executor relies on.
std::string validateArtifact(const Artifact &artifact);

} // namespace mhcc::runtime

#endif // MHCC_RUNTIME_ARTIFACT_ARTIFACT_H
