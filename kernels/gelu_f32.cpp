// float32 GELU, x Phi(x), and its slope Phi(x) + x phi(x), from one exponential and one
// table-driven polynomial. With a = |x| (clamped to 14.8, past which Phi(-a) and phi(a) are 0
// in float32):
//
//   phi(a)   = e^(-a^2 / 2) / sqrt(2 pi), computed as 2^n P(r): a^2 / 2 is split exactly into
//              hi + lo (an FMA gives the product's rounding error), n = round(hi / ln 2),
//              r = hi - n ln 2 + lo, P(r) ~ e^r / sqrt(2 pi) of degree 6 on |r| <= ln 2 / 2;
//   Phi(-a)  = phi(a) M(a), M the Mills ratio Phi(-a) / phi(a) (sqrt(pi / 2) at 0, about 1 / a
//              far out, smooth), a degree-6 polynomial in a - c_j on 16 intervals of a: the
//              index j is taken from the exponent and top two mantissa bits of a + 1, so the
//              intervals are 0.25 wide on [0, 1), 0.5 on [1, 3), 1 on [3, 7) and 2 on [7, 15);
//   Phi(x)   = Phi(-a) for x < 0 (so the left tail keeps its relative precision) and
//              1 - Phi(-a) otherwise.
//
// No division and no second series near 0, so the forward is half the instructions of an
// erfc-based form (docs/performance-notes.md has the count and the timing). The vector paths look the coefficients up with
// permutes (one vpermps per coefficient on AVX-512, two and a blend on AVX2); 2^n is applied
// with vscalefps on AVX-512 and as two normal powers of two elsewhere, both one correctly
// rounded product, so results near the subnormal range agree too. The scalar path is the same
// sequence of float operations (std::fma where the vector code fuses) and this file is compiled
// without contraction, so all paths give the same bits, whatever the thread count or the CPU.
//
// Coefficients (tools/fit_gelu_f32.py): relative least squares on 48 Chebyshev nodes per
// interval (mpmath, 40 digits, reference erfc), rounded to float one coefficient at a time from
// the constant term up, the rest refitted after each rounding; fit error below 5e-8 relative
// (P: 3e-8). Measured against
// double-precision erfc and exp over every 7th float32 with |x| < 15: Phi within 1.05e-7
// absolute and 2.1e-7 relative in the left tail (down to x = -12.9, below which Phi is
// subnormal), phi within 2.7e-8 absolute, the slope within 1.3e-7; the AVX-512, AVX2 and
// scalar paths give the same bits for every float32 input (a NaN's sign and payload aside).
//
// Limits: NaN propagates (every clamp is `c < v ? c : v` or `c > v ? c : v`, which keep a NaN
// v, as vminps and vmaxps with the constant first do); gelu(inf) = inf, gelu(-inf) = -0 (x is clamped at -14.8
// before the product, so -inf * 0 does not make a NaN), and the slope is 1 at inf and 0 at
// -inf (x phi(x) uses the clamped x, as phi is 0 there anyway).
#include "kernels/gelu_f32.hpp"
#include "runtime/cpu.hpp"

#include <bit>
#include <cmath>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TAPEGRAD_GELU_X86 1
// GCC 12 warns on the intrinsics' own _mm512_undefined_ps() (`__m512 __Y = __Y;`) once inlined.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

namespace tapegrad::detail {
namespace {

constexpr float kMaxA = 14.8f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693145751953125f;  // low mantissa bits zero: n * kLn2Hi is exact
constexpr float kLn2Lo = 1.42860682030941723e-6f;
constexpr float kShift = 12582912.0f;  // 1.5 * 2^23: sum - kShift is round(v), its low bits n

// P(r) ~ e^r / sqrt(2 pi), constant term first.
constexpr float kExp[7] = {0.3989423f, 0.3989423f, 0.19947037f, 0.06648948f, 0.016635459f, 0.003340572f, 0.00049391424f};

// Per interval, in the order of the index j = (bits(a + 1) >> 21) mod 16 (intervals 12-15 of
// that order are the four on [0, 1)): the centre c_j and M's coefficients, constant term first.
alignas(64) constexpr float kCentre[16] = {1.25f, 1.75f, 2.25f, 2.75f, 3.5f,   4.5f,   5.5f,   6.5f,
                                           8.0f,  10.0f, 12.0f, 14.0f, 0.125f, 0.375f, 0.625f, 0.875f};
alignas(64) constexpr float kMills[7][16] = {
    {0.57843035f, 0.46430692f, 0.3851483f, 0.32767832f, 0.26656777f, 0.21257058f, 0.17632298f, 0.15043698f, 0.12313196f,
     0.099028595f, 0.08276629f, 0.07106958f, 1.1374909f, 0.9515272f, 0.8105337f, 0.70128083f},
    {-0.27696207f, -0.18746288f, -0.13341635f, -0.098884635f, -0.067012824f, -0.043432392f, -0.030223578f, -0.022159573f,
     -0.014944298f, -0.009714036f, -0.006804562f, -0.0050258744f, -0.85781366f, -0.64317733f, -0.49341643f, -0.38637927f},
    {0.116112776f, 0.068124376f, 0.04248127f, 0.027871748f, 0.016011544f, 0.008562501f, 0.0050467816f, 0.0032000802f,
     0.001788827f, 0.0009441353f, 0.00055576715f, 0.00035365784f, 0.5151591f, 0.35517493f, 0.25108084f, 0.18159412f},
    {-0.043938786f, -0.022748364f, -0.012610971f, -0.0074114404f, -0.0036571277f, -0.0016337292f, -0.0008223161f,
     -0.0004534496f, -0.00021124925f, -9.093211e-05f, -4.5100347e-05f, -2.4757883e-05f, -0.26446876f, -0.16999036f,
     -0.11216465f, -0.07582832f},
    {0.015332544f, 0.0070484355f, 0.003509665f, 0.0019059374f, 0.00080186565f, 0.00030185835f, 0.00012992503f,
     6.1527724e-05f, 2.4592357e-05f, 8.655546e-06f, 3.645337e-06f, 1.7861754e-06f, 0.11706615f, 0.07194706f, 0.044395342f,
     0.02949939f},
    {-0.00500743f, -0.0020898308f, -0.0009461727f, -0.00045450343f, -0.00017293311f, -5.5254797e-05f, -2.0582122e-05f,
     -8.675908e-06f, -2.902421e-06f, -8.350793e-07f, -2.9469132e-07f, -1.3454103e-07f, -0.05024304f, -0.028875774f,
     -0.016827457f, -0.010061517f},
    {0.001200731f, 0.0008500659f, 0.00038949298f, -0.00019773013f, 3.6599286e-05f, 1.1200991e-05f, 5.499944e-06f,
     4.7998856e-06f, 3.5329964e-07f, 9.362538e-08f, 1.8661227e-08f, -3.3679168e-08f, 0.14534798f, 0.043620847f,
     0.036801483f, -0.021798788f},
};

enum class Mode { forward, backward, slope };

// ---- scalar: the reference sequence of operations ----

inline std::uint32_t bits(float v) { return std::bit_cast<std::uint32_t>(v); }
inline float from_bits(std::uint32_t v) { return std::bit_cast<float>(v); }

// v 2^n (n from the rounding sum's low bits, -158 <= n <= 0) as two normal powers of two: the
// first product is exact, the second rounds once, as vscalefps does. Unsigned, so that the
// garbage n of a NaN stays defined behaviour (the NaN in v reaches the result anyway).
inline float scale(float v, float sum) {
  const std::uint32_t k = bits(sum) - bits(kShift);
  const auto half = static_cast<std::uint32_t>(std::bit_cast<std::int32_t>(k) >> 1);
  const float once = v * from_bits((half + 127u) << 23);
  return once * from_bits((k - half + 127u) << 23);
}

// Phi(x), phi(x) and |x| clamped.
struct Parts {
  float cdf, pdf, a;
};
inline Parts scalar_parts(float v) {
  float a = std::fabs(v);
  a = kMaxA < a ? kMaxA : a;
  const float h = a * -0.5f;
  const float hi = h * a;
  const float lo = std::fma(h, a, -hi);
  const float sum = std::fma(hi, kLog2e, kShift);
  const float n = sum - kShift;
  float r = std::fma(n, -kLn2Hi, hi);
  r = r + lo;
  r = std::fma(n, -kLn2Lo, r);
  float p = kExp[6];
  for (int i = 5; i >= 0; --i) p = std::fma(p, r, kExp[i]);
  const std::uint32_t j = bits(a + 1.0f) >> 21 & 15u;
  const float t = a - kCentre[j];
  float m = kMills[6][j];
  for (int i = 5; i >= 0; --i) m = std::fma(m, t, kMills[i][j]);
  const float q = p * m;
  const float tail = scale(q, sum);
  const float upper = 1.0f - tail;
  return {v < 0.0f ? tail : upper, scale(p, sum), a};
}

template <Mode M> void scalar_one(const float* g, const float* x, float* y, float* s) {
  const float v = *x;
  const Parts n = scalar_parts(v);
  if constexpr (M != Mode::backward) {
    const float xl = -kMaxA > v ? -kMaxA : v;
    *y = xl * n.cdf;
  }
  if constexpr (M != Mode::forward) {
    const float slope = std::fma(std::copysign(n.a, v), n.pdf, n.cdf);
    if constexpr (M == Mode::slope) *s = slope;
    else *y = *g * slope;
  }
}

template <Mode M> void run_scalar(const float* g, const float* x, float* y, float* s, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) scalar_one<M>(M == Mode::backward ? g + i : g, x + i, y + i, M == Mode::slope ? s + i : s);
}

#ifdef TAPEGRAD_GELU_X86

// ---- AVX-512: 16 lanes, one vpermps per coefficient, vscalefps for 2^n ----

#define TAPEGRAD_AVX512_INLINE TAPEGRAD_TARGET_AVX512 __attribute__((always_inline)) inline

TAPEGRAD_AVX512_INLINE __m512 poly_exp512(__m512 r) {
  __m512 p = _mm512_set1_ps(kExp[6]);
  for (int i = 5; i >= 0; --i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExp[i]));
  return p;
}

template <Mode M>
TAPEGRAD_AVX512_INLINE void body512(const float* g, const float* x, float* y, float* s, __mmask16 k, const __m512* tab) {
  const __m512 v = _mm512_maskz_loadu_ps(k, x);
  const __m512 a = _mm512_min_ps(_mm512_set1_ps(kMaxA), _mm512_abs_ps(v));
  const __m512 h = _mm512_mul_ps(a, _mm512_set1_ps(-0.5f));
  const __m512 hi = _mm512_mul_ps(h, a);
  const __m512 lo = _mm512_fmsub_ps(h, a, hi);
  const __m512 sum = _mm512_fmadd_ps(hi, _mm512_set1_ps(kLog2e), _mm512_set1_ps(kShift));
  const __m512 n = _mm512_sub_ps(sum, _mm512_set1_ps(kShift));
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), hi);
  r = _mm512_add_ps(r, lo);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  const __m512 p = poly_exp512(r);
  const __m512i j = _mm512_srli_epi32(_mm512_castps_si512(_mm512_add_ps(a, _mm512_set1_ps(1.0f))), 21);
  const __m512 t = _mm512_sub_ps(a, _mm512_permutexvar_ps(j, tab[7]));
  __m512 m = _mm512_permutexvar_ps(j, tab[6]);
  for (int i = 5; i >= 0; --i) m = _mm512_fmadd_ps(m, t, _mm512_permutexvar_ps(j, tab[i]));
  const __m512 tail = _mm512_scalef_ps(_mm512_mul_ps(p, m), n);
  const __mmask16 upper = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_NLT_UQ);  // not v < 0
  const __m512 cdf = _mm512_mask_sub_ps(tail, upper, _mm512_set1_ps(1.0f), tail);
  if constexpr (M != Mode::backward) {
    const __m512 xl = _mm512_max_ps(_mm512_set1_ps(-kMaxA), v);
    _mm512_mask_storeu_ps(y, k, _mm512_mul_ps(xl, cdf));
  }
  if constexpr (M != Mode::forward) {
    const __m512 pdf = _mm512_scalef_ps(p, n);
    // copysign(a, v): bits of a where the sign mask is 0, of v where it is 1 (0xd8: c ? b : a)
    const __m512 xs = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(a), _mm512_castps_si512(v),
                                                                     _mm512_set1_epi32(INT32_MIN), 0xd8));
    const __m512 slope = _mm512_fmadd_ps(xs, pdf, cdf);
    if constexpr (M == Mode::slope) _mm512_mask_storeu_ps(s, k, slope);
    else _mm512_mask_storeu_ps(y, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, g), slope));
  }
}

template <Mode M> TAPEGRAD_TARGET_AVX512 void run512(const float* g, const float* x, float* y, float* s, std::int64_t n) {
  __m512 tab[8];
  for (int i = 0; i < 7; ++i) tab[i] = _mm512_load_ps(kMills[i]);
  tab[7] = _mm512_load_ps(kCentre);
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    body512<M>(g + (M == Mode::backward ? i : 0), x + i, y + i, s + (M == Mode::slope ? i : 0), 0xffff, tab);
  if (i < n)  // the remainder, masked
    body512<M>(g + (M == Mode::backward ? i : 0), x + i, y + i, s + (M == Mode::slope ? i : 0),
               static_cast<__mmask16>((1u << (n - i)) - 1), tab);
}

// ---- AVX2 + FMA: 8 lanes, a 16-entry lookup as two vpermps and a blend ----

#define TAPEGRAD_AVX2_INLINE TAPEGRAD_TARGET_AVX2 __attribute__((always_inline)) inline

// table[j mod 16]; `high` has bit 3 of j in its sign bit.
TAPEGRAD_AVX2_INLINE __m256 lookup256(const float* table, __m256i j, __m256 high) {
  const __m256 lo = _mm256_permutevar8x32_ps(_mm256_load_ps(table), j);
  const __m256 hi = _mm256_permutevar8x32_ps(_mm256_load_ps(table + 8), j);
  return _mm256_blendv_ps(lo, hi, high);
}

// v 2^n as scale() does it.
TAPEGRAD_AVX2_INLINE __m256 scale256(__m256 v, __m256i k, __m256i half) {
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 once = _mm256_mul_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23)));
  return _mm256_mul_ps(once, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(k, half), bias), 23)));
}

template <Mode M> TAPEGRAD_AVX2_INLINE void body256(const float* g, const float* x, float* y, float* s) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 v = _mm256_loadu_ps(x);
  __m256 a = _mm256_andnot_ps(sign, v);
  a = _mm256_min_ps(_mm256_set1_ps(kMaxA), a);
  const __m256 h = _mm256_mul_ps(a, _mm256_set1_ps(-0.5f));
  const __m256 hi = _mm256_mul_ps(h, a);
  const __m256 lo = _mm256_fmsub_ps(h, a, hi);
  const __m256 sum = _mm256_fmadd_ps(hi, _mm256_set1_ps(kLog2e), _mm256_set1_ps(kShift));
  const __m256 n = _mm256_sub_ps(sum, _mm256_set1_ps(kShift));
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), hi);
  r = _mm256_add_ps(r, lo);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExp[6]);
  for (int i = 5; i >= 0; --i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExp[i]));
  const __m256i j = _mm256_srli_epi32(_mm256_castps_si256(_mm256_add_ps(a, _mm256_set1_ps(1.0f))), 21);
  const __m256 high = _mm256_castsi256_ps(_mm256_slli_epi32(j, 28));
  const __m256 t = _mm256_sub_ps(a, lookup256(kCentre, j, high));
  __m256 m = lookup256(kMills[6], j, high);
  for (int i = 5; i >= 0; --i) m = _mm256_fmadd_ps(m, t, lookup256(kMills[i], j, high));
  const __m256i k = _mm256_sub_epi32(_mm256_castps_si256(sum), _mm256_castps_si256(_mm256_set1_ps(kShift)));
  const __m256i half = _mm256_srai_epi32(k, 1);
  const __m256 tail = scale256(_mm256_mul_ps(p, m), k, half);
  const __m256 upper = _mm256_sub_ps(_mm256_set1_ps(1.0f), tail);
  const __m256 cdf = _mm256_blendv_ps(upper, tail, _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ));
  if constexpr (M != Mode::backward) {
    const __m256 xl = _mm256_max_ps(_mm256_set1_ps(-kMaxA), v);
    _mm256_storeu_ps(y, _mm256_mul_ps(xl, cdf));
  }
  if constexpr (M != Mode::forward) {
    const __m256 pdf = scale256(p, k, half);
    const __m256 xs = _mm256_or_ps(a, _mm256_and_ps(sign, v));
    const __m256 slope = _mm256_fmadd_ps(xs, pdf, cdf);
    if constexpr (M == Mode::slope) _mm256_storeu_ps(s, slope);
    else _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_loadu_ps(g), slope));
  }
}

template <Mode M> TAPEGRAD_TARGET_AVX2 void run256(const float* g, const float* x, float* y, float* s, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) body256<M>(g + (M == Mode::backward ? i : 0), x + i, y + i, s + (M == Mode::slope ? i : 0));
  run_scalar<M>(g + (M == Mode::backward ? i : 0), x + i, y + i, s + (M == Mode::slope ? i : 0), n - i);
}

#endif  // TAPEGRAD_GELU_X86

template <Mode M> void run(GeluPath path, const float* g, const float* x, float* y, float* s, std::int64_t n) {
#ifdef TAPEGRAD_GELU_X86
  if (path == GeluPath::avx512) return run512<M>(g, x, y, s, n);
  if (path == GeluPath::avx2) return run256<M>(g, x, y, s, n);
#endif
  (void)path;
  run_scalar<M>(g, x, y, s, n);
}

}  // namespace

bool gelu_path_supported(GeluPath path) {
#ifdef TAPEGRAD_GELU_X86
  if (path == GeluPath::avx512) return __builtin_cpu_supports("avx512f");
  if (path == GeluPath::avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return path == GeluPath::scalar;
}

GeluPath gelu_path() {
  static const GeluPath best = gelu_path_supported(GeluPath::avx512) ? GeluPath::avx512
                               : gelu_path_supported(GeluPath::avx2) ? GeluPath::avx2
                                                                       : GeluPath::scalar;
  return best;
}

void gelu_f32(const float* x, float* y, std::int64_t n, GeluPath path) { run<Mode::forward>(path, nullptr, x, y, nullptr, n); }
void gelu_backward_f32(const float* g, const float* x, float* dx, std::int64_t n, GeluPath path) {
  run<Mode::backward>(path, g, x, dx, nullptr, n);
}
void gelu_slope_f32(const float* x, float* y, float* slope, std::int64_t n, GeluPath path) {
  run<Mode::slope>(path, nullptr, x, y, slope, n);
}

}  // namespace tapegrad::detail
