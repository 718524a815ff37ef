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
