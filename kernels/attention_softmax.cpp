// The attention core's fused softmax pass and its backward (formulas in attention.cpp and
// docs/gradients.md). Each row is independent: rows are spread over the threads, and the loops
// inside a row are written so that they vectorise (omp simd reductions, a call-free exp).
#include "kernels/attention_softmax.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "runtime/cpu.hpp"
#include "autodiff/loops.hpp"
#include "kernels/matmul_dnnl.hpp"
#include "kernels/softmax_rows.hpp"

namespace tapegrad::detail {
namespace {

// Writes x = scale s + b (+ ALiBi's bias) over the keys of row r below its causal end, -inf at the masked ones
// (and below the window's begin),
// to a, and returns their maximum: one pass (the rest of the row becomes 0 whatever it holds).
template <class T>
[[gnu::always_inline]] inline RowMax<T> load_scores(const RowPointers& scores, const RowPointers& bias, T scale, const RowMask& m,
                                                    std::int64_t r, T* a) {
  const T* s = scores.row<T>(r);
  const T* b = bias.row<T>(r);
  const std::int64_t ss = scores.stride, bs = bias.stride, end = m.end;
  const unsigned char* keys = as_bytes(m.keys);
  auto masked = [&](std::int64_t j, T x) { return m.pairs ? select(m(j), x) : select(keys[j], x); };
  if ((m.alibi || m.begin > 0) && m.dense() && m.alibi_in_float(end)) {
    // ALiBi and the window on a row with no other mask, its distances exact in T: a loop that
    // vectorises (x - m d is x + (-(m d)), the general loop's number). Unit strides get loops of
    // their own, since the compiler leaves a strided one scalar, and the fused blocks' scores are
    // contiguous.
    const T slope = m.alibi ? static_cast<T>(m.slope) : T(0), p = static_cast<T>(m.position);
    // Keys before the window's begin are -inf, written apart: a compare in the loop would have
    // it split there, and the part after the split not vectorised.
    const std::int64_t lo = m.begin;
    std::fill_n(a, lo, -std::numeric_limits<T>::infinity());
    const T* index = index_ramp<T>(end) + lo;
    const T* sl = s + lo * ss;
    if (b == nullptr && ss == 1) return load_row(a + lo, end - lo, [=](std::int64_t j) { return scale * sl[j] - slope * std::abs(p - index[j]); });
    if (b == nullptr) return load_row(a + lo, end - lo, [=](std::int64_t j) { return scale * sl[j * ss] - slope * std::abs(p - index[j]); });
    const T* bl = b + lo * bs;
    if (ss == 1 && bs == 1) return load_row(a + lo, end - lo, [=](std::int64_t j) { return scale * sl[j] + bl[j] - slope * std::abs(p - index[j]); });
    return load_row(a + lo, end - lo, [=](std::int64_t j) { return scale * sl[j * ss] + bl[j * bs] - slope * std::abs(p - index[j]); });
  }
  if (m.alibi || m.begin > 0) {  // ALiBi and the window with other masks: each key asks the row (still one pass)
    if (b == nullptr) return load_row(a, end, [&](std::int64_t j) { return select(m(j), scale * s[j * ss] + m.alibi_bias<T>(j)); });
    return load_row(a, end, [&](std::int64_t j) { return select(m(j), scale * s[j * ss] + b[j * bs] + m.alibi_bias<T>(j)); });
  }
  if (m.dense() && b == nullptr && ss == 1) return load_row(a, end, [&](std::int64_t j) { return scale * s[j]; });
  if (m.dense() && b == nullptr) return load_row(a, end, [&](std::int64_t j) { return scale * s[j * ss]; });
  if (m.dense()) return load_row(a, end, [&](std::int64_t j) { return scale * s[j * ss] + b[j * bs]; });
  if (m.pairs == nullptr && b == nullptr && ss == 1) return load_row(a, end, [&](std::int64_t j) { return select(keys[j], scale * s[j]); });
  if (b == nullptr) return load_row(a, end, [&](std::int64_t j) { return masked(j, scale * s[j * ss]); });
  return load_row(a, end, [&](std::int64_t j) { return masked(j, scale * s[j * ss] + b[j * bs]); });
}

// weights and rounded hold rows from first on; stats (if not null) gets each row's maximum m and
// log l, l the sum of exp(x - m), from first on.
template <class T>
[[gnu::always_inline]] inline void forward_rows(const RowPointers& scores, const RowPointers& bias, T scale,
                                                const RowMasks& masks, T* weights, std::uint16_t* rounded,
                                                std::int64_t first, std::int64_t begin, std::int64_t stop, T* stats = nullptr) {
  const std::int64_t k = scores.k;
  for (std::int64_t r = begin; r < stop; ++r) {
    const RowMask m = masks.row(r);
    T* a = weights + (r - first) * k;
    const RowMax<T> max = load_scores(scores, bias, scale, m, r, a);
    const T l = softmax_loaded(a, m.end, k, max, [&m](std::int64_t j) { return m(j); }, prefetch_next<T>(scores, r, stop));
    if (stats != nullptr) {
      stats[2 * (r - first)] = max.m;
      stats[2 * (r - first) + 1] = std::log(l);  // -inf for a row of zeros: never read, m is -inf
    }
    if constexpr (std::is_same_v<T, float>)
      if (rounded != nullptr) round_bf16_weights(a, rounded + (r - first) * k, k);  // the row is still in L1
  }
}

// The fused path's backward pass over a block (float32), see attention_softmax.hpp.
[[gnu::always_inline]] inline void recompute_rows(float* s, const RowPointers& bias, float scale, const RowMasks& masks,
                                                  const float* stats, const float* delta, float* da, float factor,
                                                  std::uint16_t* rounded_p, std::uint16_t* rounded_ds, std::int64_t ld,
                                                  std::int64_t begin, std::int64_t stop) {
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
  const RowPointers rows = RowPointers::block(s, Shape{ld}, begin);  // the scores, read in place
  for (std::int64_t r = begin; r < stop; ++r) {
    const RowMask m = masks.row(r);
    const std::int64_t i = r - begin, end = m.end, pad = padded_end(end, ld);
    float* p = s + i * ld;
    float* ds = da != nullptr ? da + i * ld : nullptr;
    const float mx = stats[2 * i], log_l = stats[2 * i + 1];
    if (log_l != log_l) {  // a NaN row: NaN at its allowed keys, as the forward's weights
      for (std::int64_t j = 0; j < ld; ++j) p[j] = j < end && m(j) ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
    } else if (mx == kMinusInf) {  // empty: no weight, no gradient
      std::fill_n(p, ld, 0.0f);
    } else {
      load_scores(rows, bias, scale, m, r, p);
      std::fill(p + end, p + pad, kMinusInf);
      // exp((x - m) - log l): every exponent <= 0 (the one that is 0 gives 1 / l), masked keys 0
      for (std::int64_t j = 0; j < pad; ++j) p[j] = exp_flush_f32((p[j] - mx) - log_l);
      std::fill(p + pad, p + ld, 0.0f);
    }
    if (ds != nullptr) {
      // dS selected where P = 0: dA is not finite at a masked key whose v is
      const float dl = delta != nullptr ? delta[i] : simd_sum(pad, [&](std::int64_t j) { return p[j] != 0.0f ? p[j] * ds[j] : 0.0f; });
      for (std::int64_t j = 0; j < pad; ++j) ds[j] = p[j] == 0.0f ? 0.0f : factor * (p[j] * (ds[j] - dl));
      std::fill(ds + pad, ds + ld, 0.0f);
    }
    if (rounded_p != nullptr) round_bf16_weights(p, rounded_p + i * ld, ld);
    if (ds != nullptr && rounded_ds != nullptr) round_bf16_weights(ds, rounded_ds + i * ld, ld);
  }
}

// weights, out and rounded hold rows from first on (one_row: out is the same single row for each).
template <class T>
[[gnu::always_inline]] inline void backward_rows(const T* weights, const RowPointers& ga, const RowPointers& gb, T factor,
                                                 const RowMasks& masks, T* out, std::int64_t first, bool one_row,
                                                 std::uint16_t* rounded, std::int64_t begin, std::int64_t stop) {
  const std::int64_t k = ga.base ? ga.k : gb.k, sa = ga.stride, sb = gb.stride;
  for (std::int64_t r = begin; r < stop; ++r) {
    const std::int64_t end = masks.row(r).end;
    const T* a = weights + (r - first) * k;
    const T* pa = ga.row<T>(r);
    const T* pb = gb.row<T>(r);
    T* o = one_row ? out : out + (r - first) * k;  // one row: dS is kept only rounded
    if (pa && pb && sa == 1 && sb == 1)
      softmax_backward_row(a, end, k, factor, o, [&](std::int64_t j) { return pa[j] + pb[j]; });
    else if (pa && pb)
      softmax_backward_row(a, end, k, factor, o, [&](std::int64_t j) { return pa[j * sa] + pb[j * sb]; });
    else if (pa && sa == 1)
      softmax_backward_row(a, end, k, factor, o, [&](std::int64_t j) { return pa[j]; });
    else if (pa)
      softmax_backward_row(a, end, k, factor, o, [&](std::int64_t j) { return pa[j * sa]; });
    else
      softmax_backward_row(a, end, k, factor, o, [&](std::int64_t j) { return pb[j * sb]; });
    if constexpr (std::is_same_v<T, float>)
      if (rounded != nullptr) round_bf16_weights(o, rounded + (r - first) * k, k);
  }
}

// float32, the common case, is compiled for each vector width and picked at run time for the
// CPU at hand (the build machine's CPU is never assumed); the templates above are inlined into
// each clone.
TAPEGRAD_CPU_CLONES void forward_rows_f32(const RowPointers& scores, const RowPointers& bias,
                                                                           float scale, const RowMasks& masks, float* weights,
                                                                           std::uint16_t* rounded, std::int64_t first,
                                                                           std::int64_t begin, std::int64_t stop, float* stats) {
  forward_rows<float>(scores, bias, scale, masks, weights, rounded, first, begin, stop, stats);
}

TAPEGRAD_CPU_CLONES void recompute_rows_f32(float* s, const RowPointers& bias, float scale,
                                                                             const RowMasks& masks, const float* stats,
                                                                             const float* delta, float* da, float factor,
                                                                             std::uint16_t* rounded_p, std::uint16_t* rounded_ds,
                                                                             std::int64_t ld, std::int64_t begin, std::int64_t stop) {
  recompute_rows(s, bias, scale, masks, stats, delta, da, factor, rounded_p, rounded_ds, ld, begin, stop);
}

TAPEGRAD_CPU_CLONES void backward_rows_f32(const float* weights, const RowPointers& ga,
                                                                            const RowPointers& gb, float factor,
                                                                            const RowMasks& masks, float* out,
                                                                            std::int64_t first, bool one_row,
                                                                            std::uint16_t* rounded, std::int64_t begin,
                                                                            std::int64_t stop) {
  backward_rows<float>(weights, ga, gb, factor, masks, out, first, one_row, rounded, begin, stop);
}

}  // namespace

void attention_softmax_forward(const Tensor& scores, double scale, const Tensor& bias, const RowMasks& masks,
                               const Tensor& weights, std::uint16_t* rounded) {
  const Shape& shape = weights.shape();
  const RowPointers s(scores, shape), b(bias, shape);
  void* out = mutable_data(weights);
  for_each_row(
      weights, "attention",
      [&](std::int64_t begin, std::int64_t stop) {
        forward_rows_f32(s, b, static_cast<float>(scale), masks, static_cast<float*>(out), rounded, 0, begin, stop, nullptr);
      },
      [&](std::int64_t begin, std::int64_t stop) {
        forward_rows<double>(s, b, scale, masks, static_cast<double*>(out), nullptr, 0, begin, stop);
      });
}

Tensor attention_softmax_backward(const Tensor& weights, const Tensor& grad_a, const Tensor& grad_b, const RowMasks& masks,
                                  double factor, std::uint16_t* rounded, bool keep_float) {
  const Shape& shape = weights.shape();
  keep_float = keep_float || rounded == nullptr || weights.dtype() != DType::float32;
  Tensor ds = keep_float ? new_tensor(shape, weights.dtype(), "attention") : Tensor();
  const std::int64_t k = shape.back();
  const RowPointers ga(grad_a, shape), gb(grad_b, shape);
  const void* a = weights.raw_data();
  void* out = keep_float ? mutable_data(ds) : nullptr;
  for_each_row(
      weights, "attention",
      [&](std::int64_t begin, std::int64_t stop) {
        std::vector<float> row(keep_float ? 0 : static_cast<std::size_t>(k));  // one row at a time, rounded as it is written
        float* dst = keep_float ? static_cast<float*>(out) : row.data();
        backward_rows_f32(static_cast<const float*>(a), ga, gb, static_cast<float>(factor), masks, dst, 0, !keep_float, rounded,
                          begin, stop);
      },
      [&](std::int64_t begin, std::int64_t stop) {
        backward_rows<double>(static_cast<const double*>(a), ga, gb, factor, masks, static_cast<double*>(out), 0, false, nullptr,
                              begin, stop);
      });
  return ds;
}

void attention_softmax_forward_rows(const RowPointers& scores, const RowPointers& bias, float scale, const RowMasks& masks,
                                    float* weights, std::uint16_t* rounded, std::int64_t begin, std::int64_t stop, float* stats) {
  forward_rows_f32(scores, bias, scale, masks, weights, rounded, begin, begin, stop, stats);
}

void attention_softmax_recompute_rows(float* scores, const RowPointers& bias, float scale, const RowMasks& masks, const float* stats,
                                      const float* delta, float* grad, float factor, std::uint16_t* rounded_p,
                                      std::uint16_t* rounded_ds, std::int64_t ld, std::int64_t begin, std::int64_t stop) {
  recompute_rows_f32(scores, bias, scale, masks, stats, delta, grad, factor, rounded_p, rounded_ds, ld, begin, stop);
}

void attention_softmax_backward_rows(const float* weights, const RowPointers& grad_a, const RowPointers& grad_b, float factor,
                                     const RowMasks& masks, float* out, std::uint16_t* rounded, std::int64_t begin,
                                     std::int64_t stop) {
  backward_rows_f32(weights, grad_a, grad_b, factor, masks, out, begin, false, rounded, begin, stop);
}

}  // namespace tapegrad::detail
