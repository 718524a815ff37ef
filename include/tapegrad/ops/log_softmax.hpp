// Log-softmax over the last dim, masked like masked_softmax, with a hand-derived backward.
//
//   y_j = x_j - m - log sum_i(allowed_i exp(x_i - m))  for allowed j,   y_j = -inf otherwise
//
// m is the maximum over allowed entries only, so any finite scores give finite log-probabilities
// (never log(0) of an underflowed weight). `allowed` (bool, True = allowed) broadcasts to x's
// shape; an undefined tensor allows everything. A row with no allowed entry, or whose allowed
// scores are all -inf, is all -inf and gets a zero gradient. A NaN or +inf among a row's allowed
// scores makes its allowed entries NaN.
//
// Backward, per row: dx_j = g_j - softmax_j * sum_i g_i, the sum over entries whose y_i is not
// -inf. An entry with y_j = -inf (disallowed, an empty row, a score of -inf) is a constant:
// dx_j is exactly 0 there and its g_j is left out of the sum, even when g_j is not finite.
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

Tensor log_softmax(const Tensor& x, const Tensor& allowed = Tensor());

}  // namespace tapegrad
