// The projections around the attention core, each one tape node with its backward beside it
// (derived in docs/gradients.md, section 9). Recorded as separate ops (a matmul, a bias add and
// two views each) they made a small layer's step 17 nodes, whose bookkeeping cost more than its
// arithmetic. Folding the batch into the rows also makes each weight gradient one product
// instead of a product per batch entry and a sum.
//
//   in-projection, x [B, L, C] -> y [B, H, L, W]     (N = H W)
//     forward                                  backward
//     Y = X w (+ b)      X as [B L, C]         dX = dY w^T,  dw = X^T dY,  db = colsum(dY)
//     y = Y as [B, L, H, W] viewed [B, H, L, W]    dY = dy permuted back to [B L, N]
//
//   out-projection, o [B, H, Q, Dv] -> out [B, Q, Cout]
//     M = o permuted to [B Q, H Dv]            do = (dout w_o^T) viewed [B, H, Q, Dv]
//     out = M w_o (+ b_o)                      dw_o = M^T dout,  db_o = colsum(dout)
#include "kernels/bias_rows.hpp"
#include "ops/multihead_projections.hpp"
#include "ops/op.hpp"
#include "tapegrad/ops/matmul.hpp"
#include "tapegrad/ops/view.hpp"

namespace tapegrad::detail {
namespace {

// The thread's matmul precision as it applies to these operands (float64 is always exact).
MatmulPrecision precision_for(const Tensor& x) {
  return x.dtype() == DType::float32 ? matmul_precision() : MatmulPrecision::exact;
}

// x [..., C] as a [rows, C] matrix (a view when x's strides allow it). The rows are given: -1
// cannot be inferred when C is 0.
Tensor as_rows(const Tensor& x, std::int64_t rows) { return reshape(x, {rows, x.size(-1)}); }

// Y = X w (+ b) on [rows, C] and [C, N]: a fresh contiguous [rows, N].
Tensor affine(const Tensor& x2, const Tensor& w, const Tensor& b, MatmulPrecision precision) {
  Tensor y = matmul(x2, w, precision);
  if (b.defined()) add_bias_rows(y, b);
  return y;
}

// dX, dw, db of Y = X w + b from dY [rows, N], as `needs` asks, into grads[0..2].
void affine_backward(const Tensor& dy, const Tensor& x2, const Tensor& w, MatmulPrecision precision,
                     const std::vector<bool>& needs, std::vector<Tensor>& grads) {
  if (needs[0]) grads[0] = matmul(dy, transpose(w, 0, 1), precision);
  if (needs[1]) grads[1] = matmul(transpose(x2, 0, 1), dy, precision);
  if (needs[2]) grads[2] = sum_to(dy, {dy.size(1)});
}

}  // namespace

Tensor project_heads(const char* op, const Tensor& x, const Tensor& w, const Tensor& b, std::int64_t heads) {
  const std::int64_t batch = x.size(0), len = x.size(1), n = w.size(1), width = n / heads;
  const MatmulPrecision precision = precision_for(x);
  Tensor x2, y;
  {
    NoGradGuard no_grad;  // the node below is the whole projection
    x2 = as_rows(x, batch * len);
    y = make_view(affine(x2, w, b, precision), {batch, heads, len, width}, {len * n, width, n, 1}, 0, op);
  }
  // The backward takes the rows from x again (a view, or a copy of a strided x): x2 has no
  // history, and a create_graph pass needs dw to differentiate in x.
  record(op, {x, w, b}, y, {x, w},
         [x, w, x_shape = x.shape(), rows = batch * len, n, precision](std::span<const Tensor> g, const std::vector<bool>& needs) {
           std::vector<Tensor> grads(3);
           const Tensor dy = reshape(permute(g[0], {0, 2, 1, 3}), {rows, n});  // [B L, N]
           affine_backward(dy, as_rows(x, rows), w, precision, needs, grads);
           if (grads[0].defined()) grads[0] = reshape(grads[0], x_shape);
           return grads;
         });
  return y;
}

Tensor merge_heads_project(const char* op, const Tensor& o, const Tensor& w, const Tensor& b) {
  const std::int64_t batch = o.size(0), heads = o.size(1), len = o.size(2), width = o.size(3);
  const MatmulPrecision precision = precision_for(o);
  Tensor merged, out;
  {
    NoGradGuard no_grad;
    merged = reshape(permute(o, {0, 2, 1, 3}), {batch * len, heads * width});
    out = reshape(affine(merged, w, b, precision), {batch, len, w.size(1)});
  }
  // The node keeps o and the backward merges it again (one copy): keeping merged, which has no
  // history, would need o too for a create_graph pass, where the merge and the split of
  // d merged are recorded.
  record(op, {o, w, b}, out, {o, w},
         [o, w, batch, heads, len, width, precision](std::span<const Tensor> g, const std::vector<bool>& needs) {
           std::vector<Tensor> grads(3);
           const Tensor merged = reshape(permute(o, {0, 2, 1, 3}), {batch * len, heads * width});
           affine_backward(as_rows(g[0], batch * len), merged, w, precision, needs, grads);
           // d merged [B Q, H Dv] is d o read through the merge's strides: two views, no copy.
           if (grads[0].defined()) grads[0] = permute(reshape(grads[0], {batch, len, heads, width}), {0, 2, 1, 3});
           return grads;
         });
  return out;
}

}  // namespace tapegrad::detail
