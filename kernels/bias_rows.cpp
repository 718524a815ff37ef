// linear's bias rows, forward and backward, on the threads (formulas in ops/linear.cpp).
#include "kernels/bias_rows.hpp"

#include <vector>

#include "runtime/cpu.hpp"
#include "runtime/parallel.hpp"
#include "autodiff/loops.hpp"

namespace tapegrad::detail {
namespace {

// y[r, :] += b for the rows [r0, r1) of y.
template <class T> TAPEGRAD_CPU_CLONES void add_to_rows(T* py, const T* pb, std::int64_t r0, std::int64_t r1, std::int64_t cols) {
  for (std::int64_t r = r0; r < r1; ++r) {
    T* __restrict row = py + r * cols;
#pragma omp simd
    for (std::int64_t j = 0; j < cols; ++j) row[j] += pb[j];
  }
}

// acc[j] += pg[r * stride + j] for every row r, in row order, for j < cols.
template <class T>
TAPEGRAD_CPU_CLONES void sum_rows(double* __restrict acc, const T* pg, std::int64_t rows, std::int64_t cols, std::int64_t stride) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* __restrict row = pg + r * stride;
#pragma omp simd
    for (std::int64_t j = 0; j < cols; ++j) acc[j] += static_cast<double>(row[j]);
  }
}

}  // namespace

void add_bias_rows(const Tensor& y, const Tensor& bias) {
  const std::int64_t rows = y.shape()[0], cols = y.shape()[1];
  if (rows * cols == 0) return;
  const Tensor b = bias.is_contiguous() ? bias : copy_of(bias);
  visit_float(y.dtype(), "linear", [&]<class T>(Tag<T>) {
    T* py = static_cast<T*>(mutable_data(y));
    const T* pb = static_cast<const T*>(b.raw_data());
    parallel_for(rows, cols, [&](std::int64_t r0, std::int64_t r1) { add_to_rows<T>(py, pb, r0, r1, cols); });
  });
}

// The columns are split over the threads; each is summed over the rows in order, so any split
// gives the same bits.
Tensor bias_gradient(const Tensor& g, const Shape& shape) {
  const std::int64_t rows = g.shape()[0], cols = g.shape()[1];
  std::vector<double> acc(static_cast<std::size_t>(cols), 0.0);
  Tensor out = new_tensor(shape, g.dtype(), "linear");
  visit_float(g.dtype(), "linear", [&]<class T>(Tag<T>) {
    const T* pg = static_cast<const T*>(g.raw_data());
    T* po = static_cast<T*>(mutable_data(out));
    parallel_for(cols, rows, [&](std::int64_t j0, std::int64_t j1) {
      sum_rows<T>(acc.data() + j0, pg + j0, rows, j1 - j0, cols);
      for (std::int64_t j = j0; j < j1; ++j) po[j] = static_cast<T>(acc[static_cast<std::size_t>(j)]);
    });
  });
  return out;
}

}  // namespace tapegrad::detail
