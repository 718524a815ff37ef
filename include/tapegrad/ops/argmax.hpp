// The position of the maximum: int64 results, never differentiable.
#pragma once

#include <cstdint>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

// Index along `dim` of the largest element of each slice of x (float32, float64 or int64), as
// torch.argmax: ties give the first index, and NaN counts as larger than every number, so a
// slice holding NaN gives its first NaN. With keepdim the reduced dim stays as size 1. A
// zero-size dim has no maximum (a ShapeError, unless the result is empty anyway).
Tensor argmax(const Tensor& x, std::int64_t dim, bool keepdim = false);
// The row-major (flattened) index of the largest element of all of x, rank 0; x must not be empty.
Tensor argmax(const Tensor& x);

}  // namespace tapegrad
