// Layer normalisation over the last dim, with a hand-derived backward.
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

// Each row of E = x.size(-1) elements is normalised with its mean mu and biased variance var:
//   y = (x - mu) / sqrt(var + eps) * weight + bias
// weight and bias are optional (undefined: 1 and 0); when given they have shape [E] and x's
// floating dtype. eps must be finite and >= 0. Statistics are computed in double. Backward,
// with xhat = (x - mu) / sigma, sigma = sqrt(var + eps) and dxhat = g * weight:
//   dx = (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) / sigma
//   dweight = sum over rows of g * xhat,   dbias = sum over rows of g
Tensor layer_norm(const Tensor& x, const Tensor& weight = Tensor(), const Tensor& bias = Tensor(), double eps = 1e-5);

}  // namespace tapegrad
