// Multi-head attention (docs/semantics.md §6) as a function, and the MultiHeadAttention layer
// with a KV cache (§7).
//
// Call site, with designated initializers for the three groups of inputs:
//   auto [out, attn] = tg::multihead_attention(
//       {.query = x, .context = memory},
//       {.w_q = wq, .w_k = wk, .w_v = wv, .w_o = wo, .b_o = bo},
//       {.key_mask = padding},
//       /*heads=*/4, /*causal=*/true);
#pragma once

#include <cstdint>
#include <vector>

#include "tapegrad/autodiff/tensor.hpp"
#include "tapegrad/ops/attention.hpp"

namespace tapegrad {

struct MhaActivations {
  Tensor query;    // [B, Q, Cq]
  Tensor context;  // [B, K, Cctx]
  Tensor bias{};   // optional additive floating bias, broadcastable to [B, H, Q, K]
};

struct MhaParameters {
  Tensor w_q;  // [Cq, H*D]
  Tensor w_k;  // [Cctx, H*D]
  Tensor w_v;  // [Cctx, H*Dv]
  Tensor w_o;  // [H*Dv, Cout]
  Tensor b_q{}, b_k{}, b_v{}, b_o{};  // optional: [H*D], [H*D], [H*Dv], [Cout]
};

struct MhaMasks {  // all optional, bool, True = allowed
  Tensor key_mask{};        // [B, K]
  Tensor query_mask{};      // [B, Q]
  Tensor attention_mask{};  // broadcastable to [B, H, Q, K]
};

// Returns output [B, Q, Cout] and attention [B, H, Q, K]. With need_weights = false the
// attention is left undefined and is never formed: the heads run fused, block by block over the
// keys (memory O(B H Q) on top of the activations instead of O(B H Q K)); the output and every
// gradient are the same up to float rounding.
//  1. q = query w_q (+ b_q), k = context w_k (+ b_k), v = context w_v (+ b_v)
//  2. head h owns channels [h*D, (h+1)*D) of q and k, [h*Dv, (h+1)*Dv) of v
//  3. scores = q k^T / sqrt(D) + bias
//  4. allowed = key_mask[b,j] & query_mask[b,i] & attention_mask[b,h,i,j]
//               (& j <= i + causal_offset when causal, for any Q, K and signed offset)
//  5. attention = masked_softmax(scores, allowed)
//  6. output = concat_h(attention_h v_h) w_o (+ b_o)
//  7. a query with no allowed key in any head gets output exactly 0 (after b_o)
// A query with no allowed key in any head, a key no query may attend to in any head, and a masked
// bias entry have no effect on any output or gradient, whatever they hold (NaN and +-inf
// included); their own gradients are exactly 0.
// B, Q, K >= 1 and heads >= 1; D != Dv and Cq, Cctx, Cout all different are fine.
AttentionResult multihead_attention(const MhaActivations& activations, const MhaParameters& parameters,
                                    const MhaMasks& masks = {}, std::int64_t heads = 1, bool causal = false,
                                    std::int64_t causal_offset = 0, bool need_weights = true);

}  // namespace tapegrad
