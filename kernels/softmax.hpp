// Internal: the masked softmax's row kernels (softmax.cpp), which the masked_softmax op calls.
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad::detail {

// A fresh contiguous tensor of the weights, softmax over the last dim of the scores (any
// strides) at the keys `allowed` (undefined, or bool broadcastable to the scores) allows, by
// softmax_rows.hpp's row rules. Records nothing.
Tensor masked_softmax_forward(const Tensor& scores, const Tensor& allowed);
// dS = A * (dA - rowsum(A * dA)) for contiguous A; dA may have any layout. dS is exactly 0
// wherever A is 0, whatever dA holds there. Records nothing.
Tensor masked_softmax_backward(const Tensor& weights, const Tensor& grad_weights);

}  // namespace tapegrad::detail
