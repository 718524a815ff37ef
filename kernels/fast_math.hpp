// Internal: float32 exp and tanh, written so that a loop over them vectorises (std::exp and
// friends are calls the compiler cannot vectorise without -ffast-math). Branch-free: ranges are
// clamped with selects, NaN propagates (every clamp is `x < lo ? lo : x`, false for NaN), and no
// float-to-int conversion sees NaN or an out-of-range value. float64 keeps the std:: functions.
//
// One exponential (exp_core) serves the float32 exp op (exp_f32) and the softmax loops
// (exp_flush_f32, which want exact zeros far left of 0). GELU has its own kernels, with the
// exponential inlined (gelu_f32.cpp).
//
// Measured against the double-precision std:: functions over every 7th float32 (both signs):
// exp_f32 within 1.6 ulp (for -103 < x < 88.7), exp_flush_f32 within 1.3 ulp over all float32
// in [-87.3, 88], tanh_f32 within 2.4 ulp. tests/test_kernels.cpp holds looser bounds (2 ulp,
// 3 ulp); docs/gradients.md documents them for the ops.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace tapegrad::detail {

// 2^k for an integer k with -126 <= k <= 127, built from its exponent bits (unsigned, so that
// the garbage k of a NaN input stays defined behaviour; that NaN reaches the result anyway).
inline float pow2_f32(std::uint32_t k) { return std::bit_cast<float>((k + 127u) << 23); }

// Round-to-nearest of v (|v| < 2^22) by adding 1.5 * 2^23: the sum's low mantissa bits hold
// the integer, read by round_bits without any float-to-int conversion (none of which may see
// NaN or an out-of-range value), and sum - kShift is the rounded value as a float.
inline constexpr float kShift = 12582912.0f;
inline std::uint32_t round_bits(float sum) { return std::bit_cast<std::uint32_t>(sum) - std::bit_cast<std::uint32_t>(kShift); }

// e^x = 2^n e^r with n = round(x / ln 2), |r| <= ln 2 / 2; e^r by its Taylor series to r^7
// (truncation below 1e-8 relative). 2^n is applied as two halves, each a normal power of two
// for -174 < x < 176, so that results in the subnormal range (x down to -103.97) and the
// overflow to inf (x > 88.72) both come out right. `lo` is a small correction to x
// (|lo| <= ulp(x)) for arguments known to more than float precision. n is read from the
// rounding sum's bits, so a NaN (which propagates through r) never meets a float-to-int
// conversion. exp_core does no clamping, for callers whose argument is known to be in range:
// GCC specialises the code after a clamp for the clamped constant, and in a vectorised loop
// that becomes a second copy of the polynomial.
template <bool kHasLo, bool kSubnormal = true> inline float exp_core(float x, float lo = 0.0f) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;  // low mantissa bits zero: n * kLn2Hi is exact
  constexpr float kLn2Lo = 1.42860682030941723e-6f;
  const float sum = x * kLog2e + kShift;
  const float n = sum - kShift;
  float r = x - n * kLn2Hi;
  if constexpr (kHasLo) r += lo;  // (adding a zero lo is not free: it turns -0 into +0)
  r -= n * kLn2Lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const std::uint32_t k = round_bits(sum);
  if constexpr (!kSubnormal) return p * pow2_f32(k);  // -126 <= n <= 127 only
  const auto half = static_cast<std::uint32_t>(std::bit_cast<std::int32_t>(k) >> 1);  // floor(n / 2)
  return p * pow2_f32(half) * pow2_f32(k - half);
}

// e^x for any x: the clamps (which NaN passes) keep n within exp_core's range; exp(-104) is 0
// and exp(89) is inf in float32.
inline float exp_f32(float x) {
  x = x < -104.0f ? -104.0f : x;
  x = x > 89.0f ? 89.0f : x;
  return exp_core<false>(x);
}

// e^x for the softmax loops, whose arguments are <= 0 or NaN (a score minus its row's
// maximum; x <= 88 is required): exactly 0 below -87.3, where e^x would be subnormal (softmax
// and the fused attention want exact zeros for very negative and -inf (masked) scores, and
// no subnormal arithmetic after them, slow on some CPUs), NaN stays NaN. In between n >= -126,
// so 2^n is one normal power of two, and the upper end needs no clamp: the cheapest form.
inline float exp_flush_f32(float x) {
  constexpr float kLow = -87.3f;
  const float e = exp_core<false, false>(x < kLow ? kLow : x);
  return x < kLow ? 0.0f : e;
}

// tanh |x| = m / (m + 2) with m = e^(2|x|) - 1, computed as 2^n (e^r - 1) + (2^n - 1) so that
// small |x| keeps its relative precision (no 1 - 2 / (e^2x + 1) cancellation). Beyond
// |x| = 10, tanh rounds to 1.
inline float tanh_f32(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;
  constexpr float kLn2Lo = 1.42860682030941723e-6f;
  float y = 2.0f * std::fabs(x);
  y = y > 20.0f ? 20.0f : y;
  const float sum = y * kLog2e + kShift;
  const float n = sum - kShift;
  const float r = (y - n * kLn2Hi) - n * kLn2Lo;
  // e^r - 1 = r + r^2 (1/2 + r/6 + ... + r^6/8!)
  float p = 1.0f / 40320.0f;
  p = p * r + 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  const float q = r + r * r * p;
  const float s = pow2_f32(round_bits(sum));
  const float m = s * q + (s - 1.0f);
  return std::copysign(m / (m + 2.0f), x);
}

}  // namespace tapegrad::detail
