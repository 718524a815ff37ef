// Batched matrix multiplication: a[..., M, K] x b[..., K, N] -> [..., M, N], leading dims
// broadcast. Both operands have rank >= 2 and one floating dtype.
//
// float32 runs on oneDNN; transposed and strided operands are described to it by strides, not
// copied. MatmulPrecision::bfloat16 rounds float32 operands to bfloat16 and accumulates in
// float32 (oneDNN's AMX/AVX-512 bf16 kernels); the result and gradients stay float32. float64
// runs on OpenBLAS's cblas_dgemm (oneDNN has no float64 matmul on CPU).
#pragma once

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

enum class MatmulPrecision { exact, bfloat16 };

// With no precision given, float32 products use matmul_precision() (exact unless changed).
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor matmul(const Tensor& a, const Tensor& b, MatmulPrecision precision);

// The precision of every float32 matmul that does not name one: those inside Linear, the
// projections of multi-head attention and the other layers, forward and backward (a recorded
// product's backward keeps the precision of its forward) and the attention core's products
// (scores and weighted sums, on either path: bfloat16 operands, float32 accumulation; its
// softmax, sums and masks stay float32). Per calling thread (unlike set_num_threads, which is
// process-wide), so threads training different models do not interfere. float64 is always exact.
void set_matmul_precision(MatmulPrecision precision) noexcept;
MatmulPrecision matmul_precision() noexcept;

// Sets the calling thread's matmul precision for a scope, then restores the previous one:
//   { MatmulPrecisionGuard bf16(MatmulPrecision::bfloat16); loss = model.forward(x); backward(loss); }
class MatmulPrecisionGuard {
 public:
  explicit MatmulPrecisionGuard(MatmulPrecision precision) : saved_(matmul_precision()) { set_matmul_precision(precision); }
  ~MatmulPrecisionGuard() { set_matmul_precision(saved_); }
  MatmulPrecisionGuard(const MatmulPrecisionGuard&) = delete;
  MatmulPrecisionGuard& operator=(const MatmulPrecisionGuard&) = delete;

 private:
  MatmulPrecision saved_;
};

// Whether this CPU has native bfloat16 dot products (AVX512-BF16 or AMX). The bfloat16
// precision works everywhere oneDNN supports it, but is only fast where this is true.
bool bfloat16_native() noexcept;

}  // namespace tapegrad
