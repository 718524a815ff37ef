// Internal: the masked softmax's argument check, which log_softmax shares, and its backward as
// an op of its own (softmax.cpp), which attention's reference backward runs too.
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad::detail {

// Checks (scores floating, allowed bool and broadcastable to scores without enlarging it) and
// names `op` and the arguments in any error.
void check_softmax_args(const char* op, const char* scores_name, const Tensor& scores, const char* allowed_name,
                        const Tensor& allowed);

// dS = A ⊙ (dA − rowsum(A ⊙ dA)) over the last dim, exactly 0 wherever A is 0 (masked entries,
// empty rows) whatever dA holds there. A and dA of one shape (dA may broadcast to it). An op:
// it records when grad mode is on (a create_graph pass), with its own gradient beside it, so the
// softmax's backward is this one formula to every order.
Tensor softmax_backward(const Tensor& weights, const Tensor& grad_weights);

}  // namespace tapegrad::detail
