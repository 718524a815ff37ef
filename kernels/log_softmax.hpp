// Internal: log_softmax's row kernels (log_softmax.cpp), which the log_softmax op calls.
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad::detail {

// A fresh contiguous y = log_softmax(x) over the last dim at the entries `allowed` (undefined, or
// bool broadcastable to x) allows, -inf elsewhere (softmax_rows.hpp's row rules). x may have any
// strides. Records nothing.
Tensor masked_log_softmax_forward(const Tensor& x, const Tensor& allowed);
// dx = g - exp(y) * rowsum(g where y is finite), and exactly 0 where y = -inf. y contiguous, grad
// any layout. Records nothing.
Tensor masked_log_softmax_backward(const Tensor& y, const Tensor& grad);

}  // namespace tapegrad::detail
