// Internal: the products matmul, linear and the attention's plain path compute with, on the back
// end the dtype takes (float64: matmul_f64.hpp; float32: matmul_dnnl.hpp). Records nothing.
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad::detail {

// a @ b for a [..., M, K] and b [..., K, N] of one floating dtype (checked by the caller), batch
// dims broadcast (ShapeError "matmul: ..." when they do not, or the result is too large): a
// fresh contiguous result. float64 on matmul_f64, float32 on matmul_dnnl (bfloat16 products
// with bf16), which hands small ones to matmul_rows.
Tensor product(const Tensor& a, const Tensor& b, bool bf16);

// c = a @ b on the back end a's dtype takes, for operands as the back ends take them (equal rank,
// batch dims equal to c's or 1, any strides; c fresh and contiguous; every size nonzero).
void product_into(const Tensor& a, const Tensor& b, const Tensor& c, bool bf16);

}  // namespace tapegrad::detail
