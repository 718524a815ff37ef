// Internal: the pieces of multihead_attention that the MultiHeadAttention layer's cached
// decoding reuses (it projects only the new positions, then attends over the cache).
#pragma once

#include <cstdint>

#include "layers/attention_mask.hpp"
#include "tapegrad/layers/multihead_attention.hpp"

namespace tapegrad::detail {

struct MhaShapes {
  const char* op;  // the public function being run, for error messages and the tape node's name
  std::int64_t b, q, k, h, d, dv, cout;
};

// Validates everything but the context tensor itself (the layer's cache stands in for it), for
// a context of `context_length` positions.
MhaShapes check_mha(const char* op, const MhaActivations& a, const MhaParameters& p, const MhaMasks& m, std::int64_t heads,
                    std::int64_t context_length);

// multihead_attention, with errors that name `op` (the layer's forward runs it too).
AttentionResult multihead_attention(const char* op, const MhaActivations& a, const MhaParameters& p, const MhaMasks& m,
                                    std::int64_t heads, bool causal, std::int64_t causal_offset, bool need_weights);

// x w (+ b)
Tensor project(const Tensor& x, const Tensor& w, const Tensor& b);
// x [B, L, C] with the rows where `rows` [B, L] is false set to 0 (selected: NaN is dropped too);
// x itself when `rows` is undefined.
Tensor rows_where(const Tensor& rows, const Tensor& x);

// Step 4: which (query, key) pairs may attend, and which queries and keys take part at all.
struct AllowedPairs {
  AttentionMask mask;  // the masks and the causal rule, described (never a [B, H, Q, K] tensor)
  Tensor active;       // bool [B, Q]: the query has an allowed key in some head; undefined when all do
  Tensor used;         // bool [B, K]: some query may attend to the key in some head; undefined when all are
};
AllowedPairs allowed_pairs(const MhaMasks& m, const MhaShapes& s, bool causal, std::int64_t causal_offset);

// Steps 2-7 of multihead_attention from projected q [B, Q, H*D], k [B, K, H*D], v [B, K, H*Dv].
// Without need_weights the attention runs fused and the returned weights are undefined.
AttentionResult attend_projected(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias, const MhaParameters& p,
                                 const AllowedPairs& allowed, const MhaShapes& s, bool need_weights);

}  // namespace tapegrad::detail
