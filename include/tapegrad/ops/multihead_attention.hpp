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
#include <optional>
#include <vector>

#include "tapegrad/autodiff/tensor.hpp"
#include "tapegrad/ops/attention.hpp"
#include "tapegrad/ops/rotary.hpp"

namespace tapegrad {
namespace detail {
struct KVCacheAccess;
}  // namespace detail

struct MhaActivations {
  Tensor query;      // [B, Q, Cq]
  Tensor context{};  // [B, K, Cctx]; decoding (with a KVCache) takes its keys from query
  Tensor bias{};     // optional additive floating bias, broadcastable to [B, H, Q, K]
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
//   multihead_attention(act, par, {.heads = 8, .kv_heads = 2, .masking = {.causal = true, .window = 256}});
struct MhaOptions {
  std::int64_t heads = 1;     // H, >= 1
  std::int64_t kv_heads = 0;  // Hkv, dividing H (0: H). w_k is [Cctx, Hkv*D], w_v [Cctx, Hkv*Dv],
                              // b_k and b_v likewise; query head h reads key/value head h / (H / Hkv)
  // Steps 3-4: the masks (mask broadcasts to [B, H, Q, K], one entry per query head; key_mask
  // [B, K]; query_mask [B, Q]), the causal rule, the window and ALiBi's slopes [H].
  AttentionMasking masking{};
  // Rotary positions (ops/rotary.hpp) on each head's q and k after step 2: key j at position j,
  // query i at causal_offset + i (decoding: both at their absolute positions L + i).
  std::optional<RotaryOptions> rotary{};
  bool need_weights = false;  // true: also return the attention [B, H, Q, K] (else undefined, heads fused)
};
// The same computation with those options; with MhaMasks' fields in `masking` and the defaults
// otherwise it is the call above (which returns the attention).
AttentionResult multihead_attention(const MhaActivations& activations, const MhaParameters& parameters, const MhaOptions& options);

// Keys and values of the positions decoded so far, for one attention layer and one batch: what
// the decoding form of multihead_attention below reads and appends to. Appending is amortised
// O(1) per position: storage grows by doubling and is never re-copied per step. With a window,
// the keys that no later query can see are dropped when the buffer is full (the kept ones move to
// its front), instead of growing it: its capacity stays at most max(16, 2 (window - 1 + n)) for
// at most n positions per call (docs/semantics.md §14.4).
//
// A copy is deep: it gets buffers of its own holding the cached positions, so decoding on a copy
// (to branch a beam, say) leaves the original exactly as it was. Copying costs one pass over the
// cached keys and values. A move takes the buffers and leaves the source empty (length 0, no
// storage), ready for a new sequence.
class KVCache {
 public:
  KVCache() = default;
  KVCache(const KVCache& other);
  KVCache& operator=(const KVCache& other);
  KVCache(KVCache&& other) noexcept;
  KVCache& operator=(KVCache&& other) noexcept;
  ~KVCache() = default;

  // Positions decoded so far (the next call's first position), dropped ones included.
  std::int64_t length() const noexcept { return start_ + held_; }
  // The first position still held (0 unless a window dropped older ones); held() positions follow it.
  std::int64_t start() const noexcept { return start_; }
  std::int64_t held() const noexcept { return held_; }
  std::int64_t capacity() const noexcept { return k_.defined() ? k_.size(1) : 0; }
  // Width of one cached position's keys and values: kv_heads * head_dim, kv_heads * value_head_dim.
  std::int64_t key_width() const noexcept { return k_.defined() ? k_.size(2) : 0; }
  std::int64_t value_width() const noexcept { return v_.defined() ? v_.size(2) : 0; }
  // Forgets every position but keeps the storage for the next sequence of the same shape.
  void clear() noexcept { start_ = held_ = 0; }

 private:
  friend struct detail::KVCacheAccess;
  // The first position held after appending n positions with those before keep_from droppable.
  std::int64_t start_after(std::int64_t n, std::int64_t keep_from) const noexcept;
  // k [B, n, Hkv*D], v [B, n, Hkv*Dv]. Positions before `keep_from` may be dropped first.
  void append(const Tensor& k, const Tensor& v, std::int64_t keep_from = 0);
  Tensor keys() const;  // views [B, held, Hkv*D]
  Tensor values() const;
  Tensor k_, v_;  // [B, capacity, width]: positions start_ .. start_ + held_ - 1 at rows 0 ..
  std::int64_t start_ = 0, held_ = 0;
};

// Incremental causal self-attention, the decoding form of the call above: `query` [B, n, Cq]
// holds the n positions L .. L + n - 1 that follow the L = cache.length() positions decoded so
// far. Their keys and values (projected, and rotated by absolute position with options.rotary)
// are appended to `cache`, and query i attends to every held position up to its own, L + i: the
// causal rule with offset L, which the call sets (options.masking.causal is implied and its
// causal_offset must be 0). The window, the slopes and the masks apply as in the call above; the
// masks and the bias cover every position decoded so far, K = L + n, dropped ones included (only
// the held keys' part is read), and the returned weights cover the held keys, positions
// cache.start() .. L + n - 1. Nothing is appended when the call is refused. Equal to the full
// causal call over the whole sequence, whose steps it runs. Decoding is inference: it records
// nothing on the tape.
AttentionResult multihead_attention(const MhaActivations& activations, const MhaParameters& parameters, const MhaOptions& options,
                                    KVCache& cache);

}  // namespace tapegrad
