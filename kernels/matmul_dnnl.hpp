// Internal: every oneDNN call (matmul_dnnl.cpp, the only file that sees oneDNN): float32 and
// bfloat16 products, the gemms the fused attention multiplies its tiles with, and the bfloat16
// rounding of their operands.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad::detail {

// c = a @ b for operands of equal rank r >= 2 whose batch dims (all but the last two) are either
// equal to c's or 1 (broadcast); a is [..., M, K], b is [..., K, N], c is a fresh contiguous
// [..., M, N]. M, N, K and the batch are all nonzero. float32; with `bf16` the operands are
// rounded to bfloat16 first and accumulated in float32. Small single-row products go to
// matmul_rows instead.
void matmul_dnnl(const Tensor& a, const Tensor& b, const Tensor& c, bool bf16);

// Whether dims of these sizes and strides fill one dense block in some order of the dims (size-1
// dims aside), so that the block can be read or converted in memory order.
bool dense_in_some_order(std::span<const std::int64_t> sizes, std::span<const std::int64_t> strides);
bool dnnl_bf16_native() noexcept;

// Row-major BLAS-style float32 gemm on raw blocks, for kernels that multiply many small tiles
// (the fused attention): C[m, n] = alpha op(A) op(B) + beta C, op(X) = X or X^T as stored,
// lda/ldb/ldc the row strides as stored. C is not read when beta = 0. Single-threaded when
// called from inside a parallel region.
void gemm_f32(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
              std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc);

// The bfloat16 pieces of the attention core's products (kernels/attention_*.cpp), which round each
// operand once per call rather than once per product. bfloat16 bits are uint16_t.
//
// Rounds a [rows, cols] float32 block (row stride ld) to nearest-even bfloat16 into dense dst,
// with every inf and NaN written as 0 and flagged in bad_rows[r] (when given), so that a
// product on dst multiplies finite numbers only and the caller adds the non-finite ones back
// where their weight is not zero. A finite value stays finite (saturating at 3.39e38). Returns
// whether any value was not finite.
bool round_bf16_operand(const float* src, std::int64_t ld, std::int64_t rows, std::int64_t cols, std::uint16_t* dst,
                        unsigned char* bad_rows) noexcept;
// The bfloat16 bits of f, rounded to nearest even; a NaN stays a (quiet) NaN, an infinity one.
// Saturate: a finite f past bfloat16's largest finite (3.39e38) becomes that value rather than an
// infinity (the attention products' rule: a finite operand stays finite). Selects, no branches,
// so that the loops over it vectorise.
template <bool Saturate = false> inline std::uint16_t to_bf16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f), mag = u & 0x7fffffffu;
  std::uint32_t out = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  if constexpr (Saturate) out = mag < 0x7f800000u && (out & 0x7fffu) == 0x7f80u ? ((u >> 16) & 0x8000u) | 0x7f7fu : out;
  return static_cast<std::uint16_t>(mag > 0x7f800000u ? (u >> 16) | 0x40u : out);
}

// n contiguous float32 values rounded as a bfloat16 product rounds its operands (nearest even,
// no saturation, to_bf16<false>; a weight's kept copy uses it, Adam's update calls to_bf16 itself).
void round_bf16(const float* src, std::uint16_t* dst, std::int64_t n) noexcept;
// n contiguous weights rounded as above, but NaN and infinities kept (a NaN weight must reach the
// output, as it does in float32).
void round_bf16_weights(const float* src, std::uint16_t* dst, std::int64_t n) noexcept;
// gemm_f32 on bfloat16 operands, float32 accumulation and C: oneDNN's bfloat16 gemm where the CPU
// has native bfloat16 dot products, else (emulated, slower) the float32 gemm on the widened
// operands, which computes the same products exactly.
void gemm_bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const std::uint16_t* a,
               std::int64_t lda, const std::uint16_t* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc);

// oneDNN primitives kept per thread, least recently used dropped first.
inline constexpr std::size_t kDnnlCacheCapacity = 512;
// How many oneDNN primitives the calling thread has created (cache misses), for tests.
std::int64_t dnnl_primitives_created() noexcept;
// The threads oneDNN gets for a product of `macs` multiply-adds: 1 below a few hundred
// microseconds of work, then up to num_threads().
int dnnl_threads_for(double macs) noexcept;

}  // namespace tapegrad::detail
