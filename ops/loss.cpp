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

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>

#include "ops/op.hpp"
#include "ops/softmax.hpp"
#include "kernels/cross_entropy.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/reduction.hpp"
#include "tapegrad/ops/softmax.hpp"
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

// cross_entropy's backward as an op of the logits and g: dlogits = (p - q) w per counted row,
// w = g scale (g per row for reduction none), p = softmax(s) from the forward's lse, q the
// smoothed one-hot; exact zeros on ignored rows (the row kernel). Its own gradients, written
// beside it, for the upstream U of dlogits, with U' = U on counted rows and 0 on ignored ones
// and P = masked_softmax of the logits, recorded so that it differentiates in them again:
//   dg_r     = scale <U'_r, P_r - q_r>          (summed over the rows for mean and sum)
//   dlogits' = w * softmax_backward(P, U')       (P's Jacobian diag(P) - P P^T is symmetric)
// Ignored rows lose their logits, w and U to where(): nothing they hold reaches a product, and
// every order of their gradients is exactly 0.
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& ids, const std::shared_ptr<std::vector<RowLse>>& lse,
                              const CrossEntropyOptions& o, double scale, const Tensor& g) {
  const bool per_row = o.reduction == Reduction::none;
  std::vector<double> w = g.to_vector<double>();
  for (double& x : w) x *= scale;
  Tensor dlogits = cross_entropy_rows_backward(logits, ids, rule_of(o), lse->data(), w.data(), per_row);
  if (!is_grad_enabled()) return dlogits;  // a first-order pass: record() would return at once
  record("cross_entropy_backward", {logits, g}, dlogits, {logits, ids, g},
         [logits, ids, o, scale, g, per_row](std::span<const Tensor> u, const std::vector<bool>& needs) {
           const std::int64_t rows = ids.numel(), classes = logits.shape().back();
           Shape column = ids.shape();  // [..., 1]: one entry per row, broadcast along the classes
           column.push_back(1);
           const auto* t = static_cast<const std::int64_t*>(ids.raw_data());
           const double eps = o.label_smoothing;
           std::vector<bool> counted(static_cast<std::size_t>(rows));
           std::vector<double> q(static_cast<std::size_t>(rows * classes), 0.0);
           for (std::int64_t r = 0; r < rows; ++r) {
             counted[static_cast<std::size_t>(r)] = t[r] != o.ignore_index;
             if (t[r] == o.ignore_index) continue;
             std::fill_n(q.begin() + r * classes, classes, eps / static_cast<double>(classes));
             q[static_cast<std::size_t>(r * classes + t[r])] += 1.0 - eps;
           }
           const Tensor keep = from_bools(counted, column), zero = scalar(0.0, logits.dtype());
           const Tensor p = masked_softmax(where(keep, logits, zero)), u_read = where(keep, u[0], zero);
           std::vector<Tensor> grads(2);
           if (needs[0]) grads[0] = mul(softmax_backward(p, u_read), where(keep, mul(per_row ? unsqueeze(g, -1) : g, scale), zero));
           if (needs[1]) {
             const Tensor q_t = from_vector(std::span<const double>(q), logits.shape()).to(logits.dtype());
             const Tensor dg = mul(sum(mul(u_read, sub(p, q_t)), {-1}), scale);
             grads[1] = per_row ? dg : sum(dg);
           }
           return grads;
         });
  return dlogits;
}

// mse_loss's backward as an op: dpred = c g (pred - target), g a scalar or of pred's shape, one
// loop in that order. Its own gradients, written beside it, for the upstream U of dpred:
//   dg = sum to g's shape of c U (pred - target)   (this op again, on U: dpred is linear in g)
//   dpred' = c g U,  dtarget' = -dpred'
Tensor mse_loss_backward(const Tensor& g, const Tensor& pred, const Tensor& target, double c) {
  Tensor dpred = new_tensor(pred.shape(), pred.dtype());
  visit_float(pred.dtype(), "mse_loss", [&]<class T>(Tag<T>) {
    const T k = convert<T>(c);
    map_into<T, T, T, T>(dpred, [k](T gv, T p, T t) { return k * gv * (p - t); }, g, pred, target);
  });
  if (!is_grad_enabled()) return dpred;  // a first-order pass: record() would return at once
  record("mse_loss_backward", {g, pred, target}, dpred, {g, pred, target},
         [g, pred, target, c](std::span<const Tensor> u, const std::vector<bool>& needs) {
           std::vector<Tensor> grads(3);
           if (needs[0]) grads[0] = sum_to(mse_loss_backward(u[0], pred, target, c), g.shape());
           if (needs[1] || needs[2]) {
             const Tensor d = mul(mul(g, c), u[0]);
             if (needs[1]) grads[1] = d;
             if (needs[2]) grads[2] = neg(d);
           }
           return grads;
         });
  return dpred;
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& options) {
  const Tensor ids = check_cross_entropy_args(logits, targets, options);
  const auto rows = static_cast<std::size_t>(ids.numel());
  std::vector<double> loss(rows, 0.0);                     // per row, 0 where ignored
  auto lse = std::make_shared<std::vector<RowLse>>(rows);  // per row, for the backward
  cross_entropy_rows(logits, ids, rule_of(options), loss.data(), lse->data());
  const auto* t = static_cast<const std::int64_t*>(ids.raw_data());
  const auto counted = std::count_if(t, t + ids.numel(), [&](std::int64_t id) { return id != options.ignore_index; });
  // mean over the counted rows; 0 (not 0/0) when there are none
  const double scale =
      options.reduction != Reduction::mean ? 1.0 : counted > 0 ? 1.0 / static_cast<double>(counted) : 0.0;
  Tensor out = options.reduction == Reduction::none
                   ? from_vector(std::span<const double>(loss), ids.shape()).to(logits.dtype())
                   : scalar(std::accumulate(loss.begin(), loss.end(), 0.0) * scale, logits.dtype());
  // dlogits = (softmax(logits) - smoothed one-hot) * g * scale per counted row, 0 on ignored rows
  // the op cross_entropy_backward, one formula to every order
  record_one("cross_entropy", logits, out, {logits, ids}, [logits, ids, lse, options, scale](const Tensor& g) {
    return cross_entropy_backward(logits, ids, lse, options, scale, g);
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
    double total = std::accumulate(v.begin(), v.end(), 0.0);
    if (reduction == Reduction::mean) total = n > 0 ? total / static_cast<double>(n) : std::numeric_limits<double>::quiet_NaN();
    out = scalar(total, dtype);
  }
  // dpred = c g (pred - target), dtarget = -dpred, c = 2 / n for mean and 2 otherwise: the op
  // mse_loss_backward, one formula to every order
  const double c = reduction != Reduction::mean ? 2.0 : n > 0 ? 2.0 / static_cast<double>(n) : 0.0;
  record("mse_loss", {pred, target}, out, {pred, target}, [pred, target, c](std::span<const Tensor> g, const std::vector<bool>& needs) {
    const Tensor dpred = mse_loss_backward(g[0], pred, target, c);
    return std::vector<Tensor>{needs[0] ? dpred : Tensor(), needs[1] ? neg(dpred) : Tensor()};
  });
  return out;
}

}  // namespace tapegrad
