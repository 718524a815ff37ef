// Internal: the tile kernels of the fused attention (layers/attention_flash.cpp, its only user):
// a vectorisable exp for softmax tiles, row reductions, gemm on raw tiles and the gemm in which a
// zero weight contributes nothing. That file is compiled with -fno-trapping-math, which lets the
// compiler turn the selects below into vector blends.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ops/fast_math.hpp"
#include "ops/matmul_kernels.hpp"

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
template <class T> T row_max(const T* s, std::int64_t n) {  // NaN skipped, as masked_max does
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

// C[m, n] += alpha W ⊛ X with W [m, k] (or stored [k, m] when wt) and X rows x (row stride ldx):
// the product in which a zero weight contributes nothing. X is always copied (to `pack`, set to 0
// where not finite), so that the product runs on the same numbers whether or not a poisoned row
// is present: a tile whose non-finite values meet only zero weights gives bitwise what zeros give.
template <class T>
void weighted_gemm(bool wt, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* w, std::int64_t ldw, const T* x,
                   std::int64_t ldx, T* c, std::int64_t ldc, std::vector<T>& pack) {
  if (m == 0 || n == 0 || k == 0) return;
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
  if (!any_bad) return;
  for (std::int64_t t = 0; t < k; ++t)
    for (std::int64_t j = 0; j < n; ++j) {
      const T v = x[t * ldx + j];
      if (!non_finite(v)) continue;
      for (std::int64_t i = 0; i < m; ++i)
        if (const T weight = wt ? w[t * ldw + i] : w[i * ldw + t]; weight != T(0)) c[i * ldc + j] += alpha * weight * v;
    }
}

}  // namespace tapegrad::detail::tiles
