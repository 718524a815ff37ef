// scaled_dot_product_attention with AttentionOptions (docs/semantics.md §14.2), and ALiBi's
// default slopes. Everything here is validation and views: the masking is checked once against
// the scores (masking_rows) and goes to the attention core as its rows (it applies them inside
// its softmax passes and differentiates the slopes), and grouped-query heads become views of q,
// k and v (ops/grouped_heads.hpp), so that nothing of k or v is copied per group.
#include <cmath>
#include <span>
#include <utility>
#include <vector>

#include "autodiff/check.hpp"
#include "ops/grouped_heads.hpp"

namespace tapegrad {
namespace {

using detail::fail;
using detail::shape_str;

constexpr const char* kOp = "scaled_dot_product_attention";

// With enable_gqa: q, k, v of one floating dtype and rank >= 3, Hkv = k.size(-3) = v.size(-3)
// dividing H = q.size(-3); returns Hkv. (Without, check_attention checks the dtypes.)
std::int64_t check_groups(const Tensor& q, const Tensor& k, const Tensor& v) {
  detail::check_same_float(kOp, "q", q, "k", k);
  detail::check_same_float(kOp, "q", q, "v", v);
  for (auto [name, t] : {std::pair{"q", &q}, {"k", &k}, {"v", &v}})
    if (t->dim() < 3)
      fail<ShapeError>("{}: with options.enable_gqa, argument '{}' must have rank >= 3 ([..., heads, length, width]), got shape {}", kOp,
                       name, shape_str(t->shape()));
  const std::int64_t heads = q.size(-3), kv_heads = k.size(-3);
  if (v.size(-3) != kv_heads)
    fail<ShapeError>("{}: with options.enable_gqa, arguments 'k' {} and 'v' {} must have the same number of key/value heads (dim -3)",
                     kOp, shape_str(k.shape()), shape_str(v.shape()));
  if (kv_heads < 1 || heads % kv_heads != 0)
    fail<ShapeError>("{}: with options.enable_gqa, the key/value heads Hkv = {} (dim -3 of 'k' {}) must be >= 1 and divide the query "
                     "heads H = {} (dim -3 of 'q' {})",
                     kOp, kv_heads, shape_str(k.shape()), heads, shape_str(q.shape()));
  return kv_heads;
}

// ALiBi's slopes for a power of two n: 2^(-8 (h + 1) / n), h = 0 .. n - 1.
std::vector<double> geometric_slopes(std::int64_t n) {
  std::vector<double> s(static_cast<std::size_t>(n));
  for (std::int64_t h = 0; h < n; ++h) s[static_cast<std::size_t>(h)] = std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(n));
  return s;
}

}  // namespace

AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  const std::int64_t kv_heads = o.enable_gqa ? check_groups(q, k, v) : 0;
  return detail::grouped_attention({kOp, q, k, v, Tensor(), o.need_weights}, kv_heads, [&](const Shape& scores) {
    return detail::masking_rows(kOp, o.masking, scores, q.dtype(), {.prefix = "options.masking."});
  });
}

Tensor alibi_slopes(std::int64_t heads, DType dtype) {
  const char* op = "alibi_slopes";
  if (heads < 1) fail<ValueError>("{}: argument 'heads' must be >= 1, got {}", op, heads);
  if (!is_floating(dtype)) fail<DTypeError>("{}: argument 'dtype' must be float32 or float64, got {}", op, dtype);
  detail::check_shape(op, "the slopes [heads]", {heads}, DType::float64);
  // The reference's get_slopes: for a power of two, the geometric sequence; otherwise that of
  // the largest power of two n below, then every other slope of 2n for the remaining heads
  // (they fall between the first ones, so no two heads share a slope).
  std::int64_t n = 1;
  while (n * 2 <= heads) n *= 2;
  std::vector<double> s = geometric_slopes(n);
  const std::vector<double> finer = n == heads ? std::vector<double>() : geometric_slopes(2 * n);
  for (std::int64_t i = 0; i < heads - n; ++i) s.push_back(finer[static_cast<std::size_t>(2 * i)]);
  return from_vector(std::span<const double>(s), {heads}).to(dtype);
}

}  // namespace tapegrad
