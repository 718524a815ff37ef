// Scaled dot-product attention and the causal mask (docs/semantics.md §4 and §5).
#pragma once

#include <cstdint>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

// The two results of attention; usable with structured bindings: auto [out, w] = ...
struct AttentionResult {
  Tensor output;   // [..., Q, Dv]
  Tensor weights;  // [..., Q, K]
};

// q[..., Q, D], k[..., K, D], v[..., K, Dv] with D >= 1, leading dims broadcast among the three
// (rank 2 is plain attention(Q, K, V, mask)). `mask` (optional, bool, True = allowed) broadcasts to
// [..., Q, K].
//   weights = masked_softmax(q k^T / sqrt(D), mask) over keys;  output = weights v.
// A query with no allowed key gets exactly zero weights and output, and zero gradients. A weight
// of exactly zero contributes nothing: a key masked for every query, and a query with no allowed
// key, have no effect on any output or gradient whatever their k, v or q hold (NaN and +-inf
// included); a non-finite key that some query may attend to affects exactly those queries. One
// tape node with a hand-written backward (see docs/gradients.md); gradients reach q, k and v,
// from both returned tensors.
AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& mask = Tensor());

// The output alone: attention(Q, K, V, mask) of docs/semantics.md §9. Computed fused, tile by
// tile over the keys, without ever forming the [..., Q, K] weights (beyond its inputs and output
// it keeps one number per query); same semantics, same output and gradients up to rounding.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask = Tensor());

// Bool [Q, K], True exactly where j <= i + offset (upper-left aligned for offset 0). Any integer
// offset: negative masks more, offset >= K - 1 allows everything.
Tensor causal_mask(std::int64_t queries, std::int64_t keys, std::int64_t offset = 0);

}  // namespace tapegrad
