// The loop engine's out-of-line pieces and the copy helpers every layer above uses.
#include "autodiff/loops.hpp"

namespace tapegrad::detail {

// The strides of t's first `own` dims read as broadcast to `shape` (0 on new and stretched dims).
static Dims8 stretched_strides(const Tensor& t, std::size_t own, std::span<const std::int64_t> shape) {
  Dims8 out(shape.size(), 0);
  const std::size_t lead = shape.size() - own;
  for (std::size_t i = 0; i < own; ++i)
    out[lead + i] = t.shape()[i] == 1 && shape[lead + i] != 1 ? 0 : t.strides()[i];
  return out;
}

Dims8 broadcast_strides(const Tensor& t, const Shape& shape) { return stretched_strides(t, t.shape().size(), shape); }

Dims8 batch_strides(const Tensor& t, std::span<const std::int64_t> batch) {
  return stretched_strides(t, t.shape().size() - 2, batch);
}

void copy_into(const Tensor& dst, const Tensor& src) {
  visit_any(dst.dtype(), [&]<class T>(Tag<T>) { map_into<T, T>(dst, [](T v) { return v; }, src); });
}

Tensor copy_of(const Tensor& t) {
  Tensor out = new_tensor(t.shape(), t.dtype());
  copy_into(out, t);
  return out;
}

Tensor add_same_shape(const Tensor& a, const Tensor& b) {
  Tensor out = new_tensor(a.shape(), a.dtype());
  visit_float(a.dtype(), "backward", [&]<class T>(Tag<T>) { map_into<T, T, T>(out, [](T x, T y) { return x + y; }, a, b); });
  return out;
}

Shape broadcast_args(const char* op, const char* a_name, const Shape& x, const char* b_name,
                     const Shape& y) {
  if (x == y) return x;
  const std::size_t n = std::max(x.size(), y.size());
  Shape out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t p = i + x.size() >= n ? x[i + x.size() - n] : 1;
    const std::int64_t q = i + y.size() >= n ? y[i + y.size() - n] : 1;
    if (p != q && p != 1 && q != 1)
      fail<ShapeError>("{}: argument '{}' with shape {} does not broadcast with argument '{}' with "
                       "shape {} (dim {} from the end: {} vs {})",
                       op, b_name, shape_str(y), a_name, shape_str(x), n - i, q, p);
    out[i] = p == 1 ? q : p;
  }
  return out;
}

}  // namespace tapegrad::detail
