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

struct MultiHeadAttentionConfig {
  std::int64_t query_dim = 0;       // Cq (required)
  std::int64_t heads = 1;           // H
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
};

// Keys and values of the positions decoded so far, for one layer and one batch. Appending is
// amortised O(1) per position: storage grows by doubling and is never re-copied per step.
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

  std::int64_t length() const noexcept { return length_; }
  std::int64_t capacity() const noexcept { return k_.defined() ? k_.size(1) : 0; }
  // Forgets every position but keeps the storage for the next sequence of the same shape.
  void clear() noexcept { length_ = 0; }

 private:
  friend class MultiHeadAttention;
  void append(const Tensor& k, const Tensor& v);  // [B, n, H*D], [B, n, H*Dv]
  Tensor keys() const;                            // views [B, length, H*D]
  Tensor values() const;
  Tensor k_, v_;  // [B, capacity, width]
  std::int64_t length_ = 0;
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
  // causal_offset = the cache length before this call (call.causal/causal_offset are ignored;
  // masks and bias must cover all cached keys). Equal to the full causal forward over the
  // whole sequence. Decoding is inference: it records nothing on the tape.
  AttentionResult decode(const Tensor& query, KVCache& cache, const Call& call = Call{}) const;

  // Parameters, named "w_q", "w_k", "w_v", "w_o" and, with config.bias, "b_q", "b_k", "b_v",
  // "b_o". They are leaves that require grad; update them in place (ops/inplace.hpp).
  void visit(ModuleVisitor& v) override;
  const MhaParameters& weights() const noexcept { return params_; }
  const MultiHeadAttentionConfig& config() const noexcept { return config_; }

 private:
  MultiHeadAttentionConfig config_;
  MhaParameters params_;
};

}  // namespace tapegrad
