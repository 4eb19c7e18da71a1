//===- Program.cpp - compiled stage programs and their autodiff -------------===//
#include "runtime/program/Program.h"

namespace mhcc::runtime {

namespace {
constexpr struct {
  Prim prim;
  const char *name;
} kPrims[] = {
    {Prim::Identity, "identity"},     {Prim::Embed, "embed"},
    {Prim::Expand, "expand"},         {Prim::MhcCoeffs, "mhc_coeffs"},
    {Prim::MhcPre, "mhc_pre"},        {Prim::RmsNorm, "rms_norm"},
    {Prim::Attention, "attention"},   {Prim::SwiGlu, "swiglu"},
    {Prim::MhcPostRes, "mhc_post_res"}, {Prim::Residual, "residual"},
    {Prim::Contract, "contract"},     {Prim::LmHead, "lm_head"},
    {Prim::ConcatProj, "concat_proj"}, {Prim::CrossEntropy, "cross_entropy"},
    {Prim::GatedDeltaNet, "gated_delta_net"},
};
} // namespace

const char *primName(Prim prim) {
  for (const auto &entry : kPrims)
    if (entry.prim == prim)
      return entry.name;
  return "?";
}

std::optional<Prim> parsePrim(const std::string &name) {
  for (const auto &entry : kPrims)
    if (name == entry.name)
      return entry.prim;
  return std::nullopt;
}

} // namespace mhcc::runtime
