//===- Instructions.cpp - per-rank schedule instructions --------------------===//
#include "runtime/program/Instructions.h"

#include <sstream>

namespace mhcc::runtime {

namespace {
constexpr struct {
  OpKind kind;
  const char *name;
} kKinds[] = {
    {OpKind::Forward, "FWD"},        {OpKind::Backward, "BWD"},
    {OpKind::BackwardInput, "B"},    {OpKind::BackwardWeight, "W"},
    {OpKind::Send, "SEND"},          {OpKind::Recv, "RECV"},
    {OpKind::Free, "FREE"},          {OpKind::Optimizer, "OPTIM"},
    {OpKind::AllReduce, "ALLREDUCE"}, {OpKind::Collective, "COLLECTIVE"},
};
constexpr struct {
  CollectiveOp op;
  const char *name;
} kCollectives[] = {
    {CollectiveOp::AllGather, "all_gather"},
    {CollectiveOp::ReduceScatter, "reduce_scatter"},
    {CollectiveOp::AllReduce, "all_reduce"},
    {CollectiveOp::AllReduceMax, "all_reduce_max"},
};
} // namespace

const char *collectiveOpName(CollectiveOp op) {
  for (const auto &entry : kCollectives)
    if (entry.op == op)
      return entry.name;
  return "?";
}

std::optional<CollectiveOp> parseCollectiveOp(const std::string &name) {
  for (const auto &entry : kCollectives)
    if (name == entry.name)
      return entry.op;
  return std::nullopt;
}

const char *meshAxisName(MeshAxis axis) { return axis == MeshAxis::Tensor ? "tp" : "cp"; }

std::optional<MeshAxis> parseMeshAxis(const std::string &name) {
  if (name == "tp")
    return MeshAxis::Tensor;
  if (name == "cp")
    return MeshAxis::Context;
  return std::nullopt;
}

const char *opKindName(OpKind kind) {
  for (const auto &entry : kKinds)
    if (entry.kind == kind)
      return entry.name;
  return "?";
}

std::optional<OpKind> parseOpKind(const std::string &name) {
  for (const auto &entry : kKinds)
    if (name == entry.name)
      return entry.kind;
  return std::nullopt;
}

std::string Instr::describe() const {
  std::ostringstream os;
  os << opKindName(kind);
  if (isComm()) {
    os << " " << (payload == Payload::Activation ? "act" : "grad") << " s" << srcStage
       << "->s" << dstStage << " mb" << mb << (kind == OpKind::Send ? " to r" : " from r")
       << peer << " [" << tokens << "x" << width << "]";
  } else if (kind == OpKind::AllReduce) {
    if (collective == CollectiveOp::ReduceScatter) { // the distributed optimizer's: each member keeps its part
      os.str("");
      os << "REDUCESCATTER";
    }
    os << " grads s" << stage << " dp [" << width << "]";
  } else if (kind == OpKind::Collective) {
    os.str("");
    os << meshAxisName(axis) << " " << collectiveOpName(collective) << " in (s" << stage << ",mb" << mb << ") ["
       << tokens << "x" << width << "]";
  } else if (kind != OpKind::Optimizer) {
    os << "(s" << stage << ",mb" << mb << ")";
  }
  return os.str();
}

} // namespace mhcc::runtime
