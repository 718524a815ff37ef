// The MultiHeadAttention layer and its KV cache.
#include "tapegrad/layers/multihead_attention_layer.hpp"

#include <cmath>

#include "layers/mha_detail.hpp"
#include "ops/kernel.hpp"
#include "tapegrad/ops/view.hpp"

namespace tapegrad {
namespace {
using detail::fail;

constexpr const char* kLayer = "MultiHeadAttention";

Tensor xavier(std::int64_t fan_in, std::int64_t fan_out, Generator& gen, DType dtype) {
  const double a = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return rand({fan_in, fan_out}, gen, dtype, -a, a).set_requires_grad();
}

MultiHeadAttentionConfig resolve(MultiHeadAttentionConfig c) {
  if (c.query_dim < 1) fail<ValueError>("{}: config.query_dim must be >= 1, got {}", kLayer, c.query_dim);
  if (c.heads < 1) fail<ValueError>("{}: config.heads must be >= 1, got {}", kLayer, c.heads);
  if (!is_floating(c.dtype)) fail<DTypeError>("{}: config.dtype must be float32 or float64, got {}", kLayer, c.dtype);
  if (c.context_dim == 0) c.context_dim = c.query_dim;
  if (c.head_dim == 0) {
    if (c.query_dim % c.heads != 0)
      fail<ValueError>("{}: config.heads = {} must divide config.query_dim = {} when head_dim is not given", kLayer,
                       c.heads, c.query_dim);
    c.head_dim = c.query_dim / c.heads;
  }
  if (c.value_head_dim == 0) c.value_head_dim = c.head_dim;
  if (c.out_dim == 0) c.out_dim = c.query_dim;
  if (c.context_dim < 1 || c.head_dim < 1 || c.value_head_dim < 1 || c.out_dim < 1)
    fail<ValueError>("{}: config widths must be >= 1, got context_dim={} head_dim={} value_head_dim={} out_dim={}", kLayer,
                     c.context_dim, c.head_dim, c.value_head_dim, c.out_dim);
  return c;
}

// H*D and H*Dv are sizes made from config integers, and the weights they shape must be tensors
// (which also keeps xavier's fan_in + fan_out in range).
void check_weight_sizes(const MultiHeadAttentionConfig& c) {
  std::int64_t hd = 0, hdv = 0;
  if (__builtin_mul_overflow(c.heads, c.head_dim, &hd) || __builtin_mul_overflow(c.heads, c.value_head_dim, &hdv))
    fail<ShapeError>("{}: config.heads = {} times head_dim = {} or value_head_dim = {} overflows int64", kLayer, c.heads,
                     c.head_dim, c.value_head_dim);
  for (const auto& [name, shape] : {std::pair{"config's w_q shape", Shape{c.query_dim, hd}},
                                    std::pair{"config's w_k shape", Shape{c.context_dim, hd}},
                                    std::pair{"config's w_v shape", Shape{c.context_dim, hdv}},
                                    std::pair{"config's w_o shape", Shape{hdv, c.out_dim}}})
    detail::check_shape(kLayer, name, shape, c.dtype);
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(const MultiHeadAttentionConfig& config) : config_(resolve(config)) {
  check_weight_sizes(config_);
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

std::vector<Tensor*> MultiHeadAttention::parameters() {
  std::vector<Tensor*> out{&params_.w_q, &params_.w_k, &params_.w_v, &params_.w_o};
  if (config_.bias) out.insert(out.end(), {&params_.b_q, &params_.b_k, &params_.b_v, &params_.b_o});
  return out;
}

AttentionResult MultiHeadAttention::forward(const Tensor& query, const Tensor& context, const Call& call) const {
  detail::check_defined("MultiHeadAttention::forward", "query", query);
  detail::check_defined("MultiHeadAttention::forward", "context", context);
  AttentionResult r = multihead_attention({query, context, call.bias}, params_, call.masks, config_.heads, call.causal,
                                          call.causal_offset);
  if (!call.need_weights) r.weights = Tensor();
  return r;
}

AttentionResult MultiHeadAttention::decode(const Tensor& query, KVCache& cache, const Call& call) const {
  NoGradGuard no_grad;
  detail::check_floating("MultiHeadAttention::decode", "query", query);
  if (query.dim() != 3 || query.size(2) != config_.query_dim || query.size(1) < 1)
    fail<ShapeError>("MultiHeadAttention::decode: argument 'query' must be [B, n >= 1, {}], got shape {}", config_.query_dim,
                     detail::shape_str(query.shape()));
  if (config_.context_dim != config_.query_dim)
    fail<ValueError>("MultiHeadAttention::decode: incremental decoding is self-attention; this layer's context_dim {} differs "
                     "from its query_dim {}",
                     config_.context_dim, config_.query_dim);
  if (query.dtype() != config_.dtype)
    fail<DTypeError>("MultiHeadAttention::decode: argument 'query' ({}) is {} but the layer is {}", detail::shape_str(query.shape()),
                     query.dtype(), config_.dtype);
  if (cache.k_.defined()) {
    // A cache holds one batch of one layer's keys and values. An empty (cleared) cache with
    // other buffers is re-made; a non-empty one must match.
    const bool fits = cache.k_.size(0) == query.size(0) && cache.k_.size(2) == params_.w_k.size(1) &&
                      cache.v_.size(2) == params_.w_v.size(1) && cache.k_.dtype() == query.dtype();
    if (!fits && cache.length() > 0)
      fail<ShapeError>("MultiHeadAttention::decode: argument 'cache' holds keys [{}, {}, {}] of {} from another batch or layer; "
                       "'query' is {} {} and this layer's keys are {} wide (clear() the cache to start over)",
                       cache.k_.size(0), cache.length(), cache.k_.size(2), cache.k_.dtype(), detail::shape_str(query.shape()),
                       query.dtype(), params_.w_k.size(1));
    if (!fits) cache.k_ = cache.v_ = Tensor();
  }
  const std::int64_t before = cache.length();
  const MhaActivations a{query, Tensor(), call.bias};
  const detail::MhaShapes s = detail::check_mha(a, params_, call.masks, config_.heads, before + query.size(1));
  cache.append(detail::project(query, params_.w_k, params_.b_k), detail::project(query, params_.w_v, params_.b_v));
  AttentionResult r = detail::attend_projected(detail::project(query, params_.w_q, params_.b_q), cache.keys(), cache.values(),
                                               a, params_, call.masks, s, /*causal=*/true, /*causal_offset=*/before);
  if (!call.need_weights) r.weights = Tensor();
  return r;
}

void KVCache::append(const Tensor& k, const Tensor& v) {
  const std::int64_t n = k.size(1);
  const std::int64_t capacity = k_.defined() ? k_.size(1) : 0;
  if (length_ + n > capacity) {
    // Grow by doubling: each position is copied O(1) times on average.
    const std::int64_t grown = std::max<std::int64_t>({2 * capacity, length_ + n, 16});
    Tensor nk = detail::new_tensor({k.size(0), grown, k.size(2)}, k.dtype());
    Tensor nv = detail::new_tensor({v.size(0), grown, v.size(2)}, v.dtype());
    if (length_ > 0) {
      detail::copy_into(slice(nk, 1, 0, length_), keys());
      detail::copy_into(slice(nv, 1, 0, length_), values());
    }
    k_ = nk;
    v_ = nv;
  }
  detail::copy_into(slice(k_, 1, length_, length_ + n), k);
  detail::copy_into(slice(v_, 1, length_, length_ + n), v);
  length_ += n;
}

Tensor KVCache::keys() const { return slice(k_, 1, 0, length_); }
Tensor KVCache::values() const { return slice(v_, 1, 0, length_); }

}  // namespace tapegrad
