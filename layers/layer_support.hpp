// Internal: what the layer sources share: config checks with messages that name the field, and
// seeds for child layers.
#pragma once

#include <cmath>
#include <cstdint>

#include "autodiff/check.hpp"
#include "tapegrad/layers/feed_forward.hpp"
#include "tapegrad/layers/norm.hpp"

namespace tapegrad::detail {

// Requires value >= low; names the layer and the field (`why`, when given, says why that bound).
inline void check_field(const char* layer, const char* field, std::int64_t value, std::int64_t low = 1, const char* why = "") {
  if (value < low) fail<ValueError>("{}: config.{} must be >= {}{}, got {}", layer, field, low, why, value);
}
// heads divides the width a config splits into heads: the one rule TransformerBlock, Decoder and
// MultiHeadAttention share; `when` ends the message.
inline void check_heads_divide(const char* layer, std::int64_t heads, const char* width_field, std::int64_t width, const char* when = "") {
  if (width % heads != 0) fail<ValueError>("{}: config.heads = {} must divide config.{} = {}{}", layer, heads, width_field, width, when);
}
// An enum config value must be one of its enumerators (a value cast from an integer may not be):
// `names` lists them, e.g. "NormKind::layer or NormKind::rms".
template <class Enum>
void check_enum(const char* layer, const char* what, Enum value, Enum last, const char* names) {
  const auto v = static_cast<long long>(value);
  if (v < 0 || v > static_cast<long long>(last)) fail<ValueError>("{}: {} must be {}, got the value {}", layer, what, names, v);
}
inline void check_activation(const char* layer, Activation a) {
  check_enum(layer, "config.activation", a, Activation::swiglu, "Activation::gelu, Activation::relu or Activation::swiglu");
}
inline void check_norm_kind(const char* layer, const char* what, NormKind k) {
  check_enum(layer, what, k, NormKind::rms, "NormKind::layer or NormKind::rms");
}
inline void check_float_dtype(const char* layer, DType dtype) {
  if (!is_floating(dtype)) fail<DTypeError>("{}: config.dtype must be float32 or float64, got {}", layer, dtype);
}
// A normalisation layer's config: dim >= 1, eps finite and > 0, a floating dtype.
inline void check_norm_config(const char* layer, std::int64_t dim, double eps, DType dtype) {
  check_field(layer, "dim", dim);
  check_float_dtype(layer, dtype);
  if (!(eps > 0) || !std::isfinite(eps)) fail<ValueError>("{}: config.eps must be finite and > 0, got {}", layer, eps);
}
// A layer's input: x [..., dim] (dim is config.`field`) of the layer's dtype.
inline void check_layer_input(const char* op, const Tensor& x, const char* field, std::int64_t dim, DType dtype) {
  check_floating(op, "x", x);
  if (x.dim() < 1 || x.size(-1) != dim)
    fail<ShapeError>("{}: argument 'x' must be [..., {}] (config.{}), got shape {}", op, dim, field,
                     shape_str(x.shape()));
  if (x.dtype() != dtype)
    fail<DTypeError>("{}: argument 'x' ({}) is {} but the layer is {} (config.dtype)", op, shape_str(x.shape()), x.dtype(), dtype);
}
// a * b for two config fields, or a ValueError naming both when it overflows.
inline std::int64_t checked_product(const char* layer, const char* a_name, std::int64_t a, const char* b_name, std::int64_t b) {
  std::int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out))
    fail<ValueError>("{}: config.{} * config.{} = {} * {} overflows", layer, a_name, b_name, a, b);
  return out;
}

// A tensor a config asks for, or a ValueError naming the config when it cannot be allocated.
inline void check_config_shape(const char* layer, const char* what, const Shape& shape, DType dtype) {
  try {
    check_shape(layer, what, shape, dtype);
  } catch (const ShapeError&) {
    fail<ValueError>("{}: {} would have shape {} of {}, more than can be allocated", layer, what, shape_str(shape), dtype);
  }
}

// A well-mixed seed for child `index` of a layer seeded with `seed` (splitmix64), so sibling
// layers never draw the same numbers.
constexpr std::uint64_t child_seed(std::uint64_t seed, std::uint64_t index) {
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * (index + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace tapegrad::detail
