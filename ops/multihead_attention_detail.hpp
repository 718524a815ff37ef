// Internal: the pieces of multihead_attention that the MultiHeadAttention layer's cached
// decoding reuses (it projects only the new positions, then attends over the cache).
#pragma once

#include <cstdint>

#include "kernels/attention_mask.hpp"
#include "tapegrad/ops/multihead_attention.hpp"
#include "tapegrad/ops/rotary.hpp"

namespace tapegrad::detail {

struct MhaShapes {
  const char* op;  // the public function being run, for error messages and the tape node's name
  std::int64_t b, q, k, h, d, dv, cout;
  std::int64_t hkv = 0;  // key/value heads, dividing h
};

// Validates everything but the context tensor itself (the layer's cache stands in for it), for
// a context of `context_length` positions, and the options (heads, kv_heads, window, slopes).
MhaShapes check_mha(const char* op, const MhaActivations& a, const MhaParameters& p, const MhaMasks& m, const MhaOptions& o,
                    std::int64_t context_length);

// multihead_attention, with errors that name `op` (the layer's forward runs it too). With
// `rotary`, q and k are rotated per head after step 2 (the layer's option; the function has
// none): query i at position causal_offset + i, key j at position j.
AttentionResult multihead_attention(const char* op, const MhaActivations& a, const MhaParameters& p, const MhaMasks& m,
                                    const MhaOptions& o, const RotaryOptions* rotary = nullptr);
// int64 [n]: first, first + 1, ... (saturating at INT64_MAX, which rotary then refuses by name).
Tensor positions_from(std::int64_t first, std::int64_t n);

// x w (+ b)
Tensor project(const Tensor& x, const Tensor& w, const Tensor& b);
// [B, L, H*W] -> [B, H, L, W]: a view.
Tensor split_heads(const Tensor& x, std::int64_t heads);

// Steps 1-2 as one tape node (ops/multihead_attention_projections.cpp): x [B, L, C] w [C, H*W] (+ b [H*W]),
// returned as [B, H, L, W], a view of the [B, L, H*W] product. Follows the matmul precision.
Tensor project_heads(const char* op, const Tensor& x, const Tensor& w, const Tensor& b, std::int64_t heads);
// Step 6 as one tape node: o [B, H, Q, Dv] with its heads concatenated, times w [H*Dv, Cout]
// (+ b [Cout]): [B, Q, Cout].
Tensor merge_heads_project(const char* op, const Tensor& o, const Tensor& w, const Tensor& b);
// x [B, L, C] with the rows where `rows` [B, L] is false set to 0 (selected: NaN is dropped too);
// x itself when `rows` is undefined.
Tensor rows_where(const Tensor& rows, const Tensor& x);

// Step 4: which (query, key) pairs may attend, and which queries and keys take part at all.
struct AllowedPairs {
  AttentionMask mask;  // the masks, the causal rule and the window, described (never a [B, H, Q, K] tensor)
  Tensor active;       // bool [B, Q]: the query has an allowed key in some head; undefined when all do
  Tensor used;         // bool [B, K]: some query may attend to the key in some head; undefined when all are
};
// The window applies with causal only (check_mha refuses one without).
AllowedPairs allowed_pairs(const MhaMasks& m, const MhaShapes& s, const MhaOptions& o);

// Steps 3-7 of multihead_attention from projected heads q [B, H, Q, D], k [B, Hkv, K, D], v [B, Hkv, K, Dv]
// (grouped as views when Hkv < H), with o's slopes. Without need_weights the attention runs fused
// and the returned weights are undefined.
AttentionResult attend_projected(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias, const MhaParameters& p,
                                 const AllowedPairs& allowed, const MhaShapes& s, const MhaOptions& o);

}  // namespace tapegrad::detail
