// The attention core's fused softmax pass and its backward (formulas in attention.cpp and
// docs/gradients.md). Each row is independent: rows are spread over the threads, and the loops
// inside a row are written so that they vectorise (omp simd reductions, a call-free exp).
#include "layers/attention_softmax.hpp"

#include <algorithm>
#include <limits>
#include <type_traits>

#include "autodiff/parallel.hpp"
#include "ops/kernel.hpp"
#include "ops/softmax_kernels.hpp"

namespace tapegrad::detail {
namespace {

// Where each row of a tensor read as `shape` ([..., Q, K], broadcasting) starts, and the stride
// along K. Rows of a contiguous tensor of that shape start every K elements; other layouts
// unravel the row number over [..., Q].
struct Rows {
  const std::byte* base = nullptr;
  Shape shape;
  Dims8 strides;
  std::int64_t k = 0, stride = 0;
  bool packed = false;

  Rows(const Tensor& t, const Shape& shape_) : shape(shape_), k(shape_.back()) {
    if (!t.defined()) return;
    base = static_cast<const std::byte*>(t.raw_data());
    packed = t.shape() == shape && t.is_contiguous();
    strides = broadcast_strides(t, shape);
    stride = strides[shape.size() - 1];
  }
  template <class T> const T* row(std::int64_t r) const noexcept {
    if (base == nullptr) return nullptr;
    if (packed) return reinterpret_cast<const T*>(base) + r * k;
    std::int64_t offset = 0;
    for (std::size_t d = shape.size() - 1; d-- > 0;) {
      offset += (r % shape[d]) * strides[d];
      r /= shape[d];
    }
    return reinterpret_cast<const T*>(base) + offset;
  }
};

// Softmax in place over the allowed keys of a[0, end); a[end, k) and the other keys get 0.
// Same rules as masked_max: NaN scores are skipped by the maximum but propagate, and a row with
// no allowed key or only -inf allowed scores is all zeros. The keys that the mask forbids are
// first set to -inf, so that the loops after it are plain float loops (they vectorise): -inf
// changes no maximum, marks no NaN, and exp(-inf - m) is 0 for every m but -inf. m = -inf
// happens only with a NaN score and no finite one; that row takes the loop that asks the mask.
template <class T, class Allowed>
[[gnu::always_inline]] inline void softmax_in_place(T* a, std::int64_t end, std::int64_t k, bool dense, Allowed allowed) {
  constexpr T kMinusInf = -std::numeric_limits<T>::infinity();
  if (!dense)
    for (std::int64_t j = 0; j < end; ++j) a[j] = allowed(j) ? a[j] : kMinusInf;
  T m = kMinusInf;
  int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
  for (std::int64_t j = 0; j < end; ++j) {
    const T v = a[j];
    nan |= v != v ? 1 : 0;
    m = v > m ? v : m;
  }
  if (m == kMinusInf && !nan) {  // nothing allowed, or only -inf
    std::fill_n(a, k, T(0));
    return;
  }
  // s - m <= 0: no overflow; +inf - inf = NaN propagates
  const T z = m == kMinusInf ? simd_sum(end, [&](std::int64_t j) { return a[j] = allowed(j) ? softmax_exp<T>(a[j] - m) : T(0); })
                             : simd_sum(end, [&](std::int64_t j) { return a[j] = softmax_exp<T>(a[j] - m); });
  const T inv = T(1) / z;
  for (std::int64_t j = 0; j < end; ++j) a[j] *= inv;
  std::fill(a + end, a + k, T(0));
}

template <class T>
[[gnu::always_inline]] inline void forward_rows(const Rows& scores, const Rows& bias, T scale, const RowMasks& masks, T* weights, std::int64_t begin,
                  std::int64_t stop) {
  const std::int64_t k = scores.k;
  for (std::int64_t r = begin; r < stop; ++r) {
    const RowMask m = masks.row(r);
    const T* s = scores.row<T>(r);
    const T* b = bias.row<T>(r);
    T* a = weights + r * k;
    const std::int64_t ss = scores.stride, bs = bias.stride, end = m.end;
    // x = scale s + b over the keys below the causal end (the rest is 0 whatever it holds)
    if (b == nullptr && ss == 1)
      for (std::int64_t j = 0; j < end; ++j) a[j] = scale * s[j];
    else if (b == nullptr)
      for (std::int64_t j = 0; j < end; ++j) a[j] = scale * s[j * ss];
    else if (ss == 1 && bs == 1)
      for (std::int64_t j = 0; j < end; ++j) a[j] = scale * s[j] + b[j];
    else
      for (std::int64_t j = 0; j < end; ++j) a[j] = scale * s[j * ss] + b[j * bs];
    if (m.pairs == nullptr)
      softmax_in_place(a, end, k, m.dense(), [keys = m.keys](std::int64_t j) { return keys == nullptr || keys[j]; });
    else
      softmax_in_place(a, end, k, false, [&m](std::int64_t j) { return m(j); });
  }
}

// One row of dS (see the header) with dA_j = grad(j).
template <class T, class Grad>
[[gnu::always_inline]] inline void backward_row(const T* a, std::int64_t end, std::int64_t k, T factor, T* out, Grad grad) {
  // Entries with A_j = 0 (masked, empty rows) contribute nothing and get exactly 0, even when
  // their upstream gradient is not finite (0 * inf would be NaN).
  const T d = simd_sum(end, [&](std::int64_t j) { return a[j] != T(0) ? a[j] * grad(j) : T(0); });
  for (std::int64_t j = 0; j < end; ++j) out[j] = a[j] == T(0) ? T(0) : factor * (a[j] * (grad(j) - d));
  std::fill(out + end, out + k, T(0));
}

template <class T>
[[gnu::always_inline]] inline void backward_rows(const T* weights, const Rows& ga, const Rows& gb, T factor, const RowMasks& masks, T* out,
                   std::int64_t begin, std::int64_t stop) {
  const std::int64_t k = ga.base ? ga.k : gb.k, sa = ga.stride, sb = gb.stride;
  for (std::int64_t r = begin; r < stop; ++r) {
    const std::int64_t end = masks.row(r).end;
    const T* a = weights + r * k;
    const T* pa = ga.row<T>(r);
    const T* pb = gb.row<T>(r);
    T* o = out + r * k;
    if (pa && pb && sa == 1 && sb == 1)
      backward_row(a, end, k, factor, o, [&](std::int64_t j) { return pa[j] + pb[j]; });
    else if (pa && pb)
      backward_row(a, end, k, factor, o, [&](std::int64_t j) { return pa[j * sa] + pb[j * sb]; });
    else if (pa && sa == 1)
      backward_row(a, end, k, factor, o, [&](std::int64_t j) { return pa[j]; });
    else if (pa)
      backward_row(a, end, k, factor, o, [&](std::int64_t j) { return pa[j * sa]; });
    else
      backward_row(a, end, k, factor, o, [&](std::int64_t j) { return pb[j * sb]; });
  }
}

// float32, the common case, is compiled for each vector width and picked at run time for the
// CPU at hand (the build machine's CPU is never assumed); the templates above are inlined into
// each clone.
[[gnu::target_clones("avx512f", "avx2", "default")]] void forward_rows_f32(const Rows& scores, const Rows& bias, float scale,
                                                                           const RowMasks& masks, float* weights,
                                                                           std::int64_t begin, std::int64_t stop) {
  forward_rows<float>(scores, bias, scale, masks, weights, begin, stop);
}

[[gnu::target_clones("avx512f", "avx2", "default")]] void backward_rows_f32(const float* weights, const Rows& ga,
                                                                            const Rows& gb, float factor,
                                                                            const RowMasks& masks, float* out,
                                                                            std::int64_t begin, std::int64_t stop) {
  backward_rows<float>(weights, ga, gb, factor, masks, out, begin, stop);
}

// Rows of K elements cost about this many units each per element (an exp, a few passes).
constexpr std::int64_t kRowCost = 8;

}  // namespace

void attention_softmax_forward(const Tensor& scores, double scale, const Tensor& bias, const RowMasks& masks,
                               const Tensor& weights) {
  const Shape& shape = weights.shape();
  const std::int64_t k = shape.back(), rows = k == 0 ? 0 : weights.numel() / k;
  const Rows s(scores, shape), b(bias, shape);
  visit_float(weights.dtype(), "attention", [&]<class T>(Tag<T>) {
    T* out = static_cast<T*>(mutable_data(weights));
    parallel_for(rows, k * kRowCost, [&](std::int64_t begin, std::int64_t stop) {
      if constexpr (std::is_same_v<T, float>) forward_rows_f32(s, b, static_cast<T>(scale), masks, out, begin, stop);
      else forward_rows<T>(s, b, static_cast<T>(scale), masks, out, begin, stop);
    });
  });
}

Tensor attention_softmax_backward(const Tensor& weights, const Tensor& grad_a, const Tensor& grad_b, const RowMasks& masks,
                                  double factor) {
  const Shape& shape = weights.shape();
  Tensor ds = new_tensor(shape, weights.dtype(), "attention");
  const std::int64_t k = shape.back(), rows = k == 0 ? 0 : weights.numel() / k;
  const Rows ga(grad_a, shape), gb(grad_b, shape);
  visit_float(weights.dtype(), "attention", [&]<class T>(Tag<T>) {
    const T* a = static_cast<const T*>(weights.raw_data());
    T* out = static_cast<T*>(mutable_data(ds));
    parallel_for(rows, k * kRowCost, [&](std::int64_t begin, std::int64_t stop) {
      if constexpr (std::is_same_v<T, float>) backward_rows_f32(a, ga, gb, static_cast<T>(factor), masks, out, begin, stop);
      else backward_rows<T>(a, ga, gb, static_cast<T>(factor), masks, out, begin, stop);
    });
  });
  return ds;
}

}  // namespace tapegrad::detail
