// Internal: float32 GELU, x Phi(x) (Phi, phi: the standard normal cdf and density), over
// contiguous arrays, with explicit AVX-512 and AVX2 code picked at run time and a scalar path
// that computes the same formula operation by operation, so every path gives the same bits
// (ops/gelu_f32.cpp has the formula and its measured error).
#pragma once

#include <cstdint>

namespace tapegrad::detail {

enum class GeluPath { scalar, avx2, avx512 };

// The fastest path this CPU runs, and whether it runs a given one (for the tests).
GeluPath gelu_path();
bool gelu_path_supported(GeluPath path);

// y = x Phi(x).
void gelu_f32(const float* x, float* y, std::int64_t n, GeluPath path = gelu_path());
// dx = g (Phi(x) + x phi(x)).
void gelu_backward_f32(const float* g, const float* x, float* dx, std::int64_t n, GeluPath path = gelu_path());
// y = x Phi(x) and its slope Phi(x) + x phi(x), for a node that keeps the slope.
void gelu_slope_f32(const float* x, float* y, float* slope, std::int64_t n, GeluPath path = gelu_path());

}  // namespace tapegrad::detail
