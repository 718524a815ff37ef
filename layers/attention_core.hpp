// Internal: attention with an optional additive bias on the scores, as one tape node. Both the
// public scaled_dot_product_attention (no bias) and multihead_attention (bias allowed) use it.
#pragma once

#include "tapegrad/layers/attention.hpp"

namespace tapegrad::detail {

struct AttentionArgs {
  const char* op;  // for error messages
  Tensor q, k, v;
  Tensor bias;     // optional, floating, broadcasts to [..., Q, K]
  Tensor allowed;  // optional, bool, broadcasts to [..., Q, K]
};

AttentionResult attention_core(const AttentionArgs& args);

}  // namespace tapegrad::detail
