//===- Layout.h - pipeline layouts: parse, validate, print --------*- C++ -*-===//
//
// A layout assigns the model's units to virtual stages, written as Megatron
// writes it: `E` embedding, `t` transformer layer, `m` MTP module, `L` loss
// (final norm, LM head, cross-entropy), `|` between virtual stages, `X*N` or
// `(...)*N` for repetition. Virtual stage s = chunk * p + rank runs the s-th
// slice in forward order; a stage may be empty (`||`).
//
// Plain C++ (no MLIR), shared by the partition pass, mhcc and the tests.
//
//===----------------------------------------------------------------------===//
#ifndef MHCC_PASSES_PIPELINE_LAYOUT_H
#define MHCC_PASSES_PIPELINE_LAYOUT_H

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mhcc::pipeline {

/// What the layout places: the model's units in forward order.
struct ModelShape {
  int64_t layers = 0;     // transformer layers (t)
  int64_t mtpModules = 0; // m
};

struct Layout {
  int64_t pp = 1;  // p, pipeline ranks
  int64_t vpp = 1; // v, virtual chunks per rank
  /// stages[s] is the string of unit symbols of virtual stage s ("Et", "").
  std::vector<std::string> stages;

  int64_t numStages() const { return pp * vpp; }
  static int64_t rankOf(int64_t stage, int64_t pp) { return stage % pp; }
  static int64_t chunkOf(int64_t stage, int64_t pp) { return stage / pp; }
  /// `Et|tt|tt|tL`, runs of one symbol written as `t*6` when shorter.
  std::string toString() const;
};

/// Expands `*N` and parentheses and splits at `|`. Returns nullopt and sets
/// `error` on a syntax error.
std::optional<std::vector<std::string>> expandLayout(const std::string &text,
                                                     std::string &error);

/// Parses and validates a layout for `model` on pp x vpp virtual stages.
std::optional<Layout> parseLayout(const std::string &text, int64_t pp,
                                  int64_t vpp, const ModelShape &model,
                                  std::string &error);

/// Checks a layout's stages against the model: p*v stages, E once and first,
/// every layer once in order, MTP modules and L in the last non-empty stage.
std::optional<std::string> validateLayout(const Layout &layout,
                                          const ModelShape &model);

/// An even split used when neither a layout nor a cost model is given.
Layout uniformLayout(int64_t pp, int64_t vpp, const ModelShape &model);

} // namespace mhcc::pipeline

#endif // MHCC_PASSES_PIPELINE_LAYOUT_H
