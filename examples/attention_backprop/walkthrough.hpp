// The pieces of the attention_backprop example: its options, the problem they describe, and the
// pictures of A, dA and dS.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "attention_backprop/staged.hpp"

namespace attention_backprop {

struct Options {
  std::int64_t batch = 2, heads = 2, d = 3, dv = 2, queries = 4, keys = 5;
  std::int64_t query_dim = 4, context_dim = 5, out_dim = 3;  // Cq, Cctx, Cout
  bool causal = false;
  std::int64_t offset = 0;
  // "default" (sized to the problem, see parse), "none", or explicit 0/1 strings (see --help).
  std::string key_mask = "default", query_mask = "default", block = "default";
  std::string bias = "heads";  // none | full | heads | pairs
  std::uint64_t seed = 3;
  std::string dtype = "float64";
  std::string out = "attention_backprop_out";
  bool colour = true, files = true;
  std::int64_t show_batch = 0, show_head = 0;  // the head drawn with A, dA and dS side by side
};

// Random inputs, parameters, bias and R from the seed (rounded to float32 values when the
// library runs in float32, so that both sides see the same numbers), and the masks.
Problem make_problem(const Options& o);

// The masks as they were given, e.g. "key_mask 11110,11111, query_mask none, attention_mask blocks 1:2".
std::string mask_options(const Problem& p);
// Human-readable lists: masked pairs, empty rows (b, h, i), suppressed queries (b, i), unused keys (b, j).
std::string describe_masks(const Problem& p);

// The entries of dL/dX (X of the given shape) that the masks make exactly 0, as a mask over X's
// entries (empty when none are), and what they are ("rows of suppressed queries", ...).
std::pair<std::vector<bool>, std::string> exact_zeros(const Problem& p, Var x, const Shape& shape);

// Terminal heatmaps of A and dS for every head, and the line-up A | dA | dS for one head.
void print_head_maps(const Problem& p, const Vars& base, const Tensor& dS, bool colour);
void print_lineup(const Problem& p, const Vars& base, const Tensor& dA, const Tensor& dS, std::int64_t b, std::int64_t h,
                  bool colour);
// PNG files in o.out; returns their paths, one per line.
std::string write_figures(const Options& o, const Problem& p, const Vars& base, const Tensor& dA, const Tensor& dS);

}  // namespace attention_backprop
