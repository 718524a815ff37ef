// Broadcasting: shapes, strides, and the reduction that undoes it in backward.
#include <algorithm>
#include <utility>

#include "ops/op.hpp"
#include "tapegrad/ops/reduction.hpp"
#include "tapegrad/ops/view.hpp"

namespace tapegrad {
namespace detail {

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const std::size_t lead = g.shape().size() - shape.size();
  Dims dims;
  for (std::size_t i = 0; i < g.shape().size(); ++i)
    if (i < lead || (shape[i - lead] == 1 && g.shape()[i] != 1)) dims.push_back(static_cast<std::int64_t>(i));
  Tensor s = dims.empty() ? g : sum(g, dims, /*keepdim=*/true);
  return reshape(s, shape);
}

}  // namespace detail

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  // Tensors' shapes are never negative; these come from the caller.
  for (const auto& [name, shape] : {std::pair{"a", &a}, std::pair{"b", &b}})
    if (std::any_of(shape->begin(), shape->end(), [](std::int64_t s) { return s < 0; }))
      detail::fail<ShapeError>("{}: argument '{}' {} has a negative size", op, name, detail::shape_str(*shape));
  return detail::broadcast_args(op, "a", a, "b", b);
}

}  // namespace tapegrad

namespace tapegrad::detail {

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
