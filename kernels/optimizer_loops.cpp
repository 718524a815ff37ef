// The optimizers' loops (optimizer_loops.hpp). Built with -fno-math-errno (with errno to set, GCC
// keeps the square root scalar), -ffp-contract=off and -ftrapping-math (CMakeLists.txt says why).
#include "kernels/optimizer_loops.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/matmul_dnnl.hpp"
#include "runtime/cpu.hpp"
#include "runtime/parallel.hpp"

namespace tapegrad::detail {
namespace {

// With Rounded (float only), the new p's bfloat16 bits go to `rounded` in the same pass, which
// GCC 12 vectorises only with trapping math (CMakeLists.txt); a second pass over the weights
// would read them all again (docs/performance-notes.md).
template <class T, bool Rounded>
TAPEGRAD_CPU_CLONES void adam_run(T* __restrict p, const T* __restrict grad, T* __restrict m, T* __restrict v,
                                   std::uint16_t* __restrict rounded, std::int64_t n, const AdamScalars<T> s) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const T gs = s.scaled ? grad[i] * s.grad_scale : grad[i];
    const T g = s.l2 ? gs + p[i] * s.decay : gs;
    const T pi = s.decoupled ? p[i] * s.decay : p[i];
    T mi = m[i] * s.beta1;
    mi = mi + s.one_minus_beta1 * g;
    T vi = v[i] * s.beta2;
    vi = vi + s.one_minus_beta2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const T out = pi + s.step * mi / (std::sqrt(vi) / s.sqrt_bias2 + s.eps);
    p[i] = out;
    if constexpr (Rounded) rounded[i] = to_bf16(out);
  }
}

// Elements per block of the sums of squares: the blocks' sums are added in block order, so the
// result does not depend on how many threads computed them.
constexpr std::int64_t kSquaresBlock = 1 << 16;
// Each block is summed in kLanes running sums (lane j takes elements j, j + kLanes, ...; the
// lanes added in order), the same bits on every ISA and however many blocks are summed at once.
// kStreams blocks side by side: one core reads four streams of memory faster than one.
constexpr int kLanes = 8;
constexpr int kStreams = 4;

// The sums of squares of S consecutive blocks of len elements from x, into out[0..S).
template <class T, int S> TAPEGRAD_CPU_CLONES void block_squares(const T* __restrict x, std::int64_t len, double* out) {
  double lanes[S][kLanes] = {};
  const std::int64_t whole = len / kLanes * kLanes;
  for (std::int64_t i = 0; i < whole; i += kLanes)
    for (int s = 0; s < S; ++s) {
#pragma omp simd
      for (int j = 0; j < kLanes; ++j) {
        const double v = static_cast<double>(x[s * len + i + j]);
        lanes[s][j] += v * v;
      }
    }
  for (int s = 0; s < S; ++s) {
    for (std::int64_t i = whole; i < len; ++i) {
      const double v = static_cast<double>(x[s * len + i]);
      lanes[s][i - whole] += v * v;
    }
    double total = 0;
    for (int j = 0; j < kLanes; ++j) total += lanes[s][j];
    out[s] = total;
  }
}

template <class T> void adam_parallel(T* p, const T* grad, T* m, T* v, std::uint16_t* rounded, std::int64_t n, const AdamScalars<T>& s) {
  // Element by element: any split gives the same bits. 7 streams of memory per element.
  parallel_for(n, 8, [&](std::int64_t i0, std::int64_t i1) {
    if (rounded == nullptr) adam_run<T, false>(p + i0, grad + i0, m + i0, v + i0, nullptr, i1 - i0, s);
    else if constexpr (std::is_same_v<T, float>) adam_run<T, true>(p + i0, grad + i0, m + i0, v + i0, rounded + i0, i1 - i0, s);
  });
}

template <class T> double squares_parallel(const T* x, std::int64_t n) {
  const std::int64_t blocks = (n + kSquaresBlock - 1) / kSquaresBlock;
  std::vector<double> partial(static_cast<std::size_t>(blocks));
  parallel_for(blocks, kSquaresBlock, [&](std::int64_t b0, std::int64_t b1) {
    std::int64_t b = b0;
    for (; b + kStreams <= b1 && (b + kStreams) * kSquaresBlock <= n; b += kStreams)
      block_squares<T, kStreams>(x + b * kSquaresBlock, kSquaresBlock, &partial[static_cast<std::size_t>(b)]);
    for (; b < b1; ++b)
      block_squares<T, 1>(x + b * kSquaresBlock, std::min(kSquaresBlock, n - b * kSquaresBlock), &partial[static_cast<std::size_t>(b)]);
  });
  double total = 0;
  for (double t : partial) total += t;
  return total;
}

}  // namespace

void adam_update(float* p, const float* grad, float* m, float* v, std::int64_t n, const AdamScalars<float>& s, std::uint16_t* rounded) {
  adam_parallel(p, grad, m, v, rounded, n, s);
}
void adam_update(double* p, const double* grad, double* m, double* v, std::int64_t n, const AdamScalars<double>& s) {
  adam_parallel(p, grad, m, v, nullptr, n, s);
}
double sum_of_squares(const float* x, std::int64_t n) { return squares_parallel(x, n); }
double sum_of_squares(const double* x, std::int64_t n) { return squares_parallel(x, n); }

}  // namespace tapegrad::detail
