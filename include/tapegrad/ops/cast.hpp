// Explicit dtype conversion (ops never convert silently).
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

// Differentiable between float32 and float64 (the gradient is cast back); from bool or int64
// the result is a constant. Returns x itself when it already has `dtype`.
Tensor to(const Tensor& x, DType dtype);

}  // namespace tapegrad
