// Internal: float32 exp, tanh and the normal distribution's cdf and density, written so that a
// loop over them vectorises (std::exp and friends are calls the compiler cannot vectorise
// without -ffast-math). Branch-free: ranges are clamped with selects, NaN propagates (every
// clamp is `x < lo ? lo : x`, false for NaN), and no float-to-int conversion sees NaN or an
// out-of-range value. float64 keeps the std:: functions.
//
// One exponential (exp_core) serves every float32 exp in tapegrad: exp_f32 (the exp op, GELU)
// and exp_flush_f32 (the softmax loops, which want exact zeros far left of 0).
//
// Measured against the double-precision std:: functions over every 7th float32 (both signs):
// exp_f32 within 1.6 ulp (for -103 < x < 88.7), exp_flush_f32 within 1.3 ulp over all float32
// in [-87.3, 88], tanh_f32 within 2.4 ulp, normal_f32's cdf
// within 1.3e-7 absolute everywhere (erf form: 0.5 (1 + erf(x / sqrt 2)); float32 rounding of
// a value near 1 is 6e-8) and 5e-7 relative in the left tail, its density within 5e-8
// absolute. tests/test_kernels.cpp holds looser bounds (2 ulp, 3 ulp, 1.5e-7); GELU's use of
// them is documented in docs/gradients.md.
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

// The standard normal cdf Phi(x) = 0.5 (1 + erf(x / sqrt 2)) and density phi(x), sharing one
// exponential: with z = |x| / sqrt 2, 0.5 erfc(z) = 0.5 e^(-z^2) R(z), where R(z) = e^(z^2)
// erfc(z) is smooth and bounded (1 at 0, about 1 / (z sqrt pi) far out). R is a degree-10
// polynomial in t = 1 / (1 + 0.35 z), fitted (Chebyshev, mpmath) on 0 <= z <= 10.5, past
// which e^(-z^2) is 0 in float32: its fit error is 1.2e-9. Phi(x) = 1 - 0.5 erfc(z) for
// x >= 0 and 0.5 erfc(z) for x < 0, so the left tail keeps its relative precision; z^2 =
// x^2 / 2 goes to the exponential in two parts (x split into 12 + 12 significant bits), as its
// rounding would otherwise cost that precision. Near 0 (z < 0.5) Phi = 0.5 + 0.5 erf(z) from
// erf's Taylor series to z^13 (truncation below 1e-9), where the erfc form loses bits to 1 - .
struct NormalF32 {
  float cdf, pdf;
};
inline NormalF32 normal_f32(float x) {
  constexpr float kInvSqrt2 = 0.707106781186547524f;
  constexpr float kInvSqrt2Pi = 0.398942280401432678f;
  constexpr float k2InvSqrtPi = 1.12837916709551257f;
  float z = std::fabs(x) * kInvSqrt2;
  z = z > 10.5f ? 10.5f : z;
  float xc = x < -14.8f ? -14.8f : x;  // past which phi and the tail are 0 in float32
  xc = xc > 14.8f ? 14.8f : xc;
  const float xh = std::bit_cast<float>(std::bit_cast<std::uint32_t>(xc) & 0xfffff000u);
  const float xl = xc - xh;
  const float e = exp_core<true>(-0.5f * (xh * xh), -0.5f * (xl * (xh + xc)));  // e^(-x^2 / 2), >= e^-110
  const float t = 1.0f / (1.0f + 0.35f * z);
  float r = 0.0225691098439f;
  r = r * t - 0.0650011940354f;
  r = r * t - 0.063270899896f;
  r = r * t + 0.340490571453f;
  r = r * t - 0.266625302645f;
  r = r * t + 0.372268100075f;
  r = r * t + 0.0537170538699f;
  r = r * t + 0.215795567581f;
  r = r * t + 0.192069163121f;
  r = r * t + 0.198011761362f;
  r = r * t - 2.39295397259e-5f;
  const float tail = 0.5f * e * r;  // Phi(-|x|)
  const float y = z * z;
  float s = -1.0f / 75600.0f;  // erf(z) = 2/sqrt(pi) sum_k (-1)^k z^(2k+1) / (k! (2k+1))
  s = s * y + 1.0f / 9360.0f;
  s = s * y - 1.0f / 1320.0f;
  s = s * y + 1.0f / 216.0f;
  s = s * y - 1.0f / 42.0f;
  s = s * y + 1.0f / 10.0f;
  s = s * y - 1.0f / 3.0f;
  s = s * y + 1.0f;
  const float half_erf = 0.5f * k2InvSqrtPi * z * s;  // 0.5 erf(z)
  const float upper = z < 0.5f ? 0.5f + half_erf : 1.0f - tail;
  const float lower = z < 0.5f ? 0.5f - half_erf : tail;
  return {x < 0.0f ? lower : upper, e * kInvSqrt2Pi};
}

}  // namespace tapegrad::detail
