// The affine map of a linear layer as one op: y = x weight + bias.
#pragma once

#include "tapegrad/autodiff/tensor.hpp"
#include "tapegrad/ops/matmul.hpp"

namespace tapegrad {

// x is [..., K], weight [K, N] (in, out: the layout of Linear's weight), bias [N] or undefined
// (no bias); all one floating dtype. Returns [..., N]: every row of x times weight, plus bias.
// Equal to matmul(x, weight) + bias, but recorded as one node whose backward makes
//   dx = g weight^T,   dweight = x^T g (over all rows of x),   dbias = sum over rows of g
// with no broadcast reduction and no intermediate product kept. Products follow matmul's
// rules: float32 on oneDNN at the given precision (matmul_precision() when none is given),
// float64 exact.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, MatmulPrecision precision);

}  // namespace tapegrad
