//===- Layout.cpp - pipeline layouts: parse, validate, print -----------------===//
#include "passes/pipeline/Layout.h"

#include <cctype>

namespace mhcc::pipeline {
namespace {

constexpr int64_t kMaxExpandedLength = 1 << 20;
constexpr int kMaxNesting = 64;

/// Recursive-descent expansion: sequence := item*; item := (symbol | '|' |
/// '(' sequence ')') ('*' number)?
class Expander {
public:
  explicit Expander(const std::string &text) : text_(text) {}

  std::optional<std::string> run(std::string &error) {
    std::string out;
    if (!sequence(out, error))
      return std::nullopt;
    if (pos_ != text_.size()) {
      error = "unexpected '" + std::string(1, text_[pos_]) + "' at position " +
              std::to_string(pos_);
      return std::nullopt;
    }
    return out;
  }

private:
  bool sequence(std::string &out, std::string &error) {
    while (pos_ < text_.size() && text_[pos_] != ')') {
      std::string item;
      char c = text_[pos_];
      if (c == '(') {
        size_t open = pos_++;
        // Each level is a stack frame: 6000 nested '(' overflowed the stack
        // (found by tests/fuzz/layout_fuzz.cpp); no layout needs more than a few.
        if (++depth_ > kMaxNesting) {
          error = "parentheses nested deeper than " + std::to_string(kMaxNesting) +
                  " at position " + std::to_string(open);
          return false;
        }
        bool ok = sequence(item, error);
        --depth_;
        if (!ok)
          return false;
        if (pos_ >= text_.size() || text_[pos_] != ')') {
          error = "unbalanced '(' at position " + std::to_string(open);
          return false;
        }
        ++pos_;
      } else if (c == 'E' || c == 't' || c == 'm' || c == 'L' || c == '|') {
        item = std::string(1, c);
        ++pos_;
      } else if (c == ' ' || c == ',') {
        ++pos_; // Megatron allows separators for readability
        continue;
      } else {
        error = "unknown symbol '" + std::string(1, c) + "' at position " +
                std::to_string(pos_) + " (use E, t, m, L, |, *N and parentheses)";
        return false;
      }
      int64_t repeat = 1;
      if (pos_ < text_.size() && text_[pos_] == '*') {
        size_t star = pos_++;
        size_t start = pos_;
        while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_])))
          ++pos_;
        if (start == pos_ || pos_ - start > 7) {
          error = "'*' at position " + std::to_string(star) + " needs a count";
          return false;
        }
        repeat = std::stoll(text_.substr(start, pos_ - start));
      }
      if (static_cast<int64_t>(out.size() + item.size() * repeat) > kMaxExpandedLength) {
        error = "layout expands to more than " + std::to_string(kMaxExpandedLength) + " symbols";
        return false;
      }
      for (int64_t i = 0; i < repeat; ++i)
        out += item;
    }
    return true;
  }

  const std::string &text_;
  size_t pos_ = 0;
  int depth_ = 0;
};

int64_t countOf(const std::string &s, char c) {
  int64_t n = 0;
  for (char x : s)
    n += x == c;
  return n;
}

} // namespace

std::optional<std::vector<std::string>> expandLayout(const std::string &text,
                                                     std::string &error) {
  std::optional<std::string> flat = Expander(text).run(error);
  if (!flat)
    return std::nullopt;
  std::vector<std::string> stages(1);
  for (char c : *flat) {
    if (c == '|')
      stages.emplace_back();
    else
      stages.back() += c;
  }
  return stages;
}

std::optional<std::string> validateLayout(const Layout &layout,
                                          const ModelShape &model) {
  int64_t expected = layout.numStages();
  int64_t got = static_cast<int64_t>(layout.stages.size());
  if (got != expected)
    return "the layout has " + std::to_string(got) + " virtual stages, but --pp " +
           std::to_string(layout.pp) + " x --vpp " + std::to_string(layout.vpp) +
           " needs " + std::to_string(expected) + " (separate them with '|'; " +
           "a stage may be empty)";
  std::string all;
  for (const std::string &stage : layout.stages)
    all += stage;
  int64_t layers = countOf(all, 't'), mtp = countOf(all, 'm');
  if (countOf(all, 'E') != 1)
    return "the layout must place the embedding 'E' exactly once, found " +
           std::to_string(countOf(all, 'E'));
  if (countOf(all, 'L') != 1)
    return "the layout must place the loss 'L' exactly once, found " +
           std::to_string(countOf(all, 'L'));
  if (layers != model.layers)
    return "the layout places " + std::to_string(layers) + " transformer layers 't', "
           "but the model has " + std::to_string(model.layers);
  if (mtp != model.mtpModules)
    return "the layout places " + std::to_string(mtp) + " MTP modules 'm', but the "
           "model has " + std::to_string(model.mtpModules);
  // Forward order: E first, then layers, then MTP modules and L together.
  if (all.front() != 'E')
    return "the embedding 'E' must come first (in virtual stage 0)";
  if (layout.stages.front().empty() || layout.stages.front()[0] != 'E')
    return "the embedding 'E' must be in virtual stage 0, the first stage of rank 0";
  size_t lastT = all.rfind('t');
  size_t firstM = all.find('m'), loss = all.find('L');
  if (lastT != std::string::npos && loss < lastT)
    return "the loss 'L' must come after every transformer layer";
  if (firstM != std::string::npos && firstM < lastT)
    return "MTP modules 'm' must come after every transformer layer";
  // MTP modules read the final residual and feed their loss beside L: they
  // must share L's stage.
  for (size_t s = 0; s < layout.stages.size(); ++s) {
    const std::string &stage = layout.stages[s];
    if (countOf(stage, 'm') && !countOf(stage, 'L'))
      return "MTP modules 'm' must be in the stage of the loss 'L' (virtual stage " +
             std::to_string(s) + " has 'm' without 'L')";
  }
  if (layout.stages.back().find('L') == std::string::npos)
    return "the loss 'L' must be in the last virtual stage (" +
           std::to_string(expected - 1) + ", the last chunk of rank " +
           std::to_string(layout.pp - 1) + ")";
  return std::nullopt;
}

std::optional<Layout> parseLayout(const std::string &text, int64_t pp,
                                  int64_t vpp, const ModelShape &model,
                                  std::string &error) {
  if (pp < 1 || vpp < 1) {
    error = "--pp and --vpp must be at least 1";
    return std::nullopt;
  }
  std::optional<std::vector<std::string>> stages = expandLayout(text, error);
  if (!stages)
    return std::nullopt;
  Layout layout{pp, vpp, *stages};
  if (std::optional<std::string> problem = validateLayout(layout, model)) {
    error = *problem;
    return std::nullopt;
  }
  return layout;
}

std::string Layout::toString() const {
  std::string out;
  for (size_t s = 0; s < stages.size(); ++s) {
    if (s)
      out += '|';
    const std::string &stage = stages[s];
    for (size_t i = 0; i < stage.size();) {
      size_t j = i;
      while (j < stage.size() && stage[j] == stage[i])
        ++j;
      size_t run = j - i;
      std::string literal(run, stage[i]);
      std::string compact = std::string(1, stage[i]) + "*" + std::to_string(run);
      out += compact.size() < literal.size() ? compact : literal;
      i = j;
    }
  }
  return out;
}

Layout uniformLayout(int64_t pp, int64_t vpp, const ModelShape &model) {
  Layout layout{pp, vpp, std::vector<std::string>(pp * vpp)};
  int64_t stages = pp * vpp;
  for (int64_t l = 0; l < model.layers; ++l)
    layout.stages[l * stages / model.layers] += 't';
  layout.stages.front().insert(0, "E");
  layout.stages.back() += std::string(model.mtpModules, 'm') + "L";
  return layout;
}

} // namespace mhcc::pipeline
