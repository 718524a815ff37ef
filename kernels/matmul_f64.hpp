// Internal: float64 products on OpenBLAS's dgemm (matmul_f64.cpp, the only file that sees it).
#pragma once

#include <cstdint>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad::detail {

// c = a @ b for operands of equal rank r >= 2 whose batch dims (all but the last two) are either
// equal to c's or 1 (broadcast); a is [..., M, K], b is [..., K, N], c is a fresh contiguous
// [..., M, N]. M, N, K and the batch are all nonzero. Split for threads as float32 products are.
void matmul_f64(const Tensor& a, const Tensor& b, const Tensor& c);
// What it does for sizes past dgemm's int (tensors of many GiB, or views): blocks of at most
// `block` in each dim, packed into dense buffers, the blocks along K summed in order.
void matmul_f64_blocked(const Tensor& a, const Tensor& b, const Tensor& c, std::int64_t block);

}  // namespace tapegrad::detail
