// Selection by a boolean condition. Differentiable in the selected values, not the condition.
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

// cond ? a : b elementwise, all three broadcast together. cond is bool; a and b share a dtype.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// x where mask is false, `value` where it is true (mask broadcasts to x's shape).
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

}  // namespace tapegrad
