// Internal: attention with an optional additive bias on the scores, as one tape node. Both the
// public scaled_dot_product_attention (no bias) and multihead_attention (bias allowed) use it.
#pragma once

#include "kernels/attention_mask.hpp"
#include "tapegrad/ops/attention.hpp"

namespace tapegrad::detail {

struct AttentionArgs {
  const char* op;  // for error messages
  Tensor q, k, v;
  Tensor bias;          // optional, floating, broadcasts to [..., Q, K]
  AttentionMask mask;   // which (query, key) pairs may attend; empty: all
  // false: only the output is wanted, and the attention runs fused (layers/attention_flash.cpp)
  // without ever holding the [..., Q, K] weights; the result's weights are then undefined.
  bool need_weights = true;
};

// The single entry: validates, computes the weights and the output, records one node.
AttentionResult attention_core(const AttentionArgs& args);

// The fused path: validated arguments and the scores' shape [..., Q, K]. Returns the output.
Tensor flash_attention(const AttentionArgs& args, const Shape& scores_shape);

// The weights path for float32 (exact or bfloat16 products, as the matmul precision says), in
// blocks of query rows that stay in cache from the scores' product to the output's
// (layers/attention_pipeline.cpp). Validated arguments, their masks and 1/sqrt(D); block_rows 0
// sizes the blocks for L2 (tests ask for small ones). Records the node as attention_core does.
// With args.need_weights false, the fused path on the same blocks: each block's weights stay in
// a per-thread buffer, the backward computes them again, and the result's weights are undefined.
AttentionResult attention_pipelined(const AttentionArgs& args, const Shape& scores_shape, const RowMasks& masks, double scale,
                                    std::int64_t block_rows = 0);
// Whether scores of this shape are worth the blocks (too small, whole-tensor passes stay in cache).
bool attention_pipeline_pays(const Shape& scores_shape);
// Whether the fused path (need_weights false) takes the blocks rather than flash_attention's tiles.
bool attention_fused_blocks_pay(const AttentionArgs& args, const Shape& scores_shape);

}  // namespace tapegrad::detail
