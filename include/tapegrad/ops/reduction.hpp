// Reductions over given dimensions. `dims` may be negative (counted from the end); an empty
// list reduces over every dimension, as in PyTorch. With keepdim the reduced dimensions stay as
// size 1.
#pragma once

#include <cstdint>
#include <vector>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

using Dims = std::vector<std::int64_t>;

Tensor sum(const Tensor& x);  // all elements, rank 0
Tensor sum(const Tensor& x, const Dims& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const Dims& dims, bool keepdim = false);
// Maximum. NaN wins (propagates). The gradient is shared equally between tied maxima (like
// torch.amax), so it is well defined even where ties make max non-differentiable.
Tensor max(const Tensor& x);
Tensor max(const Tensor& x, const Dims& dims, bool keepdim = false);

// The sum of x's squared elements (floating), accumulated in float64 whatever x's dtype: a
// norm's square (clip_grad_norm sums it over the gradients). Not recorded.
double sum_of_squares(const Tensor& x);

}  // namespace tapegrad
