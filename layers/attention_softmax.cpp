// The attention core's fused softmax pass and its backward (formulas in attention.cpp and
// docs/gradients.md). Each row is independent: rows are spread over the threads, and the loops
// inside a row are written so that they vectorise (lane-split reductions, a call-free exp).
#include "layers/attention_softmax.hpp"

#include <algorithm>
#include <limits>

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

// Softmax in place over a[0, end) restricted to the keys allowed(j); a[end, k) is set to 0.
// Same rules as masked_max: NaN scores are skipped by the maximum but propagate, and a row with
// no allowed key or only -inf allowed scores is all zeros.
template <class T, class Allowed> void softmax_in_place(T* a, std::int64_t end, std::int64_t k, Allowed allowed) {
  constexpr T kMinusInf = -std::numeric_limits<T>::infinity();
  T lane_max[kLanes];
  unsigned char lane_any[kLanes] = {}, lane_nan[kLanes] = {};
  std::fill_n(lane_max, kLanes, kMinusInf);
  auto take = [&](std::int64_t j, std::int64_t l) {
    const T v = a[j];
    const bool ok = allowed(j);
    lane_any[l] |= ok;
    lane_nan[l] |= ok & (v != v);
    lane_max[l] = ok && v > lane_max[l] ? v : lane_max[l];
  };
  std::int64_t j = 0;
  for (; j + kLanes <= end; j += kLanes)
    for (std::int64_t l = 0; l < kLanes; ++l) take(j + l, l);
  for (; j < end; ++j) take(j, 0);
  T m = kMinusInf;
  bool any = false, nan = false;
  for (std::int64_t l = 0; l < kLanes; ++l) {
    m = std::max(m, lane_max[l]);
    any |= lane_any[l] != 0;
    nan |= lane_nan[l] != 0;
  }
  if (!any || (!nan && m == kMinusInf)) {
    std::fill_n(a, k, T(0));
    return;
  }
  // s - m <= 0: no overflow; +inf - inf = NaN propagates
  const double z = lane_sum(end, [&](std::int64_t i) {
    const T e = allowed(i) ? softmax_exp<T>(a[i] - m) : T(0);
    a[i] = e;
    return e;
  });
  const T inv = static_cast<T>(1.0 / z);
  for (std::int64_t i = 0; i < end; ++i) a[i] *= inv;
  std::fill(a + end, a + k, T(0));
}

template <class T>
void forward_rows(const Rows& scores, const Rows& bias, T scale, const RowMasks& masks, T* weights, std::int64_t begin,
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
    if (m.dense())
      softmax_in_place(a, end, k, [](std::int64_t) { return true; });
    else if (m.pairs == nullptr)
      softmax_in_place(a, end, k, [keys = m.keys](std::int64_t j) { return keys[j]; });
    else
      softmax_in_place(a, end, k, [&m](std::int64_t j) { return m(j); });
  }
}

// One row of dS (see the header) with dA_j = grad(j).
template <class T, class Grad>
void backward_row(const T* a, std::int64_t end, std::int64_t k, T factor, T* out, Grad grad) {
  // Entries with A_j = 0 (masked, empty rows) contribute nothing and get exactly 0, even when
  // their upstream gradient is not finite (0 * inf would be NaN).
  const double dot = lane_sum(end, [&](std::int64_t j) {
    return a[j] != T(0) ? static_cast<double>(a[j]) * static_cast<double>(grad(j)) : 0.0;
  });
  const T d = static_cast<T>(dot);
  for (std::int64_t j = 0; j < end; ++j) out[j] = a[j] == T(0) ? T(0) : factor * (a[j] * (grad(j) - d));
  std::fill(out + end, out + k, T(0));
}

template <class T>
void backward_rows(const T* weights, const Rows& ga, const Rows& gb, T factor, const RowMasks& masks, T* out,
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
      forward_rows<T>(s, b, static_cast<T>(scale), masks, out, begin, stop);
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
      backward_rows<T>(a, ga, gb, static_cast<T>(factor), masks, out, begin, stop);
    });
  });
  return ds;
}

}  // namespace tapegrad::detail
