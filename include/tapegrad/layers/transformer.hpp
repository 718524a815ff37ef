// A pre-norm transformer block and a small decoder-only language model built from the layers.
//
//   TransformerBlock:  h = x + drop(attn(ln1(x)))      causal self-attention
//                      y = h + ff(ln2(h))              ff ends in its own dropout
//   Decoder:           logits = head(ln_f(blocks(tok(ids) + pos)))
// The defaults are GPT's (LayerNorm, GELU, biases, a head of its own); Llama's choices are
// NormKind::rms, Activation::swiglu, bias = false, rotary positions and kv_heads < heads.
#pragma once

#include <cstdint>
#include <optional>
#include <variant>
#include <vector>

#include "tapegrad/layers/embedding.hpp"
#include "tapegrad/layers/feed_forward.hpp"
#include "tapegrad/layers/generate.hpp"
#include "tapegrad/layers/linear.hpp"
#include "tapegrad/layers/module.hpp"
#include "tapegrad/layers/multihead_attention.hpp"
#include "tapegrad/layers/norm.hpp"
#include "tapegrad/layers/positions.hpp"

namespace tapegrad {

struct TransformerBlockConfig {
  std::int64_t dim = 0;     // required, >= 1
  std::int64_t heads = 1;   // must divide dim
  std::int64_t hidden = 0;  // feed-forward width; 0: FeedForwardConfig's default for the activation
  Activation activation = Activation::gelu;
  double dropout = 0.0;  // after attention and after the feed-forward network
  NormKind norm = NormKind::layer;  // ln1 and ln2
  bool bias = true;                 // the attention's and the feed-forward network's biases
  DType dtype = float32;
  std::uint64_t seed = 0;
  std::optional<RotaryOptions> rotary{};  // the attention's (MultiHeadAttentionConfig::rotary)
  std::int64_t kv_heads = 0;              // the attention's key/value heads (0: heads; must divide heads)
  std::int64_t window = 0;                // > 0: sliding-window attention over this many positions
  Alibi alibi = Alibi::none;              // the attention's ALiBi
};

class TransformerBlock : public Module {
 public:
  explicit TransformerBlock(const TransformerBlockConfig& config);
  // x [B, T, dim] -> [B, T, dim], position i attending to positions <= i. `key_mask` [B, T]
  // (optional) marks padding positions false. With `attention`, also stores the attention
  // weights [B, heads, T, T] there.
  Tensor forward(const Tensor& x, const Tensor& key_mask = Tensor(), Tensor* attention = nullptr) const;
  // The same block over n new positions, attending to every earlier position through `cache`
  // (see MultiHeadAttention::decode). Inference: records nothing.
  Tensor decode(const Tensor& x, KVCache& cache) const;
  void visit(ModuleVisitor& v) override;

  Norm ln1;
  MultiHeadAttention attn;
  Dropout drop;
  Norm ln2;
  FeedForward ff;
};

// learned and sinusoidal add a table to the token embeddings; rotary adds nothing and has every
// block's attention rotate q and k instead (DecoderConfig::rotary), which needs an even
// dim / heads unless rotary.rotary_dim says fewer channels; alibi adds nothing and gives every
// block's attention ALiBi's fixed slopes (Alibi::fixed).
enum class PositionKind { learned, sinusoidal, rotary, alibi };

struct DecoderConfig {
  std::int64_t vocab = 0;    // required, >= 1
  // Longest sequence, prompt plus generated tokens: required (>= 1) with learned and sinusoidal
  // positions, whose table it sizes; with rotary and alibi, 0 means no limit.
  std::int64_t max_len = 0;
  std::int64_t dim = 0;      // required, >= 1
  std::int64_t heads = 1;
  std::int64_t layers = 1;  // >= 1
  std::int64_t hidden = 0;  // 0: FeedForwardConfig's default for the activation
  Activation activation = Activation::gelu;
  double dropout = 0.0;
  PositionKind positions = PositionKind::learned;
  NormKind norm = NormKind::layer;  // every block's and ln_f
  bool bias = true;                 // every Linear's: attention, feed-forward networks, head
  // The head uses tok's table transposed, logits = h tok.weight^T: one parameter, "tok.weight",
  // trained by both uses and saved once; no head bias. tok's table is then drawn N(0, 1 / dim)
  // rather than N(0, 1), so that the first logits are of order 1.
  bool tie_embeddings = false;
  DType dtype = float32;
  std::uint64_t seed = 0;
  RotaryOptions rotary{};  // with PositionKind::rotary only
  std::int64_t kv_heads = 0;  // key/value heads of every block's attention (0: heads; must divide heads)
  std::int64_t window = 0;    // > 0: every block attends to the last `window` positions only
};

class Decoder : public Module {
 public:
  explicit Decoder(const DecoderConfig& config);
  // ids int64 [B, T] with T <= max_len (when not 0) -> logits [B, T, vocab].
  Tensor forward(const Tensor& ids) const;
  // The last block's output h [..., dim] -> logits [..., vocab]: ln_f, then the head (or the
  // tied table).
  Tensor logits(const Tensor& h) const;
  // generate(*this, prompt, options, gen) with gen = Generator(options.seed), the prompt's ids
  // checked against config.vocab and, without options.restart_after, its length plus new_tokens
  // against config.max_len. Inference (records nothing); dropout follows the module's mode, so
  // call eval() first.
  Tensor generate(const Tensor& prompt, const GenerateOptions& options) const;
  // The model as generate() runs it (CachedModel): a KV cache per block, and ids int64 [B, n]
  // after the cache's positions -> the logits [B, vocab] of the position after the last.
  using Cache = std::vector<KVCache>;
  Cache start_cache() const { return Cache(blocks.size()); }
  Tensor decode_step(const Tensor& ids, Cache& cache) const;
  // config.max_len: with a position table, the most positions a cache may hold (0: no limit).
  std::int64_t max_positions() const { return config_.max_len; }
  // Every block's attention weights [B, heads, T, T] for ids [B, T], in block order (records
  // nothing): what each position looked at.
  std::vector<Tensor> attention_weights(const Tensor& ids) const;
  void visit(ModuleVisitor& v) override;
  const DecoderConfig& config() const noexcept { return config_; }

  Embedding tok;
  std::variant<LearnedPositions, SinusoidalPositions, std::monostate> pos;  // monostate: rotary, alibi
  std::vector<TransformerBlock> blocks;
  Norm ln_f;
  std::optional<Linear> head;  // "head"; empty with tie_embeddings

 private:
  Tensor embed(const Tensor& ids, std::int64_t offset) const;
  DecoderConfig config_;
};

}  // namespace tapegrad
