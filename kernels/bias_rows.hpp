// Internal: linear's bias, added to each row of the output and summed back over the rows of
// the gradient (bias_rows.cpp).
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad::detail {

// y[r, :] += bias for every row of the contiguous [rows, cols] y (bias: [cols], any layout).
void add_bias_rows(const Tensor& y, const Tensor& bias);

// A fresh tensor of `shape` (cols elements) holding the column sums of the contiguous
// [rows, cols] g, accumulated in double, each column in row order whatever the thread count.
Tensor bias_gradient(const Tensor& g, const Shape& shape);

}  // namespace tapegrad::detail
