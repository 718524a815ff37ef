// Internal: the gradient of ALiBi's slopes from the gradient of the scores. The scores x of
// head h get -slope_h |i + offset - j| added, so
//   d slope_h = sum over the rows of head h and their keys j of dS_ij (-|i + offset - j|)
// with dS = dL/dx (zero wherever the weights are: masked keys, empty rows).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "autodiff/check.hpp"
#include "kernels/attention_mask.hpp"
#include "runtime/parallel.hpp"

namespace tapegrad::detail {

// One row's share, sum over j in [begin, end) of ds[j] (-|position - j|), ds holding keys
// from j0 on (the fused path's tiles).
template <class T> double alibi_row_gradient(const RowMask& m, const T* ds, std::int64_t j0, std::int64_t n) {
  double sum = 0;
  const std::int64_t lo = std::max(m.begin - j0, std::int64_t{0}), hi = std::min(m.end - j0, n);
  for (std::int64_t j = lo; j < hi; ++j) {
    const std::int64_t d = m.position - (j0 + j);
    sum -= static_cast<double>(ds[j]) * static_cast<double>(d < 0 ? -d : d);
  }
  return sum;
}

// dS contiguous [..., Q, K] (the scores' shape, unscaled: the gradient of x itself); returns
// [H], H the number of slopes `masks` holds, in dS's dtype. Rows are summed in double, each
// row on its own and then in row order, so the result does not depend on the threads.
inline Tensor alibi_slopes_gradient(const Tensor& dS, const RowMasks& masks) {
  const std::int64_t heads = masks.alibi_heads(), k = dS.shape().back(), q = dS.shape()[dS.shape().size() - 2];
  const std::int64_t rows = k == 0 ? 0 : dS.numel() / k;
  std::vector<double> per_row(static_cast<std::size_t>(rows));
  visit_float(dS.dtype(), "attention", [&]<class T>(Tag<T>) {
    const T* base = static_cast<const T*>(dS.raw_data());
    parallel_for(rows, k, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) per_row[static_cast<std::size_t>(r)] = alibi_row_gradient(masks.row(r), base + r * k, 0, k);
    });
  });
  std::vector<double> sums(static_cast<std::size_t>(heads), 0.0);
  for (std::int64_t r = 0; r < rows; ++r) sums[static_cast<std::size_t>((r / q) % heads)] += per_row[static_cast<std::size_t>(r)];
  const Tensor out = from_vector(std::span<const double>(sums), {heads});
  return dS.dtype() == DType::float64 ? out : out.to(dS.dtype());
}

}  // namespace tapegrad::detail
