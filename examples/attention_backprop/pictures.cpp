// A, dA and dS per head: as coloured cells in the terminal and as PNG heatmaps.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "attention_backprop/walkthrough.hpp"
#include "support/plot.hpp"
#include "support/terminal_heatmap.hpp"

namespace tg = tapegrad;
namespace ex = tapegrad_examples;

namespace attention_backprop {
namespace {

// One head's [Q, K] slice of a [B, H, Q, K] tensor, and which of its cells are masked.
struct Slice {
  std::vector<double> values;
  std::vector<bool> masked;
};
Slice head_slice(const Problem& p, const Tensor& t, std::int64_t b, std::int64_t h) {
  Slice s{tg::contiguous(tg::select(tg::select(t, 0, b), 0, h)).to_vector<double>(), {}};
  const auto first = static_cast<std::size_t>((b * p.n.h + h) * p.n.q * p.n.k);
  for (std::size_t e = 0; e < s.values.size(); ++e) s.masked.push_back(!p.allowed_host[first + e]);
  return s;
}

double max_abs(const std::vector<double>& v, const std::vector<bool>& masked) {
  double m = 0;
  for (std::size_t e = 0; e < v.size(); ++e)
    if (masked.empty() || !masked[e]) m = std::max(m, std::abs(v[e]));
  return m;
}

// "suppressed query" or "empty row" for the rows of head (b, h) that are either.
std::vector<std::string> row_notes(const Problem& p, std::int64_t b, std::int64_t h) {
  std::vector<std::string> notes;
  for (std::int64_t i = 0; i < p.n.q; ++i) {
    bool any = false;
    for (std::int64_t j = 0; j < p.n.k; ++j) any = any || p.allowed_host[static_cast<std::size_t>(((b * p.n.h + h) * p.n.q + i) * p.n.k + j)];
    notes.push_back(!p.active_host[static_cast<std::size_t>(b * p.n.q + i)] ? "suppressed query: empty in every head"
                    : !any                                                   ? "empty row in this head (query active elsewhere)"
                                                                             : "");
  }
  return notes;
}

// dA - rowsum(A * dA), row by row over one head's [Q, K] slice.
std::vector<double> centred(const std::vector<double>& a, const std::vector<double>& da, std::int64_t q, std::int64_t k) {
  std::vector<double> out(da.size());
  for (std::int64_t i = 0; i < q; ++i) {
    double dot = 0;
    for (std::int64_t j = 0; j < k; ++j) dot += a[static_cast<std::size_t>(i * k + j)] * da[static_cast<std::size_t>(i * k + j)];
    for (std::int64_t j = 0; j < k; ++j) out[static_cast<std::size_t>(i * k + j)] = da[static_cast<std::size_t>(i * k + j)] - dot;
  }
  return out;
}

}  // namespace

void print_head_maps(const Problem& p, const Vars& base, const Tensor& dS, bool colour) {
  double scale = 0;
  for (std::int64_t b = 0; b < p.n.b; ++b)
    for (std::int64_t h = 0; h < p.n.h; ++h) {
      const Slice s = head_slice(p, dS, b, h);
      scale = std::max(scale, max_abs(s.values, s.masked));
    }
  for (std::int64_t b = 0; b < p.n.b; ++b)
    for (std::int64_t h = 0; h < p.n.h; ++h) {
      const Slice a = head_slice(p, at(base, Var::A), b, h), ds = head_slice(p, dS, b, h);
      fmt::print("\n");
      const bool last = b == p.n.b - 1 && h == p.n.h - 1;
      ex::print_text_heatmaps({{fmt::format("A   batch {} head {}", b, h), p.n.q, p.n.k, a.values, a.masked, false, 1.0, {}, "A (every head)"},
                               {fmt::format("dS  batch {} head {}", b, h), p.n.q, p.n.k, ds.values, ds.masked, true, scale,
                                row_notes(p, b, h), "dS (every head)"}},
                              colour, last);
    }
}

void print_lineup(const Problem& p, const Vars& base, const Tensor& dA, const Tensor& dS, std::int64_t b, std::int64_t h,
                  bool colour) {
  const Slice a = head_slice(p, at(base, Var::A), b, h), da = head_slice(p, dA, b, h), ds = head_slice(p, dS, b, h);
  std::vector<std::string> notes = row_notes(p, b, h);
  for (std::int64_t i = 0; i < p.n.q; ++i) {
    double dot = 0;
    for (std::int64_t j = 0; j < p.n.k; ++j) dot += a.values[static_cast<std::size_t>(i * p.n.k + j)] * da.values[static_cast<std::size_t>(i * p.n.k + j)];
    const std::string row = dot == 0 ? std::string("rowsum(A ⊙ dA) = 0") : fmt::format("rowsum(A ⊙ dA) = {:+.4f}", dot);
    notes[static_cast<std::size_t>(i)] = notes[static_cast<std::size_t>(i)].empty() ? row : row + "; " + notes[static_cast<std::size_t>(i)];
  }
  ex::print_text_heatmaps({{fmt::format("A  (b{} h{})", b, h), p.n.q, p.n.k, a.values, a.masked, false, 1.0, {}, "A"},
                           {"dA = dO vᵀ", p.n.q, p.n.k, da.values, da.masked, true, max_abs(da.values, da.masked), {}, "dA"},
                           {"dS = A ⊙ (dA − rowsum)", p.n.q, p.n.k, ds.values, ds.masked, true, max_abs(ds.values, ds.masked), notes, "dS"}},
                          colour);
}

std::string write_figures(const Options& o, const Problem& p, const Vars& base, const Tensor& dA, const Tensor& dS) {
  std::filesystem::create_directories(o.out);
  std::vector<ex::Heatmap> weights, grads;
  const std::int64_t shown = 9;  // panels per figure
  for (std::int64_t b = 0; b < p.n.b; ++b)
    for (std::int64_t h = 0; h < p.n.h && static_cast<std::int64_t>(weights.size()) < shown; ++h) {
      const Slice a = head_slice(p, at(base, Var::A), b, h), ds = head_slice(p, dS, b, h);
      weights.push_back({fmt::format("A, batch {} head {}", b, h), "key j", "query i", "weight", p.n.q, p.n.k, a.values, a.masked, false});
      grads.push_back({fmt::format("dS, batch {} head {}", b, h), "key j", "query i", "dL/dS", p.n.q, p.n.k, ds.values, ds.masked, true});
    }
  const std::string a_path = o.out + "/attention_weights.png", ds_path = o.out + "/score_gradients.png";
  ex::plot_heatmaps(a_path, "attention weights A (grey: masked)", weights);
  ex::plot_heatmaps(ds_path, "score gradients dS = A (dA - rowsum(A dA)) (grey: masked, exactly 0)", grads);

  const std::int64_t b = o.show_batch, h = o.show_head;
  const Slice a = head_slice(p, at(base, Var::A), b, h), da = head_slice(p, dA, b, h), ds = head_slice(p, dS, b, h);
  const std::vector<double> c = centred(a.values, da.values, p.n.q, p.n.k);
  const std::string lineup = fmt::format("{}/softmax_backward_b{}_h{}.png", o.out, b, h);
  ex::plot_heatmaps(lineup, fmt::format("batch {} head {}: the masked softmax backward, left to right and down", b, h),
                    {{"A (weights)", "key j", "query i", "weight", p.n.q, p.n.k, a.values, a.masked, false},
                     {"dA = dO v^T (upstream)", "key j", "query i", "dL/dA", p.n.q, p.n.k, da.values, da.masked, true},
                     {"dA - rowsum(A dA) (centred per row)", "key j", "query i", "", p.n.q, p.n.k, c, da.masked, true},
                     {"dS = A (dA - rowsum(A dA))", "key j", "query i", "dL/dS", p.n.q, p.n.k, ds.values, ds.masked, true}});
  return fmt::format("  {}  (A for each head)\n  {}  (dS for each head)\n  {}  (A, dA, dA - rowsum, dS for batch {} head {})\n", a_path,
                     ds_path, lineup, b, h);
}

}  // namespace attention_backprop
