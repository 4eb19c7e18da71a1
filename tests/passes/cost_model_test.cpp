// Cost-model checks against independent counts: parameters by listing every
// weight tensor's shape, and FLOPs from the matmul shapes.
#include "passes/CostModel.h"

#include <gtest/gtest.h>

namespace mhcc {
namespace {

ModelInfo smallDims(int64_t streams) {
  ModelInfo d;
  d.vocab = 256;
  d.hidden = 512;
  d.heads = 8;
  d.ffnHidden = 1408;
  d.seqLen = 1024;
  d.streams = streams;
  return d;
}

int64_t product(std::initializer_list<std::initializer_list<int64_t>> shapes) {
  int64_t total = 0;
  for (auto shape : shapes) {
    int64_t count = 1;
    for (int64_t dim : shape)
      count *= dim;
    total += count;
  }
  return total;
}

TEST(CostModel, SublayerParametersMatchTensorShapes) {
  ModelInfo d = smallDims(4);
  int64_t n = 4, c = 512, k = n * n + 2 * n;
  int64_t mapping = product({{n * c, k}, {k}, {1}, {1}, {1}}); // W_map, b, 3 alphas
  EXPECT_EQ(mhcMappingParams(d), mapping);
  EXPECT_EQ(unitCost(UnitKind::AttentionSublayer, d).params,
            mapping + product({{c}, {c, 3 * c}, {c, c}}));
  EXPECT_EQ(unitCost(UnitKind::MlpSublayer, d).params,
            mapping + product({{c}, {c, 1408}, {c, 1408}, {1408, c}}));
}

// What a tensor-parallel rank keeps whole: a sublayer's input residual (n C
// in the residual's dtype), u and normed u (C each, in the activations');
// the LM head's input; an MTP module's two sublayers' plus its four C-wide
// norms and projection inputs.
TEST(CostModel, ReplicatedSavedBytesAreTheResidualAndTheNormInputs) {
  ModelInfo d = smallDims(4);
  d.dtype = "bf16";
  d.residualDtype = "f32";
  const int64_t C = d.hidden, residual = 4 * 4 * C;
  for (UnitKind kind : {UnitKind::AttentionSublayer, UnitKind::GdnSublayer, UnitKind::MlpSublayer}) {
    const UnitCost u = unitCost(kind, d);
    EXPECT_EQ(u.replicatedSavedBytesPerToken, residual + 2 * 2 * C) << unitKindName(kind);
    EXPECT_LT(u.replicatedSavedBytesPerToken, u.savedBytesPerToken) << unitKindName(kind);
  }
  EXPECT_EQ(unitCost(UnitKind::LmHead, d).replicatedSavedBytesPerToken, 2 * C);
  EXPECT_EQ(unitCost(UnitKind::Loss, d).replicatedSavedBytesPerToken, 0); // vocabulary-parallel logits
  const UnitCost mtp = unitCost(UnitKind::Mtp, d);
  EXPECT_EQ(mtp.replicatedSavedBytesPerToken, 2 * (residual + 2 * 2 * C) + 2 * 6 * C);
}

// An MTP module's pieces, as recomputation cuts it: they sum to the
// module, only the two sublayers end in a residual update, and the tail
// keeps what the main model's final norm, head and loss keep.
TEST(CostModel, MtpPiecesSumToTheModule) {
  const ModelInfo d = smallDims(4);
  const UnitCost mtp = unitCost(UnitKind::Mtp, d);
  const std::vector<UnitCost> pieces = mtpPieces(d);
  ASSERT_EQ(pieces.size(), 4u);
  int64_t params = 0, saved = 0;
  double flops = 0;
  for (const UnitCost &piece : pieces) {
    params += piece.params;
    saved += piece.savedBytesPerToken;
    flops += piece.forwardFlopsPerToken;
  }
  EXPECT_EQ(params, mtp.params);
  EXPECT_EQ(saved, mtp.savedBytesPerToken);
  EXPECT_DOUBLE_EQ(flops, mtp.forwardFlopsPerToken);
  EXPECT_EQ(pieces[0].checkpointBytesPerToken, 0);
  EXPECT_GT(pieces[1].checkpointBytesPerToken, 0);
  EXPECT_GT(pieces[2].checkpointBytesPerToken, 0);
  EXPECT_EQ(pieces[3].checkpointBytesPerToken, 0);
  EXPECT_EQ(pieces[3].savedBytesPerToken, unitCost(UnitKind::FinalNorm, d).savedBytesPerToken +
                                              unitCost(UnitKind::LmHead, d).savedBytesPerToken +
                                              unitCost(UnitKind::Loss, d).savedBytesPerToken);
  EXPECT_EQ(mtp.checkpointBytesPerToken, 0);
}

TEST(CostModel, PlainModelHasNoMapping) {
  ModelInfo d = smallDims(1);
  EXPECT_EQ(mhcMappingParams(d), 0);
  EXPECT_EQ(unitCost(UnitKind::AttentionSublayer, d).outputWidth, 512);
  EXPECT_EQ(unitCost(UnitKind::AttentionSublayer, smallDims(4)).outputWidth, 2048);
}

TEST(CostModel, FlopsAreDominatedByMatmuls) {
  ModelInfo d = smallDims(4);
  double mlp = unitCost(UnitKind::MlpSublayer, d).forwardFlopsPerToken;
  double matmul = 2.0 * 3 * 512 * 1408;
  EXPECT_GT(mlp, matmul);
  EXPECT_LT(mlp, matmul * 1.1);
  // The head: one [C, V] matmul per token.
  EXPECT_DOUBLE_EQ(unitCost(UnitKind::LmHead, d).forwardFlopsPerToken, 2.0 * 512 * 256);
}

TEST(CostModel, CausalAttentionCountsHalfTheKeys) {
  ModelInfo shortSeq = smallDims(1), longSeq = smallDims(1);
  shortSeq.seqLen = 1024;
  longSeq.seqLen = 2048;
  double delta = unitCost(UnitKind::AttentionSublayer, longSeq).forwardFlopsPerToken -
                 unitCost(UnitKind::AttentionSublayer, shortSeq).forwardFlopsPerToken;
  // 1024 more positions, half of them seen on average, QK^T and PV: 2*2*C*512
  // plus softmax work per head.
  EXPECT_NEAR(delta, 2.0 * 2 * 512 * 512 + 5.0 * 8 * 512, 1e-6);
}

TEST(CostModel, TotalsCountLayers) {
  ModelInfo d = smallDims(4);
  std::vector<UnitCost> units = {unitCost(UnitKind::Embedding, d)};
  for (int i = 0; i < 3; ++i) {
    units.push_back(unitCost(UnitKind::AttentionSublayer, d));
    units.push_back(unitCost(UnitKind::MlpSublayer, d));
  }
  ModelTotals totals = totalCost(units, d);
  EXPECT_EQ(totals.layers, 3);
  EXPECT_EQ(totals.mhcParams, 6 * mhcMappingParams(d));
  EXPECT_DOUBLE_EQ(totals.trainingFlopsPerToken(), 3 * totals.forwardFlopsPerToken);
}

} // namespace
} // namespace mhcc
