// Internal: float32 products as plain loops, one row of c at a time (matmul_rows.cpp).
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad::detail {

// c = a @ b as matmul_dnnl takes them (matmul_dnnl.hpp). For one row per matrix (a is
// [..., 1, K]) no primitive is created for each new N or K (KV-cache decoding meets a new K at
// every step), and for tiny products the loops cost less than a call into oneDNN.
void matmul_rows(const Tensor& a, const Tensor& b, const Tensor& c);

}  // namespace tapegrad::detail
