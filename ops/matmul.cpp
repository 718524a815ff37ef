// matmul: validation, batch broadcasting, the choice of back end, and the backward.
#include "ops/op.hpp"
#include "kernels/matmul.hpp"
#include "tapegrad/ops/matmul.hpp"
#include "tapegrad/ops/view.hpp"

namespace tapegrad {
namespace {
using namespace detail;

thread_local MatmulPrecision current_precision = MatmulPrecision::exact;

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

Tensor forward(const Tensor& a_in, const Tensor& b_in, MatmulPrecision precision) {
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
  a = fit_batch(a, b);
  b = fit_batch(b, a);
  Tensor c = new_tensor(shape, a.dtype(), "matmul");
  if (a.dtype() == DType::float64) matmul_f64(a, b, c);
  else matmul_dnnl(a, b, c, precision == MatmulPrecision::bfloat16);
  return c;
}

}  // namespace

void set_matmul_precision(MatmulPrecision precision) noexcept { current_precision = precision; }
MatmulPrecision matmul_precision() noexcept { return current_precision; }

Tensor matmul(const Tensor& a, const Tensor& b) {
  // The thread's precision applies to float32 only: float64 stays exact rather than an error.
  const bool f32 = a.defined() && a.dtype() == DType::float32;
  return matmul(a, b, f32 ? current_precision : MatmulPrecision::exact);
}

Tensor matmul(const Tensor& a, const Tensor& b, MatmulPrecision precision) {
  const DType dtype = check_same_float("matmul", "a", a, "b", b);
  if (a.dim() < 2 || b.dim() < 2)
    fail<ShapeError>("matmul: arguments 'a' and 'b' must have rank >= 2 ([..., M, K] and [..., K, N]), got "
                     "shapes {} and {}; unsqueeze a vector first",
                     shape_str(a.shape()), shape_str(b.shape()));
  if (a.shape().back() != b.shape()[b.shape().size() - 2])
    fail<ShapeError>("matmul: inner dims differ: argument 'a' has shape {} (K = {}) but argument 'b' has shape {} "
                     "(K = {})",
                     shape_str(a.shape()), a.shape().back(), shape_str(b.shape()), b.shape()[b.shape().size() - 2]);
  if (precision == MatmulPrecision::bfloat16 && dtype != DType::float32)
    fail<DTypeError>("matmul: bfloat16 precision takes float32 operands, got {} with shapes {} and {}", dtype,
                     shape_str(a.shape()), shape_str(b.shape()));
  Tensor out = forward(a, b, precision);
  // da = g b^T,  db = a^T g   (each summed over the batch dims its operand was broadcast along).
  // A zero-size g gives zeros, made at the operand's shape: the product would be made at the
  // broadcast shape first, and with N = 0 that is [batch..., M, K] of zeros however long the batch.
  record("matmul", {a, b}, out, {a, b}, [a, b, precision](std::span<const Tensor> g, const std::vector<bool>& needs) {
    std::vector<Tensor> grads(2);
    const bool empty = g[0].numel() == 0;
    if (needs[0]) grads[0] = empty ? zeros(a.shape(), a.dtype()) : sum_to(forward(g[0], transpose(b, -1, -2), precision), a.shape());
    if (needs[1]) grads[1] = empty ? zeros(b.shape(), b.dtype()) : sum_to(forward(transpose(a, -1, -2), g[0], precision), b.shape());
    return grads;
  });
  return out;
}

bool bfloat16_native() noexcept { return dnnl_bf16_native(); }

}  // namespace tapegrad
