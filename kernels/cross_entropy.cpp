// cross_entropy's rows, forward and backward, on the threads (formulas in ops/loss.cpp): float32
// rows on vectorised loops, exp as the softmax's, sums in double.
#include "kernels/cross_entropy.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/cpu.hpp"
#include "kernels/softmax_rows.hpp"

namespace tapegrad::detail {
namespace {

// Per row r of contiguous targets: loss[r] (0 where ignored) and lse[r]; rows [begin, stop).
// The maximum skips NaN (which then reaches Z); the sums are in double over 16 lanes.
template <class T, class At>
[[gnu::always_inline]] inline void loss_row(std::int64_t classes, At s, std::int64_t t, double eps, double& loss, RowLse& lse) {
  constexpr T kMinusInf = -std::numeric_limits<T>::infinity();
  T m = kMinusInf;
#pragma omp simd reduction(max : m)
  for (std::int64_t c = 0; c < classes; ++c) m = s(c) > m ? s(c) : m;
  if (!(m > std::numeric_limits<T>::lowest())) {  // nothing above -FLT_MAX: the exact maximum, -inf included
    m = kMinusInf;
    for (std::int64_t c = 0; c < classes; ++c) m = s(c) > m ? s(c) : m;
  }
  const double log_z = std::log(simd_sum(classes, [&](std::int64_t c) { return static_cast<double>(softmax_exp<T>(s(c) - m)); }));
  lse = {static_cast<double>(m), log_z};
  // lse - s_c = log Z - (s_c - m): the large terms cancel before they meet.
  loss = (1.0 - eps) * (log_z - (static_cast<double>(s(t)) - static_cast<double>(m)));
  if (eps > 0) {  // skipped at eps = 0, where a -inf logit elsewhere must not turn 0 * inf into NaN
    const double shifted = simd_sum(classes, [&](std::int64_t c) { return static_cast<double>(s(c)) - static_cast<double>(m); });
    loss += eps * (log_z - shifted / static_cast<double>(classes));
  }
}

// d_c = (p_c - q_c) w for one counted row, q the smoothed one-hot of t.
template <class T, class At>
[[gnu::always_inline]] inline void loss_row_backward(std::int64_t classes, At s, std::int64_t t, double eps, RowLse lse, double w, T* d) {
  const T m = static_cast<T>(lse.m), log_z = static_cast<T>(lse.log_z), wt = static_cast<T>(w);
  const T smooth = static_cast<T>(eps / static_cast<double>(classes));
  for (std::int64_t c = 0; c < classes; ++c) d[c] = (softmax_exp<T>((s(c) - m) - log_z) - smooth) * wt;
  const double p_t = std::exp((static_cast<double>(s(t)) - lse.m) - lse.log_z);
  d[t] = convert<T>((p_t - eps / static_cast<double>(classes) - (1.0 - eps)) * w);
}

template <class T>
[[gnu::always_inline]] inline void loss_rows(const RowPointers& x, const std::int64_t* ids, const TargetRule& o, double* loss,
                                             RowLse* lse, std::int64_t begin, std::int64_t stop) {
  for (std::int64_t r = begin; r < stop; ++r) {
    loss[r] = 0;
    lse[r] = {};
    if (ids[r] == o.ignore_index) continue;
    const T* s = x.row<T>(r);
    if (const std::int64_t ss = x.stride; ss == 1) loss_row<T>(x.k, [s](std::int64_t c) { return s[c]; }, ids[r], o.label_smoothing, loss[r], lse[r]);
    else loss_row<T>(x.k, [s, ss](std::int64_t c) { return s[c * ss]; }, ids[r], o.label_smoothing, loss[r], lse[r]);
  }
}

template <class T>
[[gnu::always_inline]] inline void loss_rows_backward(const RowPointers& x, const std::int64_t* ids, const TargetRule& o,
                                                      const RowLse* lse, const double* w, bool per_row, T* dx, std::int64_t begin,
                                                      std::int64_t stop) {
  for (std::int64_t r = begin; r < stop; ++r) {
    T* d = dx + r * x.k;
    if (ids[r] == o.ignore_index) {  // exact zeros, whatever the upstream gradient of this row
      std::fill_n(d, x.k, T(0));
      continue;
    }
    const T* s = x.row<T>(r);
    const double wr = w[per_row ? r : 0];
    if (const std::int64_t ss = x.stride; ss == 1)
      loss_row_backward<T>(x.k, [s](std::int64_t c) { return s[c]; }, ids[r], o.label_smoothing, lse[r], wr, d);
    else
      loss_row_backward<T>(x.k, [s, ss](std::int64_t c) { return s[c * ss]; }, ids[r], o.label_smoothing, lse[r], wr, d);
  }
}

// float32 compiled for each vector width, picked at run time for the CPU at hand.
TAPEGRAD_CPU_CLONES void loss_rows_f32(const RowPointers& x, const std::int64_t* ids, const TargetRule& o, double* loss, RowLse* lse,
                                       std::int64_t begin, std::int64_t stop) {
  loss_rows<float>(x, ids, o, loss, lse, begin, stop);
}
TAPEGRAD_CPU_CLONES void loss_rows_backward_f32(const RowPointers& x, const std::int64_t* ids, const TargetRule& o, const RowLse* lse,
                                                const double* w, bool per_row, float* dx, std::int64_t begin, std::int64_t stop) {
  loss_rows_backward<float>(x, ids, o, lse, w, per_row, dx, begin, stop);
}

}  // namespace

void cross_entropy_rows(const Tensor& logits, const Tensor& targets, const TargetRule& rule, double* loss, RowLse* lse) {
  const auto* ids = static_cast<const std::int64_t*>(targets.raw_data());
  const RowPointers x(logits, logits.shape());
  for_each_row(
      logits, "cross_entropy",
      [&](std::int64_t begin, std::int64_t stop) { loss_rows_f32(x, ids, rule, loss, lse, begin, stop); },
      [&](std::int64_t begin, std::int64_t stop) { loss_rows<double>(x, ids, rule, loss, lse, begin, stop); });
}

Tensor cross_entropy_rows_backward(const Tensor& logits, const Tensor& targets, const TargetRule& rule, const RowLse* lse,
                                   const double* w, bool per_row) {
  Tensor dx = new_tensor(logits.shape(), logits.dtype());
  const auto* ids = static_cast<const std::int64_t*>(targets.raw_data());
  const RowPointers x(logits, logits.shape());
  void* pd = mutable_data(dx);
  for_each_row(
      logits, "cross_entropy",
      [&](std::int64_t begin, std::int64_t stop) {
        loss_rows_backward_f32(x, ids, rule, lse, w, per_row, static_cast<float*>(pd), begin, stop);
      },
      [&](std::int64_t begin, std::int64_t stop) {
        loss_rows_backward<double>(x, ids, rule, lse, w, per_row, static_cast<double*>(pd), begin, stop);
      });
  return dx;
}

}  // namespace tapegrad::detail
