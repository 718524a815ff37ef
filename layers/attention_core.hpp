// Internal: attention with an optional additive bias on the scores, as one tape node. Both the
// public scaled_dot_product_attention (no bias) and multihead_attention (bias allowed) use it.
#pragma once

#include "layers/attention_mask.hpp"
#include "tapegrad/layers/attention.hpp"

namespace tapegrad::detail {

struct AttentionArgs {
  const char* op;  // for error messages
  Tensor q, k, v;
  Tensor bias;         // optional, floating, broadcasts to [..., Q, K]
  AttentionMask mask;  // which (query, key) pairs may attend; empty: all of them
};

// The single entry: validates, computes the weights and the output, records one node.
AttentionResult attention_core(const AttentionArgs& args);

}  // namespace tapegrad::detail
