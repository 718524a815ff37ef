// log_softmax's rows, forward and backward, on the threads (formulas in ops/log_softmax.cpp).
#include "kernels/log_softmax.hpp"

#include <cmath>
#include <limits>

#include "runtime/cpu.hpp"
#include "kernels/softmax_rows.hpp"

namespace tapegrad::detail {
namespace {

template <class T> constexpr T kMinusInf = -std::numeric_limits<T>::infinity();

// The rest of one row after load_row wrote it with -inf at the disallowed entries: y = (x - m)
// - log sum over allowed j of exp(x_j - m), -inf where not allowed (softmax_rows.hpp's row rules). The
// loops are plain float loops, except in a NaN row (a NaN or +inf among the allowed scores).
template <class T, class Allowed>
[[gnu::always_inline]] inline void log_softmax_loaded(T* y, std::int64_t k, RowMax<T> max, Allowed allowed,
                                                      const void* ahead) {
  const T m = max.m;
  if (m == kMinusInf<T> && !max.nan) {  // nothing allowed, or only -inf
    std::fill_n(y, k, kMinusInf<T>);
    return;
  }
  if (m == kMinusInf<T>) {
    for (std::int64_t j = 0; j < k; ++j) y[j] = allowed(j) ? std::numeric_limits<T>::quiet_NaN() : kMinusInf<T>;
    return;
  }
  // Every exponent is <= 0, so nothing overflows; NaN and +inf scores make it NaN.
  const T log_z = std::log(simd_sum(k, [&](std::int64_t j) { return softmax_exp<T>(y[j] - m); }, ahead));
  if (log_z == log_z)
    for (std::int64_t j = 0; j < k; ++j) y[j] = (y[j] - m) - log_z;
  else  // a NaN row: NaN at the allowed entries, and the others stay -inf
    for (std::int64_t j = 0; j < k; ++j) y[j] = allowed(j) ? std::numeric_limits<T>::quiet_NaN() : kMinusInf<T>;
}

template <class T>
[[gnu::always_inline]] inline void forward_rows(const RowPointers& x, const RowPointers& mask, T* out, std::int64_t begin,
                                                std::int64_t stop) {
  const std::int64_t k = x.k, xs = x.stride, ms = mask.stride;
  for (std::int64_t r = begin; r < stop; ++r) {
    const T* s = x.row<T>(r);
    T* y = out + r * k;
    // Copy, mask (-inf) and maximum in one pass, then the rest on the copy.
    const bool* m = mask.row<bool>(r);
    const unsigned char* b = as_bytes(m);
    RowMax<T> max;
    if (m == nullptr && xs == 1) max = load_row(y, k, [&](std::int64_t j) { return s[j]; });
    else if (m == nullptr) max = load_row(y, k, [&](std::int64_t j) { return s[j * xs]; });
    else if (xs == 1 && ms == 1) max = load_row(y, k, [&](std::int64_t j) { return select(b[j], s[j]); });
    else max = load_row(y, k, [&](std::int64_t j) { return select(b[j * ms], s[j * xs]); });
    log_softmax_loaded(y, k, max, [&](std::int64_t j) { return m == nullptr || m[j * ms]; }, prefetch_next<T>(x, r, stop));
  }
}

// dx = g - exp(y) * rowsum(g over finite y), and 0 where y = -inf.
template <class T, class Grad>
[[gnu::always_inline]] inline void backward_row(const T* y, std::int64_t k, T* dx, Grad g) {
  const T sum = simd_sum(k, [&](std::int64_t j) { return y[j] != kMinusInf<T> ? g(j) : T(0); });
  for (std::int64_t j = 0; j < k; ++j) dx[j] = y[j] == kMinusInf<T> ? T(0) : g(j) - softmax_exp<T>(y[j]) * sum;
}

template <class T>
[[gnu::always_inline]] inline void backward_rows(const T* y, const RowPointers& grad, T* dx, std::int64_t begin,
                                                 std::int64_t stop) {
  const std::int64_t k = grad.k, gs = grad.stride;
  for (std::int64_t r = begin; r < stop; ++r) {
    const T* g = grad.row<T>(r);
    if (gs == 1) backward_row(y + r * k, k, dx + r * k, [g](std::int64_t j) { return g[j]; });
    else backward_row(y + r * k, k, dx + r * k, [g, gs](std::int64_t j) { return g[j * gs]; });
  }
}

// float32 compiled for each vector width, picked at run time for the CPU at hand.
TAPEGRAD_CPU_CLONES void forward_rows_f32(const RowPointers& x, const RowPointers& mask, float* out, std::int64_t begin,
                                          std::int64_t stop) {
  forward_rows<float>(x, mask, out, begin, stop);
}

TAPEGRAD_CPU_CLONES void backward_rows_f32(const float* y, const RowPointers& grad, float* dx, std::int64_t begin,
                                           std::int64_t stop) {
  backward_rows<float>(y, grad, dx, begin, stop);
}

}  // namespace

Tensor masked_log_softmax_forward(const Tensor& x, const Tensor& allowed) {
  Tensor y = new_tensor(x.shape(), x.dtype());
  const RowPointers xr(x, x.shape()), mask(allowed, x.shape());
  void* py = mutable_data(y);
  for_each_row(
      x, "log_softmax",
      [&](std::int64_t begin, std::int64_t stop) { forward_rows_f32(xr, mask, static_cast<float*>(py), begin, stop); },
      [&](std::int64_t begin, std::int64_t stop) { forward_rows<double>(xr, mask, static_cast<double*>(py), begin, stop); });
  return y;
}

Tensor masked_log_softmax_backward(const Tensor& y, const Tensor& grad) {
  Tensor dx = new_tensor(y.shape(), y.dtype());
  const RowPointers g(grad, y.shape());
  const void* py = y.raw_data();
  void* out = mutable_data(dx);
  for_each_row(
      y, "log_softmax",
      [&](std::int64_t begin, std::int64_t stop) {
        backward_rows_f32(static_cast<const float*>(py), g, static_cast<float*>(out), begin, stop);
      },
      [&](std::int64_t begin, std::int64_t stop) {
        backward_rows<double>(static_cast<const double*>(py), g, static_cast<double*>(out), begin, stop);
      });
  return dx;
}

}  // namespace tapegrad::detail
