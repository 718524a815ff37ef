// The MultiHeadAttention layer: its weights and config around multihead_attention, whose
// decoding form keeps the KV cache.
#include "tapegrad/layers/multihead_attention.hpp"

#include <cmath>
#include <string>
#include <string_view>
#include <utility>

#include "layers/layer_support.hpp"

namespace tapegrad {
namespace {
using detail::fail;

constexpr const char* kLayer = "MultiHeadAttention";

Tensor xavier(std::int64_t fan_in, std::int64_t fan_out, Generator& gen, DType dtype) {
  // resolve() bounded both fans (each weight is allocatable), so the sum cannot overflow; it is
  // taken in double all the same.
  const double a = std::sqrt(6.0 / (static_cast<double>(fan_in) + static_cast<double>(fan_out)));
  return rand({fan_in, fan_out}, gen, dtype, -a, a).set_requires_grad();
}

// Validates every field before anything is computed from it, then fills in the defaults. A
// config that cannot give a layer is a ValueError (DTypeError for the dtype) naming its fields:
// nothing overflows further on, and no weight gets a shape that wraps around.
MultiHeadAttentionConfig resolve(MultiHeadAttentionConfig c) {
  detail::check_field(kLayer, "query_dim", c.query_dim);
  detail::check_field(kLayer, "heads", c.heads);
  check_kv_heads(kLayer, "config.", c.heads, c.kv_heads);
  check_window(kLayer, "config.window", c.window);
  for (auto [field, value] : {std::pair{"context_dim", c.context_dim}, {"head_dim", c.head_dim}, {"value_head_dim", c.value_head_dim},
                              {"out_dim", c.out_dim}})
    if (value < 0) fail<ValueError>("{}: config.{} must be >= 1, or 0 for its default, got {}", kLayer, field, value);
  detail::check_float_dtype(kLayer, c.dtype);

  std::string defaults;  // named in the messages below, which may concern a filled-in field
  auto fill = [&](std::int64_t& field, std::int64_t value, const char* rule) {
    if (field != 0) return;
    field = value;
    defaults += fmt::format("{}{}", defaults.empty() ? " (filled in: " : ", ", rule);
  };
  fill(c.context_dim, c.query_dim, "context_dim = query_dim");
  if (c.kv_heads == 0) c.kv_heads = c.heads;  // named in no message: every one that uses it names heads too
  if (c.head_dim == 0) detail::check_heads_divide(kLayer, c.heads, "query_dim", c.query_dim, " when head_dim is not given");
  fill(c.head_dim, c.query_dim / c.heads, "head_dim = query_dim / heads");
  fill(c.value_head_dim, c.head_dim, "value_head_dim = head_dim");
  fill(c.out_dim, c.query_dim, "out_dim = query_dim");
  if (!defaults.empty()) defaults += ")";
  if (c.rotary) check_rotary_options(*c.rotary, c.head_dim, kLayer, "config.rotary", "config.head_dim", defaults);

  const char* hd_fields = "config.heads * config.head_dim";
  const char* hdv_fields = "config.heads * config.value_head_dim";
  // kv_heads divides heads, so its products are no larger than these.
  std::int64_t hd = 0, hdv = 0;
  for (auto [product, width, fields] : {std::tuple{&hd, c.head_dim, hd_fields}, {&hdv, c.value_head_dim, hdv_fields}})
    if (__builtin_mul_overflow(c.heads, width, product))
      fail<ValueError>("{}: {} = {} * {} overflows int64{}", kLayer, fields, c.heads, width, defaults);
  const std::int64_t kvd = c.kv_heads * c.head_dim, kvdv = c.kv_heads * c.value_head_dim;
  const bool grouped = c.kv_heads != c.heads;
  const char* kvd_fields = grouped ? "config.kv_heads * config.head_dim" : hd_fields;
  const char* kvdv_fields = grouped ? "config.kv_heads * config.value_head_dim" : hdv_fields;
  // Each weight must be a tensor tapegrad can allocate (its element and byte counts fit); that
  // also bounds fan_in + fan_out.
  for (const auto& [name, rows_fields, cols_fields, rows, cols] :
       {std::tuple{"w_q", "config.query_dim", hd_fields, c.query_dim, hd},
        {"w_k", "config.context_dim", kvd_fields, c.context_dim, kvd},
        {"w_v", "config.context_dim", kvdv_fields, c.context_dim, kvdv},
        {"w_o", hdv_fields, "config.out_dim", hdv, c.out_dim}})
    detail::check_config_shape(kLayer,
                               fmt::format("weight '{}' [{}, {}]{}", name, rows_fields, cols_fields, defaults).c_str(),
                               {rows, cols}, c.dtype);
  return c;
}

constexpr const char* kForward = "MultiHeadAttention::forward";
constexpr const char* kDecode = "MultiHeadAttention::decode";

// f(), with an error of the op it calls reported as the layer's own: the same class, the message
// naming `layer` where it named the op, and the call's fields as the caller wrote them
// ("multihead_attention: argument 'options.masking.key_mask' ..." becomes
// "MultiHeadAttention::forward: argument 'call.masking.key_mask' ...").
std::string caller_message(const char* layer, std::string message) {
  constexpr std::string_view op = "multihead_attention: ";
  message = message.starts_with(op) ? message.substr(op.size()) : message;
  for (std::size_t at = 0; (at = message.find("options.masking.", at)) != std::string::npos;) message.replace(at, 8, "call.");
  return fmt::format("{}: {}", layer, message);
}
template <class F> AttentionResult as_caller(const char* layer, F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    const std::string message = caller_message(layer, e.what());
    if (dynamic_cast<const ShapeError*>(&e) != nullptr) throw ShapeError(message);
    if (dynamic_cast<const DTypeError*>(&e) != nullptr) throw DTypeError(message);
    if (dynamic_cast<const ValueError*>(&e) != nullptr) throw ValueError(message);
    if (dynamic_cast<const GraphError*>(&e) != nullptr) throw GraphError(message);
    throw Error(message);
  }
}

// The layer's inputs are checked against its config before anything else, so that a mismatch
// is reported as what the caller passed (its rank, width or dtype) rather than as a weight the
// caller never handed over (multihead_attention would blame w_q for a query of the wrong width).
// `role` says how the input is used when its name does not.
void check_input(const char* op, const char* name, const Tensor& x, const char* width_field, std::int64_t width,
                 DType dtype, const char* role = "") {
  detail::check_floating(op, name, x);
  if (x.dim() != 3 || x.size(0) < 1 || x.size(1) < 1)
    fail<ShapeError>("{}: argument '{}'{} must be [B, L, config.{} = {}] with B, L >= 1, got shape {}", op, name, role,
                     width_field, width, detail::shape_str(x.shape()));
  if (x.size(2) != width)
    fail<ShapeError>("{}: argument '{}'{} has width {} (shape {}) but the layer's config.{} is {}", op, name, role,
                     x.size(2), detail::shape_str(x.shape()), width_field, width);
  if (x.dtype() != dtype)
    fail<DTypeError>("{}: argument '{}'{} is {} but the layer's config.dtype is {}; convert it with to()", op, name,
                     role, x.dtype(), dtype);
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(const MultiHeadAttentionConfig& config) : config_(resolve(config)) {
  const auto& c = config_;
  Generator gen(c.seed);
  const std::int64_t hd = c.heads * c.head_dim, hdv = c.heads * c.value_head_dim;
  const std::int64_t kvd = c.kv_heads * c.head_dim, kvdv = c.kv_heads * c.value_head_dim;
  params_.w_q = xavier(c.query_dim, hd, gen, c.dtype);
  params_.w_k = xavier(c.context_dim, kvd, gen, c.dtype);
  params_.w_v = xavier(c.context_dim, kvdv, gen, c.dtype);
  params_.w_o = xavier(hdv, c.out_dim, gen, c.dtype);
  if (c.bias)
    for (auto [b, n] :
         {std::pair{&params_.b_q, hd}, {&params_.b_k, kvd}, {&params_.b_v, kvdv}, {&params_.b_o, c.out_dim}})
      *b = zeros({n}, c.dtype).set_requires_grad();
  if (c.alibi != Alibi::none) alibi_ = tapegrad::alibi_slopes(c.heads, c.dtype);
  if (c.alibi == Alibi::learnable) alibi_.set_requires_grad();
}

void MultiHeadAttention::visit(ModuleVisitor& v) {
  for (auto [name, t] :
       {std::pair{"w_q", &params_.w_q}, {"w_k", &params_.w_k}, {"w_v", &params_.w_v}, {"w_o", &params_.w_o}})
    v.parameter(name, *t);
  if (config_.bias)
    for (auto [name, t] :
         {std::pair{"b_q", &params_.b_q}, {"b_k", &params_.b_k}, {"b_v", &params_.b_v}, {"b_o", &params_.b_o}})
      v.parameter(name, *t);
  if (config_.alibi == Alibi::learnable) v.parameter("alibi_slopes", alibi_);
}

MhaOptions MultiHeadAttention::options(const Call& call, const char* op) const {
  AttentionMasking m = call.masking;
  // The config's window applies to causal calls, its slopes to every call.
  if (config_.window > 0 && m.causal) {
    if (m.window != 0 && m.window != config_.window)
      fail<ValueError>("{}: argument 'call.masking.window' = {} differs from the layer's config.window = {}; set one of them", op, m.window,
                       config_.window);
    m.window = config_.window;
  }
  if (alibi_.defined()) {
    if (m.alibi_slopes.defined())
      fail<ValueError>("{}: argument 'call.masking.alibi_slopes' is given but the layer's config.alibi supplies the slopes; set one of "
                       "them",
                       op);
    m.alibi_slopes = alibi_;
  }
  return {.heads = config_.heads, .kv_heads = config_.kv_heads, .masking = m, .rotary = config_.rotary, .need_weights = call.need_weights};
}

AttentionResult MultiHeadAttention::forward(const Tensor& query, const Tensor& context, const Call& call) const {
  check_input(kForward, "query", query, "query_dim", config_.query_dim, config_.dtype);
  check_input(kForward, "context", context, "context_dim", config_.context_dim, config_.dtype);
  return as_caller(kForward, [&] { return multihead_attention({query, context, call.bias}, params_, options(call, kForward)); });
}

AttentionResult MultiHeadAttention::forward(const Tensor& x, const Call& call) const {
  check_input(kForward, "x", x, "query_dim", config_.query_dim, config_.dtype);
  check_input(kForward, "x", x, "context_dim", config_.context_dim, config_.dtype,
              " (the context too: forward(x) is self-attention)");
  return as_caller(kForward, [&] { return multihead_attention({x, x, call.bias}, params_, options(call, kForward)); });
}

AttentionResult MultiHeadAttention::decode(const Tensor& query, KVCache& cache, const Call& call) const {
  if (config_.context_dim != config_.query_dim)
    fail<ValueError>("{}: incremental decoding is self-attention; this layer's config.context_dim {} differs from its "
                     "config.query_dim {}",
                     kDecode, config_.context_dim, config_.query_dim);
  check_input(kDecode, "query", query, "query_dim", config_.query_dim, config_.dtype);
  Call causal = call;
  causal.masking.causal = true;  // decoding is causal: the config's window applies
  return as_caller(kDecode, [&] { return multihead_attention({.query = query, .bias = call.bias}, params_, options(causal, kDecode), cache); });
}

}  // namespace tapegrad
