// Internal: the softmax of one row, in pieces that the row kernels of masked_softmax
// (softmax.cpp), log_softmax, cross_entropy and the attention core build on.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/fast_math.hpp"
#include "kernels/rows.hpp"

namespace tapegrad::detail {

// The row rules: a row's maximum skips NaN scores (a NaN still reaches the row's sums), and a
// row with no allowed entry, or only -inf allowed scores, is empty: softmax gives it zeros,
// log_softmax -inf.

// exp for the softmax loops: float's call-free exp_flush_f32 (exactly 0 below -87.3, NaN
// stays NaN; within 1.3 ulp above), so that a loop over it vectorises; double is std::exp.
template <class T> [[gnu::always_inline]] inline T softmax_exp(T x) {
  if constexpr (std::is_same_v<T, float>) return exp_flush_f32(x);
  else return std::exp(x);
}

// sum over j < n of f(j), in f's type, over 16 explicit lanes (element j goes to lane j % 16)
// that meet at the end: the loop vectorises with the lanes in registers, the many partial sums
// make a float sum much more accurate than one running total, and the order of the additions
// depends on n alone (not on the vector width). (`omp simd reduction` keeps its lanes in memory,
// a store-to-load chain per vector.)
// With `ahead` (the next row's scores, prefetch_next below), each block of 16 elements also
// asks for the cache line at ahead + 16 j elements.
template <class F> [[gnu::always_inline]] inline auto simd_sum(std::int64_t n, F&& f, const void* ahead = nullptr) {
  using T = decltype(f(0));
  constexpr std::int64_t kLanes = 16;
  T lane[kLanes] = {};
  std::int64_t j = 0;
  const char* next = static_cast<const char*>(ahead);
  for (; j + kLanes <= n; j += kLanes) {
    if (next != nullptr) __builtin_prefetch(next + j * static_cast<std::int64_t>(sizeof(T)), 0, 3);
    for (std::int64_t l = 0; l < kLanes; ++l) lane[l] += f(j + l);
  }
  for (std::int64_t l = 0; j + l < n; ++l) lane[l] += f(j + l);
  T total = 0;
  for (std::int64_t l = 0; l < kLanes; ++l) total += lane[l];
  return total;
}

// A bool mask read as bytes: GCC vectorises a select on a byte load, not on a bool load.
inline const unsigned char* as_bytes(const bool* p) noexcept { return reinterpret_cast<const unsigned char*>(p); }

// The softmax of one row, in two pieces below: load_row, then softmax_loaded. Over the allowed
// keys of a[0, end); a[end, k) and the other keys get 0.
// The row rules above: NaN scores are skipped by the maximum but propagate, and a row with
// no allowed key or only -inf allowed scores is all zeros. The keys that the mask forbids are
// first set to -inf, so that the loops after it are plain float loops (they vectorise): -inf
// changes no maximum, marks no NaN, and exp(-inf - m) is 0 for every m but -inf. m = -inf
// happens only with a NaN score and no finite one; that row takes the loop that asks the mask.
//
// Short rows (causal ends) would spend their time in the scalar tail of each loop: the loops
// run to `stop`, end rounded up to a multiple of kRowPad (within k), over -inf entries that
// behave exactly like masked keys.
inline constexpr std::int64_t kRowPad = 16;
inline std::int64_t padded_end(std::int64_t end, std::int64_t k) noexcept {
  return std::min(k, (end + kRowPad - 1) / kRowPad * kRowPad);
}

// The row after row r of `rows` when it is in the same thread's range and contiguous, else
// null: softmax_loaded asks for its cache lines while it computes the exponentials of row r (a
// line per 16 elements), so that it arrives during that computation. Without it a row read from
// beyond the core's caches cost its transfer plus its computation: the load pass found nothing
// in flight, as the exponential pass touches only the row already in L1.
template <class T> const void* prefetch_next(const RowPointers& rows, std::int64_t r, std::int64_t stop) noexcept {
  return r + 1 < stop && rows.stride == 1 ? rows.row<T>(r + 1) : nullptr;
}

// x where the mask byte (or bool) is set, else -inf; x is computed unconditionally, so that a
// loop of these vectorises.
template <class M, class T> [[gnu::always_inline]] inline T select(M allowed, T x) {
  return allowed ? x : -std::numeric_limits<T>::infinity();
}

template <class T> struct RowMax {
  T m;
  bool nan;
};
// {m, false} for the maximum m of a row a[0, end) just written; a row with no entry above
// -FLT_MAX is read again, for its exact maximum and whether it holds a NaN.
template <class T> RowMax<T> row_max_checked(const T* a, std::int64_t end, T m) {
  if (m > std::numeric_limits<T>::lowest()) return {m, false};
  m = -std::numeric_limits<T>::infinity();
  bool nan = false;
  for (std::int64_t j = 0; j < end; ++j) {
    nan |= a[j] != a[j];
    m = a[j] > m ? a[j] : m;
  }
  return {m, nan};
}

// Writes a[j] = load(j) for j < end (load gives -inf at masked keys) and returns their maximum
// and whether one is NaN, in one pass: the caller's scaling, bias and mask fuse into it.
// The loop carries the maximum alone: a NaN flag and an "above -inf" flag per element made
// it twice the work, and with a mask byte read GCC then vectorised it at a quarter of the
// vector width with its lanes in memory. Whether the row holds a NaN matters only when no
// entry is above -inf (an empty row or a NaN row), and only then, or when the maximum is at
// or below -FLT_MAX (OpenMP starts each lane's maximum at the type's lowest value, which Clang
// takes to be -FLT_MAX rather than -inf), is the written row read again. The maximum never
// picks a NaN, and its value does not depend on the order of the comparisons.
template <class T, class Load> [[gnu::always_inline]] inline RowMax<T> load_row(T* a, std::int64_t end, Load load) {
  constexpr T kMinusInf = -std::numeric_limits<T>::infinity();
  T m = kMinusInf;
#pragma omp simd reduction(max : m)
  for (std::int64_t j = 0; j < end; ++j) {
    const T v = load(j);
    a[j] = v;
    m = v > m ? v : m;
  }
  return row_max_checked(a, end, m);
}

// The rest of the softmax of a row that load_row wrote; allowed(j) is asked only in a NaN row.
// `ahead`: the next row's scores (prefetch_next), asked for during the exponentials. Returns
// the sum l of exp(x - m) (0 for a row of zeros, NaN for a NaN row).
template <class T, class Allowed>
[[gnu::always_inline]] inline T softmax_loaded(T* a, std::int64_t end, std::int64_t k, RowMax<T> max, Allowed allowed,
                                               const void* ahead = nullptr) {
  constexpr T kMinusInf = -std::numeric_limits<T>::infinity();
  const std::int64_t stop = padded_end(end, k);
  std::fill(a + end, a + stop, kMinusInf);
  const T m = max.m;
  if (m == kMinusInf && !max.nan) {  // nothing allowed, or only -inf
    std::fill_n(a, k, T(0));
    return T(0);
  }
  auto ok = [&](std::int64_t j) { return j < end && allowed(j); };
  // s - m <= 0: no overflow; +inf - inf = NaN propagates
  const T z = m == kMinusInf
                  ? simd_sum(stop, [&](std::int64_t j) { return a[j] = ok(j) ? softmax_exp<T>(a[j] - m) : T(0); })
                  : simd_sum(stop, [&](std::int64_t j) { return a[j] = softmax_exp<T>(a[j] - m); }, ahead);
  const T inv = T(1) / z;
  if (z == z)
    for (std::int64_t j = 0; j < stop; ++j) a[j] *= inv;
  else  // a NaN row: NaN at the allowed keys, and the others stay exact zeros
    for (std::int64_t j = 0; j < stop; ++j) a[j] = ok(j) ? a[j] * inv : T(0);
  std::fill(a + stop, a + k, T(0));
  return z;
}

// One row of the softmax backward, out = factor * A * (dA - sum(A * dA)) over [0, end), with
// dA_j = grad(j); out[end, k) = 0 (A is 0 there, so the loops may run on to padded_end).
template <class T, class Grad>
[[gnu::always_inline]] inline void softmax_backward_row(const T* a, std::int64_t end, std::int64_t k, T factor, T* out,
                                                        Grad grad) {
  // Entries with A_j = 0 (masked, empty rows) contribute nothing and get exactly 0, even when
  // their upstream gradient is not finite (0 * inf would be NaN).
  const std::int64_t stop = padded_end(end, k);
  const T d = simd_sum(stop, [&](std::int64_t j) { return a[j] != T(0) ? a[j] * grad(j) : T(0); });
  for (std::int64_t j = 0; j < stop; ++j) out[j] = a[j] == T(0) ? T(0) : factor * (a[j] * (grad(j) - d));
  std::fill(out + stop, out + k, T(0));
}

}  // namespace tapegrad::detail
