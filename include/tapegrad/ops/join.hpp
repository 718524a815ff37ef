// Joining tensors of one dtype along a dimension.
#pragma once

#include <cstdint>
#include <vector>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

// Shapes must match except along dim.
Tensor concat(const std::vector<Tensor>& tensors, std::int64_t dim);
// Shapes must match exactly; the result has a new dim of size tensors.size().
Tensor stack(const std::vector<Tensor>& tensors, std::int64_t dim);

}  // namespace tapegrad
