// RMS normalisation over the last dim (Llama's norm), with a hand-derived backward.
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

// Each row of E = x.size(-1) elements is divided by its root mean square:
//   y = x / sqrt(mean(x^2) + eps) * weight
// weight is optional (undefined: 1); when given it has shape [E] and x's floating dtype. eps must
// be finite and >= 0. Statistics are computed in double. Backward, with xhat = x / rms and
// dxhat = g * weight:
//   dx = (dxhat - xhat * mean(dxhat * xhat)) / rms,   dweight = sum over rows of g * xhat
Tensor rms_norm(const Tensor& x, const Tensor& weight = Tensor(), double eps = 1e-5);

}  // namespace tapegrad
