// Every CPU kernel's backward against central finite differences, in
// float64: the objective is <w, forward(inputs)> for a random w, whose exact
// gradient is backward(dOut = w).
#include "runtime/cpu/Bf16.h"
#include "runtime/cpu/Kernels.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>

namespace mhcc::runtime::kernels {
namespace {

using Vec = std::vector<double>;

template <typename T = double>
std::vector<T> randomVec(std::mt19937_64 &rng, size_t size, T scale = 1) {
  std::normal_distribution<T> normal(0, scale);
  std::vector<T> v(size);
  for (T &x : v)
    x = normal(rng);
  return v;
}

double dot(const Vec &a, const Vec &b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i)
    s += a[i] * b[i];
  return s;
}

/// Checks d objective / d input[k] for every element of `input` (or a
/// sample of 40 for large inputs) against the analytic gradient.
void checkGradient(const std::string &what, Vec &input, const Vec &analytic,
                   const std::function<double()> &objective, double tolerance = 1e-6) {
  ASSERT_EQ(input.size(), analytic.size()) << what;
  std::mt19937_64 rng(7);
  size_t checks = std::min<size_t>(input.size(), 40);
  double worst = 0;
  for (size_t c = 0; c < checks; ++c) {
    size_t k = input.size() <= 40 ? c : rng() % input.size();
    double saved = input[k], h = 1e-6 * std::max(1.0, std::abs(saved));
    input[k] = saved + h;
    double up = objective();
    input[k] = saved - h;
    double down = objective();
    input[k] = saved;
    double numeric = (up - down) / (2 * h);
    double error = std::abs(numeric - analytic[k]) / std::max(1.0, std::abs(numeric));
    worst = std::max(worst, error);
    EXPECT_LT(error, tolerance) << what << "[" << k << "]: numeric " << numeric << ", analytic "
                                << analytic[k];
  }
  EXPECT_LT(worst, tolerance) << what;
}

constexpr int64_t kRows = 6, kSeq = 3, kC = 8, kN = 3, kHeads = 2, kF = 5, kV = 7;
constexpr int64_t kK = kN * kN + 2 * kN;

TEST(GradCheck, Embedding) {
  std::mt19937_64 rng(1);
  std::vector<int32_t> tokens = {1, 4, 4, 0, 6, 2};
  for (int64_t shift : {0, 1}) {
    Vec table = randomVec(rng, kV * kC), w = randomVec(rng, kRows * kC), out(kRows * kC);
    auto objective = [&] {
      embedForward(tokens.data(), table.data(), out.data(), kRows, kC, shift, kSeq);
      return dot(w, out);
    };
    Vec dTable(table.size(), 0.0);
    embedBackward(tokens.data(), w.data(), dTable.data(), kRows, kC, shift, kSeq);
    checkGradient("embedding table", table, dTable, objective);
  }
}

TEST(GradCheck, ExpandAndContract) {
  std::mt19937_64 rng(2);
  Vec h = randomVec(rng, kRows * kC), x = randomVec(rng, kRows * kN * kC);
  Vec wx = randomVec(rng, kRows * kN * kC), wh = randomVec(rng, kRows * kC);
  Vec outX(x.size()), outH(h.size());
  Vec dh(h.size(), 0.0), dx(x.size(), 0.0);
  expandBackward(wx.data(), dh.data(), kRows, kC, kN);
  checkGradient("expand", h, dh, [&] {
    expandForward(h.data(), outX.data(), kRows, kC, kN);
    return dot(wx, outX);
  });
  contractBackward(wh.data(), dx.data(), kRows, kC, kN);
  checkGradient("contract", x, dx, [&] {
    contractForward(x.data(), outH.data(), kRows, kC, kN);
    return dot(wh, outH);
  });
}

TEST(GradCheck, SinkhornIsDoublyStochasticAndDifferentiable) {
  std::mt19937_64 rng(3);
  for (int64_t iters : {1, 3, 20}) {
    Vec logits = randomVec(rng, kN * kN, 2.0), w = randomVec(rng, kN * kN), out(kN * kN);
    sinkhorn(logits.data(), out.data(), kN, iters);
    for (int64_t j = 0; j < kN; ++j) {
      double col = 0;
      for (int64_t i = 0; i < kN; ++i)
        col += out[i * kN + j];
      EXPECT_NEAR(col, 1.0, 1e-12); // the last step normalizes columns
    }
    if (iters == 20)
      for (int64_t i = 0; i < kN; ++i) {
        double row = 0;
        for (int64_t j = 0; j < kN; ++j)
          row += out[i * kN + j];
        EXPECT_NEAR(row, 1.0, 1e-3);
      }
    Vec dLogits(logits.size(), 0.0);
    sinkhornBackward(logits.data(), w.data(), dLogits.data(), kN, iters);
    checkGradient("sinkhorn K=" + std::to_string(iters), logits, dLogits, [&] {
      sinkhorn(logits.data(), out.data(), kN, iters);
      return dot(w, out);
    });
  }
}

TEST(GradCheck, MhcCoefficients) {
  std::mt19937_64 rng(4);
  const int64_t width = kN * kC;
  Vec x = randomVec(rng, kRows * width), wmap = randomVec(rng, width * kK, 0.3);
  Vec bias = randomVec(rng, kK, 0.5), alpha = {0.7, 1.3, 0.9};
  Vec w = randomVec(rng, kRows * kK), coef(kRows * kK), aux(kRows * (kK + 1));
  const int64_t iters = 4;
  auto objective = [&] {
    mhcCoeffsForward(x.data(), wmap.data(), bias.data(), alpha.data(), coef.data(), aux.data(),
                     kRows, kC, kN, iters);
    return dot(w, coef);
  };
  objective();
  Vec dx(x.size(), 0.0), dW(wmap.size(), 0.0), dB(kK, 0.0), dA(3, 0.0);
  mhcCoeffsBackward(x.data(), wmap.data(), alpha.data(), aux.data(), w.data(), dx.data(), dW.data(),
                    dB.data(), dA.data(), kRows, kC, kN, iters);
  checkGradient("mhc coeffs x", x, dx, objective);
  checkGradient("mhc coeffs W_map", wmap, dW, objective);
  checkGradient("mhc coeffs b", bias, dB, objective);
  checkGradient("mhc coeffs alpha", alpha, dA, objective);
}

TEST(GradCheck, MhcPreAndPostRes) {
  std::mt19937_64 rng(5);
  Vec x = randomVec(rng, kRows * kN * kC), coef = randomVec(rng, kRows * kK);
  Vec y = randomVec(rng, kRows * kC);
  Vec wu = randomVec(rng, kRows * kC), wo = randomVec(rng, kRows * kN * kC);
  Vec u(kRows * kC), out(kRows * kN * kC);
  auto pre = [&] {
    mhcPreForward(x.data(), coef.data(), u.data(), kRows, kC, kN);
    return dot(wu, u);
  };
  Vec dx(x.size(), 0.0), dCoef(coef.size(), 0.0);
  mhcPreBackward(x.data(), coef.data(), wu.data(), dx.data(), dCoef.data(), kRows, kC, kN);
  checkGradient("mhc pre x", x, dx, pre);
  checkGradient("mhc pre coef", coef, dCoef, pre);

  auto post = [&] {
    mhcPostResForward(x.data(), coef.data(), y.data(), out.data(), kRows, kC, kN);
    return dot(wo, out);
  };
  Vec dx2(x.size(), 0.0), dCoef2(coef.size(), 0.0), dy(y.size(), 0.0);
  mhcPostResBackward(x.data(), coef.data(), y.data(), wo.data(), dx2.data(), dCoef2.data(),
                     dy.data(), kRows, kC, kN);
  checkGradient("mhc post/res x", x, dx2, post);
  checkGradient("mhc post/res coef", coef, dCoef2, post);
  checkGradient("mhc post/res y", y, dy, post);
}

TEST(GradCheck, Residual) {
  std::mt19937_64 rng(6);
  Vec x = randomVec(rng, 12), y = randomVec(rng, 12), w = randomVec(rng, 12), out(12);
  Vec dx(12, 0.0), dy(12, 0.0);
  residualBackward(w.data(), dx.data(), dy.data(), 12);
  auto objective = [&] {
    residualForward(x.data(), y.data(), out.data(), 12);
    return dot(w, out);
  };
  checkGradient("residual x", x, dx, objective);
  checkGradient("residual y", y, dy, objective);
}

TEST(GradCheck, RmsNorm) {
  std::mt19937_64 rng(7);
  Vec u = randomVec(rng, kRows * kC), gain = randomVec(rng, kC), w = randomVec(rng, kRows * kC);
  Vec y(u.size()), aux(kRows);
  auto objective = [&] {
    rmsNormForward(u.data(), gain.data(), y.data(), aux.data(), kRows, kC, 1e-6);
    return dot(w, y);
  };
  objective();
  Vec du(u.size(), 0.0), dg(kC, 0.0);
  rmsNormBackward(u.data(), gain.data(), aux.data(), w.data(), du.data(), dg.data(), kRows, kC);
  checkGradient("rmsnorm u", u, du, objective);
  checkGradient("rmsnorm gain", gain, dg, objective);
}

TEST(GradCheck, CausalAttentionWithRope) {
  std::mt19937_64 rng(8);
  Vec x = randomVec(rng, kRows * kC), wqkv = randomVec(rng, kC * 3 * kC, 0.4);
  Vec wo = randomVec(rng, kC * kC, 0.4), w = randomVec(rng, kRows * kC);
  Vec y(kRows * kC), aux(kRows * 3 * kC + kRows * kC + kRows * kHeads);
  auto objective = [&] {
    attentionForward(x.data(), wqkv.data(), wo.data(), y.data(), aux.data(), kRows, kC, kHeads, kSeq);
    return dot(w, y);
  };
  objective();
  Vec dx(x.size(), 0.0), dWqkv(wqkv.size(), 0.0), dWo(wo.size(), 0.0);
  attentionBackward(x.data(), wqkv.data(), wo.data(), aux.data(), w.data(), dx.data(), dWqkv.data(),
                    dWo.data(), kRows, kC, kHeads, kSeq);
  checkGradient("attention x", x, dx, objective);
  checkGradient("attention W_qkv", wqkv, dWqkv, objective);
  checkGradient("attention W_o", wo, dWo, objective);
}

TEST(GradCheck, AttentionIsCausal) {
  // Changing the last token of a sequence must not change earlier outputs.
  std::mt19937_64 rng(9);
  Vec x = randomVec(rng, kRows * kC), wqkv = randomVec(rng, kC * 3 * kC, 0.4);
  Vec wo = randomVec(rng, kC * kC, 0.4);
  Vec y1(kRows * kC), y2(kRows * kC), aux(kRows * 3 * kC + kRows * kC + kRows * kHeads);
  attentionForward(x.data(), wqkv.data(), wo.data(), y1.data(), aux.data(), kRows, kC, kHeads, kSeq);
  for (int64_t c = 0; c < kC; ++c)
    x[(kSeq - 1) * kC + c] += 1.0;
  attentionForward(x.data(), wqkv.data(), wo.data(), y2.data(), aux.data(), kRows, kC, kHeads, kSeq);
  for (int64_t k = 0; k < (kSeq - 1) * kC; ++k)
    EXPECT_EQ(y1[k], y2[k]);
  // Rows of the second sequence are untouched too.
  for (int64_t k = kSeq * kC; k < kRows * kC; ++k)
    EXPECT_EQ(y1[k], y2[k]);
}

// Two sequences of 6 with packed documents: [0, 2) [2, 6) and [0, 3) [3, 4) [4, 6).
constexpr int64_t kDocRows = 12, kDocSeq = 6;
const std::vector<int64_t> kDocStarts = {0, 2, 6, 9, 10}; // in the microbatch's rows; ends at kDocRows

/// positions and firstKeys of kDocStarts (Documents' arrays).
void packedDocuments(std::vector<int32_t> &positions, std::vector<int32_t> &firstKeys) {
  positions.assign(kDocRows, 0);
  firstKeys.assign(kDocRows, 0);
  for (size_t d = 0; d < kDocStarts.size(); ++d) {
    const int64_t begin = kDocStarts[d], end = d + 1 < kDocStarts.size() ? kDocStarts[d + 1] : kDocRows;
    for (int64_t t = begin; t < end; ++t) {
      positions[t] = int32_t(t - begin);
      firstKeys[t] = int32_t(begin % kDocSeq);
    }
  }
}

TEST(GradCheck, AttentionWithPackedDocuments) {
  std::vector<int32_t> positions, firstKeys;
  packedDocuments(positions, firstKeys);
  const Documents docs{positions.data(), firstKeys.data()};
  std::mt19937_64 rng(18);
  Vec x = randomVec(rng, kDocRows * kC), wqkv = randomVec(rng, kC * 3 * kC, 0.4);
  Vec wo = randomVec(rng, kC * kC, 0.4), w = randomVec(rng, kDocRows * kC);
  Vec y(kDocRows * kC), aux(kDocRows * 3 * kC + kDocRows * kC + kDocRows * kHeads);
  auto objective = [&] {
    attentionForward<double>(x.data(), wqkv.data(), wo.data(), y.data(), aux.data(), kDocRows, kC, kHeads,
                             kDocSeq, nullptr, docs);
    return dot(w, y);
  };
  objective();
  Vec dx(x.size(), 0.0), dWqkv(wqkv.size(), 0.0), dWo(wo.size(), 0.0);
  attentionBackward<double>(x.data(), wqkv.data(), wo.data(), aux.data(), w.data(), dx.data(), dWqkv.data(),
                            dWo.data(), kDocRows, kC, kHeads, kDocSeq, nullptr, docs);
  checkGradient("packed attention x", x, dx, objective);
  checkGradient("packed attention W_qkv", wqkv, dWqkv, objective);
  checkGradient("packed attention W_o", wo, dWo, objective);
  // No gradient crosses a document boundary: the first document's inputs
  // get none from the second's outputs.
  Vec seed(y.size(), 0.0), dxLater(x.size(), 0.0);
  for (int64_t k = 2 * kC; k < kDocSeq * kC; ++k)
    seed[k] = w[k];
  attentionBackward<double>(x.data(), wqkv.data(), wo.data(), aux.data(), seed.data(), dxLater.data(), nullptr,
                            nullptr, kDocRows, kC, kHeads, kDocSeq, nullptr, docs);
  for (int64_t k = 0; k < 2 * kC; ++k)
    EXPECT_EQ(dxLater[k], 0.0) << "x[" << k << "] of document 0 got a gradient from document 1";
}

/// Each packed document's outputs and input gradients carry the bits the
/// document gets as a sequence of its own (rotary positions from 0, score
/// rows summed from its start): in float, and with bf16 storage.
template <typename T> void expectDocumentsAlone(Store<T> store) {
  std::vector<int32_t> positions, firstKeys;
  packedDocuments(positions, firstKeys);
  std::mt19937_64 rng(19);
  std::vector<T> x = randomVec<T>(rng, kDocRows * kC), wqkv = randomVec<T>(rng, kC * 3 * kC, T(0.4));
  std::vector<T> wo = randomVec<T>(rng, kC * kC, T(0.4)), dy = randomVec<T>(rng, kDocRows * kC);
  const int64_t auxPerRow = 3 * kC + kC + kHeads;
  std::vector<T> y(kDocRows * kC), aux(kDocRows * auxPerRow), dx(kDocRows * kC, T(0));
  attentionForward<T>(x.data(), wqkv.data(), wo.data(), y.data(), aux.data(), kDocRows, kC, kHeads, kDocSeq, store,
                      Documents{positions.data(), firstKeys.data()});
  attentionBackward<T>(x.data(), wqkv.data(), wo.data(), aux.data(), dy.data(), dx.data(), nullptr, nullptr,
                       kDocRows, kC, kHeads, kDocSeq, store, Documents{positions.data(), firstKeys.data()});
  for (size_t d = 0; d < kDocStarts.size(); ++d) {
    const int64_t begin = kDocStarts[d], end = d + 1 < kDocStarts.size() ? kDocStarts[d + 1] : kDocRows;
    const int64_t len = end - begin;
    std::vector<T> yAlone(len * kC), auxAlone(len * auxPerRow), dxAlone(len * kC, T(0));
    attentionForward<T>(x.data() + begin * kC, wqkv.data(), wo.data(), yAlone.data(), auxAlone.data(), len, kC,
                        kHeads, len, store);
    attentionBackward<T>(x.data() + begin * kC, wqkv.data(), wo.data(), auxAlone.data(), dy.data() + begin * kC,
                         dxAlone.data(), nullptr, nullptr, len, kC, kHeads, len, store);
    for (int64_t k = 0; k < len * kC; ++k) {
      ASSERT_EQ(y[begin * kC + k], yAlone[k]) << "document " << d << " output " << k;
      ASSERT_EQ(dx[begin * kC + k], dxAlone[k]) << "document " << d << " input gradient " << k;
    }
  }
}

TEST(PackedDocuments, EachDocumentGetsTheBitsItGetsAlone) {
  expectDocumentsAlone<float>(nullptr);
  expectDocumentsAlone<float>(&roundBf16);
}

/// Gated DeltaNet's parameters and a random input: C = 8, 2 heads of 4.
struct GdnCase {
  static constexpr int64_t kH = 2;
  Vec x, wqkv, conv, wab, aLog, dtBias, outNorm, wgate, wo;
  explicit GdnCase(int64_t rows, uint64_t seed) {
    std::mt19937_64 rng(seed);
    x = randomVec(rng, rows * kC);
    wqkv = randomVec(rng, kC * 3 * kC, 0.5);
    conv = randomVec(rng, kGdnConvWidth * 3 * kC, 0.5);
    wab = randomVec(rng, kC * 2 * kH, 0.5);
    aLog = randomVec(rng, kH, 0.5);
    dtBias = randomVec(rng, kH, 0.5);
    outNorm = randomVec(rng, kC / kH, 0.5);
    for (double &w : outNorm)
      w += 1;
    wgate = randomVec(rng, kC * kC, 0.5);
    wo = randomVec(rng, kC * kC, 0.5);
  }
  void forward(Vec &y, Vec &aux, int64_t rows, int64_t seq, Documents docs = {}) {
    gdnForward<double>(x.data(), wqkv.data(), conv.data(), wab.data(), aLog.data(), dtBias.data(), outNorm.data(),
                       wgate.data(), wo.data(), y.data(), aux.data(), rows, kC, kH, seq, 1e-6, nullptr, docs);
  }
  GdnGrads<double> grads(std::vector<Vec> &g, double *dx) {
    Vec *all[] = {&wqkv, &conv, &wab, &aLog, &dtBias, &outNorm, &wgate, &wo};
    g.clear();
    for (Vec *v : all)
      g.emplace_back(v->size(), 0.0);
    return {dx, g[0].data(), g[1].data(), g[2].data(), g[3].data(), g[4].data(), g[5].data(), g[6].data(), g[7].data()};
  }
};

TEST(GradCheck, GatedDeltaNet) {
  // With packed documents (kDocStarts) and without: the conv taps and the
  // state restart at a document's start.
  std::vector<int32_t> positions, firstKeys;
  packedDocuments(positions, firstKeys);
  for (bool packed : {false, true}) {
    GdnCase g(kDocRows, 21);
    const Documents docs = packed ? Documents{nullptr, firstKeys.data()} : Documents{};
    std::mt19937_64 rng(22);
    const Vec w = randomVec(rng, kDocRows * kC);
    Vec y(kDocRows * kC), aux(kDocRows * gdnAuxPerRow(kC, GdnCase::kH));
    auto objective = [&] {
      g.forward(y, aux, kDocRows, kDocSeq, docs);
      return dot(w, y);
    };
    objective();
    std::vector<Vec> grads;
    Vec dx(g.x.size(), 0.0);
    gdnBackward<double>(g.x.data(), g.wqkv.data(), g.conv.data(), g.wab.data(), g.aLog.data(), g.dtBias.data(),
                        g.outNorm.data(), g.wgate.data(), g.wo.data(), aux.data(), w.data(), g.grads(grads, dx.data()),
                        kDocRows, kC, GdnCase::kH, kDocSeq, nullptr, docs);
    const std::string what = packed ? "packed gdn " : "gdn ";
    checkGradient(what + "x", g.x, dx, objective);
    const char *names[] = {"W_qkv", "conv", "W_ab", "a_log", "dt_bias", "out_norm", "W_gate", "W_o"};
    Vec *params[] = {&g.wqkv, &g.conv, &g.wab, &g.aLog, &g.dtBias, &g.outNorm, &g.wgate, &g.wo};
    for (size_t p = 0; p < 8; ++p)
      checkGradient(what + names[p], *params[p], grads[p], objective);
  }
}

TEST(PackedDocuments, GatedDeltaNetDocumentsGetTheBitsTheyGetAlone) {
  std::vector<int32_t> positions, firstKeys;
  packedDocuments(positions, firstKeys);
  GdnCase g(kDocRows, 23);
  const int64_t per = gdnAuxPerRow(kC, GdnCase::kH);
  Vec y(kDocRows * kC), aux(kDocRows * per);
  g.forward(y, aux, kDocRows, kDocSeq, Documents{nullptr, firstKeys.data()});
  for (size_t d = 0; d < kDocStarts.size(); ++d) {
    const int64_t begin = kDocStarts[d], end = d + 1 < kDocStarts.size() ? kDocStarts[d + 1] : kDocRows;
    GdnCase alone = g;
    alone.x.assign(g.x.begin() + begin * kC, g.x.begin() + end * kC);
    Vec yAlone((end - begin) * kC), auxAlone((end - begin) * per);
    alone.forward(yAlone, auxAlone, end - begin, end - begin);
    for (int64_t k = 0; k < (end - begin) * kC; ++k)
      ASSERT_EQ(y[begin * kC + k], yAlone[k]) << "document " << d << " output " << k;
  }
}

TEST(SplitBackward, GatedDeltaNetHalvesEqualTheWhole) {
  GdnCase g(kDocRows, 24);
  Vec y(kDocRows * kC), aux(kDocRows * gdnAuxPerRow(kC, GdnCase::kH));
  g.forward(y, aux, kDocRows, kDocSeq);
  std::vector<Vec> whole, weights, none;
  Vec dxWhole(g.x.size(), 0.0), dxInput(g.x.size(), 0.0);
  auto run = [&](GdnGrads<double> grads) {
    gdnBackward<double>(g.x.data(), g.wqkv.data(), g.conv.data(), g.wab.data(), g.aLog.data(), g.dtBias.data(),
                        g.outNorm.data(), g.wgate.data(), g.wo.data(), aux.data(), y.data(), grads, kDocRows, kC,
                        GdnCase::kH, kDocSeq);
  };
  run(g.grads(whole, dxWhole.data()));
  GdnGrads<double> inputOnly;
  inputOnly.dx = dxInput.data();
  run(inputOnly);
  run(g.grads(weights, nullptr));
  EXPECT_EQ(dxWhole, dxInput);
  for (size_t p = 0; p < whole.size(); ++p)
    EXPECT_EQ(whole[p], weights[p]) << "parameter " << p;
}

TEST(GradCheck, SwiGlu) {
  std::mt19937_64 rng(10);
  Vec x = randomVec(rng, kRows * kC), wg = randomVec(rng, kC * kF, 0.5);
  Vec wu = randomVec(rng, kC * kF, 0.5), wd = randomVec(rng, kF * kC, 0.5);
  Vec w = randomVec(rng, kRows * kC), y(kRows * kC), aux(3 * kRows * kF);
  auto objective = [&] {
    swigluForward(x.data(), wg.data(), wu.data(), wd.data(), y.data(), aux.data(), kRows, kC, kF);
    return dot(w, y);
  };
  objective();
  Vec dx(x.size(), 0.0), dWg(wg.size(), 0.0), dWu(wu.size(), 0.0), dWd(wd.size(), 0.0);
  swigluBackward(x.data(), wg.data(), wu.data(), wd.data(), aux.data(), w.data(), dx.data(),
                 dWg.data(), dWu.data(), dWd.data(), kRows, kC, kF);
  checkGradient("swiglu x", x, dx, objective);
  checkGradient("swiglu W_gate", wg, dWg, objective);
  checkGradient("swiglu W_up", wu, dWu, objective);
  checkGradient("swiglu W_down", wd, dWd, objective);
}

TEST(GradCheck, LmHeadAndConcatProjection) {
  std::mt19937_64 rng(11);
  Vec h = randomVec(rng, kRows * kC), wHead = randomVec(rng, kC * kV), w = randomVec(rng, kRows * kV);
  Vec logits(kRows * kV);
  auto head = [&] {
    matmul(h.data(), wHead.data(), logits.data(), kRows, kC, kV);
    return dot(w, logits);
  };
  Vec dh(h.size(), 0.0), dW(wHead.size(), 0.0);
  matmulTransAAcc(h.data(), w.data(), dW.data(), kRows, kC, kV);
  matmulTransBAcc(w.data(), wHead.data(), dh.data(), kRows, kV, kC);
  checkGradient("lm head h", h, dh, head);
  checkGradient("lm head W", wHead, dW, head);

  Vec a = randomVec(rng, kRows * kC), b = randomVec(rng, kRows * kC);
  Vec wp = randomVec(rng, 2 * kC * kC), wz = randomVec(rng, kRows * kC), z(kRows * kC);
  auto proj = [&] {
    concatProjForward(a.data(), b.data(), wp.data(), z.data(), kRows, kC, kC);
    return dot(wz, z);
  };
  Vec da(a.size(), 0.0), db(b.size(), 0.0), dWp(wp.size(), 0.0);
  concatProjBackward(a.data(), b.data(), wp.data(), wz.data(), da.data(), db.data(), dWp.data(),
                     kRows, kC, kC);
  checkGradient("concat proj a", a, da, proj);
  checkGradient("concat proj b", b, db, proj);
  checkGradient("concat proj W", wp, dWp, proj);
}

TEST(GradCheck, CrossEntropyWithAndWithoutShift) {
  std::mt19937_64 rng(12);
  std::vector<int32_t> labels = {3, 0, 6, 1, 1, 5};
  for (int64_t shift : {0, 1, 2}) {
    Vec logits = randomVec(rng, kRows * kV, 2.0), aux(kRows);
    const double scale = 0.3;
    auto objective = [&] {
      return scale * crossEntropyForward(logits.data(), labels.data(), aux.data(), kRows, kV, shift, kSeq);
    };
    objective();
    Vec dLogits(logits.size(), 0.0);
    crossEntropyBackward(logits.data(), labels.data(), aux.data(), scale, dLogits.data(), kRows, kV,
                         shift, kSeq);
    checkGradient("cross entropy shift " + std::to_string(shift), logits, dLogits, objective);
  }
  // Uniform logits: the loss is log V.
  Vec flat(kRows * kV, 0.0), aux(kRows);
  EXPECT_NEAR(crossEntropyForward(flat.data(), labels.data(), aux.data(), kRows, kV, 0, kSeq),
              std::log(double(kV)), 1e-12);
}

} // namespace
} // namespace mhcc::runtime::kernels

namespace mhcc::runtime::kernels {
namespace {

using FVec = std::vector<float>;

FVec randomFloats(std::mt19937_64 &rng, size_t size, float scale = 1.0f) {
  return randomVec<float>(rng, size, scale);
}

/// The zero-bubble split: B (input gradient only) then W (weight gradients
/// only) must give the same bits as the whole backward.
TEST(SplitBackward, HalvesEqualTheWholeBitForBit) {
  std::mt19937_64 rng(21);
  // Attention.
  FVec x = randomFloats(rng, kRows * kC), wqkv = randomFloats(rng, kC * 3 * kC, 0.4f);
  FVec wo = randomFloats(rng, kC * kC, 0.4f), dy = randomFloats(rng, kRows * kC);
  FVec y(kRows * kC), aux(kRows * 4 * kC + kRows * kHeads);
  attentionForward(x.data(), wqkv.data(), wo.data(), y.data(), aux.data(), kRows, kC, kHeads, kSeq);
  FVec dx1(x.size()), dq1(wqkv.size()), do1(wo.size()), dx2(x.size()), dq2(wqkv.size()), do2(wo.size());
  attentionBackward(x.data(), wqkv.data(), wo.data(), aux.data(), dy.data(), dx1.data(), dq1.data(), do1.data(),
                    kRows, kC, kHeads, kSeq);
  attentionBackward<float>(x.data(), wqkv.data(), wo.data(), aux.data(), dy.data(), dx2.data(), nullptr, nullptr,
                           kRows, kC, kHeads, kSeq);
  attentionBackward<float>(x.data(), wqkv.data(), wo.data(), aux.data(), dy.data(), nullptr, dq2.data(), do2.data(),
                           kRows, kC, kHeads, kSeq);
  EXPECT_EQ(dx1, dx2);
  EXPECT_EQ(dq1, dq2);
  EXPECT_EQ(do1, do2);
  // SwiGLU.
  FVec wg = randomFloats(rng, kC * kF, 0.5f), wu = randomFloats(rng, kC * kF, 0.5f), wd = randomFloats(rng, kF * kC, 0.5f);
  FVec sw(3 * kRows * kF);
  swigluForward(x.data(), wg.data(), wu.data(), wd.data(), y.data(), sw.data(), kRows, kC, kF);
  FVec a1(x.size()), g1(wg.size()), u1(wu.size()), d1(wd.size()), a2(x.size()), g2(wg.size()), u2(wu.size()), d2(wd.size());
  swigluBackward(x.data(), wg.data(), wu.data(), wd.data(), sw.data(), dy.data(), a1.data(), g1.data(), u1.data(),
                 d1.data(), kRows, kC, kF);
  swigluBackward<float>(x.data(), wg.data(), wu.data(), wd.data(), sw.data(), dy.data(), a2.data(), nullptr, nullptr,
                        nullptr, kRows, kC, kF);
  swigluBackward<float>(x.data(), wg.data(), wu.data(), wd.data(), sw.data(), dy.data(), nullptr, g2.data(), u2.data(),
                        d2.data(), kRows, kC, kF);
  EXPECT_EQ(a1, a2);
  EXPECT_EQ(g1, g2);
  EXPECT_EQ(u1, u2);
  EXPECT_EQ(d1, d2);
  // mHC coefficients.
  const int64_t width = kN * kC;
  FVec xr = randomFloats(rng, kRows * width), wmap = randomFloats(rng, width * kK, 0.3f), bias = randomFloats(rng, kK);
  FVec alpha = {0.7f, 1.3f, 0.9f}, coef(kRows * kK), maux(kRows * (kK + 1)), dc = randomFloats(rng, kRows * kK);
  mhcCoeffsForward(xr.data(), wmap.data(), bias.data(), alpha.data(), coef.data(), maux.data(), kRows, kC, kN, 5);
  FVec mx1(xr.size()), mw1(wmap.size()), mb1(kK), ma1(3), mx2(xr.size()), mw2(wmap.size()), mb2(kK), ma2(3);
  mhcCoeffsBackward(xr.data(), wmap.data(), alpha.data(), maux.data(), dc.data(), mx1.data(), mw1.data(), mb1.data(),
                    ma1.data(), kRows, kC, kN, 5);
  mhcCoeffsBackward<float>(xr.data(), wmap.data(), alpha.data(), maux.data(), dc.data(), mx2.data(), nullptr, nullptr,
                           nullptr, kRows, kC, kN, 5);
  mhcCoeffsBackward<float>(xr.data(), wmap.data(), alpha.data(), maux.data(), dc.data(), nullptr, mw2.data(),
                           mb2.data(), ma2.data(), kRows, kC, kN, 5);
  EXPECT_EQ(mx1, mx2);
  EXPECT_EQ(mw1, mw2);
  EXPECT_EQ(mb1, mb2);
  EXPECT_EQ(ma1, ma2);
  // RMSNorm.
  FVec gain = randomFloats(rng, kC), raux(kRows), ry(kRows * kC);
  rmsNormForward(x.data(), gain.data(), ry.data(), raux.data(), kRows, kC, 1e-6);
  FVec ru1(x.size()), rg1(kC), ru2(x.size()), rg2(kC);
  rmsNormBackward(x.data(), gain.data(), raux.data(), dy.data(), ru1.data(), rg1.data(), kRows, kC);
  rmsNormBackward<float>(x.data(), gain.data(), raux.data(), dy.data(), ru2.data(), nullptr, kRows, kC);
  rmsNormBackward<float>(x.data(), gain.data(), raux.data(), dy.data(), nullptr, rg2.data(), kRows, kC);
  EXPECT_EQ(ru1, ru2);
  EXPECT_EQ(rg1, rg2);
}

} // namespace
} // namespace mhcc::runtime::kernels
