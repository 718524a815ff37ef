// linear: y = x w + b as one tape node, forward and hand-written backward side by side.
//
// x [..., K] is seen as M rows [M, K]; w is [K, N]; b is [N].
//   forward                          backward (g = dL/dy as [M, N])
//     y = x w      (one product)       dx = g w^T   (one product)
//     y[r, :] += b (each row)          dw = x^T g   (one product, summing over all M rows)
//                                      db = sum over the rows of g
// Recorded as matmul then add, the backward would also run the add's broadcast reduction
// (sum_to) and accumulate the product's gradient through an extra node; here each gradient is
// made once, directly at its input's shape. The bias's loops: kernels/bias_rows.cpp.
#include "tapegrad/ops/linear.hpp"

#include <algorithm>
#include <vector>

#include "runtime/parallel.hpp"
#include "ops/op.hpp"
#include "kernels/bias_rows.hpp"
#include "kernels/matmul_dnnl.hpp"
#include "kernels/product.hpp"
#include "tapegrad/ops/matmul.hpp"
#include "tapegrad/ops/view.hpp"

namespace tapegrad {
namespace {
using namespace detail;

DType check_linear_args(const Tensor& x, const Tensor& weight, const Tensor& bias, MatmulPrecision precision) {
  const DType dtype = check_same_float("linear", "x", x, "weight", weight);
  if (weight.dim() != 2)
    fail<ShapeError>("linear: argument 'weight' must be [K, N] (in, out), got shape {}", shape_str(weight.shape()));
  if (x.dim() < 1 || x.shape().back() != weight.shape()[0])
    fail<ShapeError>("linear: argument 'x' with shape {} must be [..., {}], K being the first dim of argument 'weight' "
                     "(shape {})",
                     shape_str(x.shape()), weight.shape()[0], shape_str(weight.shape()));
  if (bias.defined()) {
    check_same_float("linear", "x", x, "bias", bias);
    if (bias.shape() != Shape{weight.shape()[1]})
      fail<ShapeError>("linear: argument 'bias' with shape {} must have shape [{}], the last dim of argument 'weight' "
                       "(shape {})",
                       shape_str(bias.shape()), weight.shape()[1], shape_str(weight.shape()));
  }
  if (precision == MatmulPrecision::bfloat16 && dtype != DType::float32)
    fail<DTypeError>("linear: bfloat16 precision takes float32 operands, got {} with shapes {} and {}", dtype,
                     shape_str(x.shape()), shape_str(weight.shape()));
  return dtype;
}

// t [..., cols] as a [rows, cols] matrix: a view of t, or of a contiguous copy when t's
// layout does not flatten.
Tensor as_matrix(const Tensor& t) {
  if (t.dim() == 2) return t;
  const std::int64_t cols = t.shape().back();
  std::int64_t rows = 1;
  for (std::size_t d = 0; d + 1 < t.shape().size(); ++d) rows *= t.shape()[d];
  const Tensor c = t.is_contiguous() ? t : copy_of(t);
  return make_view(c, {rows, cols}, {cols, 1}, c.offset(), "linear");
}

// A fresh contiguous tensor of `shape` (whose last dim is b's) holding a b, zeros when K = 0.
Tensor product_into_new(const Tensor& a, const Tensor& b, const Shape& shape, MatmulPrecision precision) {
  if (a.shape()[0] == 0 || b.shape()[1] == 0 || a.shape()[1] == 0) return zeros(shape, a.dtype());
  Tensor c = new_tensor(shape, a.dtype(), "linear");
  product_into(a, b, as_matrix(c), precision == MatmulPrecision::bfloat16);
  return c;
}

// The multiply-adds of x w (rows [M, K], w [K, N]), capped where they no longer matter.
std::int64_t product_cost(const Tensor& rows, const Tensor& w) {
  const double macs = static_cast<double>(rows.shape()[0]) * static_cast<double>(rows.shape()[1]) * static_cast<double>(w.shape()[1]);
  return static_cast<std::int64_t>(std::min(macs, 1e15));
}

// Whether the backward runs its two products (dx and dw, equal in size) at once, one per thread:
// when more than one thread is allowed but each product is too small to be split (matmul gives it
// one thread), which is every product of a small model.
bool side_by_side(const Tensor& rows, const Tensor& w) {
  const std::int64_t macs = product_cost(rows, w);
  const bool unsplit = rows.dtype() == DType::float64 || dnnl_threads_for(static_cast<double>(macs)) == 1;
  return max_threads() > 1 && macs >= kParallelGrain && unsplit;
}

// rows, the forward's [M, K] matrix of x (x itself, a view of it, or a copy when x's layout does
// not flatten), as an op of x: the same elements, recorded as a reshape of x, so that dw = rows^T g
// differentiates in x when a create_graph pass records it.
Tensor rows_of(const Tensor& x, const Tensor& rows) {
  if (!is_grad_enabled()) return rows;  // a first-order pass: record() would return at once
  Tensor out = rows.detach();
  record_one("linear_rows", x, out, {}, [shape = x.shape()](const Tensor& g) { return reshape(g, shape); });
  return out;
}

// db = the column sums of the contiguous [M, N] g (bias_gradient's loop) as an op: linear in g,
// its own gradient is U broadcast back over the rows.
Tensor bias_backward(const Tensor& g2, const Shape& shape) {
  Tensor db = bias_gradient(g2, shape);
  if (!is_grad_enabled()) return db;  // a first-order pass: record() would return at once
  record_one("linear_bias_backward", g2, db, {}, [rows = g2.shape()](const Tensor& u) {
    return expand(reshape(u, {1, rows[1]}), rows);
  });
  return db;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const bool f32 = x.defined() && x.dtype() == DType::float32;
  return linear(x, weight, bias, f32 ? matmul_precision() : MatmulPrecision::exact);
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, MatmulPrecision precision) {
  check_linear_args(x, weight, bias, precision);
  Shape out_shape = x.shape();
  out_shape.back() = weight.shape()[1];
  const Tensor rows = as_matrix(x);
  Tensor y = product_into_new(rows, weight, out_shape, precision);
  if (bias.defined()) add_bias_rows(as_matrix(y), bias);
  // dx = g w^T, dw = x^T g (all rows), db = column sums of g: matmuls at the node's precision and
  // the op bias_backward, one formula to every order (they record only in a create_graph pass)
  record("linear", {x, weight, bias}, y, {x, weight},
         [x, rows, weight, precision, x_shape = x.shape(), b_shape = bias.defined() ? bias.shape() : Shape{}](
             std::span<const Tensor> g, const std::vector<bool>& needs) {
           const Tensor g2 = reshape(contiguous(g[0]), {rows.shape()[0], weight.shape()[1]});
           std::vector<Tensor> grads(3);
           auto dx = [&] { grads[0] = reshape(matmul(g2, transpose(weight, 0, 1), precision), x_shape); };
           auto dw = [&] { grads[1] = matmul(transpose(rows_of(x, rows), 0, 1), g2, precision); };
           // Side by side only where nothing records (a first-order pass): a pool thread would
           // record onto its own tape.
           if (needs[0] && needs[1] && !is_grad_enabled() && side_by_side(rows, weight)) {
             parallel_for(2, product_cost(rows, weight), [&](std::int64_t i0, std::int64_t i1) {
               const NoGradGuard no_grad;  // a pool thread's own grad mode is on
               for (std::int64_t i = i0; i < i1; ++i) i == 0 ? dx() : dw();
             });
           } else {
             if (needs[0]) dx();
             if (needs[1]) dw();
           }
           if (needs[2]) grads[2] = bias_backward(g2, b_shape);
           return grads;
         });
  return y;
}

}  // namespace tapegrad
