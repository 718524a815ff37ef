// Shape ops. Each returns a view sharing the input's storage, except reshape when the strides
// do not allow one (then it copies, as torch.reshape does) and contiguous on a strided input.
#pragma once

#include <cstdint>
#include <vector>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

// One entry of `shape` may be -1 (inferred).
Tensor reshape(const Tensor& x, Shape shape);
Tensor flatten(const Tensor& x);  // rank 1
Tensor permute(const Tensor& x, std::vector<std::int64_t> dims);
Tensor transpose(const Tensor& x, std::int64_t dim0, std::int64_t dim1);
// Elements start, start + step, ... < end along dim (Python slice semantics for negative and
// out-of-range start/end; step >= 1).
Tensor slice(const Tensor& x, std::int64_t dim, std::int64_t start, std::int64_t end,
             std::int64_t step = 1);
Tensor narrow(const Tensor& x, std::int64_t dim, std::int64_t start, std::int64_t length);
// Selects index `i` along dim and removes that dim.
Tensor select(const Tensor& x, std::int64_t dim, std::int64_t index);
// Broadcasts to `shape` without copying (stride 0 on new and size-1 dims).
Tensor expand(const Tensor& x, const Shape& shape);
Tensor broadcast_to(const Tensor& x, const Shape& shape);  // expand, under NumPy's name
Tensor squeeze(const Tensor& x, std::int64_t dim);  // dim must have size 1
Tensor unsqueeze(const Tensor& x, std::int64_t dim);
Tensor contiguous(const Tensor& x);  // x itself when already contiguous

// The broadcast of two shapes, or a ShapeError naming `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op = "broadcast_shapes");

}  // namespace tapegrad
