// The masked softmax's rows, forward and backward, on the threads (formulas in ops/softmax.cpp).
#include "kernels/softmax.hpp"

#include "runtime/cpu.hpp"
#include "kernels/softmax_rows.hpp"

namespace tapegrad::detail {
namespace {

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
TAPEGRAD_CPU_CLONES void forward_rows_f32(const RowPointers& scores, const RowPointers& mask, float* weights,
                                          std::int64_t begin, std::int64_t stop) {
  forward_rows<float>(scores, mask, weights, begin, stop);
}

TAPEGRAD_CPU_CLONES void backward_rows_f32(const float* weights, const RowPointers& grad, float* out, std::int64_t begin,
                                           std::int64_t stop) {
  backward_rows<float>(weights, grad, out, begin, stop);
}

}  // namespace

Tensor masked_softmax_forward(const Tensor& s, const Tensor& allowed) {
  // Scores are read through their strides; the weights are written contiguously.
  Tensor a = new_tensor(s.shape(), s.dtype(), "masked_softmax");
  const RowPointers scores(s, s.shape()), mask(allowed, s.shape());
  void* pa = mutable_data(a);
  for_each_row(
      s, "masked_softmax",
      [&](std::int64_t begin, std::int64_t stop) { forward_rows_f32(scores, mask, static_cast<float*>(pa), begin, stop); },
      [&](std::int64_t begin, std::int64_t stop) { forward_rows<double>(scores, mask, static_cast<double*>(pa), begin, stop); });
  return a;
}

Tensor masked_softmax_backward(const Tensor& weights, const Tensor& grad_weights) {
  // Entries with A_j = 0 (masked, empty rows) contribute nothing and get exactly 0, even when
  // their upstream gradient is not finite (0 * inf would be NaN).
  Tensor ds = new_tensor(weights.shape(), weights.dtype(), "masked_softmax");
  const RowPointers grad(grad_weights, weights.shape());
  const void* a = weights.raw_data();
  void* out = mutable_data(ds);
  for_each_row(
      weights, "masked_softmax",
      [&](std::int64_t begin, std::int64_t stop) {
        backward_rows_f32(static_cast<const float*>(a), grad, static_cast<float*>(out), begin, stop);
      },
      [&](std::int64_t begin, std::int64_t stop) {
        backward_rows<double>(static_cast<const double*>(a), grad, static_cast<double*>(out), begin, stop);
      });
  return ds;
}

}  // namespace tapegrad::detail
