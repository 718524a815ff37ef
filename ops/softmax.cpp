// Masked softmax: forward and its hand-derived backward (see softmax.hpp for the formulas).
//
// Derivation of the backward, for one row with A_i = e_i / Z, e_i = allowed_i exp(S_i - m):
//   dA_i/dS_j = A_i (delta_ij - A_j)  for allowed i, j   (m cancels: it is a constant shift)
//   dS_j = sum_i dA_i A_i (delta_ij - A_j) = A_j (dA_j - sum_i A_i dA_i)
// Disallowed j have A_j = 0, so dS_j = 0 there, and an empty row (all A = 0) gets dS = 0.
#include "tapegrad/ops/softmax.hpp"

#include <cmath>
#include <limits>
#include <type_traits>

#include "runtime/cpu.hpp"
#include "runtime/parallel.hpp"
#include "ops/op.hpp"
#include "kernels/softmax_rows.hpp"
#include "tapegrad/ops/compare.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/reduction.hpp"
#include "tapegrad/ops/where.hpp"

namespace tapegrad {
namespace detail {
namespace {

// Rows of K elements cost about this many units each per element (an exp, a few passes).
constexpr std::int64_t kRowCost = 8;

// Rows [begin, stop) of the weights: each row's scores (any strides) are copied into its
// contiguous output row, then turned into weights there.
template <class T>
[[gnu::always_inline]] inline void forward_rows(const RowPointers& scores, const RowPointers& mask, T* weights,
                                                std::int64_t begin, std::int64_t stop) {
  const std::int64_t k = scores.k, ss = scores.stride, ms = mask.stride;
  for (std::int64_t r = begin; r < stop; ++r) {
    const T* s = scores.row<T>(r);
    T* a = weights + r * k;
    // Copy, mask (-inf) and maximum in one pass, then the rest of the softmax on the copy.
    const bool* m = mask.row<bool>(r);
    const unsigned char* b = as_bytes(m);
    RowMax<T> max;
    if (m == nullptr && ss == 1) max = load_row(a, k, [&](std::int64_t j) { return s[j]; });
    else if (m == nullptr) max = load_row(a, k, [&](std::int64_t j) { return s[j * ss]; });
    else if (ss == 1 && ms == 1) max = load_row(a, k, [&](std::int64_t j) { return select(b[j], s[j]); });
    else max = load_row(a, k, [&](std::int64_t j) { return select(b[j * ms], s[j * ss]); });
    softmax_loaded(a, k, k, max, [&](std::int64_t j) { return m == nullptr || m[j * ms]; }, prefetch_next<T>(scores, r, stop));
  }
}

template <class T>
[[gnu::always_inline]] inline void backward_rows(const T* weights, const RowPointers& grad, T* out, std::int64_t begin,
                                                 std::int64_t stop) {
  const std::int64_t k = grad.k, gs = grad.stride;
  for (std::int64_t r = begin; r < stop; ++r) {
    const T* g = grad.row<T>(r);
    if (gs == 1) softmax_backward_row(weights + r * k, k, k, T(1), out + r * k, [g](std::int64_t j) { return g[j]; });
    else softmax_backward_row(weights + r * k, k, k, T(1), out + r * k, [g, gs](std::int64_t j) { return g[j * gs]; });
  }
}

// float32 compiled for each vector width, picked at run time for the CPU at hand.
TAPEGRAD_CPU_CLONES void forward_rows_f32(const RowPointers& scores, const RowPointers& mask,
                                                                           float* weights, std::int64_t begin,
                                                                           std::int64_t stop) {
  forward_rows<float>(scores, mask, weights, begin, stop);
}

TAPEGRAD_CPU_CLONES void backward_rows_f32(const float* weights, const RowPointers& grad,
                                                                            float* out, std::int64_t begin,
                                                                            std::int64_t stop) {
  backward_rows<float>(weights, grad, out, begin, stop);
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
  // Scores are read through their strides; the weights are written contiguously. Rows are
  // independent: they are spread over the threads.
  Tensor a = new_tensor(s.shape(), s.dtype(), "masked_softmax");
  const std::int64_t k = s.shape().back(), rows = k == 0 ? 0 : s.numel() / k;
  const RowPointers scores(s, s.shape()), mask(allowed, s.shape());
  visit_float(s.dtype(), "masked_softmax", [&]<class T>(Tag<T>) {
    T* pa = static_cast<T*>(mutable_data(a));
    parallel_for(rows, k * kRowCost, [&](std::int64_t begin, std::int64_t stop) {
      if constexpr (std::is_same_v<T, float>) forward_rows_f32(scores, mask, pa, begin, stop);
      else forward_rows<T>(scores, mask, pa, begin, stop);
    });
  });
  return a;
}

Tensor masked_softmax_backward(const Tensor& weights, const Tensor& grad_weights) {
  // Entries with A_j = 0 (masked, empty rows) contribute nothing and get exactly 0, even when
  // their upstream gradient is not finite (0 * inf would be NaN).
  Tensor ds = new_tensor(weights.shape(), weights.dtype(), "masked_softmax");
  const std::int64_t k = weights.shape().back(), rows = k == 0 ? 0 : weights.numel() / k;
  const RowPointers grad(grad_weights, weights.shape());
  visit_float(weights.dtype(), "masked_softmax", [&]<class T>(Tag<T>) {
    const T* a = static_cast<const T*>(weights.raw_data());
    T* out = static_cast<T*>(mutable_data(ds));
    parallel_for(rows, k * kRowCost, [&](std::int64_t begin, std::int64_t stop) {
      if constexpr (std::is_same_v<T, float>) backward_rows_f32(a, grad, out, begin, stop);
      else backward_rows<T>(a, grad, out, begin, stop);
    });
  });
  return ds;
}

// The same in recorded ops, for a create_graph pass; A joined to its node, so the gradient of
// dS with respect to A goes on through the softmax (docs/gradients.md derives both halves):
//   P = A * dA',  dA' = dA where A != 0 else 0,   dS = where(A != 0, P - A * rowsum(P), 0)
// The where()s keep the kernel's rule that an entry with A = 0 reads nothing and gets exactly 0:
// a non-finite dA there, or a non-finite row sum, cannot make NaN through 0 * inf.
Tensor masked_softmax_backward_with_graph(const Tensor& weights, const Tensor& grad_weights) {
  const Tensor a = output_with_history(weights, 0);
  const Tensor nonzero = ne(weights, scalar(0.0, weights.dtype()));
  const Tensor zero = scalar(0.0, weights.dtype());
  const Tensor p = mul(a, where(nonzero, grad_weights, zero));
  return where(nonzero, sub(p, mul(a, sum(p, {-1}, /*keepdim=*/true))), zero);
}

}  // namespace detail

Tensor masked_softmax(const Tensor& scores, const Tensor& allowed) {
  detail::check_softmax_args("masked_softmax", "scores", scores, "allowed", allowed);
  Tensor a = detail::masked_softmax_forward(scores, allowed);
  // dS = A * (dA - rowsum(A * dA)); keeps only its output A
  detail::record("masked_softmax", {scores}, a, {a}, [a = a.detach()](std::span<const Tensor> g, const std::vector<bool>&) {
    if (detail::creating_graph()) return std::vector<Tensor>{detail::masked_softmax_backward_with_graph(a, g[0])};
    return std::vector<Tensor>{detail::masked_softmax_backward(a, g[0])};
  });
  return a;
}

}  // namespace tapegrad
