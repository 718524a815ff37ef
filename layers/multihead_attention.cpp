// The MultiHeadAttention layer and its KV cache.
#include "tapegrad/layers/multihead_attention.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "autodiff/check.hpp"
#include "ops/multihead_attention_detail.hpp"
#include "tapegrad/autodiff/tape.hpp"
#include "tapegrad/ops/inplace.hpp"
#include "tapegrad/ops/view.hpp"

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
  if (c.query_dim < 1) fail<ValueError>("{}: config.query_dim must be >= 1, got {}", kLayer, c.query_dim);
  if (c.heads < 1) fail<ValueError>("{}: config.heads must be >= 1, got {}", kLayer, c.heads);
  for (auto [field, value] : {std::pair{"context_dim", c.context_dim}, {"head_dim", c.head_dim}, {"value_head_dim", c.value_head_dim},
                              {"out_dim", c.out_dim}})
    if (value < 0) fail<ValueError>("{}: config.{} must be >= 1, or 0 for its default, got {}", kLayer, field, value);
  if (!is_floating(c.dtype)) fail<DTypeError>("{}: config.dtype must be float32 or float64, got {}", kLayer, c.dtype);

  std::string defaults;  // named in the messages below, which may concern a filled-in field
  auto fill = [&](std::int64_t& field, std::int64_t value, const char* rule) {
    if (field != 0) return;
    field = value;
    defaults += fmt::format("{}{}", defaults.empty() ? " (filled in: " : ", ", rule);
  };
  fill(c.context_dim, c.query_dim, "context_dim = query_dim");
  if (c.head_dim == 0 && c.query_dim % c.heads != 0)
    fail<ValueError>("{}: config.heads = {} must divide config.query_dim = {} when head_dim is not given", kLayer, c.heads,
                     c.query_dim);
  fill(c.head_dim, c.query_dim / c.heads, "head_dim = query_dim / heads");
  fill(c.value_head_dim, c.head_dim, "value_head_dim = head_dim");
  fill(c.out_dim, c.query_dim, "out_dim = query_dim");
  if (!defaults.empty()) defaults += ")";
  if (c.rotary) {
    if (!(std::isfinite(c.rotary->base) && c.rotary->base > 0))
      fail<ValueError>("{}: config.rotary.base must be finite and > 0, got {}", kLayer, c.rotary->base);
    const std::int64_t r = c.rotary->rotary_dim == 0 ? c.head_dim : c.rotary->rotary_dim;
    if (r < 0 || r % 2 != 0 || r > c.head_dim)
      fail<ValueError>("{}: config.rotary.rotary_dim must be even and in [0, config.head_dim = {}] (0 means head_dim), got {}{}", kLayer,
                       c.head_dim, c.rotary->rotary_dim, defaults);
  }

  std::int64_t hd = 0, hdv = 0;
  if (__builtin_mul_overflow(c.heads, c.head_dim, &hd))
    fail<ValueError>("{}: config.heads * config.head_dim = {} * {} overflows int64{}", kLayer, c.heads, c.head_dim, defaults);
  if (__builtin_mul_overflow(c.heads, c.value_head_dim, &hdv))
    fail<ValueError>("{}: config.heads * config.value_head_dim = {} * {} overflows int64{}", kLayer, c.heads, c.value_head_dim,
                     defaults);
  // Each weight must be a tensor tapegrad can allocate (its element and byte counts fit); that
  // also bounds fan_in + fan_out.
  struct Weight {
    const char *name, *rows_fields, *cols_fields;
    std::int64_t rows, cols;
  };
  const char* hd_fields = "config.heads * config.head_dim";
  const char* hdv_fields = "config.heads * config.value_head_dim";
  for (const Weight& w : {Weight{"w_q", "config.query_dim", hd_fields, c.query_dim, hd},
                          Weight{"w_k", "config.context_dim", hd_fields, c.context_dim, hd},
                          Weight{"w_v", "config.context_dim", hdv_fields, c.context_dim, hdv},
                          Weight{"w_o", hdv_fields, "config.out_dim", hdv, c.out_dim}}) {
    try {
      detail::check_shape(kLayer, w.name, {w.rows, w.cols}, c.dtype);
    } catch (const Error&) {
      fail<ValueError>("{}: weight '{}' would have shape [{}, {}] = [{}, {}] of {}, more than can be allocated{}", kLayer, w.name,
                       w.rows_fields, w.cols_fields, w.rows, w.cols, c.dtype, defaults);
    }
  }
  return c;
}

constexpr const char* kForward = "MultiHeadAttention::forward";
constexpr const char* kDecode = "MultiHeadAttention::decode";

// An input as the caller passed it: its argument name, and how it is used when that is not
// obvious from the name.
struct Input {
  const char *name, *role;
  const Tensor& tensor;
};

// The layer's inputs are checked against its config before anything else, so that a mismatch
// is reported as what the caller passed (its rank, width or dtype) rather than as a weight the
// caller never handed over (multihead_attention would blame w_q for a query of the wrong width).
void check_input(const char* op, const Input& in, const char* width_field, std::int64_t width, DType dtype) {
  const Tensor& x = in.tensor;
  detail::check_floating(op, in.name, x);
  if (x.dim() != 3 || x.size(0) < 1 || x.size(1) < 1)
    fail<ShapeError>("{}: argument '{}'{} must be [B, L, config.{} = {}] with B, L >= 1, got shape {}", op, in.name, in.role,
                     width_field, width, detail::shape_str(x.shape()));
  if (x.size(2) != width)
    fail<ShapeError>("{}: argument '{}'{} has width {} (shape {}) but the layer's config.{} is {}", op, in.name, in.role, x.size(2),
                     detail::shape_str(x.shape()), width_field, width);
  if (x.dtype() != dtype)
    fail<DTypeError>("{}: argument '{}'{} is {} but the layer's config.dtype is {}; convert it with to()", op, in.name, in.role,
                     x.dtype(), dtype);
}

AttentionResult run_forward(const MultiHeadAttention& layer, const Input& query, const Input& context, const MhaCall& call) {
  const MultiHeadAttentionConfig& c = layer.config();
  check_input(kForward, query, "query_dim", c.query_dim, c.dtype);
  check_input(kForward, context, "context_dim", c.context_dim, c.dtype);
  return detail::multihead_attention(kForward, {query.tensor, context.tensor, call.bias}, layer.weights(), call.masks,
                                     c.heads, call.causal, call.causal_offset, call.need_weights, c.rotary ? &*c.rotary : nullptr);
}

// A fresh [B, capacity, width] buffer holding the first `length` positions of `buffer` (the
// positions past them are not read: they were never written).
Tensor reallocated(const Tensor& buffer, std::int64_t length, std::int64_t capacity) {
  const NoGradGuard no_grad;
  Tensor out = empty({buffer.size(0), capacity, buffer.size(2)}, buffer.dtype());
  if (length > 0) copy_(slice(out, 1, 0, length), slice(buffer, 1, 0, length));
  return out;
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(const MultiHeadAttentionConfig& config) : config_(resolve(config)) {
  const auto& c = config_;
  Generator gen(c.seed);
  const std::int64_t hd = c.heads * c.head_dim, hdv = c.heads * c.value_head_dim;
  params_.w_q = xavier(c.query_dim, hd, gen, c.dtype);
  params_.w_k = xavier(c.context_dim, hd, gen, c.dtype);
  params_.w_v = xavier(c.context_dim, hdv, gen, c.dtype);
  params_.w_o = xavier(hdv, c.out_dim, gen, c.dtype);
  if (c.bias) {
    params_.b_q = zeros({hd}, c.dtype).set_requires_grad();
    params_.b_k = zeros({hd}, c.dtype).set_requires_grad();
    params_.b_v = zeros({hdv}, c.dtype).set_requires_grad();
    params_.b_o = zeros({c.out_dim}, c.dtype).set_requires_grad();
  }
}

void MultiHeadAttention::visit(ModuleVisitor& v) {
  v.parameter("w_q", params_.w_q);
  v.parameter("w_k", params_.w_k);
  v.parameter("w_v", params_.w_v);
  v.parameter("w_o", params_.w_o);
  if (!config_.bias) return;
  v.parameter("b_q", params_.b_q);
  v.parameter("b_k", params_.b_k);
  v.parameter("b_v", params_.b_v);
  v.parameter("b_o", params_.b_o);
}

AttentionResult MultiHeadAttention::forward(const Tensor& query, const Tensor& context, const Call& call) const {
  return run_forward(*this, {"query", "", query}, {"context", "", context}, call);
}

AttentionResult MultiHeadAttention::forward(const Tensor& x, const Call& call) const {
  return run_forward(*this, {"x", "", x}, {"x", " (the context too: forward(x) is self-attention)", x}, call);
}

AttentionResult MultiHeadAttention::decode(const Tensor& query, KVCache& cache, const Call& call) const {
  NoGradGuard no_grad;
  if (config_.context_dim != config_.query_dim)
    fail<ValueError>("{}: incremental decoding is self-attention; this layer's config.context_dim {} differs from its "
                     "config.query_dim {}",
                     kDecode, config_.context_dim, config_.query_dim);
  check_input(kDecode, {"query", "", query}, "query_dim", config_.query_dim, config_.dtype);
  if (cache.k_.defined()) {
    // A cache holds one batch of one layer's keys and values. An empty (cleared) cache with
    // other buffers is re-made; a non-empty one must match.
    const bool fits = cache.k_.size(0) == query.size(0) && cache.k_.size(2) == params_.w_k.size(1) &&
                      cache.v_.size(2) == params_.w_v.size(1) && cache.k_.dtype() == query.dtype();
    if (!fits && cache.length() > 0)
      fail<ShapeError>("{}: argument 'cache' holds keys [{}, {}, {}] of {} from another batch or layer; 'query' is {} {} and this "
                       "layer's keys are {} wide (clear() the cache to start over)",
                       kDecode, cache.k_.size(0), cache.length(), cache.k_.size(2), cache.k_.dtype(), detail::shape_str(query.shape()),
                       query.dtype(), params_.w_k.size(1));
    if (!fits) cache.k_ = cache.v_ = Tensor();
  }
  const std::int64_t before = cache.length();
  const MhaActivations a{query, Tensor(), call.bias};
  const detail::MhaShapes s = detail::check_mha(kDecode, a, params_, call.masks, config_.heads, before + query.size(1));
  const std::int64_t h = config_.heads;
  Tensor q = detail::project_heads(kDecode, query, params_.w_q, params_.b_q, h);
  Tensor k = detail::project(query, params_.w_k, params_.b_k);
  if (config_.rotary) {
    // The cache holds rotated keys: each is turned once, by its absolute position, as the full
    // forward turns it.
    const Tensor positions = detail::positions_from(before, query.size(1));
    q = rotary(q, positions, *config_.rotary);
    k = reshape(permute(rotary(detail::split_heads(k, h), positions, *config_.rotary), {0, 2, 1, 3}), k.shape());
  }
  cache.append(k, detail::project(query, params_.w_v, params_.b_v));
  // Unlike multihead_attention, the rows of inactive queries and unattended keys are kept: the
  // new keys may serve later queries, and nothing here has a gradient.
  return detail::attend_projected(q, detail::split_heads(cache.keys(), h), detail::split_heads(cache.values(), h), call.bias, params_,
                                  detail::allowed_pairs(call.masks, s, /*causal=*/true, before), s, call.need_weights);
}

KVCache::KVCache(const KVCache& other)
    : k_(other.k_.defined() ? reallocated(other.k_, other.length_, other.capacity()) : Tensor()),
      v_(other.v_.defined() ? reallocated(other.v_, other.length_, other.capacity()) : Tensor()),
      length_(other.length_) {}

KVCache& KVCache::operator=(const KVCache& other) {
  if (this != &other) *this = KVCache(other);
  return *this;
}

KVCache::KVCache(KVCache&& other) noexcept
    : k_(std::move(other.k_)), v_(std::move(other.v_)), length_(std::exchange(other.length_, 0)) {}

KVCache& KVCache::operator=(KVCache&& other) noexcept {
  if (this == &other) return *this;
  k_ = std::move(other.k_);  // a moved-from Tensor is undefined
  v_ = std::move(other.v_);
  length_ = std::exchange(other.length_, 0);
  return *this;
}

void KVCache::append(const Tensor& k, const Tensor& v) {
  const std::int64_t n = k.size(1);
  if (length_ + n > capacity()) {
    // Grow by doubling: each position is copied O(1) times on average. Not past what can be
    // allocated, while what is needed still can be.
    std::int64_t grown = std::max<std::int64_t>({2 * capacity(), length_ + n, 16});
    try {
      detail::check_shape("KVCache", "buffer", {k.size(0), grown, std::max(k.size(2), v.size(2))}, k.dtype());
    } catch (const ShapeError&) {
      grown = length_ + n;
    }
    k_ = reallocated(k_.defined() ? k_ : k, length_, grown);
    v_ = reallocated(v_.defined() ? v_ : v, length_, grown);
  }
  const NoGradGuard no_grad;
  copy_(slice(k_, 1, length_, length_ + n), k);
  copy_(slice(v_, 1, length_, length_ + n), v);
  length_ += n;
}

Tensor KVCache::keys() const { return slice(k_, 1, 0, length_); }
Tensor KVCache::values() const { return slice(v_, 1, 0, length_); }

}  // namespace tapegrad
