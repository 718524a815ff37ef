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
  auto allowed = [&](std::int64_t j) { return mask == nullptr || mask[j * ms]; };
  T m = -std::numeric_limits<T>::infinity();
  bool any = false, nan = false;
  for (std::int64_t j = 0; j < k; ++j) {
    if (!allowed(j)) continue;
    any = true;
    if (std::isnan(s[j * ss])) nan = true;
    else if (s[j * ss] > m) m = s[j * ss];
  }
  // No allowed entry, or every allowed score is -inf: an empty row.
  if (!any || (!nan && m == -std::numeric_limits<T>::infinity())) {
    for (std::int64_t j = 0; j < k; ++j) a[j] = T(0);
    return;
  }
  double z = 0;
  for (std::int64_t j = 0; j < k; ++j) {
    a[j] = allowed(j) ? std::exp(s[j * ss] - m) : T(0);  // s - m <= 0: no overflow; +inf - inf = NaN propagates
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
  // Scores are read through their strides (a transposed or broadcast view is not copied); the
  // weights are written contiguously.
  Tensor a = new_tensor(s.shape(), s.dtype(), "masked_softmax");
  const std::size_t rank = s.shape().size();
  const std::int64_t k = s.shape().back();
  const Dims8 m_strides = allowed.defined() ? broadcast_strides(allowed, s.shape()) : Dims8(rank, 0);
  StridedLoop<3> rows(s.shape().data(), rank - 1, {a.strides().data(), s.strides().data(), m_strides.data()});
  const bool* mask = allowed.defined() ? static_cast<const bool*>(allowed.raw_data()) : nullptr;
  const std::int64_t ss = s.strides()[rank - 1], ms = m_strides[rank - 1];
  visit_float(s.dtype(), "masked_softmax", [&]<class T>(Tag<T>) {
    const T* ps = static_cast<const T*>(s.raw_data());
    T* pa = static_cast<T*>(mutable_data(a));
    rows.for_each_run([&](const auto& off, std::int64_t n, const auto& inner) {
      for (std::int64_t t = 0; t < n; ++t)
        softmax_row(ps + off[1] + t * inner[1], ss, pa + off[0] + t * inner[0], k,
                    mask ? mask + off[2] + t * inner[2] : nullptr, ms);
    });
  });
  return a;
}

Tensor masked_softmax_backward(const Tensor& weights, const Tensor& grad_weights) {
  const Tensor g = grad_weights.is_contiguous() ? grad_weights : clone(grad_weights);
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
