// Internal: the matmul that attention multiplies its weights with.
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad::detail {

// w @ x (batch dims broadcast, as matmul) in which a weight that is exactly zero contributes
// nothing: c[i, n] = sum over k with w[i, k] != 0 of w[i, k] x[k, n]. A plain matmul adds
// 0 * x[k, n], which is NaN when x[k, n] is NaN or infinite. Attention multiplies by its
// weights A and by their gradient dS (O = A v, dv = A^T dO, dq = dS k, dk = dS^T q), which are
// exactly zero at masked keys and empty rows: with a plain matmul, one NaN in a masked key's
// value would reach every query. Records nothing.
//
// Where every element of x is finite (one O(size) scan decides) this is the plain matmul.
// Otherwise an element of c that no non-finite x[k, n] reaches through a nonzero weight is
// bitwise what the plain matmul gives for x with its non-finite elements replaced by 0.
Tensor weighted_matmul(const Tensor& w, const Tensor& x);

// Whether every element of a floating tensor (any layout) is finite: the scan above, for
// callers that multiply many blocks of one operand.
bool all_finite_values(const Tensor& x);
// Whether every row of x [B, L, C] (any strides) that `keep` [B, L] (bool, contiguous) leaves out
// is finite.
bool left_out_rows_finite(const Tensor& keep, const Tensor& x);
// The same for n contiguous elements from p.
bool all_finite_run(const float* p, std::int64_t n) noexcept;
bool all_finite_run(const double* p, std::int64_t n) noexcept;

}  // namespace tapegrad::detail
