// Internal: attention with an optional additive bias on the scores, as one tape node. Both the
// public scaled_dot_product_attention (no bias) and multihead_attention (bias allowed) use it.
#pragma once

#include <optional>

#include "kernels/attention_paths.hpp"
#include "tapegrad/ops/attention.hpp"

namespace tapegrad::detail {

// The single entry: validates, computes the weights (when asked for) and the output on the
// path attention_path() chooses, records one node. `path` forces one (the tests run each on
// every shape; block_rows > 0: the pipelined paths' blocks of that many rows).
AttentionResult attention_core(const AttentionArgs& args, std::optional<AttentionPath> path = std::nullopt, std::int64_t block_rows = 0);

}  // namespace tapegrad::detail
