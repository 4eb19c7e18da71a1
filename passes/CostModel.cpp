//===- CostModel.cpp - parameters, FLOPs and bytes per model unit -----------===//
#include "passes/CostModel.h"

#include <cstdio>

namespace mhcc {

const char *unitKindName(UnitKind kind) {
  switch (kind) {
  case UnitKind::Embedding: return "embedding";
  case UnitKind::Expand: return "expand";
  case UnitKind::AttentionSublayer: return "attention";
  case UnitKind::GdnSublayer: return "gdn";
  case UnitKind::MlpSublayer: return "mlp";
  case UnitKind::Contract: return "contract";
  case UnitKind::FinalNorm: return "final_norm";
  case UnitKind::LmHead: return "lm_head";
  case UnitKind::Loss: return "loss";
  case UnitKind::Mtp: return "mtp";
  case UnitKind::MhcMixing: return "mhc";
  }
  return "?";
}

int64_t mhcMappingParams(const ModelInfo &d) {
  if (d.streams == 1)
    return 0;
  int64_t n = d.streams;
  int64_t coefficients = n * n + 2 * n;
  return d.residualWidth() * coefficients + coefficients + 3;
}

namespace {

/// Forward FLOPs per token of the mHC mixing around one sublayer: the
/// projection x @ W_map, the RMS, the Sinkhorn iterations, pre-mix, res-mix
/// and post-mix (a plain residual adds C, and with an fp32 residual beside
/// bf16 activations copies C more: u, rounded by a one-stream contract).
double mhcMixingFlops(const ModelInfo &d) {
  int64_t n = d.streams, c = d.hidden;
  if (n == 1)
    return d.roundsSublayerInput() ? 2.0 * c : c;
  double coefficients = n * n + 2 * n;
  double projection = 2.0 * n * c * coefficients;
  double rms = 2.0 * n * c;
  double sinkhorn = d.sinkhornIterations * 4.0 * n * n + 3.0 * n * n;
  double preMix = 2.0 * n * c;
  double resMix = 2.0 * n * n * c;
  double postMix = 2.0 * n * c;
  return projection + rms + sinkhorn + preMix + resMix + postMix;
}

/// Forward FLOPs per token of a Gated DeltaNet: the q/k/v, gate and output
/// projections and the gates' (C -> 2 heads), the conv, norms and the
/// recurrence's four d x d products per head (decay, S k, the rank-1
/// update, S q).
double gdnFlops(const ModelInfo &d) {
  double c = d.hidden, h = d.heads, dh = c / h;
  double projections = 2.0 * 5 * c * c + 2.0 * c * 2 * h;
  double convAndNorms = 2.0 * 4 * 3 * c + 20.0 * c;
  double recurrence = h * 8.0 * dh * dh;
  return projections + convAndNorms + recurrence;
}

double attentionFlops(const ModelInfo &d) {
  double c = d.hidden;
  double projections = 2.0 * 4 * c * c;                    // QKV + output
  double averageKeys = (d.seqLen + 1) / 2.0;                // causal
  double scoresAndValues = 2.0 * 2 * c * averageKeys;       // QK^T and PV
  double softmaxAndRope = 5.0 * d.heads * averageKeys + 3.0 * c;
  return projections + scoresAndValues + softmaxAndRope;
}

} // namespace

bool splitByTensorParallelism(UnitKind kind) {
  switch (kind) {
  case UnitKind::Embedding: // vocabulary-parallel: every rank writes every row (masked), then the sum
  case UnitKind::Expand:
  case UnitKind::Contract:
  case UnitKind::FinalNorm:
  case UnitKind::MhcMixing:
    return false;
  default:
    return true;
  }
}

UnitCost unitCost(UnitKind kind, const ModelInfo &d) {
  UnitCost u;
  u.kind = kind;
  int64_t c = d.hidden, n = d.streams, v = d.vocab, f = d.ffnHidden;
  int64_t bytes = d.dtypeBytes();
  int64_t residual = d.residualBytes() * n * c; // a token's input residual, kept for the backward
  // Recomputed, a sublayer keeps its input residual; at n > 1 also what the
  // CUDA backend's fused span (the previous post-res mix with this
  // coefficients and pre-mix) carries across the cut: u and the coefficients.
  int64_t checkpoint = residual + (n > 1 ? bytes * c + 4 * (n * n + 2 * n) : 0);
  double norm = 4.0 * c;
  switch (kind) {
  case UnitKind::Embedding:
    u.params = u.splitParams = v * c;
    u.outputWidth = c;
    break;
  case UnitKind::Expand:
    u.forwardFlopsPerToken = 0;
    u.outputWidth = n * c;
    break;
  case UnitKind::AttentionSublayer:
    u.params = mhcMappingParams(d) + c + 4 * c * c;
    u.splitParams = 4 * c * c;
    u.forwardFlopsPerToken = mhcMixingFlops(d) + norm + attentionFlops(d);
    u.outputWidth = n * c;
    // Input residual, u, normed u, Q, K, V, attention output, softmax stats.
    u.savedBytesPerToken = residual + bytes * (6 * c + d.heads);
    u.replicatedSavedBytesPerToken = residual + bytes * 2 * c;
    u.mixingFlopsPerToken = mhcMixingFlops(d);
    u.checkpointBytesPerToken = checkpoint;
    u.mixings = 1;
    break;
  case UnitKind::GdnSublayer:
    // W_qkv, the conv, W_ab, A_log, dt_bias, the head norm, W_gate, W_o.
    u.params = mhcMappingParams(d) + c + 5 * c * c + 12 * c + 2 * c * d.heads + 2 * d.heads + c / d.heads;
    u.splitParams = 5 * c * c + 12 * c + 2 * c * d.heads + 2 * d.heads; // all but the norms (tensor parallelism)
    u.forwardFlopsPerToken = mhcMixingFlops(d) + norm + gdnFlops(d);
    u.outputWidth = n * c;
    // Input residual, u, normed u, then what the forward keeps (GdnKernels.h): 11 C + 5 heads,
    // and on the GPU its scans' U, W and chunk states for the backward, (2 + D / 64) C (GdnWy.cu).
    u.savedBytesPerToken =
        residual + bytes * 2 * c + 4 * (11 * c + 5 * d.heads) + 4 * (2 * c + c * (c / d.heads) / 64);
    u.replicatedSavedBytesPerToken = residual + bytes * 2 * c;
    u.mixingFlopsPerToken = mhcMixingFlops(d);
    u.checkpointBytesPerToken = checkpoint;
    u.mixings = 1;
    break;
  case UnitKind::MlpSublayer:
    u.params = mhcMappingParams(d) + c + 3 * c * f;
    u.splitParams = 3 * c * f;
    u.forwardFlopsPerToken = mhcMixingFlops(d) + norm + 6.0 * c * f + 4.0 * f;
    u.outputWidth = n * c;
    // Input residual, u, normed u, gate and up projections, their product.
    u.savedBytesPerToken = residual + bytes * (2 * c + 3 * f);
    u.replicatedSavedBytesPerToken = residual + bytes * 2 * c;
    u.mixingFlopsPerToken = mhcMixingFlops(d);
    u.checkpointBytesPerToken = checkpoint;
    u.mixings = 1;
    break;
  case UnitKind::Contract:
    u.forwardFlopsPerToken = n * c;
    u.outputWidth = c;
    break;
  case UnitKind::FinalNorm:
    u.params = c;
    u.forwardFlopsPerToken = norm;
    u.outputWidth = c;
    u.savedBytesPerToken = u.replicatedSavedBytesPerToken = bytes * c;
    break;
  case UnitKind::LmHead:
    u.params = u.splitParams = c * v;
    u.forwardFlopsPerToken = 2.0 * c * v;
    u.outputWidth = v;
    u.savedBytesPerToken = u.replicatedSavedBytesPerToken = bytes * c; // its input
    break;
  case UnitKind::Loss:
    u.forwardFlopsPerToken = 4.0 * v;
    u.outputWidth = 1;
    u.savedBytesPerToken = bytes * v;
    break;
  case UnitKind::Mtp: // the sum of its pieces, in program order
    u.outputWidth = 1;
    for (const UnitCost &piece : mtpPieces(d)) {
      u.params += piece.params;
      u.splitParams += piece.splitParams;
      u.forwardFlopsPerToken += piece.forwardFlopsPerToken;
      u.mixingFlopsPerToken += piece.mixingFlopsPerToken;
      u.mixings += piece.mixings;
      u.savedBytesPerToken += piece.savedBytesPerToken;
      u.replicatedSavedBytesPerToken += piece.replicatedSavedBytesPerToken;
    }
    break;
  case UnitKind::MhcMixing:
    u.forwardFlopsPerToken = mhcMixingFlops(d);
    u.outputWidth = n * c;
    break;
  }
  return u;
}

std::vector<UnitCost> mtpPieces(const ModelInfo &d) {
  const int64_t c = d.hidden, v = d.vocab, bytes = d.dtypeBytes();
  const double norm = 4.0 * c;
  // Contract and normalize the residual, normalize the embedding of the
  // token ahead (the table is the main model's), project the concatenation
  // 2C -> C; the norms keep their inputs, the projection its two.
  UnitCost prelude;
  prelude.kind = UnitKind::Mtp;
  prelude.params = 2 * c + 2 * c * c;
  prelude.forwardFlopsPerToken = 2 * norm + 4.0 * c * c;
  prelude.outputWidth = c;
  prelude.savedBytesPerToken = prelude.replicatedSavedBytesPerToken = bytes * 4 * c;
  // Contract, the final norm, the shared head (its FLOPs, not its
  // parameters) and the loss: as the main model's (their inputs, the logits).
  UnitCost tail;
  tail.kind = UnitKind::Mtp;
  tail.params = c;
  tail.forwardFlopsPerToken = norm + 2.0 * c * v + 4.0 * v;
  tail.outputWidth = 1;
  tail.savedBytesPerToken = bytes * (2 * c + v);
  tail.replicatedSavedBytesPerToken = bytes * 2 * c;
  return {prelude, unitCost(UnitKind::AttentionSublayer, d), unitCost(UnitKind::MlpSublayer, d), tail};
}

ModelTotals totalCost(const std::vector<UnitCost> &units, const ModelInfo &d) {
  ModelTotals totals;
  int64_t sublayers = 0;
  for (const UnitCost &u : units) {
    totals.params += u.params;
    totals.forwardFlopsPerToken += u.forwardFlopsPerToken;
    if (u.kind == UnitKind::AttentionSublayer || u.kind == UnitKind::GdnSublayer || u.kind == UnitKind::MlpSublayer) {
      ++sublayers;
      totals.mhcParams += mhcMappingParams(d);
    }
    if (u.kind == UnitKind::Mtp)
      totals.mhcParams += 2 * mhcMappingParams(d);
  }
  totals.layers = sublayers / 2;
  return totals;
}

std::string humanBytes(double bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f %s", bytes, units[unit]);
  return buffer;
}

} // namespace mhcc
