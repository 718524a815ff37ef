// Internal: the row kernels (layer_norm.cpp) the layer_norm and rms_norm ops call. `centred`
// false is rms_norm: mu = 0, and dx drops its mean(dxhat) term.
#pragma once

#include <vector>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad::detail {

struct Normalised {
  Tensor y;      // fresh, contiguous, x's shape
  Tensor stats;  // float64 [rows, 2]: mu, rstd
};
// y = (x - mu) rstd weight + bias per row of the last dim (weight, bias: [E] or undefined, for 1
// and 0), mu and rstd = 1 / sqrt(var + eps) from sums in double. Records nothing.
Normalised layer_norm_rows_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, bool centred);

struct LayerNormGrads {
  Tensor dx;                             // fresh, contiguous, x's shape
  std::vector<double> dweight, dbias;    // [E]: sum over rows of g xhat, and of g
};
// From x, weight and the forward's stats, for the upstream gradient g (any layout); the column
// sums do not depend on the thread count. Records nothing.
LayerNormGrads layer_norm_rows_backward(const Tensor& x, const Tensor& weight, const Tensor& stats, const Tensor& grad, bool centred);

}  // namespace tapegrad::detail
