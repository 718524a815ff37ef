// Batched matrix multiplication: a[..., M, K] x b[..., K, N] -> [..., M, N], leading dims
// broadcast. Both operands have rank >= 2 and one floating dtype.
//
// float32 runs on oneDNN; transposed and strided operands are described to it by strides, not
// copied. Precision::bfloat16 rounds float32 operands to bfloat16 and accumulates in float32
// (oneDNN's AMX/AVX-512 bf16 kernels); the result and gradients stay float32. float64 runs on
// tapegrad's own blocked kernel (oneDNN has no float64 matmul on CPU).
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

enum class MatmulPrecision { exact, bfloat16 };

Tensor matmul(const Tensor& a, const Tensor& b, MatmulPrecision precision = MatmulPrecision::exact);

// Whether this CPU has native bfloat16 dot products (AVX512-BF16 or AMX). The bfloat16
// precision works everywhere oneDNN supports it, but is only fast where this is true.
bool bfloat16_native() noexcept;

}  // namespace tapegrad
