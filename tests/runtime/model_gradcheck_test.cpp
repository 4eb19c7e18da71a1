// End-to-end check of compile-time autodiff: the compiled program of a whole
// model (embedding, mHC sublayers with Sinkhorn, attention, Gated DeltaNet, SwiGLU, contract,
// final norm, LM head, cross-entropy and an MTP module sharing the embedding
// and head) runs in float64, and the gradient of its total loss with respect
// to every parameter is compared with central finite differences.
//
// usage: model_gradcheck_test ARTIFACT (compiled at PP1, one microbatch)
#include "runtime/cpu/StageExecutor.h"
#include "runtime/train/Trainer.h"

#include <gtest/gtest.h>

#include <random>

namespace mhcc::runtime {
namespace {

std::string gArtifact;

TEST(ModelGradCheck, EveryParameterOfTheCompiledModel) {
  std::string error;
  std::optional<Artifact> artifact = readArtifact(gArtifact, error);
  ASSERT_TRUE(artifact) << error;
  ASSERT_EQ(artifact->stages.size(), 1u) << "compile the gradcheck model at PP1";
  const StageProgram &program = artifact->stages[0];
  const ModelInfo &model = artifact->model;

  std::vector<std::vector<double>> weights;
  for (const ParamInfo &info : artifact->params) {
    std::vector<float> init = initialParameter(info, model.seed);
    weights.emplace_back(init.begin(), init.end());
  }
  // Perturb the constant initializations (ones, zeros, gates) so every
  // parameter's gradient is generic.
  std::mt19937_64 rng(11);
  std::normal_distribution<double> noise(0.0, 0.1);
  for (auto &w : weights)
    for (double &v : w)
      v += noise(rng);
  std::vector<int32_t> tokens(model.tokens()), labels(model.tokens());
  for (int64_t t = 0; t < model.tokens(); ++t) {
    tokens[t] = static_cast<int32_t>(rng() % model.vocab);
    labels[t] = static_cast<int32_t>(rng() % model.vocab);
  }

  std::vector<std::vector<double>> slotGrads;
  for (const ParamSlot &slot : program.params)
    slotGrads.emplace_back(artifact->params[slot.param].count(), 0.0);
  StageContext<double> context{program, model};
  context.microbatches = 1;
  context.tokens = tokens.data();
  context.labels = labels.data();
  context.param = [&](int slot) { return weights[program.params[slot].param].data(); };
  context.paramGrad = [&](int slot) { return slotGrads[slot].data(); };

  auto objective = [&] {
    StageBuffers<double> buffers;
    std::vector<double> losses;
    runForward(context, buffers, losses);
    double total = 0;
    for (size_t l = 0; l < losses.size(); ++l)
      total += program.losses[l].weight * losses[l];
    return total;
  };
  StageBuffers<double> buffers;
  std::vector<double> losses;
  runForward(context, buffers, losses);
  ASSERT_EQ(losses.size(), 2u) << "lm loss and mtp loss";
  runBackward(context, buffers);

  // Reduce each parameter's gradient over its uses (embedding and head are
  // used twice: by the main model and by MTP).
  std::vector<std::vector<double>> grads(weights.size());
  for (size_t p = 0; p < weights.size(); ++p)
    grads[p].assign(weights[p].size(), 0.0);
  for (size_t k = 0; k < program.params.size(); ++k)
    for (size_t e = 0; e < slotGrads[k].size(); ++e)
      grads[program.params[k].param][e] += slotGrads[k][e];

  int checked = 0;
  for (size_t p = 0; p < weights.size(); ++p) {
    const std::string &name = artifact->params[p].name;
    size_t count = weights[p].size();
    size_t samples = std::min<size_t>(count, 12);
    double worst = 0;
    for (size_t c = 0; c < samples; ++c) {
      size_t e = count <= 12 ? c : rng() % count;
      double saved = weights[p][e];
      const double h = 1e-6;
      weights[p][e] = saved + h;
      double up = objective();
      weights[p][e] = saved - h;
      double down = objective();
      weights[p][e] = saved;
      double numeric = (up - down) / (2 * h);
      double error = std::abs(numeric - grads[p][e]) / std::max(1e-3, std::abs(numeric));
      worst = std::max(worst, error);
      ++checked;
      EXPECT_LT(error, 1e-5) << name << "[" << e << "]: numeric " << numeric << ", analytic "
                             << grads[p][e];
    }
  }
  EXPECT_GT(checked, 200);
}

} // namespace
} // namespace mhcc::runtime

int main(int argc, char **argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s ARTIFACT\n", argv[0]);
    return 2;
  }
  mhcc::runtime::gArtifact = argv[1];
  return RUN_ALL_TESTS();
}
