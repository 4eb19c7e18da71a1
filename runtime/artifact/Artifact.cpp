//===- Artifact.cpp - the compiled artifact mhcrun executes -----------------===//
#include "runtime/artifact/Artifact.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

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

json toJson(const Instr &i) {
  json j = {{"kind", opKindName(i.kind)}, {"stage", i.stage}, {"mb", i.mb}};
  if (i.isComm()) {
    j["payload"] = i.payload == Payload::Activation ? "act" : "grad";
    j["peer"] = i.peer;
    j["src"] = i.srcStage;
    j["dst"] = i.dstStage;
    j["tokens"] = i.tokens;
    j["width"] = i.width;
    j["group"] = i.group;
    j["order"] = i.order;
  }
  return j;
}

Instr instrFromJson(const json &j) {
  Instr i;
  std::optional<OpKind> kind = parseOpKind(j.at("kind").get<std::string>());
  if (!kind)
    throw std::runtime_error("unknown instruction kind " + j.at("kind").dump());
  i.kind = *kind;
  i.stage = j.at("stage");
  i.mb = j.at("mb");
  if (i.isComm()) {
    std::string payload = j.at("payload");
    if (payload != "act" && payload != "grad")
      throw std::runtime_error("unknown payload " + payload);
    i.payload = payload == "act" ? Payload::Activation : Payload::Gradient;
    i.peer = j.at("peer");
    i.srcStage = j.at("src");
    i.dstStage = j.at("dst");
    i.tokens = j.at("tokens");
    i.width = j.at("width");
    i.group = j.at("group");
    i.order = j.at("order");
  }
  return i;
}

json toJson(const StageProgram &p) {
  json values = json::array();
  for (const ValueInfo &v : p.values)
    values.push_back({{"rows", v.rows}, {"cols", v.cols}, {"tap", v.tap}});
  json forward = json::array();
  for (const ForwardInstr &f : p.forward)
    forward.push_back({{"op", primName(f.op)}, {"inputs", f.inputs}, {"params", f.params},
                       {"output", f.output}, {"aux", f.auxSize}, {"streams", f.streams},
                       {"heads", f.heads}, {"ffn", f.ffn}, {"shift", f.shift},
                       {"sinkhorn", f.sinkhornIterations}, {"seq", f.seqLen}, {"eps", f.eps},
                       {"loss", f.loss}});
  json backward = json::array();
  for (const BackwardInstr &b : p.backward)
    backward.push_back({{"forward", b.forward}, {"grad_output", b.gradOutput},
                        {"grad_inputs", b.gradInputs}});
  json params = json::array();
  for (const ParamSlot &s : p.params)
    params.push_back({{"param", s.param}, {"use_order", s.useOrder}});
  json losses = json::array();
  for (const LossInfo &l : p.losses)
    losses.push_back({{"name", l.name}, {"weight", l.weight}});
  return {{"stage", p.stage},       {"input", p.input},         {"output", p.output},
          {"grad_input", p.gradInput}, {"grad_output", p.gradOutput}, {"values", values},
          {"forward", forward},     {"backward", backward},     {"params", params},
          {"losses", losses}};
}

StageProgram programFromJson(const json &j) {
  StageProgram p;
  p.stage = j.at("stage");
  p.input = j.at("input");
  p.output = j.at("output");
  p.gradInput = j.at("grad_input");
  p.gradOutput = j.at("grad_output");
  for (const json &v : j.at("values"))
    p.values.push_back({v.at("rows"), v.at("cols"), v.at("tap")});
  for (const json &f : j.at("forward")) {
    ForwardInstr instr;
    std::optional<Prim> op = parsePrim(f.at("op").get<std::string>());
    if (!op)
      throw std::runtime_error("unknown kernel " + f.at("op").dump());
    instr.op = *op;
    instr.inputs = f.at("inputs").get<std::vector<int>>();
    instr.params = f.at("params").get<std::vector<int>>();
    instr.output = f.at("output");
    instr.auxSize = f.at("aux");
    instr.streams = f.at("streams");
    instr.heads = f.at("heads");
    instr.ffn = f.at("ffn");
    instr.shift = f.at("shift");
    instr.sinkhornIterations = f.at("sinkhorn");
    instr.seqLen = f.at("seq");
    instr.eps = f.at("eps");
    instr.loss = f.at("loss");
    p.forward.push_back(instr);
  }
  for (const json &b : j.at("backward"))
    p.backward.push_back({b.at("forward"), b.at("grad_output"),
                          b.at("grad_inputs").get<std::vector<int>>()});
  for (const json &s : j.at("params"))
    p.params.push_back({s.at("param"), s.at("use_order")});
  for (const json &l : j.at("losses"))
    p.losses.push_back({l.at("name"), l.at("weight")});
  return p;
}

json toJson(const Artifact &a) {
  const ModelInfo &m = a.model;
  json params = json::array();
  for (const ParamInfo &p : a.params)
    params.push_back({{"name", p.name}, {"rows", p.rows}, {"cols", p.cols}, {"init", p.init},
                      {"scale", p.scale}, {"decay", p.decay}});
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
  return {{"model",
           {{"name", m.name}, {"vocab", m.vocab}, {"hidden", m.hidden}, {"heads", m.heads},
            {"ffn_hidden", m.ffnHidden}, {"seq_len", m.seqLen}, {"micro_batch", m.microBatch},
            {"streams", m.streams}, {"sinkhorn_iterations", m.sinkhornIterations},
            {"gating_factor", m.gatingFactor}, {"norm_eps", m.normEps}, {"dtype", m.dtype},
            {"seed", m.seed}, {"training_flops_per_token", m.trainingFlopsPerToken}}},
          {"model_hash", a.modelHash},
          {"pipeline",
           {{"pp", a.pp}, {"vpp", a.vpp}, {"microbatches", a.microbatches},
            {"group_size", a.groupSize}, {"schedule", a.scheduleKind}, {"layout", a.layout}}},
          {"params", params},
          {"stages", stages},
          {"ranks", ranks},
          {"ir", a.ir},
          {"device_code", a.deviceCode ? json{{"arch", a.deviceCode->arch},
                                               {"compiler", a.deviceCode->compiler},
                                               {"streams", a.deviceCode->streams},
                                               {"sinkhorn_iterations", a.deviceCode->sinkhornIterations},
                                               {"source", a.deviceCode->source},
                                               {"image", base64Encode(a.deviceCode->image)}}
                                        : json(nullptr)}};
}

Artifact artifactFromJson(const json &j) {
  Artifact a;
  const json &m = j.at("model");
  a.model.name = m.at("name");
  a.model.vocab = m.at("vocab");
  a.model.hidden = m.at("hidden");
  a.model.heads = m.at("heads");
  a.model.ffnHidden = m.at("ffn_hidden");
  a.model.seqLen = m.at("seq_len");
  a.model.microBatch = m.at("micro_batch");
  a.model.streams = m.at("streams");
  a.model.sinkhornIterations = m.at("sinkhorn_iterations");
  a.model.gatingFactor = m.at("gating_factor");
  a.model.normEps = m.at("norm_eps");
  a.model.dtype = m.at("dtype");
  a.model.seed = m.at("seed");
  a.model.trainingFlopsPerToken = m.value("training_flops_per_token", 0.0);
  a.modelHash = j.at("model_hash");
  const json &p = j.at("pipeline");
  a.pp = p.at("pp");
  a.vpp = p.at("vpp");
  a.microbatches = p.at("microbatches");
  a.groupSize = p.at("group_size");
  a.scheduleKind = p.at("schedule");
  a.layout = p.at("layout");
  for (const json &q : j.at("params"))
    a.params.push_back({q.at("name"), q.at("rows"), q.at("cols"), q.at("init"), q.at("scale"),
                        q.at("decay")});
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
    DeviceCode d;
    d.arch = code->at("arch");
    d.compiler = code->at("compiler");
    d.streams = code->at("streams");
    d.sinkhornIterations = code->at("sinkhorn_iterations");
    d.source = code->at("source");
    d.image = base64Decode(code->at("image"));
    a.deviceCode = std::move(d);
  }
  return a;
}

} // namespace

std::string encodeArtifact(const Artifact &artifact) {
  std::string payload = toJson(artifact).dump();
  std::string out;
  out.append(kArtifactMagic, sizeof kArtifactMagic);
  put<uint32_t>(out, kArtifactVersion);
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
  if (version != kArtifactVersion) {
    error = "artifact format version " + std::to_string(version) + ", but this mhcrun reads version " +
            std::to_string(kArtifactVersion) + "; recompile it with the matching mhcc";
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
    std::string problem = validateArtifact(artifact);
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
