// matmul: validation, the node and its backward (the product itself: kernels/product.cpp).
#include "ops/op.hpp"
#include "kernels/product.hpp"
#include "kernels/matmul_dnnl.hpp"
#include "tapegrad/ops/matmul.hpp"
#include "tapegrad/ops/view.hpp"

namespace tapegrad {
namespace {
using namespace detail;

thread_local MatmulPrecision current_precision = MatmulPrecision::exact;

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
  Tensor out = product(a, b, precision == MatmulPrecision::bfloat16);
  // da = g b^T,  db = a^T g   (each summed over the batch dims its operand was broadcast along).
  // A zero-size g gives zeros, made at the operand's shape: the product would be made at the
  // broadcast shape first, and with N = 0 that is [batch..., M, K] of zeros however long the batch.
  // Those zeros are constant in a, b and g, so they need no history in a create_graph pass either.
  // The two products are matmuls at the node's precision: one formula to every order (they record
  // only in a create_graph pass, so a first-order pass runs the bare products).
  record("matmul", {a, b}, out, {a, b}, [a, b, precision](std::span<const Tensor> g, const std::vector<bool>& needs) {
    std::vector<Tensor> grads(2);
    const bool empty = g[0].numel() == 0;
    if (needs[0]) grads[0] = empty ? zeros(a.shape(), a.dtype()) : sum_to(matmul(g[0], transpose(b, -1, -2), precision), a.shape());
    if (needs[1]) grads[1] = empty ? zeros(b.shape(), b.dtype()) : sum_to(matmul(transpose(a, -1, -2), g[0], precision), b.shape());
    return grads;
  });
  return out;
}

bool bfloat16_native() noexcept { return dnnl_bf16_native(); }

}  // namespace tapegrad
