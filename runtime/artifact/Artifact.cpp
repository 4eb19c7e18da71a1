//===- Artifact.cpp - the compiled artifact mhcrun executes -----------------===//
#include "runtime/artifact/Artifact.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include <nlohmann/json.hpp>
#include <xxhash.h>

namespace mhcc::runtime {
namespace {

using json = nlohmann::json;

constexpr size_t kHeaderSize = 8 + 4 + 4 + 8 + 8; // magic, version, reserved, size, checksum

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64Encode(const std::string &bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size())
      v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    if (i + 2 < bytes.size())
      v |= uint32_t(uint8_t(bytes[i + 2]));
    out += kBase64[(v >> 18) & 63];
    out += kBase64[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kBase64[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kBase64[v & 63] : '=';
  }
  return out;
}

std::string base64Decode(const std::string &text) {
  if (text.size() % 4)
    throw std::runtime_error("device code image: base64 length " + std::to_string(text.size()) +
                             " is not a multiple of 4");
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t v = 0;
    int padding = 0;
    for (int k = 0; k < 4; ++k) {
      char c = text[i + k];
      const char *at = c ? std::strchr(kBase64, c) : nullptr;
      if (c == '=' && i + 4 == text.size() && k >= 2) {
        ++padding;
        v <<= 6;
        continue;
      }
      if (!at || padding)
        throw std::runtime_error("device code image: bad base64 at offset " + std::to_string(i + k));
      v = (v << 6) | uint32_t(at - kBase64);
    }
    out += char((v >> 16) & 255);
    if (padding < 2)
      out += char((v >> 8) & 255);
    if (padding < 1)
      out += char(v & 255);
  }
  return out;
}

template <typename T> void put(std::string &out, T value) {
  out.append(reinterpret_cast<const char *>(&value), sizeof value);
}

template <typename T> T get(const std::string &in, size_t offset) {
  T value;
  std::memcpy(&value, in.data() + offset, sizeof value);
  return value;
}

// ---- one list of (JSON key, member) per struct, read by both directions ----
// `Model` is the struct, const when writing; `field(key, member)` is the
// direction. Enumerations and nested lists are converted around these.

template <typename Model, typename Field> void modelFields(Model &m, Field &&field) {
  field("name", m.name);
  field("vocab", m.vocab);
  field("hidden", m.hidden);
  field("heads", m.heads);
  field("ffn_hidden", m.ffnHidden);
  field("seq_len", m.seqLen);
  field("micro_batch", m.microBatch);
  field("streams", m.streams);
  field("sinkhorn_iterations", m.sinkhornIterations);
  field("gating_factor", m.gatingFactor);
  field("norm_eps", m.normEps);
  field("dtype", m.dtype);
  field("seed", m.seed);
}

template <typename Pipeline, typename Field> void pipelineFields(Pipeline &a, Field &&field) {
  field("pp", a.pp);
  field("vpp", a.vpp);
  field("microbatches", a.microbatches);
  field("group_size", a.groupSize);
  field("schedule", a.scheduleKind);
  field("layout", a.layout);
}

template <typename Param, typename Field> void paramFields(Param &p, Field &&field) {
  field("name", p.name);
  field("rows", p.rows);
  field("cols", p.cols);
  field("init", p.init);
  field("scale", p.scale);
  field("decay", p.decay);
}

/// The tensor-parallel split, written only where there is one (older readers
/// see the same parameter table).
void writeSplit(const ParamInfo &p, json &j) {
  if (!p.tpSplit.empty())
    j["tp_split"] = p.tpSplit;
}

template <typename Code, typename Field> void deviceCodeFields(Code &c, Field &&field) {
  field("arch", c.arch);
  field("compiler", c.compiler);
  field("streams", c.streams);
  field("sinkhorn_iterations", c.sinkhornIterations);
  field("source", c.source);
}

template <typename P, typename Field> void predictionFields(P &p, Field &&field) {
  field("step_ms", p.stepMs);
  field("bubble_fraction", p.bubbleFraction);
  field("profile", p.profile);
}

/// SEND / RECV fields (the payload is an enumeration, converted apart).
template <typename Message, typename Field> void messageFields(Message &i, Field &&field) {
  field("peer", i.peer);
  field("src", i.srcStage);
  field("dst", i.dstStage);
  field("tokens", i.tokens);
  field("width", i.width);
  field("group", i.group);
  field("order", i.order);
}

template <typename Kernel, typename Field> void forwardFields(Kernel &f, Field &&field) {
  field("inputs", f.inputs);
  field("params", f.params);
  field("output", f.output);
  field("aux", f.auxSize);
  field("streams", f.streams);
  field("heads", f.heads);
  field("ffn", f.ffn);
  field("shift", f.shift);
  field("sinkhorn", f.sinkhornIterations);
  field("seq", f.seqLen);
  field("eps", f.eps);
  field("loss", f.loss);
}

template <typename Program, typename Field> void programFields(Program &p, Field &&field) {
  field("stage", p.stage);
  field("input", p.input);
  field("output", p.output);
  field("grad_input", p.gradInput);
  field("grad_output", p.gradOutput);
}

template <typename Value, typename Field> void valueFields(Value &v, Field &&field) {
  field("rows", v.rows);
  field("cols", v.cols);
  field("tap", v.tap);
  field("dtype", v.dtype);
}

template <typename Backward, typename Field> void backwardFields(Backward &b, Field &&field) {
  field("forward", b.forward);
  field("grad_output", b.gradOutput);
  field("grad_inputs", b.gradInputs);
}

template <typename Slot, typename Field> void slotFields(Slot &s, Field &&field) {
  field("param", s.param);
  field("use_order", s.useOrder);
}

template <typename Loss, typename Field> void lossFields(Loss &l, Field &&field) {
  field("name", l.name);
  field("weight", l.weight);
}

/// `fields(object, field)` written into a JSON object.
template <typename T, typename Fields> json write(const T &object, Fields &&fields) {
  json j = json::object();
  fields(object, [&](const char *key, const auto &member) { j[key] = member; });
  return j;
}

template <typename T> struct IsVector : std::false_type {};
template <typename T> struct IsVector<std::vector<T>> : std::true_type {};

/// One member's value, strictly typed. nlohmann converts any JSON number to
/// any arithmetic type with a plain cast: 3.3e40 into an int64_t is undefined
/// behaviour (UBSan, found by tests/fuzz/artifact_fuzz.cpp) and 2.5 would
/// silently become 2. An integer member takes only a JSON integer in its
/// range; a floating-point member any number.
template <typename T> T strictValue(const json &v, const char *key) {
  if constexpr (IsVector<T>::value) {
    if (!v.is_array())
      throw std::runtime_error(std::string(key) + ": " + v.dump() + " is not a list");
    T out;
    for (const json &item : v)
      out.push_back(strictValue<typename T::value_type>(item, key));
    return out;
  } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    bool fits = false;
    if (v.is_number_unsigned())
      fits = v.get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max());
    else if (v.is_number_integer())
      fits = std::is_signed_v<T> ? v.get<int64_t>() >= int64_t(std::numeric_limits<T>::min()) &&
                                       v.get<int64_t>() <= int64_t(std::numeric_limits<T>::max())
                                 : v.get<int64_t>() >= 0;
    if (!fits)
      throw std::runtime_error(std::string(key) + ": " + v.dump() + " is not an integer in range");
    return v.get<T>();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number())
      throw std::runtime_error(std::string(key) + ": " + v.dump() + " is not a number");
    return v.get<T>();
  } else {
    return v.get<T>();
  }
}

/// The inverse: every key must be present with the member's type.
template <typename T, typename Fields> T read(const json &j, Fields &&fields, T object = T()) {
  fields(object, [&](const char *key, auto &member) {
    member = strictValue<std::decay_t<decltype(member)>>(j.at(key), key);
  });
  return object;
}

template <typename T, typename Fields> json writeList(const std::vector<T> &list, Fields &&fields) {
  json out = json::array();
  for (const T &item : list)
    out.push_back(write(item, fields));
  return out;
}

template <typename T, typename Fields> std::vector<T> readList(const json &j, Fields &&fields) {
  std::vector<T> out;
  for (const json &item : j)
    out.push_back(read<T>(item, fields));
  return out;
}

// Generic lambdas naming each field list (templates cannot be passed as values).
#define MHCC_FIELDS(list) [](auto &object, auto &&field) { list(object, field); }

json toJson(const Instr &i) {
  json j = {{"kind", opKindName(i.kind)}, {"stage", i.stage}, {"mb", i.mb}};
  if (i.isComm()) {
    j.update(write(i, MHCC_FIELDS(messageFields)));
    j["payload"] = i.payload == Payload::Activation ? "act" : "grad";
  }
  if (i.kind == OpKind::AllReduce) {
    j["elements"] = i.width; // the stage's gradient floats
    if (i.collective == CollectiveOp::ReduceScatter)
      j["collective"] = collectiveOpName(i.collective);
  }
  if (i.kind == OpKind::Collective) {
    j["axis"] = meshAxisName(i.axis);
    j["collective"] = collectiveOpName(i.collective);
    j["tokens"] = i.tokens;
    j["width"] = i.width;
  }
  return j;
}

Instr instrFromJson(const json &j) {
  Instr i;
  std::optional<OpKind> kind = parseOpKind(j.at("kind").get<std::string>());
  if (!kind)
    throw std::runtime_error("unknown instruction kind " + j.at("kind").dump());
  i.kind = *kind;
  i.stage = strictValue<decltype(i.stage)>(j.at("stage"), "stage");
  i.mb = strictValue<decltype(i.mb)>(j.at("mb"), "mb");
  if (i.isComm()) {
    std::string payload = j.at("payload");
    if (payload != "act" && payload != "grad")
      throw std::runtime_error("unknown payload " + payload);
    i.payload = payload == "act" ? Payload::Activation : Payload::Gradient;
    i = read(j, MHCC_FIELDS(messageFields), i);
  }
  if (i.kind == OpKind::AllReduce) {
    i.tokens = 1;
    i.width = strictValue<decltype(i.width)>(j.at("elements"), "elements");
    if (j.contains("collective")) {
      if (j.at("collective") != collectiveOpName(CollectiveOp::ReduceScatter))
        throw std::runtime_error("unknown gradient reduction " + j.at("collective").dump());
      i.collective = CollectiveOp::ReduceScatter;
    }
  }
  if (i.kind == OpKind::Collective) {
    std::optional<MeshAxis> axis = parseMeshAxis(j.at("axis").get<std::string>());
    std::optional<CollectiveOp> op = parseCollectiveOp(j.at("collective").get<std::string>());
    if (!axis || !op)
      throw std::runtime_error("unknown collective " + j.at("axis").dump() + " " + j.at("collective").dump());
    i.axis = *axis;
    i.collective = *op;
    i.tokens = strictValue<decltype(i.tokens)>(j.at("tokens"), "tokens");
    i.width = strictValue<decltype(i.width)>(j.at("width"), "width");
  }
  return i;
}

json toJson(const StageProgram &p) {
  json forward = json::array();
  for (const ForwardInstr &f : p.forward) {
    json instr = write(f, MHCC_FIELDS(forwardFields));
    instr["op"] = primName(f.op);
    forward.push_back(instr);
  }
  json j = write(p, MHCC_FIELDS(programFields));
  j["values"] = writeList(p.values, MHCC_FIELDS(valueFields));
  j["forward"] = forward;
  j["backward"] = writeList(p.backward, MHCC_FIELDS(backwardFields));
  j["params"] = writeList(p.params, MHCC_FIELDS(slotFields));
  j["losses"] = writeList(p.losses, MHCC_FIELDS(lossFields));
  return j;
}

StageProgram programFromJson(const json &j) {
  StageProgram p = read<StageProgram>(j, MHCC_FIELDS(programFields));
  p.values = readList<ValueInfo>(j.at("values"), MHCC_FIELDS(valueFields));
  for (const json &f : j.at("forward")) {
    ForwardInstr instr = read<ForwardInstr>(f, MHCC_FIELDS(forwardFields));
    std::optional<Prim> op = parsePrim(f.at("op").get<std::string>());
    if (!op)
      throw std::runtime_error("unknown kernel " + f.at("op").dump());
    instr.op = *op;
    p.forward.push_back(instr);
  }
  p.backward = readList<BackwardInstr>(j.at("backward"), MHCC_FIELDS(backwardFields));
  p.params = readList<ParamSlot>(j.at("params"), MHCC_FIELDS(slotFields));
  p.losses = readList<LossInfo>(j.at("losses"), MHCC_FIELDS(lossFields));
  return p;
}

json toJson(const Artifact &a) {
  json model = write(a.model, MHCC_FIELDS(modelFields));
  model["training_flops_per_token"] = a.model.trainingFlopsPerToken;
  model["residual_dtype"] = a.model.residualStorage();
  json stages = json::array();
  for (const StageProgram &s : a.stages)
    stages.push_back(toJson(s));
  json ranks = json::array();
  for (const auto &list : a.ranks) {
    json rank = json::array();
    for (const Instr &i : list)
      rank.push_back(toJson(i));
    ranks.push_back(rank);
  }
  json deviceCode = nullptr;
  if (a.deviceCode) {
    deviceCode = write(*a.deviceCode, MHCC_FIELDS(deviceCodeFields));
    deviceCode["image"] = base64Encode(a.deviceCode->image);
  }
  json prediction = nullptr;
  if (a.prediction)
    prediction = write(*a.prediction, MHCC_FIELDS(predictionFields));
  json params = writeList(a.params, MHCC_FIELDS(paramFields));
  for (size_t k = 0; k < a.params.size(); ++k)
    writeSplit(a.params[k], params[k]);
  json pipeline = write(a, MHCC_FIELDS(pipelineFields));
  pipeline["dp"] = a.dp; // the data-parallel replicas of the pipeline
  pipeline["cp"] = a.cp; // the context-parallel ranks of each sequence
  pipeline["tp"] = a.tp; // the tensor-parallel ranks of each layer
  pipeline["sequence_parallel"] = a.sequenceParallel;
  pipeline["distributed_optimizer"] = a.distributedOptimizer;
  if (a.recomputeSublayers) // absent otherwise: the artifacts of before read the same
    pipeline["recompute_sublayers"] = true;
  if (a.recomputeNumSublayers != 1) // likewise (format 5)
    pipeline["recompute_num_sublayers"] = a.recomputeNumSublayers;
  return {{"model", model},
          {"model_hash", a.modelHash},
          {"prediction", prediction},
          {"pipeline", pipeline},
          {"params", params},
          {"stages", stages},
          {"ranks", ranks},
          {"ir", a.ir},
          {"device_code", deviceCode}};
}

Artifact artifactFromJson(const json &j) {
  Artifact a = read<Artifact>(j.at("pipeline"), MHCC_FIELDS(pipelineFields));
  // Absent before data parallelism: one replica. Integers only, as every member.
  const json &pipeline = j.at("pipeline");
  a.dp = pipeline.contains("dp") ? strictValue<int64_t>(pipeline.at("dp"), "dp") : 1;
  a.cp = pipeline.contains("cp") ? strictValue<int64_t>(pipeline.at("cp"), "cp") : 1;
  a.tp = pipeline.contains("tp") ? strictValue<int64_t>(pipeline.at("tp"), "tp") : 1;
  a.sequenceParallel =
      pipeline.contains("sequence_parallel") && strictValue<bool>(pipeline.at("sequence_parallel"), "sequence_parallel");
  a.distributedOptimizer = pipeline.contains("distributed_optimizer") &&
                           strictValue<bool>(pipeline.at("distributed_optimizer"), "distributed_optimizer");
  a.recomputeSublayers = pipeline.contains("recompute_sublayers") &&
                         strictValue<bool>(pipeline.at("recompute_sublayers"), "recompute_sublayers");
  a.recomputeNumSublayers = pipeline.contains("recompute_num_sublayers")
                                ? strictValue<int64_t>(pipeline.at("recompute_num_sublayers"), "recompute_num_sublayers")
                                : 1;
  a.model = read<ModelInfo>(j.at("model"), MHCC_FIELDS(modelFields));
  // Absent in artifacts from before the cost model: no TFLOP/s then.
  a.model.trainingFlopsPerToken = j.at("model").value("training_flops_per_token", 0.0);
  // Absent before the fp32 residual option: the residual is stored as the activations.
  a.model.residualDtype = j.at("model").contains("residual_dtype")
                              ? strictValue<std::string>(j.at("model").at("residual_dtype"), "residual_dtype")
                              : a.model.dtype;
  a.modelHash = j.at("model_hash");
  a.params = readList<ParamInfo>(j.at("params"), MHCC_FIELDS(paramFields));
  for (size_t k = 0; k < a.params.size(); ++k)
    if (j.at("params")[k].contains("tp_split"))
      a.params[k].tpSplit = strictValue<std::string>(j.at("params")[k].at("tp_split"), "tp_split");
  for (const json &s : j.at("stages"))
    a.stages.push_back(programFromJson(s));
  for (const json &rank : j.at("ranks")) {
    std::vector<Instr> list;
    for (const json &i : rank)
      list.push_back(instrFromJson(i));
    a.ranks.push_back(std::move(list));
  }
  a.ir = j.at("ir");
  if (auto code = j.find("device_code"); code != j.end() && !code->is_null()) {
    DeviceCode d = read<DeviceCode>(*code, MHCC_FIELDS(deviceCodeFields));
    d.image = base64Decode(code->at("image"));
    a.deviceCode = std::move(d);
  }
  if (auto p = j.find("prediction"); p != j.end() && !p->is_null())
    a.prediction = read<Prediction>(*p, MHCC_FIELDS(predictionFields));
  return a;
}

#undef MHCC_FIELDS

} // namespace

uint32_t artifactVersionOf(const Artifact &artifact) {
  if (artifact.recomputeNumSublayers != 1)
    return 5;
  if (artifact.recomputeSublayers)
    return 4;
  return artifact.model.residualStorage() != artifact.model.dtype ? 3 : 2;
}

namespace {

/// What makes an artifact need artifactVersionOf's format, for the message
/// that refuses an older header.
std::string featureOfFormat(const Artifact &artifact) {
  if (artifact.recomputeNumSublayers != 1)
    return "recompute_num_sublayers " + std::to_string(artifact.recomputeNumSublayers);
  if (artifact.recomputeSublayers)
    return "recompute_sublayers";
  return "residual_dtype \"" + artifact.model.residualStorage() + "\" in a " + artifact.model.dtype + " model";
}

} // namespace

std::string encodeArtifact(const Artifact &artifact) {
  std::string payload = toJson(artifact).dump();
  std::string out;
  out.append(kArtifactMagic, sizeof kArtifactMagic);
  put<uint32_t>(out, artifactVersionOf(artifact));
  put<uint32_t>(out, 0);
  put<uint64_t>(out, payload.size());
  put<uint64_t>(out, XXH3_64bits(payload.data(), payload.size()));
  out += payload;
  return out;
}

std::optional<Artifact> decodeArtifact(const std::string &bytes, std::string &error) {
  if (bytes.size() < kHeaderSize || std::memcmp(bytes.data(), kArtifactMagic, 8) != 0) {
    error = "not an mhcc artifact (bad magic); compile one with 'mhcc MODEL.json --emit=artifact -o FILE'";
    return std::nullopt;
  }
  uint32_t version = get<uint32_t>(bytes, 8);
  if (version < kOldestArtifactVersion || version > kArtifactVersion) {
    error = "artifact format version " + std::to_string(version) + ", but this mhcrun reads versions " +
            std::to_string(kOldestArtifactVersion) + " to " + std::to_string(kArtifactVersion) +
            "; recompile it with the matching mhcc";
    return std::nullopt;
  }
  uint64_t size = get<uint64_t>(bytes, 16), checksum = get<uint64_t>(bytes, 24);
  if (bytes.size() - kHeaderSize != size) {
    error = "truncated or padded: the header promises " + std::to_string(size) +
            " payload bytes, the file holds " + std::to_string(bytes.size() - kHeaderSize) +
            "; recompile or copy it again";
    return std::nullopt;
  }
  if (XXH3_64bits(bytes.data() + kHeaderSize, size) != checksum) {
    error = "checksum mismatch: the artifact is corrupt; recompile or copy it again";
    return std::nullopt;
  }
  try {
    Artifact artifact = artifactFromJson(json::parse(bytes.begin() + kHeaderSize, bytes.end()));
    artifact.checksum = checksum;
    std::string problem = validateArtifact(artifact);
    if (problem.empty() && version < artifactVersionOf(artifact))
      problem = "format " + std::to_string(version) + " cannot hold " + featureOfFormat(artifact) + " (format " +
                std::to_string(artifactVersionOf(artifact)) + " does)";
    if (!problem.empty()) {
      error = "inconsistent artifact: " + problem + "; recompile it";
      return std::nullopt;
    }
    return artifact;
  } catch (const std::exception &e) {
    error = std::string("malformed artifact payload: ") + e.what() + "; recompile it";
    return std::nullopt;
  }
}

bool writeArtifact(const std::string &path, const Artifact &artifact, std::string &error) {
  std::string bytes = encodeArtifact(artifact);
  std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out || !out.write(bytes.data(), bytes.size())) {
      error = "cannot write " + temporary;
      std::remove(temporary.c_str());
      return false;
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    error = "cannot move " + temporary + " to " + path;
    std::remove(temporary.c_str());
    return false;
  }
  return true;
}

std::optional<Artifact> readArtifact(const std::string &path, std::string &error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = path + ": cannot open the artifact (does it exist?)";
    return std::nullopt;
  }
  std::ostringstream bytes;
  bytes << in.rdbuf();
  std::optional<Artifact> artifact = decodeArtifact(bytes.str(), error);
  if (!artifact)
    error = path + ": " + error;
  return artifact;
}

} // namespace mhcc::runtime
