//===- ModelGraph.cpp - model graph JSON: parse and validate ----------------===//
#include "compiler/ModelGraph.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

namespace mhcc {
namespace {

using json = nlohmann::json;

/// Thrown inside this file only; parseModelGraph turns it into a ModelError.
struct Failure {
  ModelError error;
};

[[noreturn]] void fail(std::string pointer, std::string message) {
  throw Failure{{std::move(pointer), std::move(message)}};
}

/// Escapes a key for use in a JSON pointer (RFC 6901: ~ -> ~0, / -> ~1).
std::string escapeKey(const std::string &key) {
  std::string out;
  for (char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

std::string join(const std::vector<std::string> &items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i)
    out += (i ? ", " : "") + items[i];
  return out;
}

const char *jsonTypeName(const json &value) {
  if (value.is_number_integer())
    return "an integer";
  if (value.is_number_float())
    return "a number";
  return value.type_name();
}

/// Reads the members of one JSON object, rejecting any key it was not asked
/// about: a misspelt option must not be silently ignored.
class ObjectReader {
public:
  ObjectReader(const json &object, std::string pointer, std::string what)
      : object_(object), pointer_(std::move(pointer)), what_(std::move(what)) {
    if (!object_.is_object())
      fail(pointer_.empty() ? "/" : pointer_,
           what_ + " must be a JSON object, got " + jsonTypeName(object_));
  }

  std::string at(const std::string &key) const {
    return pointer_ + "/" + escapeKey(key);
  }

  const json *find(const std::string &key) {
    known_.push_back(key);
    auto it = object_.find(key);
    return it == object_.end() ? nullptr : &*it;
  }

  const json &require(const std::string &key) {
    const json *value = find(key);
    if (!value)
      fail(pointer_.empty() ? "/" : pointer_,
           what_ + " is missing required member \"" + key + "\"");
    return *value;
  }

  int64_t integer(const std::string &key, std::optional<int64_t> fallback,
                  int64_t min) {
    const json *value = fallback ? find(key) : &require(key);
    if (!value)
      return *fallback;
    if (!value->is_number_integer())
      fail(at(key), "must be an integer, got " + std::string(jsonTypeName(*value)));
    int64_t result = value->get<int64_t>();
    if (result < min)
      fail(at(key), "must be at least " + std::to_string(min) + ", got " +
                        std::to_string(result));
    return result;
  }

  double positiveNumber(const std::string &key, std::optional<double> fallback) {
    const json *value = fallback ? find(key) : &require(key);
    if (!value)
      return *fallback;
    if (!value->is_number())
      fail(at(key), "must be a number, got " + std::string(jsonTypeName(*value)));
    double result = value->get<double>();
    if (!std::isfinite(result) || result <= 0)
      fail(at(key), "must be a positive finite number, got " + value->dump());
    return result;
  }

  std::string string(const std::string &key,
                     std::optional<std::string> fallback) {
    const json *value = fallback ? find(key) : &require(key);
    if (!value)
      return *fallback;
    if (!value->is_string())
      fail(at(key), "must be a string, got " + std::string(jsonTypeName(*value)));
    return value->get<std::string>();
  }

  std::string oneOf(const std::string &key, std::optional<std::string> fallback,
                    const std::vector<std::string> &choices) {
    std::string result = string(key, std::move(fallback));
    if (std::find(choices.begin(), choices.end(), result) == choices.end())
      fail(at(key), "must be one of " + join(choices) + ", got \"" + result + "\"");
    return result;
  }

  /// Call last: any member not asked about is an error.
  void rejectUnknown() const {
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (std::find(known_.begin(), known_.end(), it.key()) == known_.end())
        fail(at(it.key()), "unknown member \"" + it.key() + "\" in " + what_ +
                               "; expected one of: " + join(known_));
    }
  }

private:
  const json &object_;
  std::string pointer_;
  std::string what_;
  std::vector<std::string> known_;
};

struct OpSpec {
  const char *name;
  NodeOp op;
  ValueKind input; // ValueKind::None: takes no input
};

constexpr OpSpec kOps[] = {
    {"embedding", NodeOp::Embedding, ValueKind::None},
    {"mhc_expand", NodeOp::MhcExpand, ValueKind::Hidden},
    {"mhc_sublayer", NodeOp::MhcSublayer, ValueKind::Residual},
    {"mhc_contract", NodeOp::MhcContract, ValueKind::Residual},
    {"rmsnorm", NodeOp::RmsNorm, ValueKind::Hidden},
    {"lm_head", NodeOp::LmHead, ValueKind::Hidden},
    {"cross_entropy", NodeOp::CrossEntropy, ValueKind::Logits},
    {"mtp", NodeOp::Mtp, ValueKind::Residual},
};

const OpSpec &specOf(NodeOp op) {
  for (const OpSpec &spec : kOps)
    if (spec.op == op)
      return spec;
  return kOps[0];
}

ModelConfig parseConfig(const json &root) {
  ObjectReader reader(root, "/config", "\"config\"");
  ModelConfig c;
  c.vocab = reader.integer("vocab", std::nullopt, 2);
  c.hidden = reader.integer("hidden", std::nullopt, 1);
  c.heads = reader.integer("heads", std::nullopt, 1);
  c.ffnHidden = reader.integer("ffn_hidden", std::nullopt, 1);
  c.seqLen = reader.integer("seq_len", std::nullopt, 1);
  c.microBatch = reader.integer("micro_batch", 1, 1);
  c.streams = reader.integer("streams", 4, 1);
  c.sinkhornIterations = reader.integer("sinkhorn_iterations", 20, 1);
  c.gatingFactor = reader.positiveNumber("gating_factor", 0.01);
  c.normEps = reader.positiveNumber("norm_eps", 1e-6);
  c.dtype = reader.oneOf("dtype", std::string("f32"), {"f32", "bf16"});
  c.residualDtype = reader.oneOf("residual_dtype", c.dtype, {"f32", "bf16"});
  c.seed = reader.integer("seed", 1234, 0);
  reader.rejectUnknown();
  if (c.residualStorage() == "bf16" && c.dtype == "f32")
    fail("/config/residual_dtype", "residual_dtype \"bf16\" needs dtype \"bf16\": an f32 model keeps its "
                                   "residual stream in f32");
  if (c.hidden % c.heads != 0)
    fail("/config/heads", "hidden (C = " + std::to_string(c.hidden) +
                              ") must be divisible by heads (" +
                              std::to_string(c.heads) + ")");
  if (c.headDim() % 2 != 0)
    fail("/config/heads", "head dimension hidden/heads = " +
                              std::to_string(c.headDim()) +
                              " must be even (rotary positions rotate pairs)");
  return c;
}

std::string describeKind(ValueKind kind, const ModelConfig &c) {
  switch (kind) {
  case ValueKind::Hidden:
    return "the C-wide hidden state (" + std::to_string(c.hidden) + ")";
  case ValueKind::Residual:
    return "the n*C-wide residual (" + std::to_string(c.residualWidth()) + ")";
  case ValueKind::Logits:
    return "the V-wide logits (" + std::to_string(c.vocab) + ")";
  case ValueKind::Loss:
    return "a scalar loss";
  case ValueKind::None:
    break;
  }
  return "nothing";
}

std::string kindFix(ValueKind have, ValueKind want) {
  if (have == ValueKind::Hidden && want == ValueKind::Residual)
    return "; put an mhc_expand between them";
  if (have == ValueKind::Residual && want == ValueKind::Hidden)
    return "; put an mhc_contract between them";
  return "";
}

ModelNode parseNode(const json &value, const std::string &pointer,
                    std::vector<std::vector<std::string>> &inputNames) {
  ObjectReader reader(value, pointer, "a node");
  ModelNode node;
  node.pointer = pointer;
  node.name = reader.string("name", std::nullopt);
  if (node.name.empty())
    fail(reader.at("name"), "node name must not be empty");
  std::string opName = reader.string("op", std::nullopt);
  const OpSpec *spec = nullptr;
  for (const OpSpec &candidate : kOps)
    if (opName == candidate.name)
      spec = &candidate;
  if (!spec) {
    std::vector<std::string> names;
    for (const OpSpec &candidate : kOps)
      names.push_back(candidate.name);
    fail(reader.at("op"), "unknown op \"" + opName + "\"; known ops: " + join(names));
  }
  node.op = spec->op;

  std::vector<std::string> inputs;
  if (const json *list = reader.find("inputs")) {
    if (!list->is_array())
      fail(reader.at("inputs"), "must be an array of node names, got " +
                                    std::string(jsonTypeName(*list)));
    for (size_t i = 0; i < list->size(); ++i) {
      if (!(*list)[i].is_string())
        fail(reader.at("inputs") + "/" + std::to_string(i),
             "must be a node name (string), got " +
                 std::string(jsonTypeName((*list)[i])));
      inputs.push_back((*list)[i].get<std::string>());
    }
  }
  size_t arity = spec->input == ValueKind::None ? 0 : 1;
  if (inputs.size() != arity)
    fail(reader.at("inputs"), std::string(spec->name) + " takes " +
                                  std::to_string(arity) + " input" +
                                  (arity == 1 ? "" : "s") + ", got " +
                                  std::to_string(inputs.size()));
  inputNames.push_back(inputs);

  static const json kNoAttrs = json::object();
  const json *attrs = reader.find("attrs");
  ObjectReader attrReader(attrs ? *attrs : kNoAttrs, pointer + "/attrs",
                          std::string("the attrs of ") + spec->name);
  switch (node.op) {
  case NodeOp::MhcSublayer: {
    const std::string kind = attrReader.oneOf("sublayer", std::nullopt, {"attention", "gdn", "mlp"});
    node.sublayer = kind == "attention" ? SublayerKind::Attention
                    : kind == "gdn"     ? SublayerKind::Gdn
                                        : SublayerKind::Mlp;
    break;
  }
  case NodeOp::RmsNorm:
    node.eps = attrReader.positiveNumber("eps", 0.0); // 0: config.normEps
    break;
  case NodeOp::CrossEntropy:
    node.lossName = attrReader.string("loss_name", std::string("lm loss"));
    if (node.lossName.empty())
      fail(attrReader.at("loss_name"), "must not be empty");
    break;
  case NodeOp::Mtp:
    node.depth = attrReader.integer("depth", 1, 1);
    node.lossWeight = attrReader.positiveNumber("loss_weight", 0.1);
    break;
  default:
    break;
  }
  attrReader.rejectUnknown();
  reader.rejectUnknown();
  return node;
}

/// Orders nodes so inputs precede users (stable: file order among ready
/// nodes). Reports a cycle by naming its nodes.
std::vector<int> topologicalOrder(const std::vector<ModelNode> &nodes) {
  size_t count = nodes.size();
  std::vector<int> indegree(count, 0);
  std::vector<std::vector<int>> users(count);
  for (size_t i = 0; i < count; ++i)
    for (int input : nodes[i].inputs) {
      ++indegree[i];
      users[input].push_back(static_cast<int>(i));
    }
  std::vector<int> order;
  std::vector<bool> done(count, false);
  // O(N^2) in the worst case; models have at most a few hundred nodes.
  while (order.size() < count) {
    int next = -1;
    for (size_t i = 0; i < count && next < 0; ++i)
      if (!done[i] && indegree[i] == 0)
        next = static_cast<int>(i);
    if (next < 0)
      break;
    done[next] = true;
    order.push_back(next);
    for (int user : users[next])
      --indegree[user];
  }
  if (order.size() == count)
    return order;
  // Walk inputs from any unfinished node until a node repeats: that is a cycle.
  int start = 0;
  while (done[start])
    ++start;
  std::vector<int> path;
  std::vector<int> seenAt(count, -1);
  int current = start;
  while (seenAt[current] < 0) {
    seenAt[current] = static_cast<int>(path.size());
    path.push_back(current);
    for (int input : nodes[current].inputs)
      if (!done[input]) {
        current = input;
        break;
      }
  }
  std::vector<int> cycle(path.begin() + seenAt[current], path.end());
  std::reverse(cycle.begin(), cycle.end()); // data-flow order
  int first = *std::min_element(cycle.begin(), cycle.end());
  std::rotate(cycle.begin(), std::find(cycle.begin(), cycle.end(), first),
              cycle.end());
  std::string text;
  for (int index : cycle)
    text += "'" + nodes[index].name + "' -> ";
  text += "'" + nodes[first].name + "'";
  fail(nodes[first].pointer + "/inputs", "cycle: " + text);
}

void checkStructure(ModelGraph &graph) {
  const ModelConfig &config = graph.config;
  std::vector<ModelNode> &nodes = graph.nodes;
  std::map<NodeOp, int> firstOf;
  std::vector<int> useCount(nodes.size(), 0);
  for (size_t i = 0; i < nodes.size(); ++i) {
    ModelNode &node = nodes[i];
    ValueKind want = specOf(node.op).input;
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      const ModelNode &producer = nodes[node.inputs[k]];
      ValueKind have = outputKind(producer.op);
      if (have != want)
        fail(node.pointer + "/inputs/" + std::to_string(k),
             "'" + producer.name + "' is " + describeKind(have, config) +
                 ", but " + nodeOpName(node.op) + " needs " +
                 describeKind(want, config) + kindFix(have, want));
      ++useCount[node.inputs[k]];
    }
    bool unique = node.op == NodeOp::Embedding || node.op == NodeOp::MhcExpand ||
                  node.op == NodeOp::MhcContract || node.op == NodeOp::LmHead ||
                  node.op == NodeOp::CrossEntropy;
    auto [it, inserted] = firstOf.emplace(node.op, static_cast<int>(i));
    if (unique && !inserted)
      fail(node.pointer + "/op",
           std::string("a model has exactly one ") + nodeOpName(node.op) +
               " node; '" + nodes[it->second].name + "' at " +
               nodes[it->second].pointer + " is the first, '" + node.name +
               "' a second");
  }
  auto requireOne = [&](NodeOp op, const std::string &why) {
    if (!firstOf.count(op))
      fail("/nodes", std::string("no ") + nodeOpName(op) + " node: " + why);
  };
  requireOne(NodeOp::Embedding, "the model has no input");
  requireOne(NodeOp::CrossEntropy, "the model has no loss");
  requireOne(NodeOp::MhcExpand, "the residual stream is never formed "
                                "(use it with streams = 1 for a plain model)");
  requireOne(NodeOp::MhcContract, "the residual stream is never reduced");

  // A pipeline cuts a chain: every value has one consumer, except that MTP
  // modules may also read the final residual (the input of mhc_contract).
  // (With one embedding and one loss, an unused node would make its producer
  // fan out, so the fan-out check below also catches dead nodes.)
  int contract = firstOf[NodeOp::MhcContract];
  int finalResidual = nodes[contract].inputs[0];
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ModelNode &node = nodes[i];
    if (node.op == NodeOp::Mtp && node.inputs[0] != finalResidual)
      fail(node.pointer + "/inputs/0",
           "mtp must read the final residual '" + nodes[finalResidual].name +
               "' (the input of mhc_contract '" + nodes[contract].name + "')");
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ModelNode &node = nodes[i];
    int mtpUses = 0;
    for (const ModelNode &user : nodes)
      if (user.op == NodeOp::Mtp && user.inputs[0] == static_cast<int>(i))
        ++mtpUses;
    int chainUses = useCount[i] - mtpUses;
    if (chainUses > 1)
      fail(node.pointer, "the output of '" + node.name + "' feeds " +
                             std::to_string(chainUses) +
                             " nodes; the model must be a chain (only mtp may "
                             "also read the final residual)");
  }

  // Sublayers come in (mixer, mlp) pairs, the mixer attention or gdn; each
  // pair is one layer.
  int64_t sublayers = 0;
  for (ModelNode &node : nodes) {
    if (node.op != NodeOp::MhcSublayer)
      continue;
    const bool mixerSlot = sublayers % 2 == 0;
    if (mixerSlot == (node.sublayer == SublayerKind::Mlp))
      fail(node.pointer + "/attrs/sublayer",
           std::string("expected ") + (mixerSlot ? "\"attention\" or \"gdn\"" : "\"mlp\"") +
               ": sublayers come in (attention or gdn), mlp pairs (layer " + std::to_string(sublayers / 2) +
               ")");
    node.layer = sublayers / 2;
    ++sublayers;
  }
  if (sublayers % 2 != 0)
    fail("/nodes", "the last layer has a token mixer (attention or gdn) but no mlp");
  if (sublayers == 0)
    fail("/nodes", "the model has no mhc_sublayer: at least one layer is needed");
  for (ModelNode &node : nodes)
    if (node.op == NodeOp::RmsNorm && node.eps == 0.0)
      node.eps = config.normEps;
}

} // namespace

const char *nodeOpName(NodeOp op) { return specOf(op).name; }

const char *valueKindName(ValueKind kind) {
  switch (kind) {
  case ValueKind::None: return "none";
  case ValueKind::Hidden: return "hidden";
  case ValueKind::Residual: return "residual";
  case ValueKind::Logits: return "logits";
  case ValueKind::Loss: return "loss";
  }
  return "?";
}

ValueKind outputKind(NodeOp op) {
  switch (op) {
  case NodeOp::Embedding:
  case NodeOp::MhcContract:
  case NodeOp::RmsNorm:
    return ValueKind::Hidden;
  case NodeOp::MhcExpand:
  case NodeOp::MhcSublayer:
    return ValueKind::Residual;
  case NodeOp::LmHead:
    return ValueKind::Logits;
  case NodeOp::CrossEntropy:
  case NodeOp::Mtp:
    return ValueKind::Loss;
  }
  return ValueKind::None;
}

int64_t ModelGraph::numLayers() const {
  int64_t sublayers = 0;
  for (const ModelNode &node : nodes)
    sublayers += node.op == NodeOp::MhcSublayer;
  return sublayers / 2;
}

std::optional<ModelGraph> parseModelGraph(const std::string &text,
                                          ModelError &error) {
  json root;
  // "line L, column C" of a byte offset, for errors without a JSON pointer.
  auto position = [&](size_t byte) {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < byte && i < text.size(); ++i) {
      if (text[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    return "line " + std::to_string(line) + ", column " + std::to_string(column);
  };
  try {
    root = json::parse(text);
  } catch (const json::parse_error &e) {
    std::string what = e.what();
    // nlohmann prefixes "[json.exception.parse_error.101] parse error at ...: ".
    size_t colon = what.rfind(": ");
    error = {position(e.byte == 0 ? 0 : e.byte - 1),
             "invalid JSON: " + (colon == std::string::npos ? what : what.substr(colon + 2))};
    return std::nullopt;
  } catch (const json::out_of_range &e) {
    // A number literal beyond double's range (`1e999`): the library throws
    // out_of_range, not parse_error, and names the literal but no offset.
    // (Found by tests/fuzz/model_graph_fuzz.cpp; it aborted mhcc.)
    std::string what = e.what();
    size_t open = what.find('\''), close = what.rfind('\'');
    std::string literal = open < close ? what.substr(open + 1, close - open - 1) : "";
    size_t at = literal.empty() ? std::string::npos : text.find(literal);
    error = {position(at == std::string::npos ? 0 : at),
             "invalid JSON: the number " + (literal.empty() ? what : literal) +
                 " is out of range"};
    return std::nullopt;
  }
  try {
    ModelGraph graph;
    ObjectReader reader(root, "", "the model file");
    std::string format = reader.string("format", std::nullopt);
    if (format != kModelFormatTag)
      fail("/format", "unsupported format \"" + format + "\"; this mhcc reads \"" +
                          kModelFormatTag + "\"");
    graph.name = reader.string("name", std::nullopt);
    graph.description = reader.string("description", std::string());
    graph.config = parseConfig(reader.require("config"));
    const json &list = reader.require("nodes");
    reader.rejectUnknown();
    if (!list.is_array())
      fail("/nodes", "must be an array of nodes, got " + std::string(jsonTypeName(list)));

    std::vector<ModelNode> nodes;
    std::vector<std::vector<std::string>> inputNames;
    std::map<std::string, int> byName;
    for (size_t i = 0; i < list.size(); ++i) {
      std::string pointer = "/nodes/" + std::to_string(i);
      nodes.push_back(parseNode(list[i], pointer, inputNames));
      auto [it, inserted] = byName.emplace(nodes.back().name, static_cast<int>(i));
      if (!inserted)
        fail(pointer + "/name", "duplicate node name '" + nodes.back().name +
                                    "' (first defined at " +
                                    nodes[it->second].pointer + ")");
    }
    for (size_t i = 0; i < nodes.size(); ++i)
      for (size_t k = 0; k < inputNames[i].size(); ++k) {
        auto it = byName.find(inputNames[i][k]);
        if (it == byName.end())
          fail(nodes[i].pointer + "/inputs/" + std::to_string(k),
               "no node named '" + inputNames[i][k] + "'");
        nodes[i].inputs.push_back(it->second);
      }

    std::vector<int> order = topologicalOrder(nodes);
    std::vector<int> position(nodes.size());
    for (size_t i = 0; i < order.size(); ++i)
      position[order[i]] = static_cast<int>(i);
    for (int index : order) {
      ModelNode node = nodes[index];
      for (int &input : node.inputs)
        input = position[input];
      graph.nodes.push_back(std::move(node));
    }
    checkStructure(graph);
    return graph;
  } catch (const Failure &failure) {
    error = failure.error;
    return std::nullopt;
  }
}

std::optional<ModelGraph> loadModelGraph(const std::string &path,
                                         ModelError &error) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    error = {"/", "cannot open the model file (does it exist and is it readable?)"};
    return std::nullopt;
  }
  std::ostringstream text;
  text << file.rdbuf();
  return parseModelGraph(text.str(), error);
}

std::string formatModelError(const std::string &file, const ModelError &error) {
  return file + ": " + error.pointer + ": " + error.message;
}

} // namespace mhcc
