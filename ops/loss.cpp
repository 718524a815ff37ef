// cross_entropy and mse_loss: forward and hand-derived backward side by side.
//
// cross_entropy, one row with logits s (C classes), target t, eps = label smoothing,
// lse = log sum_c exp(s_c) = m + log Z (m the row maximum) and p = softmax(s) = exp(s - lse):
//   loss = (1 - eps) (lse - s_t) + eps mean_c(lse - s_c)
//   dloss/ds_c = (1 - eps) (p_c - [c = t]) + eps (p_c - 1/C) = p_c - q_c,
//   q_c = (1 - eps) [c = t] + eps / C   (the smoothed one-hot, which sums to 1)
// The node keeps the logits and m and log Z per row, so the backward is one pass per row (the
// row loops: kernels/cross_entropy.cpp).
#include "tapegrad/ops/loss.hpp"

#include <cmath>
#include <limits>
#include <memory>

#include "ops/op.hpp"
#include "kernels/cross_entropy.hpp"
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

TargetRule rule_of(const CrossEntropyOptions& o) { return {o.ignore_index, o.label_smoothing}; }

struct RowLosses {
  std::vector<double> loss;             // per row, 0 where ignored
  std::shared_ptr<std::vector<RowLse>> lse;  // per row, for the backward
  std::int64_t counted = 0;             // rows not ignored
};

RowLosses row_losses(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& o) {
  const std::int64_t rows = targets.numel();
  RowLosses out{std::vector<double>(static_cast<std::size_t>(rows), 0.0), std::make_shared<std::vector<RowLse>>(static_cast<std::size_t>(rows)), 0};
  const auto* ids = static_cast<const std::int64_t*>(targets.raw_data());
  for (std::int64_t r = 0; r < rows; ++r) out.counted += ids[r] != o.ignore_index;
  cross_entropy_rows(logits, targets, rule_of(o), out.loss.data(), out.lse->data());
  return out;
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
  RowLosses rows = row_losses(logits, ids, options);
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
           std::vector<double> w = g[0].to_vector<double>();
           for (double& x : w) x *= scale;
           return std::vector<Tensor>{
               cross_entropy_backward(logits, ids, rule_of(options), lse->data(), w.data(), options.reduction == Reduction::none)};
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
