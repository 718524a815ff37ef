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
  if (c.kv_heads < 0 || (c.kv_heads > 0 && c.heads % c.kv_heads != 0))
    fail<ValueError>("{}: config.kv_heads must divide config.heads = {} (or be 0 for heads), got {}", kLayer, c.heads, c.kv_heads);
  if (c.window < 0) fail<ValueError>("{}: config.window must be >= 0 (0: no window), got {}", kLayer, c.window);
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
  if (c.kv_heads == 0) c.kv_heads = c.heads;  // named in no message: every one that uses it names heads too
  if (c.head_dim == 0 && c.query_dim % c.heads != 0)
    fail<ValueError>("{}: config.heads = {} must divide config.query_dim = {} when head_dim is not given", kLayer, c.heads,
                     c.query_dim);
  fill(c.head_dim, c.query_dim / c.heads, "head_dim = query_dim / heads");
  fill(c.value_head_dim, c.head_dim, "value_head_dim = head_dim");
  fill(c.out_dim, c.query_dim, "out_dim = query_dim");
  if (!defaults.empty()) defaults += ")";
  if (c.rotary) check_rotary_options(*c.rotary, c.head_dim, kLayer, "config.rotary", "config.head_dim", defaults);

  // kv_heads divides heads, so its products are no larger than these.
  std::int64_t hd = 0, hdv = 0;
  if (__builtin_mul_overflow(c.heads, c.head_dim, &hd))
    fail<ValueError>("{}: config.heads * config.head_dim = {} * {} overflows int64{}", kLayer, c.heads, c.head_dim, defaults);
  if (__builtin_mul_overflow(c.heads, c.value_head_dim, &hdv))
    fail<ValueError>("{}: config.heads * config.value_head_dim = {} * {} overflows int64{}", kLayer, c.heads, c.value_head_dim,
                     defaults);
  const std::int64_t kvd = c.kv_heads * c.head_dim, kvdv = c.kv_heads * c.value_head_dim;
  // Each weight must be a tensor tapegrad can allocate (its element and byte counts fit); that
  // also bounds fan_in + fan_out.
  struct Weight {
    const char *name, *rows_fields, *cols_fields;
    std::int64_t rows, cols;
  };
  const char* hd_fields = "config.heads * config.head_dim";
  const char* hdv_fields = "config.heads * config.value_head_dim";
  const bool grouped = c.kv_heads != c.heads;
  const char* kvd_fields = grouped ? "config.kv_heads * config.head_dim" : hd_fields;
  const char* kvdv_fields = grouped ? "config.kv_heads * config.value_head_dim" : hdv_fields;
  for (const Weight& w : {Weight{"w_q", "config.query_dim", hd_fields, c.query_dim, hd},
                          Weight{"w_k", "config.context_dim", kvd_fields, c.context_dim, kvd},
                          Weight{"w_v", "config.context_dim", kvdv_fields, c.context_dim, kvdv},
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

AttentionResult run_forward(const MultiHeadAttention& layer, const MhaOptions& options, const Input& query, const Input& context,
                            const MhaCall& call) {
  const MultiHeadAttentionConfig& c = layer.config();
  check_input(kForward, query, "query_dim", c.query_dim, c.dtype);
  check_input(kForward, context, "context_dim", c.context_dim, c.dtype);
  return detail::multihead_attention(kForward, {query.tensor, context.tensor, call.bias}, layer.weights(), call.masks, options,
                                     c.rotary ? &*c.rotary : nullptr);
}

// A fresh [B, capacity, width] buffer holding positions [from, from + length) of `buffer` at its
// front (the positions past them are not read: they were never written).
Tensor reallocated(const Tensor& buffer, std::int64_t from, std::int64_t length, std::int64_t capacity) {
  const NoGradGuard no_grad;
  Tensor out = empty({buffer.size(0), capacity, buffer.size(2)}, buffer.dtype());
  if (length > 0) copy_(slice(out, 1, 0, length), slice(buffer, 1, from, from + length));
  return out;
}

// Those of a decode call's masks and bias that cover keys (K = L + n, every position decoded),
// cut to the held ones (from `start` on). A size-1 key dim broadcasts and stays.
Tensor held_keys(const Tensor& t, std::int64_t start) {
  return !t.defined() || start == 0 || t.dim() == 0 || t.size(-1) == 1 ? t : slice(t, -1, start, t.size(-1));
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
  if (c.bias) {
    params_.b_q = zeros({hd}, c.dtype).set_requires_grad();
    params_.b_k = zeros({kvd}, c.dtype).set_requires_grad();
    params_.b_v = zeros({kvdv}, c.dtype).set_requires_grad();
    params_.b_o = zeros({c.out_dim}, c.dtype).set_requires_grad();
  }
  if (c.alibi != Alibi::none) alibi_ = tapegrad::alibi_slopes(c.heads, c.dtype);
  if (c.alibi == Alibi::learnable) alibi_.set_requires_grad();
}

void MultiHeadAttention::visit(ModuleVisitor& v) {
  v.parameter("w_q", params_.w_q);
  v.parameter("w_k", params_.w_k);
  v.parameter("w_v", params_.w_v);
  v.parameter("w_o", params_.w_o);
  if (config_.bias) {
    v.parameter("b_q", params_.b_q);
    v.parameter("b_k", params_.b_k);
    v.parameter("b_v", params_.b_v);
    v.parameter("b_o", params_.b_o);
  }
  if (config_.alibi == Alibi::learnable) v.parameter("alibi_slopes", alibi_);
}

MhaOptions MultiHeadAttention::options(bool causal, std::int64_t causal_offset, bool need_weights) const {
  return {.heads = config_.heads,
          .kv_heads = config_.kv_heads,
          .causal = causal,
          .causal_offset = causal_offset,
          .window = causal ? config_.window : 0,
          .alibi_slopes = alibi_,
          .need_weights = need_weights};
}

AttentionResult MultiHeadAttention::forward(const Tensor& query, const Tensor& context, const Call& call) const {
  return run_forward(*this, options(call.causal, call.causal_offset, call.need_weights), {"query", "", query}, {"context", "", context},
                     call);
}

AttentionResult MultiHeadAttention::forward(const Tensor& x, const Call& call) const {
  return run_forward(*this, options(call.causal, call.causal_offset, call.need_weights), {"x", "", x},
                     {"x", " (the context too: forward(x) is self-attention)", x}, call);
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
    if (!fits && cache.held() > 0)
      fail<ShapeError>("{}: argument 'cache' holds {} {} keys [B, L, width] = [{}, {}, {}] from another batch or layer; 'query' is {} {} "
                       "(B = {}) and this layer's keys are {} wide (clear() the cache to start over)",
                       kDecode, cache.held(), cache.k_.dtype(), cache.k_.size(0), cache.held(), cache.k_.size(2),
                       detail::shape_str(query.shape()), query.dtype(), query.size(0), params_.w_k.size(1));
    if (!fits) cache.k_ = cache.v_ = Tensor();
  }
  const std::int64_t before = cache.length(), n = query.size(1);
  const MhaActivations a{query, Tensor(), call.bias};
  // Masks and bias are checked against every position decoded (K = L + n) before the cache changes.
  MhaOptions o = options(/*causal=*/true, before, call.need_weights);
  detail::MhaShapes s = detail::check_mha(kDecode, a, params_, call.masks, o, before + n);
  Tensor q = detail::project_heads(kDecode, query, params_.w_q, params_.b_q, config_.heads);
  Tensor k = detail::project(query, params_.w_k, params_.b_k);
  if (config_.rotary) {
    // The cache holds rotated keys: each is turned once, by its absolute position, as the full
    // forward turns it.
    const Tensor positions = detail::positions_from(before, n);
    q = rotary(q, positions, *config_.rotary);
    k = reshape(permute(rotary(detail::split_heads(k, config_.kv_heads), positions, *config_.rotary), {0, 2, 1, 3}), k.shape());
  }
  // The first new query (position L) sees keys after L - window: older ones may go.
  const std::int64_t keep_from = config_.window > 0 ? std::max<std::int64_t>(0, before - config_.window + 1) : 0;
  cache.append(k, detail::project(query, params_.w_v, params_.b_v), keep_from);
  // The held keys are positions start .. L + n - 1: in their coordinates the queries sit at
  // L - start + i, which the causal rule, the window and ALiBi's distances all read.
  const std::int64_t start = cache.start();
  o.causal_offset = before - start;
  s.k = cache.held();
  const MhaMasks masks{held_keys(call.masks.key_mask, start), call.masks.query_mask, held_keys(call.masks.attention_mask, start)};
  // Unlike multihead_attention, the rows of inactive queries and unattended keys are kept: the
  // new keys may serve later queries, and nothing here has a gradient.
  const std::int64_t hkv = config_.kv_heads;
  return detail::attend_projected(q, detail::split_heads(cache.keys(), hkv), detail::split_heads(cache.values(), hkv),
                                  held_keys(call.bias, start), params_, detail::allowed_pairs(masks, s, o), s, o);
}

KVCache::KVCache(const KVCache& other)
    : k_(other.k_.defined() ? reallocated(other.k_, 0, other.held_, other.capacity()) : Tensor()),
      v_(other.v_.defined() ? reallocated(other.v_, 0, other.held_, other.capacity()) : Tensor()),
      start_(other.start_),
      held_(other.held_) {}

KVCache& KVCache::operator=(const KVCache& other) {
  if (this != &other) *this = KVCache(other);
  return *this;
}

KVCache::KVCache(KVCache&& other) noexcept
    : k_(std::move(other.k_)), v_(std::move(other.v_)), start_(std::exchange(other.start_, 0)), held_(std::exchange(other.held_, 0)) {}

KVCache& KVCache::operator=(KVCache&& other) noexcept {
  if (this == &other) return *this;
  k_ = std::move(other.k_);  // a moved-from Tensor is undefined
  v_ = std::move(other.v_);
  start_ = std::exchange(other.start_, 0);
  held_ = std::exchange(other.held_, 0);
  return *this;
}

void KVCache::append(const Tensor& k, const Tensor& v, std::int64_t keep_from) {
  const std::int64_t n = k.size(1);
  const NoGradGuard no_grad;
  if (held_ + n > capacity()) {
    // Full. Positions before keep_from are dropped rather than kept: the kept ones move to the
    // front, in place when at most half the buffer is then in use (they cannot overlap their
    // destination: more than kept + n rows are dropped), else into a buffer twice that size, so
    // each move of `kept` rows is paid for by at least as many appends.
    const std::int64_t drop = std::clamp<std::int64_t>(keep_from - start_, 0, held_), kept = held_ - drop;
    if (drop > 0 && 2 * (kept + n) <= capacity()) {
      copy_(slice(k_, 1, 0, kept), slice(k_, 1, drop, held_));
      copy_(slice(v_, 1, 0, kept), slice(v_, 1, drop, held_));
    } else {
      // Grow by doubling: each position is copied O(1) times on average. Not past what can be
      // allocated, while what is needed still can be.
      std::int64_t grown = drop > 0 ? std::max<std::int64_t>(2 * (kept + n), 16) : std::max<std::int64_t>({2 * capacity(), kept + n, 16});
      try {
        detail::check_shape("KVCache", "buffer", {k.size(0), grown, std::max(k.size(2), v.size(2))}, k.dtype());
      } catch (const ShapeError&) {
        grown = kept + n;
      }
      k_ = reallocated(k_.defined() ? k_ : k, drop, kept, grown);
      v_ = reallocated(v_.defined() ? v_ : v, drop, kept, grown);
    }
    start_ += drop;
    held_ = kept;
  }
  copy_(slice(k_, 1, held_, held_ + n), k);
  copy_(slice(v_, 1, held_, held_ + n), v);
  held_ += n;
}

Tensor KVCache::keys() const { return slice(k_, 1, 0, held_); }
Tensor KVCache::values() const { return slice(v_, 1, 0, held_); }

}  // namespace tapegrad
