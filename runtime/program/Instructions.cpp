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
    {OpKind::AllReduce, "ALLREDUCE"},
};
} // namespace

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
    os << " grads s" << stage << " dp [" << width << "]";
  } else if (kind != OpKind::Optimizer) {
    os << "(s" << stage << ",mb" << mb << ")";
  }
  return os.str();
}

} // namespace mhcc::runtime
