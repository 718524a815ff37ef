// Masked log-softmax: forward and its hand-derived backward (see tapegrad/ops/log_softmax.hpp;
// the row loops in kernels/log_softmax.cpp).
//
// Derivation of the backward, for one row with y_i = x_i - lse(x), lse over allowed entries,
// and p = softmax(x) = exp(y):
//   dy_i/dx_j = delta_ij - p_j   for allowed i, j   (d lse / dx_j = p_j)
//   dx_j = sum_i g_i (delta_ij - p_j) = g_j - p_j sum_i g_i
// A disallowed i has y_i = -inf whatever x is, so it contributes nothing to the sum, and a
// disallowed j appears in no y_i, so dx_j = 0. The backward needs only y: p_j = exp(y_j), and
// y_j = -inf marks every entry that is constant.
#include "tapegrad/ops/log_softmax.hpp"

#include <limits>

#include "ops/op.hpp"
#include "ops/softmax.hpp"
#include "kernels/log_softmax.hpp"
#include "tapegrad/ops/compare.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/reduction.hpp"
#include "tapegrad/ops/where.hpp"

namespace tapegrad {
namespace {
using namespace detail;

// The backward as an op of y and g: dx = g - exp(y) rowsum(g where y is finite), 0 where
// y = -inf (the row kernel; y contiguous, as the forward made it, g of y's shape). With
// F = (y != -inf), p = exp(y), S = rowsum(where(F, g, 0)) and U' = where(F, U, 0), its own
// gradients, written beside it, for the upstream U of dx (derived in docs/gradients.md):
//   dg = where(F, U' - rowsum(p U'), 0)   (the transpose of I - p 1^T)
//   dy = where(F, -U' p S, 0)             (through y it goes on to x through the log-softmax)
// Both read g and U only where F: a -inf entry gets exactly 0 of every order.
Tensor log_softmax_backward(const Tensor& y, const Tensor& g) {
  Tensor dx = masked_log_softmax_backward(y, g);
  if (!is_grad_enabled()) return dx;  // a first-order pass: record() would return at once
  record("log_softmax_backward", {y, g}, dx, {y, g}, [y, g](std::span<const Tensor> u, const std::vector<bool>& needs) {
    const Tensor zero = scalar(0.0, y.dtype());
    const Tensor finite = ne(y, scalar(-std::numeric_limits<double>::infinity(), y.dtype()));
    const Tensor p = exp(y), u_read = where(finite, u[0], zero);
    std::vector<Tensor> grads(2);
    if (needs[0]) grads[0] = where(finite, neg(mul(mul(u_read, p), sum(where(finite, g, zero), {-1}, /*keepdim=*/true))), zero);
    if (needs[1]) grads[1] = where(finite, sub(u_read, sum(mul(p, u_read), {-1}, /*keepdim=*/true)), zero);
    return grads;
  });
  return dx;
}

}  // namespace

Tensor log_softmax(const Tensor& x, const Tensor& allowed) {
  check_softmax_args("log_softmax", "x", x, "allowed", allowed);
  Tensor y = masked_log_softmax_forward(x, allowed);
  // dx = g - exp(y) * rowsum(g where y is finite); 0 where y = -inf: the op log_softmax_backward,
  // one formula to every order (y joined to this node in a create_graph pass). Keeps only y.
  record_one("log_softmax", x, y, {y}, [y = y.detach()](const Tensor& g) {
    return log_softmax_backward(output_with_history(y, 0), g);
  });
  return y;
}

}  // namespace tapegrad
