// cross_entropy and mse_loss: forward and hand-derived backward side by side.
//
// cross_entropy, one row with logits s (C classes), target t, eps = label smoothing,
// lse = log sum_c exp(s_c) = m + log Z (m the row maximum) and p = softmax(s) = exp(s - lse):
//   loss = (1 - eps) (lse - s_t) + eps mean_c(lse - s_c)
//   dloss/ds_c = (1 - eps) (p_c - [c = t]) + eps (p_c - 1/C) = p_c - q_c,
//   q_c = (1 - eps) [c = t] + eps / C   (the smoothed one-hot, which sums to 1)
// The node keeps the logits and m and log Z per row, so the backward is one pass per row; rows
// run in parallel, float32 rows on vectorised loops (exp as the softmax's, sums in double).
#include "tapegrad/ops/loss.hpp"

#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>

#include "ops/op.hpp"
#include "kernels/softmax_rows.hpp"
#include "runtime/cpu.hpp"
#include "runtime/parallel.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/reduction.hpp"
#include "tapegrad/ops/view.hpp"
#include "tapegrad/ops/where.hpp"

namespace tapegrad {
namespace {
using namespace detail;

void check_reduction(const char* op, Reduction r) {
  if (r != Reduction::none && r != Reduction::mean && r != Reduction::sum)
    fail<ValueError>("{}: argument 'reduction' must be none, mean or sum, got {}", op, static_cast<int>(r));
}

// Checks every argument; returns the targets, contiguous.
Tensor check_cross_entropy_args(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& o) {
  check_floating("cross_entropy", "logits", logits);
  if (logits.dim() < 1)
    fail<ShapeError>("cross_entropy: argument 'logits' must have rank >= 1 ([..., C], classes last), got shape {}",
                     shape_str(logits.shape()));
  check_dtype("cross_entropy", "targets", targets, DType::int64);
  const Shape rows(logits.shape().begin(), logits.shape().end() - 1);
  if (targets.shape() != rows)
    fail<ShapeError>("cross_entropy: argument 'targets' with shape {} must have the shape of 'logits' without its "
                     "last dim, {} (logits shape {})",
                     shape_str(targets.shape()), shape_str(rows), shape_str(logits.shape()));
  if (!(o.label_smoothing >= 0.0 && o.label_smoothing < 1.0))
    fail<ValueError>("cross_entropy: option 'label_smoothing' must lie in [0, 1), got {}", o.label_smoothing);
  check_reduction("cross_entropy", o.reduction);
  const Tensor t = targets.is_contiguous() ? targets : copy_of(targets);
  const std::int64_t classes = logits.shape().back();
  const auto* ids = static_cast<const std::int64_t*>(t.raw_data());
  for (std::int64_t r = 0; r < t.numel(); ++r)
    if (ids[r] != o.ignore_index && (ids[r] < 0 || ids[r] >= classes))
      fail<ValueError>("cross_entropy: argument 'targets' holds {} at position {}, which is neither a class in [0, {}) "
                       "nor ignore_index = {}",
                       ids[r], shape_str(unravel_index(r, t.shape())), classes, o.ignore_index);
  return t;
}

// Rows of C classes cost about this many units per class (an exp and a few passes).
constexpr std::int64_t kRowCost = 8;

// Per row, what the forward computed: the maximum m and log Z = log sum_c exp(s_c - m), so that
// the backward's p_c = exp((s_c - m) - log Z) subtracts the large terms first.
struct RowLse {
  double m = 0, log_z = 0;
};

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
[[gnu::always_inline]] inline void loss_rows(const RowPointers& x, const std::int64_t* ids, const CrossEntropyOptions& o, double* loss,
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
[[gnu::always_inline]] inline void loss_rows_backward(const RowPointers& x, const std::int64_t* ids, const CrossEntropyOptions& o,
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
TAPEGRAD_CPU_CLONES void loss_rows_f32(const RowPointers& x, const std::int64_t* ids, const CrossEntropyOptions& o, double* loss, RowLse* lse,
                                       std::int64_t begin, std::int64_t stop) {
  loss_rows<float>(x, ids, o, loss, lse, begin, stop);
}
TAPEGRAD_CPU_CLONES void loss_rows_backward_f32(const RowPointers& x, const std::int64_t* ids, const CrossEntropyOptions& o, const RowLse* lse,
                                                const double* w, bool per_row, float* dx, std::int64_t begin, std::int64_t stop) {
  loss_rows_backward<float>(x, ids, o, lse, w, per_row, dx, begin, stop);
}

struct RowLosses {
  std::vector<double> loss;             // per row, 0 where ignored
  std::shared_ptr<std::vector<RowLse>> lse;  // per row, for the backward
  std::int64_t counted = 0;             // rows not ignored
};

RowLosses cross_entropy_rows(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& o) {
  const std::int64_t rows = targets.numel(), classes = logits.shape().back();
  RowLosses out{std::vector<double>(static_cast<std::size_t>(rows), 0.0), std::make_shared<std::vector<RowLse>>(static_cast<std::size_t>(rows)), 0};
  const auto* ids = static_cast<const std::int64_t*>(targets.raw_data());
  for (std::int64_t r = 0; r < rows; ++r) out.counted += ids[r] != o.ignore_index;
  const RowPointers x(logits, logits.shape());
  visit_float(logits.dtype(), "cross_entropy", [&]<class T>(Tag<T>) {
    parallel_for(rows, classes * kRowCost, [&](std::int64_t begin, std::int64_t stop) {
      if constexpr (std::is_same_v<T, float>) loss_rows_f32(x, ids, o, out.loss.data(), out.lse->data(), begin, stop);
      else loss_rows<T>(x, ids, o, out.loss.data(), out.lse->data(), begin, stop);
    });
  });
  return out;
}

// dlogits = (p - q) * w per counted row, w = g (or g[r] for none) * scale; zeros on ignored rows.
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const std::vector<RowLse>& lse,
                              const CrossEntropyOptions& o, double scale, const Tensor& grad) {
  Tensor dx = new_tensor(logits.shape(), logits.dtype());
  const std::int64_t rows = targets.numel(), classes = logits.shape().back();
  const bool per_row = o.reduction == Reduction::none;
  std::vector<double> w = grad.to_vector<double>();
  for (double& x : w) x *= scale;
  const auto* ids = static_cast<const std::int64_t*>(targets.raw_data());
  const RowPointers x(logits, logits.shape());
  visit_float(logits.dtype(), "cross_entropy", [&]<class T>(Tag<T>) {
    T* pd = static_cast<T*>(mutable_data(dx));
    parallel_for(rows, classes * kRowCost, [&](std::int64_t begin, std::int64_t stop) {
      if constexpr (std::is_same_v<T, float>) loss_rows_backward_f32(x, ids, o, lse.data(), w.data(), per_row, pd, begin, stop);
      else loss_rows_backward<T>(x, ids, o, lse.data(), w.data(), per_row, pd, begin, stop);
    });
  });
  return dx;
}

// The same gradient in recorded ops, for a create_graph pass: the softmax again from the logits
// (log Z was saved without history) less the forward's m, a constant that keeps the kernel's
// arithmetic. Ignored rows lose their logits and weights to where(), so nothing they hold
// reaches a product and every order of their gradient is exactly 0.
Tensor recorded_cross_entropy_backward(const Tensor& logits, const Tensor& targets, const std::vector<RowLse>& lse,
                                       const CrossEntropyOptions& o, double scale, const Tensor& grad) {
  const std::int64_t rows = targets.numel(), classes = logits.shape().back();
  Shape column = targets.shape();  // [..., 1]: one entry per row, broadcast along the classes
  column.push_back(1);
  const auto* ids = static_cast<const std::int64_t*>(targets.raw_data());
  const double eps = o.label_smoothing, smooth = eps / static_cast<double>(classes);
  std::vector<bool> counted(static_cast<std::size_t>(rows));
  std::vector<double> m(static_cast<std::size_t>(rows), 0.0), q(static_cast<std::size_t>(rows * classes), 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    counted[ur] = ids[r] != o.ignore_index;
    if (!counted[ur]) continue;
    m[ur] = lse[ur].m;
    std::fill_n(q.begin() + r * classes, classes, smooth);
    q[static_cast<std::size_t>(r * classes + ids[r])] += 1.0 - eps;
  }
  const Tensor keep = from_bools(counted, column), zero = scalar(0.0, logits.dtype());
  const Tensor shifted = sub(where(keep, logits, zero), from_vector(std::span<const double>(m), column).to(logits.dtype()));
  const Tensor log_z = log(sum(exp(shifted), {-1}, /*keepdim=*/true));
  const Tensor p = exp(sub(shifted, log_z));
  const Tensor g = mul(o.reduction == Reduction::none ? unsqueeze(grad, -1) : grad, scale);
  return mul(sub(p, from_vector(std::span<const double>(q), logits.shape()).to(logits.dtype())), where(keep, g, zero));
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& options) {
  const Tensor ids = check_cross_entropy_args(logits, targets, options);
  RowLosses rows = cross_entropy_rows(logits, ids, options);
  double total = 0;
  for (double l : rows.loss) total += l;
  // mean over the counted rows; 0 (not 0/0) when there are none
  const double scale = options.reduction != Reduction::mean ? 1.0 : rows.counted > 0 ? 1.0 / static_cast<double>(rows.counted) : 0.0;
  Tensor out;
  if (options.reduction == Reduction::none) {
    out = from_vector(std::span<const double>(rows.loss), ids.shape()).to(logits.dtype());
  } else {
    out = scalar(total * scale, logits.dtype());
  }
  // dlogits = (softmax(logits) - smoothed one-hot) * g * scale per counted row, 0 on ignored rows
  record("cross_entropy", {logits}, out, {logits, ids},
         [logits, ids, lse = rows.lse, options, scale](std::span<const Tensor> g, const std::vector<bool>&) {
           if (creating_graph()) return std::vector<Tensor>{recorded_cross_entropy_backward(logits, ids, *lse, options, scale, g[0])};
           return std::vector<Tensor>{cross_entropy_backward(logits, ids, *lse, options, scale, g[0])};
         });
  return out;
}

Tensor mse_loss(const Tensor& pred, const Tensor& target, Reduction reduction) {
  const DType dtype = check_same_float("mse_loss", "pred", pred, "target", target);
  if (pred.shape() != target.shape())
    fail<ShapeError>("mse_loss: argument 'target' with shape {} must have the shape of 'pred', {} (mse_loss does not "
                     "broadcast)",
                     shape_str(target.shape()), shape_str(pred.shape()));
  check_reduction("mse_loss", reduction);
  Tensor squares = new_tensor(pred.shape(), dtype);
  visit_float(dtype, "mse_loss", [&]<class T>(Tag<T>) {
    map_into<T, T, T>(squares, [](T p, T t) { return (p - t) * (p - t); }, pred, target);
  });
  const std::int64_t n = pred.numel();
  Tensor out = squares;
  if (reduction != Reduction::none) {
    const std::vector<double> v = squares.to_vector<double>();
    double total = 0;
    for (double x : v) total += x;
    if (reduction == Reduction::mean) total = n > 0 ? total / static_cast<double>(n) : std::numeric_limits<double>::quiet_NaN();
    out = scalar(total, dtype);
  }
  // dpred = c g (pred - target), dtarget = -dpred, c = 2 / n for mean and 2 otherwise
  const double c = reduction != Reduction::mean ? 2.0 : n > 0 ? 2.0 / static_cast<double>(n) : 0.0;
  record("mse_loss", {pred, target}, out, {pred, target}, [pred, target, c](std::span<const Tensor> g, const std::vector<bool>& needs) {
    if (creating_graph()) {  // the same products, recorded, in the same order: (c g) (pred - target)
      const Tensor dpred = mul(mul(g[0], c), sub(pred, target));
      return std::vector<Tensor>{needs[0] ? dpred : Tensor(), needs[1] ? neg(dpred) : Tensor()};
    }
    Tensor dpred = new_tensor(pred.shape(), pred.dtype());
    visit_float(pred.dtype(), "mse_loss", [&]<class T>(Tag<T>) {
      const T k = convert<T>(c);
      map_into<T, T, T, T>(dpred, [k](T gv, T p, T t) { return k * gv * (p - t); }, g[0], pred, target);
    });
    return std::vector<Tensor>{needs[0] ? dpred : Tensor(), needs[1] ? neg(dpred) : Tensor()};
  });
  return out;
}

}  // namespace tapegrad
