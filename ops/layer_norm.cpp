// layer_norm and rms_norm: forward and their hand-derived backward (see docs/gradients.md for the
// derivation). rms_norm is layer_norm without the centring and the bias (Zhang & Sennrich 2019,
// Llama's norm): mu = 0, on the same row kernels and backward op, with centred = false.
//
// forward, per row of E elements          backward, per row (reverse order)
//   mu = mean(x), var = mean((x - mu)^2)    dbias += g,  dweight += g * xhat
//   rstd = 1 / sqrt(var + eps)              dxhat = g * weight
//   xhat = (x - mu) * rstd                  dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
//   y = xhat * weight + bias
// The node keeps x, weight and (mu, rstd) per row, and recomputes xhat in the backward (the row
// loops: kernels/layer_norm.cpp).
#include "tapegrad/ops/layer_norm.hpp"
#include "tapegrad/ops/rms_norm.hpp"

#include <cmath>
#include <vector>

#include "ops/op.hpp"
#include "kernels/layer_norm.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/reduction.hpp"
#include "tapegrad/ops/view.hpp"

namespace tapegrad {
namespace {
using namespace detail;

void check_norm_args(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_floating(op, "x", x);
  if (x.dim() < 1)
    fail<ShapeError>("{}: argument 'x' must have rank >= 1 (it normalises the last dim), got shape {}", op, shape_str(x.shape()));
  const Shape want{x.shape().back()};
  for (auto [name, t] : {std::pair{"weight", weight}, {"bias", bias}}) {
    if (!t.defined()) continue;
    check_same_float(op, "x", x, name, t);
    if (t.shape() != want)
      fail<ShapeError>("{}: argument '{}' with shape {} must have shape {}, the last dim of 'x' (shape {})", op, name,
                       shape_str(t.shape()), shape_str(want), shape_str(x.shape()));
  }
  if (!(std::isfinite(eps) && eps >= 0)) fail<ValueError>("{}: argument 'eps' must be finite and >= 0, got {}", op, eps);
}

// r = 1 / sqrt(mean(c^2) + eps), c = x - mean(x) (centred) or x, xhat = c r, h = g w (g without a
// weight), and J v = r (v - [mean(v)] - xhat mean(v xhat)) per row (J = dxhat/dx, symmetric), so
// dx = J h. For the upstream U, V, Z of dx, dweight, dbias (derived in docs/gradients.md):
//   dg  = Z + V xhat + w J U
//   dw  = sum over the rows of g J U
//   dx' = J (V g) - r (mean(U dx) xhat + mean(h xhat) J U + mean(U xhat) dx)
std::vector<Tensor> normalised_backward_grads(const Tensor& x, const Tensor& weight, const Tensor& g, double eps, bool centred,
                                              std::span<const Tensor> u, const std::vector<bool>& needs) {
  auto row_mean = [](const Tensor& t) { return mean(t, {-1}, /*keepdim=*/true); };
  const Tensor c = centred ? sub(x, row_mean(x)) : x;
  const Tensor r = 1.0 / sqrt(add(row_mean(mul(c, c)), eps));
  const Tensor xhat = mul(c, r);
  auto jacobian = [&](const Tensor& v) { return mul(r, sub(centred ? sub(v, row_mean(v)) : v, mul(xhat, row_mean(mul(v, xhat))))); };
  auto plus = [](const Tensor& a, const Tensor& b) { return a.defined() ? add(a, b) : b; };
  const Tensor& du = u[0];
  const Tensor& dv = u[1];
  const Tensor& dz = u[2];
  const Tensor h = weight.defined() ? mul(g, weight) : g;
  const Tensor ju = du.defined() ? jacobian(du) : Tensor();
  std::vector<Tensor> grads(3);
  if (needs[0]) {
    if (dv.defined()) grads[0] = jacobian(mul(dv, g));
    if (ju.defined()) {
      const Tensor dx = jacobian(h);
      const Tensor terms = add(add(mul(row_mean(mul(du, dx)), xhat), mul(row_mean(mul(h, xhat)), ju)), mul(row_mean(mul(du, xhat)), dx));
      grads[0] = plus(grads[0], neg(mul(r, terms)));
    }
  }
  if (needs[1] && ju.defined()) grads[1] = sum_to(mul(g, ju), {x.shape().back()});
  if (needs[2]) {
    if (dz.defined()) grads[2] = expand(dz, g.shape());
    if (dv.defined()) grads[2] = plus(grads[2], mul(dv, xhat));
    if (ju.defined()) grads[2] = plus(grads[2], weight.defined() ? mul(ju, weight) : ju);
  }
  return grads;
}

// The backward as an op of x, the weight and g, with three outputs: dx, dweight and dbias (the
// row kernel, from the forward's stats); its own gradients are normalised_backward_grads'.
// `wanted` says which of dweight and dbias (entries 1 and 2) a first-order pass makes.
std::vector<Tensor> normalised_backward(bool centred, const Tensor& x, const Tensor& weight, const Tensor& g,
                                        const Tensor& stats, double eps, const std::vector<bool>& wanted) {
  const LayerNormGrads d = layer_norm_rows_backward(x, weight, stats, g, centred);
  const Shape columns{x.shape().back()};
  auto column = [&](const std::vector<double>& v) { return from_vector(std::span<const double>(v), columns).to(x.dtype()); };
  // A first-order pass makes only the outputs it wants, and record() would return at once; a
  // recorded op has all three.
  const bool all = is_grad_enabled();
  std::vector<Tensor> out{d.dx, all || wanted[1] ? column(d.dweight) : Tensor(),
                          all || wanted[2] ? column(d.dbias) : Tensor()};
  if (!all) return out;
  const Tensor inputs[] = {x, weight, g};
  record(centred ? "layer_norm_backward" : "rms_norm_backward", inputs, out, {x, weight, g},
         [x, weight, g, eps, centred](std::span<const Tensor> u, const std::vector<bool>& needs) {
           return normalised_backward_grads(x, weight, g, eps, centred, u, needs);
         });
  return out;
}

// layer_norm (centred) or rms_norm (not, and without bias: its node keeps an undefined third input,
// so both backwards index x, weight, bias alike), checked, computed and recorded.
Tensor normalise(bool centred, const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const char* op = centred ? "layer_norm" : "rms_norm";
  check_norm_args(op, x, weight, bias, eps);
  Normalised n = layer_norm_rows_forward(x, weight, bias, eps, centred);
  // dx = rstd (dxhat - [mean(dxhat)] - xhat mean(dxhat xhat)), dweight = sum_rows g xhat, dbias =
  // sum_rows g: the op layer_norm_backward or rms_norm_backward, one formula to every order
  record(op, {x, weight, bias}, n.y, {x, weight, n.stats},
         [x, weight, stats = n.stats, eps, centred](std::span<const Tensor> g, const std::vector<bool>& needs) {
           std::vector<Tensor> d = normalised_backward(centred, x, weight, g[0], stats, eps, needs);
           for (std::size_t k = 0; k < d.size(); ++k)
             if (!needs[k]) d[k] = Tensor();
           return d;
         });
  return n.y;
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  return normalise(/*centred=*/true, x, weight, bias, eps);
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  return normalise(/*centred=*/false, x, weight, Tensor(), eps);
}

}  // namespace tapegrad
