// Inverted dropout.
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

// While training with p > 0, each element of x (floating) is kept with probability 1 - p and
// scaled by 1 / (1 - p); the others become exactly 0 (even where x is inf or NaN). The mask
// takes one gen.uniform() per element in row-major order (kept when u >= p), so a seed gives
// the same mask on every platform. p = 1 drops everything: zeros, with a zero gradient. When
// !training or p == 0 the result is x itself (no copy, nothing recorded). p outside [0, 1] is a
// ValueError. Backward: dx = g * mask / (1 - p), exactly 0 where dropped.
Tensor dropout(const Tensor& x, double p, Generator& gen, bool training);

}  // namespace tapegrad
