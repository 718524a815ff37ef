// Masked softmax: forward and its hand-derived backward (formulas in tapegrad/ops/softmax.hpp;
// the row loops in kernels/softmax.cpp).
//
// Derivation of the backward, for one row with A_i = e_i / Z, e_i = allowed_i exp(S_i - m):
//   dA_i/dS_j = A_i (delta_ij - A_j)  for allowed i, j   (m cancels: it is a constant shift)
//   dS_j = sum_i dA_i A_i (delta_ij - A_j) = A_j (dA_j - sum_i A_i dA_i)
// Disallowed j have A_j = 0, so dS_j = 0 there, and an empty row (all A = 0) gets dS = 0.
#include "tapegrad/ops/softmax.hpp"

#include "ops/softmax.hpp"
#include "ops/op.hpp"
#include "kernels/softmax.hpp"
#include "tapegrad/ops/compare.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/reduction.hpp"
#include "tapegrad/ops/where.hpp"

namespace tapegrad {
namespace detail {

void check_softmax_args(const char* op, const char* scores_name, const Tensor& scores, const char* allowed_name,
                        const Tensor& allowed) {
  check_floating(op, scores_name, scores);
  if (scores.dim() < 1)
    fail<ShapeError>("{}: argument '{}' must have rank >= 1 (softmax runs over the last dim), got shape {}", op,
                     scores_name, shape_str(scores.shape()));
  if (!allowed.defined()) return;
  check_dtype(op, allowed_name, allowed, DType::bool_);
  if (broadcast_args(op, scores_name, scores.shape(), allowed_name, allowed.shape()) != scores.shape())
    fail<ShapeError>("{}: argument '{}' with shape {} must broadcast to the shape of '{}', {}", op, allowed_name,
                     shape_str(allowed.shape()), scores_name, shape_str(scores.shape()));
}

}  // namespace detail

namespace {
using namespace detail;

// The backward in recorded ops, for a create_graph pass; A joined to its node, so the gradient of
// dS with respect to A goes on through the softmax (docs/gradients.md derives both halves):
//   P = A * dA',  dA' = dA where A != 0 else 0,   dS = where(A != 0, P - A * rowsum(P), 0)
// The where()s keep the kernel's rule that an entry with A = 0 reads nothing and gets exactly 0:
// a non-finite dA there, or a non-finite row sum, cannot make NaN through 0 * inf.
Tensor recorded_backward(const Tensor& weights, const Tensor& grad_weights) {
  const Tensor a = output_with_history(weights, 0);
  const Tensor nonzero = ne(weights, scalar(0.0, weights.dtype()));
  const Tensor zero = scalar(0.0, weights.dtype());
  const Tensor p = mul(a, where(nonzero, grad_weights, zero));
  return where(nonzero, sub(p, mul(a, sum(p, {-1}, /*keepdim=*/true))), zero);
}

}  // namespace

Tensor masked_softmax(const Tensor& scores, const Tensor& allowed) {
  check_softmax_args("masked_softmax", "scores", scores, "allowed", allowed);
  Tensor a = masked_softmax_forward(scores, allowed);
  // dS = A * (dA - rowsum(A * dA)); keeps only its output A
  record("masked_softmax", {scores}, a, {a}, [a = a.detach()](std::span<const Tensor> g, const std::vector<bool>&) {
    if (creating_graph()) return std::vector<Tensor>{recorded_backward(a, g[0])};
    return std::vector<Tensor>{masked_softmax_backward(a, g[0])};
  });
  return a;
}

}  // namespace tapegrad
