// The MultiHeadAttention layer: owns w_q, w_k, w_v, w_o (and optional biases), initialised from
// a seed, and calls multihead_attention. Self-attention and cross-attention (a context of
// another width) both work. A KVCache turns it into an incremental decoder.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "tapegrad/layers/module.hpp"
#include "tapegrad/ops/multihead_attention.hpp"
#include "tapegrad/ops/rotary.hpp"

namespace tapegrad {

// ALiBi in the layer: none, the default slopes alibi_slopes(heads) kept fixed (a buffer, not a
// parameter), or those slopes as a parameter "alibi_slopes" that trains with the weights.
enum class Alibi { none, fixed, learnable };

struct MultiHeadAttentionConfig {
  std::int64_t query_dim = 0;       // Cq (required)
  std::int64_t heads = 1;           // H
  // Hkv, key/value heads (grouped-query attention; 1 is multi-query): 0 means heads, else it must
  // divide heads. w_k is [context_dim, Hkv*D], w_v [context_dim, Hkv*Dv], and the KV cache holds
  // Hkv heads per position.
  std::int64_t kv_heads = 0;
  std::int64_t context_dim = 0;     // Cctx; 0 means query_dim (self-attention)
  std::int64_t head_dim = 0;        // D; 0 means query_dim / heads
  std::int64_t value_head_dim = 0;  // Dv; 0 means head_dim
  std::int64_t out_dim = 0;         // Cout; 0 means query_dim
  bool bias = true;                 // b_q, b_k, b_v, b_o
  DType dtype = float32;
  std::uint64_t seed = 0;
  // Rotary position embeddings (ops/rotary.hpp) on each head's q and k after projection:
  // query i at position causal_offset + i, key j at position j; in decode, the cache length
  // before the call plus i for both. rotary_dim (0: all of head_dim) must be even and <= head_dim.
  std::optional<RotaryOptions> rotary{};
  // > 0: sliding-window attention in causal calls and decode: the query at position p sees the
  // keys at p - window < j <= p (non-causal calls ignore it). decode drops keys that fell out of
  // the window from its cache (KVCache::start()), so the cache stays O(window) long.
  std::int64_t window = 0;
  // ALiBi: each head's scores get -slope_h |i + causal_offset - j| (docs/semantics.md §14.1).
  Alibi alibi = Alibi::none;
};

// Per-call options of MultiHeadAttention::forward and decode. The layer's config adds its window
// (to causal calls) and its ALiBi slopes to `masking`; a call that sets either one as well must
// agree with the config (a ValueError otherwise).
struct MhaCall {
  AttentionMasking masking{};  // mask broadcasts to [B, H, Q, K], key_mask [B, K], query_mask [B, Q]
  Tensor bias{};               // additive, broadcastable to [B, H, Q, K]
  bool need_weights = false;   // true: also return the attention weights [B, H, Q, K]
};

class MultiHeadAttention : public Module {
 public:
  // Weights are Xavier-uniform, U(-a, a) with a = sqrt(6 / (fan_in + fan_out)), drawn from
  // Generator(seed) in the order w_q, w_k, w_v, w_o; biases start at zero (as PyTorch's
  // MultiheadAttention initialises its input projection).
  explicit MultiHeadAttention(const MultiHeadAttentionConfig& config);

  using Call = MhaCall;

  AttentionResult forward(const Tensor& query, const Tensor& context, const Call& call) const;
  AttentionResult forward(const Tensor& query, const Tensor& context) const { return forward(query, context, Call{}); }
  // Self-attention, forward(x, x, call): forward(x, {.causal = true}) is a causal layer.
  AttentionResult forward(const Tensor& x, const Call& call = Call{}) const;  // errors name 'x'
  // Each input is checked against the config first: a query or context of the wrong rank,
  // width or dtype is reported as such (against config.query_dim, context_dim or dtype).

  // Incremental causal self-attention: multihead_attention's decoding form with this layer's
  // weights and config. `query` [B, n, Cq] holds the n positions after the cache's L; their keys
  // and values are appended to `cache`, and query i attends to every held position up to L + i
  // (call.masking.causal is implied, its causal_offset must be 0). Masks and bias cover every
  // position decoded so far, K = L + n, dropped ones included; the returned weights cover the
  // held keys, positions cache.start() .. L + n - 1. Equal to the full causal forward over the
  // whole sequence (with the window, ALiBi and rotary too). Records nothing on the tape.
  AttentionResult decode(const Tensor& query, KVCache& cache, const Call& call = Call{}) const;

  // Parameters, named "w_q", "w_k", "w_v", "w_o" and, with config.bias, "b_q", "b_k", "b_v",
  // "b_o", then "alibi_slopes" with Alibi::learnable. They are leaves that require grad; update
  // them in place (ops/inplace.hpp).
  void visit(ModuleVisitor& v) override;
  const MhaParameters& weights() const noexcept { return params_; }
  // ALiBi's slopes [heads] (a parameter with Alibi::learnable), undefined with Alibi::none.
  const Tensor& alibi_slopes() const noexcept { return alibi_; }
  const MultiHeadAttentionConfig& config() const noexcept { return config_; }

 private:
  MhaOptions options(const Call& call, const char* op) const;
  MultiHeadAttentionConfig config_;
  MhaParameters params_;
  Tensor alibi_;
};

}  // namespace tapegrad
