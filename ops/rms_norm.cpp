// rms_norm: layer_norm without the centring (Zhang & Sennrich 2019, Llama's norm); the row
// kernels and the backward op are layer_norm's with centred = false (ops/normalization.hpp).
//
// forward, per row of E elements          backward, per row
//   rstd = 1 / sqrt(mean(x^2) + eps)        dweight += g * xhat
//   xhat = x * rstd, y = xhat * weight      dx = rstd * (g * weight - xhat * mean(g * weight * xhat))
#include "tapegrad/ops/rms_norm.hpp"

#include "kernels/layer_norm.hpp"
#include "ops/normalization.hpp"
#include "ops/op.hpp"

namespace tapegrad {
using namespace detail;

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  check_norm_args("rms_norm", x, weight, Tensor(), eps);
  Normalised n = layer_norm_rows_forward(x, weight, Tensor(), eps, /*centred=*/false);
  // dx = rstd (dxhat - xhat mean(dxhat xhat)), dweight = sum_rows g xhat: the op rms_norm_backward,
  // one formula to every order
  record("rms_norm", {x, weight}, n.y, {x, weight, n.stats},
         [x, weight, stats = n.stats, eps](std::span<const Tensor> g, const std::vector<bool>& needs) {
           std::vector<Tensor> d = normalised_backward("rms_norm_backward", /*centred=*/false, x, weight, g[0], stats, eps, needs);
           d.resize(2);
           if (!needs[1]) d[1] = Tensor();
           return d;
         });
  return n.y;
}

}  // namespace tapegrad
