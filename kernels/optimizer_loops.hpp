// Internal: the optimizers' loops over contiguous arrays, one version per vector width.
#pragma once

#include <cstdint>

namespace tapegrad::detail {

// The scalars of one Adam update, as the element type computes with them.
template <class T> struct AdamScalars {
  T decay, beta1, one_minus_beta1, beta2, one_minus_beta2, sqrt_bias2, eps, step, grad_scale;
  // Weight decay on p (AdamW) or on the gradient (Adam), each only when nonzero; scaled:
  // grad_scale != 1.
  bool decoupled, l2, scaled;
};

// On tapegrad's threads; the results do not depend on their number. Per element, in this order:
// g = grad (* grad_scale when scaled) (+ decay p when l2); p * decay when decoupled; m = m b1
// then + (1 - b1) g; v = v b2 then + (1 - b2) g g; p + step m / (sqrt(v) / sqrt_bias2 + eps).
// With `rounded`, the new p's bfloat16 bits go there too (a weight's kept copy: rounded_copy.hpp).
void adam_update(float* p, const float* grad, float* m, float* v, std::int64_t n, const AdamScalars<float>& s,
                 std::uint16_t* rounded = nullptr);
void adam_update(double* p, const double* grad, double* m, double* v, std::int64_t n, const AdamScalars<double>& s);

// The sum of the squares of n elements, in double, summed in blocks of 2^16 added in order.
double sum_of_squares(const float* x, std::int64_t n);
double sum_of_squares(const double* x, std::int64_t n);

}  // namespace tapegrad::detail
