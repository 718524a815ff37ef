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

// Keys and values of the positions decoded so far, for one layer and one batch. Appending is
// amortised O(1) per position: storage grows by doubling and is never re-copied per step. A
// layer with a window drops the keys that no later query can see when the buffer is full (the
// kept ones move to its front), instead of growing it: its capacity stays at most
// max(16, 2 (window - 1 + n)) for at most n positions per decode call (docs/semantics.md §14.4).
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
  friend class MultiHeadAttention;
  // k [B, n, Hkv*D], v [B, n, Hkv*Dv]. Positions before `keep_from` may be dropped first.
  void append(const Tensor& k, const Tensor& v, std::int64_t keep_from = 0);
  Tensor keys() const;  // views [B, held, Hkv*D]
  Tensor values() const;
  Tensor k_, v_;                              // [B, capacity, width]: positions start_ .. start_ + held_ - 1 at rows 0 ..
  std::int64_t start_ = 0, held_ = 0;
};

// Per-call options of MultiHeadAttention::forward and decode.
struct MhaCall {
  MhaMasks masks{};
  Tensor bias{};  // additive, broadcastable to [B, H, Q, K]
  bool causal = false;
  std::int64_t causal_offset = 0;
  bool need_weights = false;  // true: also return the attention weights [B, H, Q, K]
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

  // Incremental causal self-attention: projects `query` [B, n, Cq] (n new positions), appends
  // their keys and values to `cache`, and attends over every cached position with
  // causal_offset = the cache length L before this call (call.causal/causal_offset are ignored).
  // Masks and bias cover every position decoded so far, K = L + n, dropped ones included (only
  // the held keys' part is read); the returned weights cover the held keys, positions
  // cache.start() .. L + n - 1. Equal to the full causal forward over the whole sequence
  // (with the window and ALiBi too). Decoding is inference: it records nothing on the tape.
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
  MhaOptions options(bool causal, std::int64_t causal_offset, bool need_weights) const;
  MultiHeadAttentionConfig config_;
  MhaParameters params_;
  Tensor alibi_;
};

}  // namespace tapegrad
