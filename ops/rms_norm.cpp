// rms_norm: layer_norm without the centring (Zhang & Sennrich 2019, Llama's norm); the row
// kernels and the backward op are layer_norm's with centred = false (ops/normalization.hpp).
//
// forward, per row of E elements          backward, per row
//   rstd = 1 / sqrt(mean(x^2) + eps)        dweight += g * xhat
//   xhat = x * rstd, y = xhat * weight      dx = rstd * (g * weight - xhat * mean(g * weight * xhat))
#include "tapegrad/ops/rms_norm.hpp"

#include "ops/normalization.hpp"

namespace tapegrad {

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  return detail::normalise(/*centred=*/false, x, weight, Tensor(), eps);
}

}  // namespace tapegrad
