// Unit tests of the model-graph reader (no MLIR): ordering, defaults, layer
// numbering and the error pointer of each class of bad input.
#include "compiler/ModelGraph.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace mhcc {
namespace {

using json = nlohmann::json;

json validModel(int layers = 2) {
  json nodes = json::array();
  nodes.push_back({{"name", "embed"}, {"op", "embedding"}});
  nodes.push_back({{"name", "expand"}, {"op", "mhc_expand"}, {"inputs", {"embed"}}});
  std::string prev = "expand";
  for (int l = 0; l < layers; ++l)
    for (const char *kind : {"attention", "mlp"}) {
      std::string name = "l" + std::to_string(l) + "." + kind;
      nodes.push_back({{"name", name}, {"op", "mhc_sublayer"}, {"inputs", {prev}},
                       {"attrs", {{"sublayer", kind}}}});
      prev = name;
    }
  nodes.push_back({{"name", "contract"}, {"op", "mhc_contract"}, {"inputs", {prev}}});
  nodes.push_back({{"name", "norm"}, {"op", "rmsnorm"}, {"inputs", {"contract"}}});
  nodes.push_back({{"name", "head"}, {"op", "lm_head"}, {"inputs", {"norm"}}});
  nodes.push_back({{"name", "loss"}, {"op", "cross_entropy"}, {"inputs", {"head"}}});
  return {{"format", kModelFormatTag},
          {"name", "test"},
          {"config", {{"vocab", 32}, {"hidden", 16}, {"heads", 2}, {"ffn_hidden", 40}, {"seq_len", 8}}},
          {"nodes", nodes}};
}

ModelError expectError(const json &model) {
  ModelError error;
  EXPECT_FALSE(parseModelGraph(model.dump(), error).has_value());
  return error;
}

TEST(ModelGraph, ParsesAndAppliesDefaults) {
  ModelError error;
  auto graph = parseModelGraph(validModel().dump(), error);
  ASSERT_TRUE(graph) << error.pointer << ": " << error.message;
  EXPECT_EQ(graph->config.streams, 4);
  EXPECT_EQ(graph->config.sinkhornIterations, 20);
  EXPECT_DOUBLE_EQ(graph->config.gatingFactor, 0.01);
  EXPECT_EQ(graph->config.residualWidth(), 64);
  EXPECT_EQ(graph->numLayers(), 2);
  EXPECT_EQ(graph->nodes.back().lossName, "lm loss");
  // rmsnorm without eps takes the config's.
  for (const ModelNode &node : graph->nodes) {
    if (node.op == NodeOp::RmsNorm) {
      EXPECT_DOUBLE_EQ(node.eps, 1e-6);
    }
  }
}

TEST(ModelGraph, NumbersLayersInPairs) {
  ModelError error;
  auto graph = parseModelGraph(validModel(3).dump(), error);
  ASSERT_TRUE(graph);
  std::vector<int64_t> layers;
  for (const ModelNode &node : graph->nodes)
    if (node.op == NodeOp::MhcSublayer)
      layers.push_back(node.layer);
  EXPECT_EQ(layers, (std::vector<int64_t>{0, 0, 1, 1, 2, 2}));
}

TEST(ModelGraph, OrdersNodesWrittenOutOfOrder) {
  json model = validModel();
  json reversed = json::array();
  for (auto it = model["nodes"].rbegin(); it != model["nodes"].rend(); ++it)
    reversed.push_back(*it);
  model["nodes"] = reversed;
  ModelError error;
  auto graph = parseModelGraph(model.dump(), error);
  ASSERT_TRUE(graph) << error.message;
  for (size_t i = 0; i < graph->nodes.size(); ++i)
    for (int input : graph->nodes[i].inputs)
      EXPECT_LT(input, static_cast<int>(i)) << graph->nodes[i].name;
  EXPECT_EQ(graph->nodes.front().name, "embed");
  EXPECT_EQ(graph->nodes.back().name, "loss");
  // Pointers keep naming the node's place in the file, not the sorted order.
  EXPECT_EQ(graph->nodes.front().pointer, "/nodes/" + std::to_string(reversed.size() - 1));
}

TEST(ModelGraph, MtpMayReadTheFinalResidual) {
  json model = validModel();
  model["nodes"].push_back({{"name", "mtp1"}, {"op", "mtp"}, {"inputs", {"l1.mlp"}},
                            {"attrs", {{"depth", 1}, {"loss_weight", 0.3}}}});
  ModelError error;
  auto graph = parseModelGraph(model.dump(), error);
  ASSERT_TRUE(graph) << error.message;
  EXPECT_DOUBLE_EQ(graph->nodes.back().lossWeight, 0.3);
}

TEST(ModelGraph, ErrorsNameThePlace) {
  json model = validModel();
  model["config"]["streams"] = 0;
  EXPECT_EQ(expectError(model).pointer, "/config/streams");

  model = validModel();
  model["nodes"][3]["inputs"] = {"nowhere"};
  EXPECT_EQ(expectError(model).pointer, "/nodes/3/inputs/0");

  model = validModel();
  model["nodes"][2]["attrs"]["extra"] = 1;
  EXPECT_EQ(expectError(model).pointer, "/nodes/2/attrs/extra");

  model = validModel();
  model["config"]["gating_factor"] = -1.0;
  EXPECT_EQ(expectError(model).pointer, "/config/gating_factor");

  // Keys with '/' or '~' are escaped per RFC 6901.
  model = validModel();
  model["config"]["a/b~c"] = 1;
  EXPECT_EQ(expectError(model).pointer, "/config/a~1b~0c");
}

TEST(ModelGraph, SyntaxErrorsGiveLineAndColumn) {
  ModelError error;
  EXPECT_FALSE(parseModelGraph("{\n  \"format\": ,\n}", error));
  EXPECT_EQ(error.pointer, "line 2, column 13");
  EXPECT_NE(error.message.find("invalid JSON"), std::string::npos);
}

// nlohmann throws out_of_range, not parse_error, for such a literal; it
// used to escape parseModelGraph and abort mhcc (found by libFuzzer).
TEST(ModelGraph, NumberOutOfRangeIsOneError) {
  ModelError error;
  EXPECT_FALSE(parseModelGraph("{\"format\": \"mhcc-model-v1\",\n \"config\": {\"hidden\": -7e777}}", error));
  EXPECT_EQ(error.pointer, "line 2, column 23");
  EXPECT_NE(error.message.find("-7e777 is out of range"), std::string::npos) << error.message;
}

TEST(ModelGraph, CycleOfThreeIsNamedInDataFlowOrder) {
  json model = validModel(2);
  // l0.attention <- l1.mlp closes a loop through four sublayers.
  model["nodes"][2]["inputs"] = {"l1.mlp"};
  ModelError error = expectError(model);
  EXPECT_EQ(error.message,
            "cycle: 'l0.attention' -> 'l0.mlp' -> 'l1.attention' -> 'l1.mlp' -> 'l0.attention'");
}

TEST(ModelGraph, FormatsOneLine) {
  EXPECT_EQ(formatModelError("m.json", {"/nodes/1", "bad"}), "m.json: /nodes/1: bad");
}

TEST(ModelGraph, MissingFileIsAnError) {
  ModelError error;
  EXPECT_FALSE(loadModelGraph("/nonexistent/model.json", error));
  EXPECT_NE(error.message.find("cannot open"), std::string::npos);
}

} // namespace
} // namespace mhcc
