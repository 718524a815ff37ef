// Masked log-softmax: forward and its hand-derived backward (see log_softmax.hpp).
//
// Derivation of the backward, for one row with y_i = x_i - lse(x), lse over allowed entries,
// and p = softmax(x) = exp(y):
//   dy_i/dx_j = delta_ij - p_j   for allowed i, j   (d lse / dx_j = p_j)
//   dx_j = sum_i g_i (delta_ij - p_j) = g_j - p_j sum_i g_i
// A disallowed i has y_i = -inf whatever x is, so it contributes nothing to the sum, and a
// disallowed j appears in no y_i, so dx_j = 0. The backward needs only y: p_j = exp(y_j), and
// y_j = -inf marks every entry that is constant.
#include "tapegrad/ops/log_softmax.hpp"

#include <cmath>
#include <limits>

#include "ops/kernel.hpp"
#include "ops/softmax_kernels.hpp"

namespace tapegrad {
namespace {
using namespace detail;

template <class T> constexpr T kMinusInf = -std::numeric_limits<T>::infinity();

// One row of K scores (strided by ss) into contiguous log-probabilities.
template <class T>
void log_softmax_row(const T* s, std::int64_t ss, T* y, std::int64_t k, const bool* mask, std::int64_t ms) {
  const MaskedMax<T> max = masked_max(s, ss, k, mask, ms);
  if (max.empty) {
    for (std::int64_t j = 0; j < k; ++j) y[j] = kMinusInf<T>;
    return;
  }
  const T log_z = convert<T>(masked_log_sum_exp(s, ss, k, mask, ms, max.m));
  for (std::int64_t j = 0; j < k; ++j)
    y[j] = mask == nullptr || mask[j * ms] ? (s[j * ss] - max.m) - log_z : kMinusInf<T>;
}

Tensor log_softmax_forward(const Tensor& x, const Tensor& allowed) {
  Tensor y = new_tensor(x.shape(), x.dtype());
  const std::int64_t k = x.shape().back();
  visit_float(x.dtype(), "log_softmax", [&]<class T>(Tag<T>) {
    T* py = static_cast<T*>(mutable_data(y));
    for_each_row<T>(x, allowed, [&](std::int64_t r, const T* row, std::int64_t ss, const bool* mask, std::int64_t ms) {
      log_softmax_row(row, ss, py + r * k, k, mask, ms);
    });
  });
  return y;
}

// dx = g - exp(y) * rowsum(g over finite y), and 0 where y = -inf; y contiguous, g any layout.
Tensor log_softmax_backward(const Tensor& y, const Tensor& grad) {
  const Tensor g = grad.is_contiguous() ? grad : copy_of(grad);
  Tensor dx = new_tensor(y.shape(), y.dtype());
  const std::int64_t k = y.shape().back();
  const std::int64_t rows = k == 0 ? 0 : y.numel() / k;
  visit_float(y.dtype(), "log_softmax", [&]<class T>(Tag<T>) {
    const T* py = static_cast<const T*>(y.raw_data());
    const T* pg = static_cast<const T*>(g.raw_data());
    T* out = static_cast<T*>(mutable_data(dx));
    for (std::int64_t r = 0; r < rows; ++r, py += k, pg += k, out += k) {
      double total = 0;
      for (std::int64_t j = 0; j < k; ++j)
        if (py[j] != kMinusInf<T>) total += static_cast<double>(pg[j]);
      const T sum = convert<T>(total);
      for (std::int64_t j = 0; j < k; ++j) out[j] = py[j] == kMinusInf<T> ? T(0) : pg[j] - std::exp(py[j]) * sum;
    }
  });
  return dx;
}

}  // namespace

Tensor log_softmax(const Tensor& x, const Tensor& allowed) {
  check_softmax_args("log_softmax", "x", x, "allowed", allowed);
  Tensor y = log_softmax_forward(x, allowed);
  // dx = g - exp(y) * rowsum(g where y is finite); 0 where y = -inf. Keeps only its output y.
  record("log_softmax", {x}, y, {y}, [y = y.detach()](std::span<const Tensor> g, const std::vector<bool>&) {
    return std::vector<Tensor>{log_softmax_backward(y, g[0])};
  });
  return y;
}

}  // namespace tapegrad
