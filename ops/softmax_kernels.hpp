// Internal: the masked softmax kernels, shared by the masked_softmax op and the attention core
// (which records one node for the whole attention and calls these directly).
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad::detail {

// Checks (scores floating, allowed bool and broadcastable to scores without enlarging it) and
// names `op` and the arguments in any error.
void check_softmax_args(const char* op, const char* scores_name, const Tensor& scores, const char* allowed_name,
                        const Tensor& allowed);
// A fresh contiguous tensor of the weights; records nothing.
Tensor masked_softmax_forward(const Tensor& scores, const Tensor& allowed);
// dS = A * (dA - rowsum(A * dA)) for contiguous A; dA may have any layout. Records nothing.
Tensor masked_softmax_backward(const Tensor& weights, const Tensor& grad_weights);

}  // namespace tapegrad::detail
