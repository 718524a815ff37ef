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
  check_broadcasts_to(op, allowed_name, allowed.shape(), scores_name, scores.shape());
}

// Its own gradient, for the upstream gradient G of dS (both halves derived in docs/gradients.md),
// with r = rowsum(A ⊙ dA) and t = rowsum(A ⊙ G), reading dA and G only where A != 0:
//   d(dA) = A ⊙ (G − t)                 (the same backward: dS is linear in dA)
//   dA'   = G ⊙ (dA − r) − dA ⊙ t       (0 where A is 0)
Tensor softmax_backward(const Tensor& a, const Tensor& da) {
  Tensor ds = masked_softmax_backward(a, da);
  if (!is_grad_enabled()) return ds;  // a first-order pass: record() would return at once
  record("softmax_backward", {a, da}, ds, {a, da}, [a, da](std::span<const Tensor> g, const std::vector<bool>& needs) {
    std::vector<Tensor> grads(2);
    if (needs[1]) grads[1] = sum_to(softmax_backward(a, g[0]), da.shape());
    if (needs[0]) {
      const Tensor zero = scalar(0.0, a.dtype()), nonzero = ne(a, zero);
      const Tensor da_read = where(nonzero, da, zero), g_read = where(nonzero, g[0], zero);
      const Tensor r = sum(mul(a, da_read), {-1}, /*keepdim=*/true), t = sum(mul(a, g_read), {-1}, /*keepdim=*/true);
      grads[0] = where(nonzero, sub(mul(g_read, sub(da_read, r)), mul(da_read, t)), zero);
    }
    return grads;
  });
  return ds;
}

}  // namespace detail

Tensor masked_softmax(const Tensor& scores, const Tensor& allowed) {
  using namespace detail;
  check_softmax_args("masked_softmax", "scores", scores, "allowed", allowed);
  Tensor a = masked_softmax_forward(scores, allowed);
  // dS = A * (dA - rowsum(A * dA)), one formula to every order (A joined to this node in a
  // create_graph pass); keeps only its output A
  record_one("masked_softmax", scores, a, {a}, [a = a.detach()](const Tensor& g) {
    return softmax_backward(output_with_history(a, 0), g);
  });
  return a;
}

}  // namespace tapegrad
