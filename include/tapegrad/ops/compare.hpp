// Comparisons and logic: bool results, never differentiable. Comparisons broadcast and accept
// any matching dtypes (bool and int64 too); logic ops take bool tensors.
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_not(const Tensor& a);
bool any(const Tensor& a);  // bool tensor: is any element true
bool all(const Tensor& a);  // bool tensor: is every element true

}  // namespace tapegrad
