// Internal: layer_norm and rms_norm, one op whose formulas differ only in whether a row is
// centred first (ops/layer_norm.cpp defines it; rms_norm.cpp calls it uncentred).
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad::detail {

// layer_norm (centred) or rms_norm (not: xhat = x / rms(x), and no bias), checked, computed and
// recorded; its backward is the op layer_norm_backward or rms_norm_backward, dx = J (g w)
// (J = dxhat/dx), dweight = sum over the rows of g xhat, dbias = sum over the rows of g, one
// formula to every order.
Tensor normalise(bool centred, const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);

}  // namespace tapegrad::detail
