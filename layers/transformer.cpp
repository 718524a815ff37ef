// TransformerBlock and Decoder: compositions of layers whose backward passes are their ops'.
#include "tapegrad/layers/transformer.hpp"

#include "layers/layer_support.hpp"
#include "tapegrad/autodiff/tape.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/inplace.hpp"
#include "tapegrad/ops/linear.hpp"
#include "tapegrad/ops/view.hpp"

namespace tapegrad {
namespace {

const TransformerBlockConfig& checked(const TransformerBlockConfig& c) {
  const char* layer = "TransformerBlock";
  detail::check_field(layer, "dim", c.dim);
  detail::check_field(layer, "heads", c.heads);
  detail::check_heads_divide(layer, c.heads, "dim", c.dim);
  detail::check_activation(layer, c.activation);
  detail::check_norm_kind(layer, "config.norm", c.norm);
  check_kv_heads(layer, "config.", c.heads, c.kv_heads);
  check_window(layer, "config.window", c.window);
  return c;
}

// Every field is checked here, so that an error names the Decoder's config rather than the
// layer inside it that would have found the problem: each field alone first, then the rules
// that relate fields.
const DecoderConfig& checked(const DecoderConfig& c) {
  const char* layer = "Decoder";
  detail::check_field(layer, "vocab", c.vocab);
  detail::check_enum(layer, "config.positions", c.positions, PositionKind::alibi,
                     "PositionKind::learned, PositionKind::sinusoidal, PositionKind::rotary or PositionKind::alibi");
  detail::check_activation(layer, c.activation);
  detail::check_norm_kind(layer, "config.norm", c.norm);
  if (c.positions == PositionKind::learned || c.positions == PositionKind::sinusoidal)
    detail::check_field(layer, "max_len", c.max_len, 1, " with learned or sinusoidal positions (the table's rows)");
  else
    detail::check_field(layer, "max_len", c.max_len, 0, " (0: no limit, with rotary or alibi positions)");
  detail::check_field(layer, "dim", c.dim);
  detail::check_field(layer, "heads", c.heads);
  detail::check_field(layer, "layers", c.layers);
  detail::check_field(layer, "hidden", c.hidden, 0);
  detail::check_float_dtype(layer, c.dtype);
  detail::check_heads_divide(layer, c.heads, "dim", c.dim);
  check_kv_heads(layer, "config.", c.heads, c.kv_heads);
  check_window(layer, "config.window", c.window);
  if (c.positions == PositionKind::rotary) check_rotary_options(c.rotary, c.dim / c.heads, layer, "config.rotary", "dim / heads");
  if (!(c.dropout >= 0 && c.dropout < 1)) detail::fail<ValueError>("Decoder: config.dropout must be in [0, 1), got {}", c.dropout);
  detail::checked_product(layer, "vocab", c.vocab, "dim", c.dim);
  detail::checked_product(layer, "max_len", c.max_len, "dim", c.dim);
  return c;
}

// ids must be int64 [B, T] with every id in [0, vocab) and, when max_len > 0, T <= max_len.
void check_ids(const char* op, const char* name, const Tensor& ids, std::int64_t vocab, std::int64_t max_len = 0) {
  detail::check_dtype(op, name, ids, DType::int64);
  if (ids.dim() != 2) detail::fail<ShapeError>("{}: argument '{}' must be [B, T], got shape {}", op, name, detail::shape_str(ids.shape()));
  const auto values = ids.to_vector<std::int64_t>();
  for (std::size_t i = 0; i < values.size(); ++i)
    if (values[i] < 0 || values[i] >= vocab)
      detail::fail<ValueError>("{}: argument '{}' holds id {} at flat position {}; ids must be in [0, {}) (config.vocab)", op, name,
                               values[i], i, vocab);
  if (max_len > 0 && ids.size(1) > max_len)
    detail::fail<ShapeError>("{}: argument '{}' has {} positions (shape {}), more than config.max_len = {}", op, name,
                             ids.size(1), detail::shape_str(ids.shape()), max_len);
}

std::variant<LearnedPositions, SinusoidalPositions, std::monostate> make_positions(const DecoderConfig& c) {
  const PositionsConfig p{.max_len = c.max_len, .dim = c.dim, .dtype = c.dtype, .seed = detail::child_seed(c.seed, 1)};
  if (c.positions == PositionKind::learned) return LearnedPositions(p);
  if (c.positions == PositionKind::sinusoidal) return SinusoidalPositions(p);
  return std::monostate{};
}

}  // namespace

TransformerBlock::TransformerBlock(const TransformerBlockConfig& config)
    : ln1(checked(config).norm, config.dim, config.dtype),
      attn({.query_dim = config.dim,
            .heads = config.heads,
            .kv_heads = config.kv_heads,
            .bias = config.bias,
            .dtype = config.dtype,
            .seed = detail::child_seed(config.seed, 0),
            .rotary = config.rotary,
            .window = config.window,
            .alibi = config.alibi}),
      drop(config.dropout, detail::child_seed(config.seed, 1)),
      ln2(config.norm, config.dim, config.dtype),
      ff({.dim = config.dim,
          .hidden = config.hidden,
          .activation = config.activation,
          .dropout = config.dropout,
          .bias = config.bias,
          .dtype = config.dtype,
          .seed = detail::child_seed(config.seed, 2)}) {}

Tensor TransformerBlock::forward(const Tensor& x, const Tensor& key_mask, Tensor* attention) const {
  const auto [a, weights] =
      attn.forward(ln1.forward(x), {.masking = {.key_mask = key_mask, .causal = true}, .need_weights = attention != nullptr});
  if (attention != nullptr) *attention = weights;
  const Tensor h = x + drop.forward(a);
  return h + ff.forward(ln2.forward(h));
}

Tensor TransformerBlock::decode(const Tensor& x, KVCache& cache) const {
  NoGradGuard no_grad;
  const Tensor h = x + drop.forward(attn.decode(ln1.forward(x), cache).output);
  return h + ff.forward(ln2.forward(h));
}

void TransformerBlock::visit(ModuleVisitor& v) {
  v.module("ln1", ln1);
  v.module("attn", attn);
  v.module("drop", drop);
  v.module("ln2", ln2);
  v.module("ff", ff);
}

Decoder::Decoder(const DecoderConfig& config)
    : tok({.vocab = checked(config).vocab, .dim = config.dim, .dtype = config.dtype, .seed = detail::child_seed(config.seed, 0)}),
      pos(make_positions(config)),
      ln_f(config.norm, config.dim, config.dtype),
      config_(config) {
  if (config.tie_embeddings) {
    NoGradGuard no_grad;
    mul_(tok.weight, 1.0 / std::sqrt(static_cast<double>(config.dim)));
  } else {
    head.emplace(LinearConfig{.in = config.dim, .out = config.vocab, .bias = config.bias, .dtype = config.dtype,
                              .seed = detail::child_seed(config.seed, 2)});
  }
  for (std::int64_t i = 0; i < config.layers; ++i)
    blocks.emplace_back(TransformerBlockConfig{.dim = config.dim,
                                               .heads = config.heads,
                                               .hidden = config.hidden,
                                               .activation = config.activation,
                                               .dropout = config.dropout,
                                               .norm = config.norm,
                                               .bias = config.bias,
                                               .dtype = config.dtype,
                                               .seed = detail::child_seed(config.seed, 100 + static_cast<std::uint64_t>(i)),
                                               .rotary = config.positions == PositionKind::rotary
                                                             ? std::optional<RotaryOptions>(config.rotary)
                                                             : std::nullopt,
                                               .kv_heads = config.kv_heads,
                                               .window = config.window,
                                               .alibi = config.positions == PositionKind::alibi ? Alibi::fixed : Alibi::none});
}

Tensor Decoder::embed(const Tensor& ids, std::int64_t offset) const {
  const Tensor x = tok.forward(ids);
  if (const auto* learned = std::get_if<LearnedPositions>(&pos)) return learned->forward(x, offset);
  if (const auto* sinusoidal = std::get_if<SinusoidalPositions>(&pos)) return sinusoidal->forward(x, offset);
  return x;  // rotary, alibi: the blocks' attention reads positions instead
}

Tensor Decoder::forward(const Tensor& ids) const {
  check_ids("Decoder::forward", "ids", ids, config_.vocab, config_.max_len);
  Tensor x = embed(ids, 0);
  for (const auto& b : blocks) x = b.forward(x);
  return logits(x);
}

Tensor Decoder::logits(const Tensor& h) const {
  const Tensor x = ln_f.forward(h);
  return head ? head->forward(x) : linear(x, transpose(tok.weight, 0, 1), Tensor());
}

Tensor Decoder::generate(const Tensor& prompt, const GenerateOptions& o) const {
  const char* op = "Decoder::generate";
  check_ids(op, "prompt", prompt, config_.vocab);
  Generator gen(o.seed);
  Cache cache = start_cache();
  return detail::generate_tokens(
      op, prompt, o, gen, {config_.max_len, "config.max_len"}, [&] { cache = start_cache(); }, [&](const Tensor& ids) { return decode_step(ids, cache); });
}

Tensor Decoder::decode_step(const Tensor& ids, Cache& cache) const {
  const char* op = "Decoder::decode_step";
  check_ids(op, "ids", ids, config_.vocab);
  if (cache.size() != blocks.size())
    detail::fail<ValueError>("{}: argument 'cache' holds {} KV caches; the model has {} blocks (use start_cache())", op, cache.size(),
                             blocks.size());
  NoGradGuard no_grad;
  Tensor x = embed(ids, cache.empty() ? 0 : cache[0].length());
  for (std::size_t i = 0; i < blocks.size(); ++i) x = blocks[i].decode(x, cache[i]);
  return logits(select(x, 1, -1));
}

std::vector<Tensor> Decoder::attention_weights(const Tensor& ids) const {
  NoGradGuard no_grad;
  check_ids("Decoder::attention_weights", "ids", ids, config_.vocab, config_.max_len);
  std::vector<Tensor> out(blocks.size());
  Tensor x = embed(ids, 0);
  for (std::size_t i = 0; i < blocks.size(); ++i) x = blocks[i].forward(x, Tensor(), &out[i]);
  return out;
}

void Decoder::visit(ModuleVisitor& v) {
  v.module("tok", tok);
  if (auto* learned = std::get_if<LearnedPositions>(&pos)) v.module("pos", *learned);
  if (auto* sinusoidal = std::get_if<SinusoidalPositions>(&pos)) v.module("pos", *sinusoidal);
  v.modules("blocks", blocks);
  v.module("ln_f", ln_f);
  if (head) v.module("head", *head);
}

}  // namespace tapegrad
