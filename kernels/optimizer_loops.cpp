// The optimizers' loops (optimizer_loops.hpp). Built with -fno-math-errno (CMakeLists.txt): with errno to
// set, GCC keeps the square root scalar.
#include "kernels/optimizer_loops.hpp"

#include <cmath>

#include "runtime/cpu.hpp"

namespace tapegrad::detail {
namespace {

template <class T>
TAPEGRAD_CPU_CLONES void adam_run(T* __restrict p, const T* __restrict grad, T* __restrict m, T* __restrict v, std::int64_t n,
                                   const AdamScalars<T> s) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const T g = s.l2 ? grad[i] + p[i] * s.decay : grad[i];
    const T pi = s.decoupled ? p[i] * s.decay : p[i];
    m[i] = m[i] * s.beta1;
    m[i] = m[i] + s.one_minus_beta1 * g;
    v[i] = v[i] * s.beta2;
    v[i] = v[i] + s.one_minus_beta2 * g * g;
    p[i] = pi + s.step * m[i] / (std::sqrt(v[i]) / s.sqrt_bias2 + s.eps);
  }
}

template <class T> TAPEGRAD_CPU_CLONES double squares_run(const T* x, std::int64_t n) {
  double total = 0;
#pragma omp simd reduction(+ : total)
  for (std::int64_t i = 0; i < n; ++i) total += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return total;
}

}  // namespace

void adam_update(float* p, const float* grad, float* m, float* v, std::int64_t n, const AdamScalars<float>& s) {
  adam_run<float>(p, grad, m, v, n, s);
}
void adam_update(double* p, const double* grad, double* m, double* v, std::int64_t n, const AdamScalars<double>& s) {
  adam_run<double>(p, grad, m, v, n, s);
}
double sum_of_squares(const float* x, std::int64_t n) { return squares_run<float>(x, n); }
double sum_of_squares(const double* x, std::int64_t n) { return squares_run<double>(x, n); }

}  // namespace tapegrad::detail
