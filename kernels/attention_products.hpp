// Internal: the tile kernels of the fused attention (kernels/attention_tiles.cpp, its only user):
// a vectorisable exp for softmax tiles, row reductions, gemm on raw tiles and the gemm in which a
// zero weight contributes nothing, in float32 and on bfloat16 copies (the bfloat16 ones serve
// the weights path too, on whole matrices). That file is compiled with -fno-trapping-math, which
// lets the compiler turn the selects below into vector blends.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/fast_math.hpp"
#include "kernels/matmul_dnnl.hpp"

namespace tapegrad::detail::tiles {

template <class T> constexpr T kInf = std::numeric_limits<T>::infinity();

// exp(x) for the x <= 0 (and NaN) that softmax tiles take: fast_math's call-free exp_flush_f32
// (the one float32 exp of the softmax loops), so that the tile loops vectorise (libm's expf is a
// call per element, most of the tile time). Below -87.3 (and at -inf) it is exactly 0, which
// the online softmax's rescale exp(m - m') relies on; NaN stays NaN.
inline float exp_tile(float x) { return exp_flush_f32(x); }
inline double exp_tile(double x) { return std::exp(x); }  // float64 is for exact checks

// 1 for an infinity or NaN (exponent bits all ones), as an integer so that scans vectorise.
inline std::uint32_t non_finite(float v) { return (std::bit_cast<std::uint32_t>(v) & 0x7f800000u) == 0x7f800000u; }
inline std::uint32_t non_finite(double v) {
  return (std::bit_cast<std::uint64_t>(v) & 0x7ff0000000000000u) == 0x7ff0000000000000u;
}

// Row reductions in eight lanes: a float reduction loop is not vectorised without licence to
// reorder the additions (-ffast-math); eight independent lanes give the compiler that order.
template <class T> T row_max(const T* s, std::int64_t n) {  // NaN skipped, as the softmax rows' maximum does
  T lane[8];
  std::fill_n(lane, 8, -kInf<T>);
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int u = 0; u < 8; ++u) lane[u] = s[j + u] > lane[u] ? s[j + u] : lane[u];
  for (; j < n; ++j) lane[0] = s[j] > lane[0] ? s[j] : lane[0];
  return *std::max_element(lane, lane + 8);
}
template <class T> T row_sum(const T* s, std::int64_t n) {
  T lane[8] = {};
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int u = 0; u < 8; ++u) lane[u] += s[j + u];
  for (; j < n; ++j) lane[0] += s[j];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// C = alpha op(A) op(B) + beta C (row-major, beta 0 or 1).
inline void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a, std::int64_t lda,
          const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0)
      for (std::int64_t i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, 0.0f);
    return;
  }
  gemm_f32(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// float64 is for exact checks, not speed: plain loops, inner loops over contiguous memory.
inline void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha, const double* a, std::int64_t lda,
          const double* b, std::int64_t ldb, double beta, double* c, std::int64_t ldc) {
  auto at = [&](std::int64_t i, std::int64_t p) { return ta ? a[p * lda + i] : a[i * lda + p]; };
  for (std::int64_t i = 0; i < m; ++i) {
    double* row = c + i * ldc;
    if (beta == 0) std::fill_n(row, n, 0.0);
    if (tb) {
      for (std::int64_t j = 0; j < n; ++j) {
        double dot = 0;
        for (std::int64_t p = 0; p < k; ++p) dot += at(i, p) * b[j * ldb + p];
        row[j] += alpha * dot;
      }
    } else {
      for (std::int64_t p = 0; p < k; ++p) {
        const double x = alpha * at(i, p);
        for (std::int64_t j = 0; j < n; ++j) row[j] += x * b[p * ldb + j];
      }
    }
  }
}

// C[i, n] += alpha W[i, t] X[t, n] for every non-finite X[t, n] whose weight W[i, t] is nonzero
// (W [m, k], or stored [k, m] when wt), in the rows t that `bad` flags (every row when null).
template <class T>
void add_non_finite(bool wt, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* w, std::int64_t ldw, const T* x,
                    std::int64_t ldx, const unsigned char* bad, T* c, std::int64_t ldc) {
  for (std::int64_t t = 0; t < k; ++t) {
    if (bad != nullptr && !bad[t]) continue;
    for (std::int64_t j = 0; j < n; ++j) {
      const T v = x[t * ldx + j];
      if (!non_finite(v)) continue;
      for (std::int64_t i = 0; i < m; ++i)
        if (const T weight = wt ? w[t * ldw + i] : w[i * ldw + t]; weight != T(0)) c[i * ldc + j] += alpha * weight * v;
    }
  }
}

// C[m, n] += alpha W ⊛ X with W [m, k] (or stored [k, m] when wt) and X rows x (row stride ldx):
// the product in which a zero weight contributes nothing. X is copied (to `pack`, set to 0 where
// not finite), so that the product runs on the same numbers whether or not a poisoned row is
// present: a tile whose non-finite values meet only zero weights gives bitwise what zeros give.
// With x_finite (the caller scanned the whole operand once) the copy would be X itself: the
// product reads x in place.
template <class T>
void weighted_gemm(bool wt, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* w, std::int64_t ldw, const T* x,
                   std::int64_t ldx, T* c, std::int64_t ldc, std::vector<T>& pack, bool x_finite = false) {
  if (m == 0 || n == 0 || k == 0) return;
  if (x_finite) {
    gemm(wt, false, m, n, k, alpha, w, ldw, x, ldx, T(1), c, ldc);
    return;
  }
  pack.resize(static_cast<std::size_t>(k * n));
  std::uint32_t any_bad = 0;
  for (std::int64_t t = 0; t < k; ++t) {
    const T* row = x + t * ldx;
    T* out = pack.data() + t * n;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::uint32_t bad = non_finite(row[j]);
      any_bad |= bad;
      out[j] = bad ? T(0) : row[j];
    }
  }
  gemm(wt, false, m, n, k, alpha, w, ldw, pack.data(), n, T(1), c, ldc);
  if (any_bad) add_non_finite(wt, m, n, k, alpha, w, ldw, x, ldx, nullptr, c, ldc);
}

// The bfloat16 products of the fused path. Its operands were rounded once per call
// (round_bf16_operand: inf and NaN held as 0, their rows flagged), so each product below runs on
// finite numbers and then puts back what the non-finite ones give in float32.

// Rows of an operand (q, k, v or dO) for these products: its bfloat16 copy and, for the inf and
// NaN that the copy holds as 0, its float32 rows and their flags.
struct RoundedRows {
  const std::uint16_t* bits;
  std::int64_t ld_bits;
  const float* x;
  std::int64_t ld;
  const unsigned char* bad;
  RoundedRows from(std::int64_t r) const { return {bits + r * ld_bits, ld_bits, x + r * ld, ld, bad + r}; }
  bool any_bad(std::int64_t rows) const { return std::any_of(bad, bad + rows, [](unsigned char b) { return b != 0; }); }
};

// C[m, n] += alpha W̃ ⊛ X̃ as weighted_gemm, on bfloat16 copies: wb of the weights w (float32,
// whose zeros decide where a non-finite X element counts; read only then) and of X.
inline void weighted_gemm_bf16(bool wt, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* w,
                               const std::uint16_t* wb, std::int64_t ldw, const RoundedRows& x, float* c, std::int64_t ldc) {
  if (m == 0 || n == 0 || k == 0) return;
  gemm_bf16(wt, false, m, n, k, alpha, wb, ldw, x.bits, x.ld_bits, 1.0f, c, ldc);
  if (x.any_bad(k)) add_non_finite(wt, m, n, k, alpha, w, ldw, x.x, x.ld, x.bad, c, ldc);
}

// C[m, n] = alpha Ã B̃ᵀ on bfloat16 copies (rows of width d), then the entries that a flagged row of
// A or B reaches recomputed in float32: they are inf or NaN, as in the float32 product.
inline void scores_bf16(std::int64_t m, std::int64_t n, std::int64_t d, float alpha, const RoundedRows& a, const RoundedRows& b,
                        float* c, std::int64_t ldc) {
  gemm_bf16(false, true, m, n, d, alpha, a.bits, a.ld_bits, b.bits, b.ld_bits, 0.0f, c, ldc);
  if (!a.any_bad(m) && !b.any_bad(n)) return;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      if (!a.bad[i] && !b.bad[j]) continue;
      float dot = 0;
      for (std::int64_t t = 0; t < d; ++t) dot += a.x[i * a.ld + t] * b.x[j * b.ld + t];
      c[i * ldc + j] = alpha * dot;
    }
}

}  // namespace tapegrad::detail::tiles
