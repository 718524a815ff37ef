// Masked softmax: forward and its hand-derived backward (see softmax.hpp for the formulas).
//
// Derivation of the backward, for one row with A_i = e_i / Z, e_i = allowed_i exp(S_i - m):
//   dA_i/dS_j = A_i (delta_ij - A_j)  for allowed i, j   (m cancels: it is a constant shift)
//   dS_j = sum_i dA_i A_i (delta_ij - A_j) = A_j (dA_j - sum_i A_i dA_i)
// Disallowed j have A_j = 0, so dS_j = 0 there, and an empty row (all A = 0) gets dS = 0.
#include "tapegrad/ops/softmax.hpp"

#include <cmath>
#include <limits>

#include "ops/kernel.hpp"
#include "ops/softmax_kernels.hpp"

namespace tapegrad {
namespace detail {
namespace {

// One row of K scores (strided by ss) into contiguous weights; mask is null (all allowed) or
// strided by ms.
template <class T>
void softmax_row(const T* s, std::int64_t ss, T* a, std::int64_t k, const bool* mask, std::int64_t ms) {
  const MaskedMax<T> max = masked_max(s, ss, k, mask, ms);
  if (max.empty) {
    for (std::int64_t j = 0; j < k; ++j) a[j] = T(0);
    return;
  }
  double z = 0;
  for (std::int64_t j = 0; j < k; ++j) {
    // s - m <= 0: no overflow; +inf - inf = NaN propagates
    a[j] = mask == nullptr || mask[j * ms] ? std::exp(s[j * ss] - max.m) : T(0);
    z += static_cast<double>(a[j]);
  }
  const T inv = convert<T>(1.0 / z);
  for (std::int64_t j = 0; j < k; ++j) a[j] *= inv;
}

}  // namespace

void check_softmax_args(const char* op, const char* scores_name, const Tensor& scores, const char* allowed_name,
                        const Tensor& allowed) {
  check_floating(op, scores_name, scores);
  if (scores.dim() < 1)
    fail<ShapeError>("{}: argument '{}' must have rank >= 1 (softmax runs over the last dim), got shape {}", op,
                     scores_name, shape_str(scores.shape()));
  if (!allowed.defined()) return;
  check_dtype(op, allowed_name, allowed, DType::bool_);
  if (broadcast_args(op, scores_name, scores.shape(), allowed_name, allowed.shape()) != scores.shape())
    fail<ShapeError>("{}: argument '{}' with shape {} must broadcast to the shape of '{}', {}", op, allowed_name,
                     shape_str(allowed.shape()), scores_name, shape_str(scores.shape()));
}

Tensor masked_softmax_forward(const Tensor& s, const Tensor& allowed) {
  // Scores are read through their strides; the weights are written contiguously.
  Tensor a = new_tensor(s.shape(), s.dtype(), "masked_softmax");
  const std::int64_t k = s.shape().back();
  visit_float(s.dtype(), "masked_softmax", [&]<class T>(Tag<T>) {
    T* pa = static_cast<T*>(mutable_data(a));
    for_each_row<T>(s, allowed, [&](std::int64_t r, const T* row, std::int64_t ss, const bool* mask, std::int64_t ms) {
      softmax_row(row, ss, pa + r * k, k, mask, ms);
    });
  });
  return a;
}

Tensor masked_softmax_backward(const Tensor& weights, const Tensor& grad_weights) {
  const Tensor g = grad_weights.is_contiguous() ? grad_weights : copy_of(grad_weights);
  Tensor ds = new_tensor(weights.shape(), weights.dtype(), "masked_softmax");
  const std::int64_t k = weights.shape().back();
  const std::int64_t rows = k == 0 ? 0 : weights.numel() / k;
  visit_float(weights.dtype(), "masked_softmax", [&]<class T>(Tag<T>) {
    const T* a = static_cast<const T*>(weights.raw_data());
    const T* da = static_cast<const T*>(g.raw_data());
    T* out = static_cast<T*>(mutable_data(ds));
    for (std::int64_t r = 0; r < rows; ++r, a += k, da += k, out += k) {
      // Entries with A_j = 0 (masked, empty rows) contribute nothing and get exactly 0, even when
      // their upstream gradient is not finite (0 * inf would be NaN).
      double dot = 0;  // sum_j A_j dA_j
      for (std::int64_t j = 0; j < k; ++j)
        if (a[j] != T(0)) dot += static_cast<double>(a[j]) * static_cast<double>(da[j]);
      for (std::int64_t j = 0; j < k; ++j) out[j] = a[j] == T(0) ? T(0) : a[j] * (da[j] - convert<T>(dot));
    }
  });
  return ds;
}

}  // namespace detail

Tensor masked_softmax(const Tensor& scores, const Tensor& allowed) {
  detail::check_softmax_args("masked_softmax", "scores", scores, "allowed", allowed);
  Tensor a = detail::masked_softmax_forward(scores, allowed);
  // dS = A * (dA - rowsum(A * dA)); keeps only its output A
  detail::record("masked_softmax", {scores}, a, {a}, [a = a.detach()](std::span<const Tensor> g, const std::vector<bool>&) {
    return std::vector<Tensor>{detail::masked_softmax_backward(a, g[0])};
  });
  return a;
}

}  // namespace tapegrad
