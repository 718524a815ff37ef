// Internal: the masked softmax's argument check (softmax.cpp), which log_softmax shares.
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad::detail {

// Checks (scores floating, allowed bool and broadcastable to scores without enlarging it) and
// names `op` and the arguments in any error.
void check_softmax_args(const char* op, const char* scores_name, const Tensor& scores, const char* allowed_name,
                        const Tensor& allowed);

}  // namespace tapegrad::detail
