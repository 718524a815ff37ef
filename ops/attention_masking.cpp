// The rules of attention's masking, each written once: the window, grouped heads, the masks'
// dtypes and shapes, ALiBi's slopes. Every entry (scaled_dot_product_attention,
// multihead_attention and through it the layers, decoding) validates its AttentionMasking here.
#include "ops/attention_masking.hpp"

#include <cmath>
#include <limits>

#include "autodiff/check.hpp"
#include "tapegrad/ops/view.hpp"

namespace tapegrad {

void check_window(std::string_view who, std::string_view name, std::int64_t window) {
  if (window < 0) detail::fail<ValueError>("{}: {} must be >= 0 (0: no window), got {}", who, name, window);
}

void check_kv_heads(std::string_view who, std::string_view prefix, std::int64_t heads, std::int64_t kv_heads) {
  if (kv_heads < 0 || (kv_heads > 0 && heads % kv_heads != 0))
    detail::fail<ValueError>("{}: {}kv_heads = {} must divide {}heads = {} (or be 0 for {}heads)", who, prefix, kv_heads, prefix, heads,
                             prefix);
}

namespace detail {

void check_on_scores(const char* op, const std::string& name, const Tensor& t, const Shape& scores) {
  if (broadcast_args(op, "scores", scores, name.c_str(), t.shape()) != scores)
    fail<ShapeError>("{}: argument '{}' with shape {} must broadcast to the scores' shape {}", op, name,
                     shape_str(t.shape()), shape_str(scores));
}

Tensor keys_from(const Tensor& t, std::int64_t key_start) {
  return !t.defined() || key_start == 0 || t.dim() == 0 || t.size(-1) == 1 ? t : slice(t, -1, key_start, t.size(-1));
}

namespace {

// key_mask [B, K] or query_mask [B, Q]: bool, one row per batch entry (dim 0 of the scores).
void check_rows_mask(const char* op, const std::string& name, const Tensor& t, const Shape& scores, bool keys) {
  if (!t.defined()) return;
  check_dtype(op, name.c_str(), t, DType::bool_);
  const std::size_t rank = scores.size();
  const std::int64_t width = keys ? scores[rank - 1] : scores[rank - 2];
  if (rank < 3 || t.shape() != Shape{scores[0], width})
    fail<ShapeError>("{}: argument '{}' must have shape [B, {}] = [{}, {}] for scores {}, got {}", op, name, keys ? "K" : "Q",
                     rank < 3 ? std::int64_t{1} : scores[0], width, shape_str(scores), shape_str(t.shape()));
}

// ALiBi's slopes: floating [H] of the activations' dtype (H = dim -3 of the scores), finite, and
// the distances |i + causal_offset - j| exact doubles.
void check_slopes(const char* op, const std::string& name, const AttentionMasking& m, const Shape& scores, DType dtype) {
  const Tensor& s = m.alibi_slopes;
  check_floating(op, name.c_str(), s);
  if (s.dtype() != dtype)
    fail<DTypeError>("{}: argument '{}' is {} but the activations are {}; convert it with to()", op, name, s.dtype(), dtype);
  if (scores.size() < 3 || s.shape() != Shape{scores[scores.size() - 3]})
    fail<ShapeError>("{}: argument '{}' must have shape [H], one slope per head (dim -3 of the scores {}), got {}", op, name,
                     shape_str(scores), shape_str(s.shape()));
  const std::vector<double> v = s.detach().to(DType::float64).to_vector<double>();
  for (std::size_t h = 0; h < v.size(); ++h)
    if (!std::isfinite(v[h]))
      fail<ValueError>("{}: argument '{}' holds {} for head {}; every slope must be finite", op, name, v[h], h);
  if (m.causal_offset < -kMaxAlibiOffset || m.causal_offset > kMaxAlibiOffset)
    fail<ValueError>("{}: with alibi_slopes, causal_offset must lie in [-2^52, 2^52] (the distances |i + causal_offset - j| "
                     "stay exact doubles), got {}",
                     op, m.causal_offset);
}

}  // namespace

RowMasks masking_rows(const char* op, const AttentionMasking& m, const Shape& scores_shape, DType dtype, const MaskNames& names,
                      std::int64_t key_start) {
  check_window(op, names.of("window"), m.window);
  if (m.window > 0 && !m.causal)
    fail<ValueError>("{}: {} = {} needs {} = true (the window reaches back from each query's causal end)", op, names.of("window"),
                     m.window, names.of("causal"));
  check_rows_mask(op, names.of("key_mask"), m.key_mask, scores_shape, /*keys=*/true);
  check_rows_mask(op, names.of("query_mask"), m.query_mask, scores_shape, /*keys=*/false);
  if (m.mask.defined()) {
    const std::string name = names.of(names.mask);
    check_dtype(op, name.c_str(), m.mask, DType::bool_);
    check_on_scores(op, name, m.mask, scores_shape);
  }
  if (m.alibi_slopes.defined()) check_slopes(op, names.of("alibi_slopes"), m, scores_shape, dtype);
  // Keys from key_start on (every key when 0): the masks cut along the key dim, the positions
  // moved with them. An offset past INT64_MIN allows no key either way.
  std::int64_t offset = 0;
  if (__builtin_sub_overflow(m.causal_offset, key_start, &offset)) offset = std::numeric_limits<std::int64_t>::min();
  Shape shape = scores_shape;
  shape.back() -= key_start;
  return RowMasks({.allowed = keys_from(m.mask, key_start), .key_mask = keys_from(m.key_mask, key_start),
                   .query_mask = m.query_mask, .causal = m.causal, .causal_offset = offset, .window = m.window,
                   .slopes = m.alibi_slopes},
                  shape);
}

}  // namespace detail
}  // namespace tapegrad
