// Internal: what layer_norm and rms_norm share (ops/layer_norm.cpp defines it): the check of
// their arguments, and their backward op, whose formulas differ only in
// whether a row is centred first.
#pragma once

#include <vector>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad::detail {

// x floating with rank >= 1; weight and bias (each optional) of x's dtype and shape [x.size(-1)];
// eps finite and >= 0. Errors name `op`.
void check_norm_args(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);

// The backward of layer_norm (centred) and rms_norm (not: xhat = x / rms(x)) as an op `name` of
// x, the weight and g, with three outputs: dx = J (g w) (J = dxhat/dx), dweight = sum over the
// rows of g xhat, dbias = sum over the rows of g, from the forward's stats; its own gradient is
// one formula to every order. `wanted` (2 or 3 entries) says which of dweight and dbias a
// first-order pass makes.
std::vector<Tensor> normalised_backward(const char* name, bool centred, const Tensor& x, const Tensor& weight, const Tensor& g,
                                        const Tensor& stats, double eps, const std::vector<bool>& wanted);

}  // namespace tapegrad::detail
