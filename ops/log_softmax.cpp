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

// The same formula in recorded ops, for a create_graph pass: y joined to this node, so that
// exp(y) differentiates through the log-softmax again. Both selections keep the exact zeros:
// the -inf entries' g never reaches the sum, and their dx (and its gradient) is 0, not 0 * inf.
Tensor recorded_backward(const Tensor& y, const Tensor& g) {
  const Tensor finite = ne(y, scalar(-std::numeric_limits<double>::infinity(), y.dtype()));
  const Tensor zero = scalar(0.0, y.dtype());
  const Tensor total = sum(where(finite, g, zero), {-1}, /*keepdim=*/true);
  return where(finite, sub(g, mul(exp(y), total)), zero);
}

}  // namespace

Tensor log_softmax(const Tensor& x, const Tensor& allowed) {
  check_softmax_args("log_softmax", "x", x, "allowed", allowed);
  Tensor y = log_softmax_forward(x, allowed);
  // dx = g - exp(y) * rowsum(g where y is finite); 0 where y = -inf. Keeps only its output y.
  record("log_softmax", {x}, y, {y}, [y = y.detach()](std::span<const Tensor> g, const std::vector<bool>&) {
    if (creating_graph()) return std::vector<Tensor>{recorded_backward(output_with_history(y, 0), g[0])};
    return std::vector<Tensor>{log_softmax_backward(y, g[0])};
  });
  return y;
}

}  // namespace tapegrad
