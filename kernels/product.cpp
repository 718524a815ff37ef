// The product of two operands of rank >= 2 with batch broadcasting, on the back end its dtype
// takes: what matmul, linear and the attention's plain path compute with.
#include <algorithm>

#include "autodiff/loops.hpp"
#include "kernels/matmul_dnnl.hpp"
#include "kernels/matmul_f64.hpp"
#include "kernels/product.hpp"

namespace tapegrad::detail {
namespace {

// x with leading size-1 dims so it has `rank` dims (a view).
Tensor with_rank(const Tensor& x, std::size_t rank) {
  if (x.shape().size() == rank) return x;
  Shape shape = x.shape(), strides = x.strides();
  shape.insert(shape.begin(), rank - shape.size(), 1);
  strides.insert(strides.begin(), rank - strides.size(), 0);
  return make_view(x, std::move(shape), std::move(strides), x.offset(), "matmul");
}

// oneDNN sees a stride-0 batch dim as size 1 and broadcasts it against the other operand. That
// needs the other operand to be really that size there: when it is 1, or expanded too, copy x.
Tensor fit_batch(const Tensor& x, const Tensor& other) {
  for (std::size_t d = 0; d + 2 < x.shape().size(); ++d)
    if (x.strides()[d] == 0 && x.shape()[d] > 1 && (other.shape()[d] == 1 || other.strides()[d] == 0)) return copy_of(x);
  return x;
}

}  // namespace

Tensor product(const Tensor& a_in, const Tensor& b_in, bool bf16) {
  const std::size_t rank = std::max(a_in.shape().size(), b_in.shape().size());
  Tensor a = with_rank(a_in, rank), b = with_rank(b_in, rank);
  const std::int64_t k = a.shape()[rank - 1], n = b.shape()[rank - 1];
  Shape shape = a.shape();
  shape[rank - 1] = n;
  if (!std::equal(a.shape().begin(), a.shape().end() - 2, b.shape().begin())) {
    Shape batch_a(a.shape().begin(), a.shape().end() - 2), batch_b(b.shape().begin(), b.shape().end() - 2);
    const Shape batch = broadcast_args("matmul", "a (batch dims)", batch_a, "b (batch dims)", batch_b);
    std::copy(batch.begin(), batch.end(), shape.begin());
  }
  // A new size: [2^32, 0] @ [0, 2^32] has no element, its result 2^64.
  if (check_shape("matmul", "result shape", shape, a.dtype()) == 0) return new_tensor(shape, a.dtype(), "matmul");
  if (k == 0) return zeros(shape, a.dtype());
  if (a.dtype() != DType::float64) {  // OpenBLAS's path reads broadcast batch dims by their strides
    a = fit_batch(a, b);
    b = fit_batch(b, a);
  }
  Tensor c = new_tensor(shape, a.dtype(), "matmul");
  product_into(a, b, c, bf16);
  return c;
}

void product_into(const Tensor& a, const Tensor& b, const Tensor& c, bool bf16) {
  if (a.dtype() == DType::float64) matmul_f64(a, b, c);
  else matmul_dnnl(a, b, c, bf16);
}

}  // namespace tapegrad::detail
