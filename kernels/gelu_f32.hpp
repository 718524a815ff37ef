// Internal: float32 GELU, x Phi(x) (Phi, phi: the standard normal cdf and density), over
// contiguous arrays, with explicit AVX-512 and AVX2 code picked at run time and a scalar path
// that computes the same formula operation by operation, so every path gives the same bits
// (kernels/gelu_f32.cpp has the formula and its measured error).
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

namespace tapegrad::detail {

enum class GeluPath { scalar, avx2, avx512 };

// The fastest path this CPU runs, and whether it runs a given one (for the tests).
GeluPath gelu_path();
bool gelu_path_supported(GeluPath path);

// y = x Phi(x).
void gelu_f32(const float* x, float* y, std::int64_t n, GeluPath path = gelu_path());
// dx = g (Phi(x) + x phi(x)): the gelu node keeps x and recomputes the slope here.
void gelu_backward_f32(const float* g, const float* x, float* dx, std::int64_t n, GeluPath path = gelu_path());
// y = x Phi(x) and its slope Phi(x) + x phi(x) in one pass (the kernel tests read the slope).
void gelu_slope_f32(const float* x, float* y, float* slope, std::int64_t n, GeluPath path = gelu_path());

// float64 GELU's pieces, with the std:: functions (the gelu op's forward and backward share them).
inline double normal_cdf(double x) { return 0.5 * (1 + std::erf(x * (std::numbers::sqrt2 / 2))); }
inline double normal_pdf(double x) { return std::exp(-0.5 * x * x) * (0.5 * std::numbers::inv_sqrtpi * std::numbers::sqrt2); }

}  // namespace tapegrad::detail
