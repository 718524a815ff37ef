// Internal: the two matmul back ends. Both compute c = a @ b for operands of equal rank r >= 2
// whose batch dims (all but the last two) are either equal to c's or 1 (broadcast); a is
// [..., M, K], b is [..., K, N], c is a fresh contiguous [..., M, N]. M, N, K and the batch
// are all nonzero.
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad::detail {

// float32 on oneDNN; with `bf16` the operands are rounded to bfloat16 first and accumulated in
// float32. The only file that sees oneDNN.
void matmul_dnnl(const Tensor& a, const Tensor& b, const Tensor& c, bool bf16);
bool dnnl_bf16_native() noexcept;

// float64: tapegrad's own cache-blocked kernel.
void matmul_f64(const Tensor& a, const Tensor& b, const Tensor& c);

}  // namespace tapegrad::detail
