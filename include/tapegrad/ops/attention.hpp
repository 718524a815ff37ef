// Scaled dot-product attention and the causal mask (docs/semantics.md §4 and §5).
#pragma once

#include <cstdint>
#include <string_view>

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
// tape node with a hand-written backward; gradients reach q, k and v, from both returned tensors.
// ops/attention_reference.cpp computes it as written here, its backward beside it (derived in
// docs/gradients.md §8); the faster paths that run it are tested against that reference.
AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& mask = Tensor());

// The output alone: attention(Q, K, V, mask) of docs/semantics.md §9. Computed fused, tile by
// tile over the keys, without ever forming the [..., Q, K] weights (beyond its inputs and output
// it keeps one number per query); same semantics, same output and gradients up to rounding.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask = Tensor());

// Which (query, key) pairs may attend, and ALiBi's position bias: one value that every attention
// call takes (scaled_dot_product_attention's options, multihead_attention's, the layer's calls)
// and one check validates (docs/semantics.md §14.1). Scores are [..., H, Q, K]; B is their dim 0.
struct AttentionMasking {
  Tensor mask{};                   // optional bool, broadcasts to [..., H, Q, K]; True = allowed
  Tensor key_mask{};               // optional bool [B, K]: keys no query of that batch entry may see
  Tensor query_mask{};             // optional bool [B, Q]: queries that attend to nothing (zero output)
  bool causal = false;             // key j allowed for query i only if j <= i + causal_offset
  std::int64_t causal_offset = 0;  // query i sits at position i + causal_offset (ALiBi's distances too)
  std::int64_t window = 0;         // > 0 (with causal): also j > i + causal_offset - window
  // Optional floating [H] (the activations' dtype, finite): ALiBi. Head h's scores get
  // -alibi_slopes[h] |i + causal_offset - j| added after the 1/sqrt(D) scaling, with
  // |causal_offset| <= 2^52; gradients reach the slopes when they require grad. alibi_slopes(H)
  // gives the paper's geometric slopes.
  Tensor alibi_slopes{};
};

// The variants of today's small language models, as options of one call (docs/semantics.md §14):
//   auto [out, w] = scaled_dot_product_attention(q, k, v, {.masking = {.causal = true, .window = 256}, .enable_gqa = true});
struct AttentionOptions {
  AttentionMasking masking{};
  // k and v with Hkv heads at dim -3 where q has H, Hkv dividing H: query head h reads key/value
  // head h / (H / Hkv) (grouped-query; Hkv = 1 is multi-query). Nothing of k or v is copied per
  // group; their gradients are summed over the group.
  bool enable_gqa = false;
  bool need_weights = false;  // true: also return the weights [..., H, Q, K] (else undefined)
};
AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options);

// The rules of attention's options that configs check too, written once: each throws ValueError
// "<who>: ..." naming the fields as the caller calls them ("config.window").
void check_window(std::string_view who, std::string_view name, std::int64_t window);  // window >= 0 (0: none)
// kv_heads >= 0 and, when > 0, dividing heads (0 means heads); `prefix` goes in front of both
// fields' names ("config.", "options.").
void check_kv_heads(std::string_view who, std::string_view prefix, std::int64_t heads, std::int64_t kv_heads);

// ALiBi's default slopes for `heads` heads: 2^(-8 (h + 1) / heads) when heads is a power of two;
// otherwise those of the largest power of two n below it, then every other slope of 2n for the
// remaining heads. float32 or float64 [heads].
Tensor alibi_slopes(std::int64_t heads, DType dtype = DType::float32);

// Bool [Q, K], True exactly where j <= i + offset (upper-left aligned for offset 0). Any integer
// offset: negative masks more, offset >= K - 1 allows everything.
Tensor causal_mask(std::int64_t queries, std::int64_t keys, std::int64_t offset = 0);

}  // namespace tapegrad
