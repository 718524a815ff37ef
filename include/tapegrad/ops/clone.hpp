// A copy that owns its storage.
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

// A contiguous copy of x with its own storage (never a view of x, even when x is contiguous),
// differentiable: dx = g. Keep one before updating a tensor in place whose old values a
// recorded backward still needs.
Tensor clone(const Tensor& x);

}  // namespace tapegrad
