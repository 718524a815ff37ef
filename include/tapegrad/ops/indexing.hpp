// Selecting elements by integer ids (int64 tensors). Differentiable in x, not in the ids: the
// backward adds each output's gradient into the element of x it was read from, so an id that
// repeats accumulates the gradients of all its copies.
#pragma once

#include <cstdint>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

// numpy.take along one dim: the result has shape x.shape[:dim] + index.shape + x.shape[dim+1:]
// and out[a..., i..., b...] = x[a..., index[i...], b...]. `index` is int64 of any rank (rank 0
// removes the dim, like select). Every id must lie in [0, x.size(dim)): a negative or too large
// one is a ValueError naming the id and its position in `index`.
Tensor index_select(const Tensor& x, std::int64_t dim, const Tensor& index);

// The rows of an embedding table: weight [V, E], ids int64 of any shape with entries in [0, V)
// -> [..., E]. It is index_select(weight, 0, ids), with errors that name embedding's arguments.
Tensor embedding(const Tensor& weight, const Tensor& ids);

// torch.gather: the result has index's shape and, for dim = 1 of a rank-3 x,
// out[i][j][k] = x[i][index[i][j][k]][k] (likewise for any dim and rank). `index` is int64 with
// x's rank, index.size(d) <= x.size(d) for every d != dim (any size along dim), and ids in
// [0, x.size(dim)).
Tensor gather(const Tensor& x, std::int64_t dim, const Tensor& index);

}  // namespace tapegrad
