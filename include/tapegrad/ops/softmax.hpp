// Masked softmax over the last dim, with a hand-derived backward.
//
//   A = allowed * exp(S - m) / sum_j(allowed * exp(S - m)),  m = max of S over allowed entries
//
// `allowed` (bool, True = allowed) broadcasts to scores' shape; an undefined tensor allows
// everything. The maximum is taken over allowed entries only (no finite sentinel), so any
// finite scores, 1e4 or FLT_MAX/2 included, give finite weights. A row with no allowed entry is
// all zeros (not uniform, not NaN); so is a row whose allowed scores are all -inf. A NaN or
// +inf among a row's allowed scores makes that row NaN (it propagates, like PyTorch).
//
// Backward, per row: dS = A * (dA - sum_j A_j dA_j); zero at disallowed entries and on empty
// rows. Linear time per row, no Jacobian.
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

Tensor masked_softmax(const Tensor& scores, const Tensor& allowed = Tensor());

}  // namespace tapegrad
