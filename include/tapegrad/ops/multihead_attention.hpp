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

// Returns output [B, Q, Cout] and the attention [B, H, Q, K] (AttentionResult::weights). With
// need_weights = false the attention is left undefined and is never formed: the heads run fused,
// block by block over the keys (memory O(B H Q) on top of the activations instead of
// O(B H Q K)); the output and every gradient are the same up to float rounding.
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

// The attention variants of small language models (docs/semantics.md §14.3), as options:
//   multihead_attention(act, par, masks, {.heads = 8, .kv_heads = 2, .causal = true, .window = 256});
struct MhaOptions {
  std::int64_t heads = 1;          // H, >= 1
  std::int64_t kv_heads = 0;       // Hkv, dividing H (0: H). w_k is [Cctx, Hkv*D], w_v [Cctx, Hkv*Dv],
                                   // b_k and b_v likewise; query head h reads key/value head h / (H / Hkv)
  bool causal = false;             // step 4's causal rule
  std::int64_t causal_offset = 0;  // query i sits at position causal_offset + i, key j at j
  std::int64_t window = 0;         // > 0 (with causal only): also j > i + causal_offset - window
  // Optional floating [H] (query's dtype): ALiBi. Head h's scores get -alibi_slopes[h] |i +
  // causal_offset - j| added in step 3; gradients reach the slopes when they require grad.
  Tensor alibi_slopes{};
  bool need_weights = true;  // false: fused heads, attention undefined (as above)
};
// The same computation with those options; with their defaults it is the call above.
// bias and attention_mask still broadcast to [B, H, Q, K], one entry per query head.
AttentionResult multihead_attention(const MhaActivations& activations, const MhaParameters& parameters, const MhaMasks& masks,
                                    const MhaOptions& options);

}  // namespace tapegrad
