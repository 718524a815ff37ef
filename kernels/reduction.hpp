// Internal: the loops of sum and max over dims (reduction.cpp), which the reduction ops call.
// Results do not depend on the thread count.
#pragma once

#include <cstdint>
#include <vector>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad::detail {

// Which dims of x a reduction folds (made and checked by the op).
struct ReductionPlan {
  std::vector<bool> reduced;  // per input dim
  Shape kept;                 // input shape with reduced dims set to 1
  Shape result;               // kept, or kept without the reduced dims
  std::int64_t count = 1;     // elements folded into each result
};

// The sum over the reduced dims of the floating x, accumulated in double; a fresh contiguous
// tensor of shape p.kept. Records nothing.
Tensor sum_kept(const Tensor& x, const ReductionPlan& p);
// The maximum over the reduced dims, NaN winning; a fresh contiguous tensor of shape p.kept.
// Records nothing.
Tensor max_kept(const Tensor& x, const ReductionPlan& p);
// max's dx = [x == M] g / ties, M = max_kept(x, p) and g contiguous, both laid out as p.kept:
// each slice's gradient shared among its tied maxima. Records nothing.
Tensor max_kept_backward(const Tensor& x, const Tensor& kept, const Tensor& g, const ReductionPlan& p);

}  // namespace tapegrad::detail
