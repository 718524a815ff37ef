// TransformerBlock and Decoder: compositions of layers whose backward passes are their ops'.
#include "tapegrad/layers/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <type_traits>

#include "layers/layer_support.hpp"
#include "tapegrad/autodiff/tape.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/inplace.hpp"
#include "tapegrad/ops/linear.hpp"
#include "tapegrad/ops/view.hpp"

namespace tapegrad {
namespace {

const TransformerBlockConfig& checked(const TransformerBlockConfig& c) {
  detail::check_field("TransformerBlock", "dim", c.dim);
  detail::check_field("TransformerBlock", "heads", c.heads);
  detail::check_heads_divide("TransformerBlock", c.heads, "dim", c.dim);
  check_kv_heads("TransformerBlock", "config.", c.heads, c.kv_heads);
  check_window("TransformerBlock", "config.window", c.window);
  return c;
}

// Every field is checked here, so that an error names the Decoder's config rather than the
// layer inside it that would have found the problem.
const DecoderConfig& checked(const DecoderConfig& c) {
  const char* layer = "Decoder";
  detail::check_field(layer, "vocab", c.vocab);
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

// ids must be int64 [B, T] with every id in [0, vocab) (T checked by the caller).
void check_ids(const char* op, const char* name, const Tensor& ids, std::int64_t vocab) {
  detail::check_dtype(op, name, ids, DType::int64);
  if (ids.dim() != 2) detail::fail<ShapeError>("{}: argument '{}' must be [B, T], got shape {}", op, name, detail::shape_str(ids.shape()));
  const auto values = ids.to_vector<std::int64_t>();
  for (std::size_t i = 0; i < values.size(); ++i)
    if (values[i] < 0 || values[i] >= vocab)
      detail::fail<ValueError>("{}: argument '{}' holds id {} at flat position {}; ids must be in [0, {}) (config.vocab)", op, name,
                               values[i], i, vocab);
}

std::variant<LearnedPositions, SinusoidalPositions, std::monostate> make_positions(const DecoderConfig& c) {
  const PositionsConfig p{.max_len = c.max_len, .dim = c.dim, .dtype = c.dtype, .seed = detail::child_seed(c.seed, 1)};
  if (c.positions == PositionKind::learned) return LearnedPositions(p);
  if (c.positions == PositionKind::sinusoidal) return SinusoidalPositions(p);
  return std::monostate{};
}

// The next token of one row: argmax at temperature 0, otherwise a draw from
// softmax(logits / temperature) restricted to the top_k largest logits.
std::int64_t pick(std::vector<double> logits, const GenerateOptions& o, Generator& gen) {
  const auto v = static_cast<std::int64_t>(logits.size());
  if (o.temperature == 0) return std::max_element(logits.begin(), logits.end()) - logits.begin();
  std::vector<std::int64_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const std::int64_t k = o.top_k > 0 ? std::min(o.top_k, v) : v;
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](auto a, auto b) { return logits[a] > logits[b]; });
  const double top = logits[static_cast<std::size_t>(order[0])];
  std::vector<double> p(static_cast<std::size_t>(k));
  double z = 0;
  for (std::int64_t i = 0; i < k; ++i) z += p[i] = std::exp((logits[static_cast<std::size_t>(order[i])] - top) / o.temperature);
  double u = gen.uniform() * z;
  for (std::int64_t i = 0; i < k; ++i)
    if ((u -= p[i]) < 0) return order[i];
  return order[k - 1];  // u landed on the rounding error at the end
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
  const Tensor a = attn.decode(ln1.forward(x), cache).output;
  const Tensor h = x + drop.forward(a);
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
  return std::visit(
      [&]<class P>(const P& p) {
        if constexpr (std::is_same_v<P, std::monostate>)
          return x;  // rotary, alibi: the blocks' attention reads positions instead
        else
          return p.forward(x, offset);
      },
      pos);
}

Tensor Decoder::forward(const Tensor& ids) const {
  check_ids("Decoder::forward", "ids", ids, config_.vocab);
  if (config_.max_len > 0 && ids.size(1) > config_.max_len)
    detail::fail<ShapeError>("Decoder::forward: argument 'ids' has {} positions (shape {}), more than config.max_len = {}", ids.size(1),
                             detail::shape_str(ids.shape()), config_.max_len);
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
  if (prompt.size(1) < 1)
    detail::fail<ShapeError>("{}: argument 'prompt' must be [B, T0] with T0 >= 1, got shape {}", op, detail::shape_str(prompt.shape()));
  const bool bounded = config_.max_len > 0;  // 0: rotary or alibi positions, no limit
  if (o.restart_after < 0 || o.restart_after == 1 || (bounded && o.restart_after > config_.max_len))
    detail::fail<ValueError>("{}: options.restart_after must be 0 (no limit) or {}, got {}", op,
                             bounded ? fmt::format("in [2, config.max_len = {}]", config_.max_len) : std::string(">= 2"), o.restart_after);
  if (o.restart_after > 0 && prompt.size(1) >= o.restart_after)
    detail::fail<ValueError>("{}: the prompt's {} positions must be fewer than options.restart_after = {}", op, prompt.size(1), o.restart_after);
  if (o.new_tokens < 0 || (bounded && o.restart_after == 0 && o.new_tokens > config_.max_len - prompt.size(1)))
    detail::fail<ValueError>("{}: the prompt's {} positions plus options.new_tokens = {} must fit config.max_len = {} "
                             "(or set options.restart_after)",
                             op, prompt.size(1), o.new_tokens, config_.max_len);
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature) || o.top_k < 0)
    detail::fail<ValueError>("{}: options.temperature must be finite and >= 0 and options.top_k >= 0, got {} and {}", op,
                             o.temperature, o.top_k);
  // The result [B, T0 + new_tokens] must be possible before any step runs (with a window,
  // new_tokens is bounded by nothing else).
  std::int64_t total = 0;
  if (__builtin_add_overflow(prompt.size(1), o.new_tokens, &total))
    detail::fail<ValueError>("{}: the prompt's {} positions plus options.new_tokens = {} overflow int64", op, prompt.size(1), o.new_tokens);
  try {
    detail::check_shape(op, "the result [B, T0 + new_tokens]", {prompt.size(0), total}, DType::int64);
  } catch (const ShapeError&) {
    detail::fail<ValueError>("{}: the result [B, T0 + options.new_tokens] = [{}, {}] would be more than can be allocated", op,
                             prompt.size(0), total);
  }
  NoGradGuard no_grad;
  const std::int64_t batch = prompt.size(0), t0 = prompt.size(1), vocab = config_.vocab;
  std::vector<KVCache> caches(blocks.size());
  Generator gen(o.seed);
  std::vector<std::int64_t> ids = prompt.to_vector<std::int64_t>();  // grows row by row below
  std::vector<std::vector<std::int64_t>> rows(static_cast<std::size_t>(batch));
  for (std::int64_t b = 0; b < batch; ++b) rows[b].assign(ids.begin() + b * t0, ids.begin() + (b + 1) * t0);
  Tensor input = prompt;
  for (std::int64_t step = 0; step < o.new_tokens; ++step) {
    if (o.restart_after > 0 && caches[0].length() + input.size(1) > o.restart_after) {
      // Full: start again from the last window / 2 tokens of each row.
      const std::int64_t keep = o.restart_after / 2;
      std::vector<std::int64_t> tail;
      for (const auto& r : rows) tail.insert(tail.end(), r.end() - keep, r.end());
      input = from_vector(std::span<const std::int64_t>(tail), {batch, keep});
      for (auto& c : caches) c.clear();
    }
    Tensor x = embed(input, caches[0].length());
    for (std::size_t i = 0; i < blocks.size(); ++i) x = blocks[i].decode(x, caches[i]);
    const auto logits = this->logits(select(x, 1, -1)).to_vector<double>();  // [B, vocab]
    std::vector<std::int64_t> next(static_cast<std::size_t>(batch));
    for (std::int64_t b = 0; b < batch; ++b) {
      next[b] = pick({logits.begin() + b * vocab, logits.begin() + (b + 1) * vocab}, o, gen);
      rows[b].push_back(next[b]);
    }
    input = from_vector(std::span<const std::int64_t>(next), {batch, 1});
  }
  std::vector<std::int64_t> out;
  for (const auto& r : rows) out.insert(out.end(), r.begin(), r.end());
  return from_vector(std::span<const std::int64_t>(out), {batch, total});
}

std::vector<Tensor> Decoder::attention_weights(const Tensor& ids) const {
  NoGradGuard no_grad;
  check_ids("Decoder::attention_weights", "ids", ids, config_.vocab);
  if (config_.max_len > 0 && ids.size(1) > config_.max_len)
    detail::fail<ShapeError>("Decoder::attention_weights: argument 'ids' has {} positions, more than config.max_len = {}", ids.size(1),
                             config_.max_len);
  std::vector<Tensor> out(blocks.size());
  Tensor x = embed(ids, 0);
  for (std::size_t i = 0; i < blocks.size(); ++i) x = blocks[i].forward(x, Tensor(), &out[i]);
  return out;
}

void Decoder::visit(ModuleVisitor& v) {
  v.module("tok", tok);
  std::visit(
      [&]<class P>(P& p) {
        if constexpr (!std::is_same_v<P, std::monostate>) v.module("pos", p);
      },
      pos);
  v.modules("blocks", blocks);
  v.module("ln_f", ln_f);
  if (head) v.module("head", *head);
}

}  // namespace tapegrad
