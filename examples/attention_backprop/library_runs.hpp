// The library's own attention, run on the same numbers as the staged chain, so that the staged
// gradients can be shown to be the library's gradients.
#pragma once

#include <map>

#include "attention_backprop/staged.hpp"

namespace attention_backprop {

// Forward results and gradients of one library run, converted to float64 and keyed by the
// staged chain's name for the same quantity.
struct LibraryRun {
  Vars values;
  std::map<Var, Tensor> grads;
};

// multihead_attention on the given inputs and parameters (converted to `dtype`), with
// L = sum(out * R): out, attention and the gradients of every input and parameter.
LibraryRun run_multihead_attention(const Problem& p, tapegrad::DType dtype);

// The attention node alone (ops/attention.cpp, one tape node) on the staged q, k, v and the
// bias expanded to [B, H, Q, K]: multihead_attention with identity projections and no projection
// biases, fed the staged upstream gradient of `merged`. Its gradients are the node's dq, dk, dv
// and dS (the gradient of a full-shape bias is dS itself).
LibraryRun run_attention_node(const Problem& p, const Vars& base, const Tensor& d_merged, tapegrad::DType dtype);

// Causal only: the largest difference between row t of the full causal output and the output of
// query t alone with causal_offset = t + offset (what a KV-cache decoding step computes).
double kv_cache_gap(const Problem& p, tapegrad::DType dtype);

}  // namespace attention_backprop
