// cross_entropy and mse_loss: forward and hand-derived backward side by side.
//
// cross_entropy, one row with logits s (C classes), target t, eps = label smoothing,
// lse = log sum_c exp(s_c) = m + log Z (m the row maximum) and p = softmax(s) = exp(s - lse):
//   loss = (1 - eps) (lse - s_t) + eps mean_c(lse - s_c)
//   dloss/ds_c = (1 - eps) (p_c - [c = t]) + eps (p_c - 1/C) = p_c - q_c,
//   q_c = (1 - eps) [c = t] + eps / C   (the smoothed one-hot, which sums to 1)
// The node keeps the logits and one lse per row, so the backward is one pass per row.
#include "tapegrad/ops/loss.hpp"

#include <cmath>
#include <limits>

#include "ops/op.hpp"
#include "kernels/softmax_rows.hpp"
#include "tapegrad/ops/elementwise.hpp"

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

struct RowLosses {
  std::vector<double> loss;  // per row, 0 where ignored
  Tensor lse;                // float64 [rows]: log sum exp of each counted row
  std::int64_t counted = 0;  // rows not ignored
};

RowLosses cross_entropy_rows(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& o) {
  const std::int64_t classes = logits.shape().back();
  const double eps = o.label_smoothing;
  RowLosses out{std::vector<double>(static_cast<std::size_t>(targets.numel()), 0.0), new_tensor({targets.numel()}, DType::float64), 0};
  const auto* ids = static_cast<const std::int64_t*>(targets.raw_data());
  auto* lse = static_cast<double*>(mutable_data(out.lse));
  visit_float(logits.dtype(), "cross_entropy", [&]<class T>(Tag<T>) {
    for_each_row<T>(logits, Tensor(), [&](std::int64_t r, const T* s, std::int64_t ss, const bool*, std::int64_t) {
      lse[r] = 0;
      const std::int64_t t = ids[r];
      if (t == o.ignore_index) return;
      ++out.counted;
      const T m = masked_max<T>(s, ss, classes, nullptr, 0).m;
      const double log_z = masked_log_sum_exp<T>(s, ss, classes, nullptr, 0, m);
      lse[r] = static_cast<double>(m) + log_z;
      // lse - s_c = log Z - (s_c - m): the large terms cancel before they meet.
      auto minus_log_p = [&](std::int64_t c) { return log_z - (static_cast<double>(s[c * ss]) - static_cast<double>(m)); };
      double loss = (1.0 - eps) * minus_log_p(t);
      if (eps > 0) {  // skipped at eps = 0, where a -inf logit elsewhere must not turn 0 * inf into NaN
        double total = 0;
        for (std::int64_t c = 0; c < classes; ++c) total += minus_log_p(c);
        loss += eps * total / static_cast<double>(classes);
      }
      out.loss[static_cast<std::size_t>(r)] = loss;
    });
  });
  return out;
}

// dlogits = (p - q) * w per counted row, w = g (or g[r] for none) * scale; zeros on ignored rows.
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              const CrossEntropyOptions& o, double scale, const Tensor& grad) {
  const Tensor g = grad.is_contiguous() ? grad : copy_of(grad);
  Tensor dx = new_tensor(logits.shape(), logits.dtype());
  const std::int64_t classes = logits.shape().back();
  const double eps = o.label_smoothing;
  const bool per_row = o.reduction == Reduction::none;
  const auto* ids = static_cast<const std::int64_t*>(targets.raw_data());
  const auto* plse = static_cast<const double*>(lse.raw_data());
  visit_float(logits.dtype(), "cross_entropy", [&]<class T>(Tag<T>) {
    const T* pg = static_cast<const T*>(g.raw_data());
    T* pd = static_cast<T*>(mutable_data(dx));
    for_each_row<T>(logits, Tensor(), [&](std::int64_t r, const T* s, std::int64_t ss, const bool*, std::int64_t) {
      T* d = pd + r * classes;
      const std::int64_t t = ids[r];
      if (t == o.ignore_index) {  // exact zeros, whatever the upstream gradient of this row
        for (std::int64_t c = 0; c < classes; ++c) d[c] = T(0);
        return;
      }
      const double w = static_cast<double>(pg[per_row ? r : 0]) * scale;
      const double smooth = eps / static_cast<double>(classes);
      for (std::int64_t c = 0; c < classes; ++c) {
        const double q = smooth + (c == t ? 1.0 - eps : 0.0);
        d[c] = convert<T>((std::exp(static_cast<double>(s[c * ss]) - plse[r]) - q) * w);
      }
    });
  });
  return dx;
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
  record("cross_entropy", {logits}, out, {logits, ids, rows.lse},
         [logits, ids, lse = rows.lse, options, scale](std::span<const Tensor> g, const std::vector<bool>&) {
           return std::vector<Tensor>{cross_entropy_backward(logits, ids, lse, options, scale, g[0])};
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
