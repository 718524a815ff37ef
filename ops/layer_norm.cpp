// layer_norm: forward and its hand-derived backward (see docs/gradients.md for the derivation).
//
// forward, per row of E elements          backward, per row (reverse order)
//   mu = mean(x), var = mean((x - mu)^2)    dbias += g,  dweight += g * xhat
//   rstd = 1 / sqrt(var + eps)              dxhat = g * weight
//   xhat = (x - mu) * rstd                  dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
//   y = xhat * weight + bias
// The node keeps x, weight and (mu, rstd) per row, and recomputes xhat in the backward (the row
// loops: kernels/layer_norm.cpp).
#include "tapegrad/ops/layer_norm.hpp"

#include <cmath>
#include <vector>

#include "ops/op.hpp"
#include "kernels/layer_norm.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/reduction.hpp"

namespace tapegrad {
namespace {
using namespace detail;

void check_layer_norm_args(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_floating("layer_norm", "x", x);
  if (x.dim() < 1)
    fail<ShapeError>("layer_norm: argument 'x' must have rank >= 1 (it normalises the last dim), got shape {}",
                     shape_str(x.shape()));
  const Shape want{x.shape().back()};
  for (auto [name, t] : {std::pair{"weight", weight}, {"bias", bias}}) {
    if (!t.defined()) continue;
    check_same_float("layer_norm", "x", x, name, t);
    if (t.shape() != want)
      fail<ShapeError>("layer_norm: argument '{}' with shape {} must have shape {}, the last dim of 'x' (shape {})", name,
                       shape_str(t.shape()), shape_str(want), shape_str(x.shape()));
  }
  if (!(std::isfinite(eps) && eps >= 0))
    fail<ValueError>("layer_norm: argument 'eps' must be finite and >= 0, got {}", eps);
}

// The same formula in recorded ops, for a create_graph pass, with mu and rstd computed again
// from x: `stats` has no history, and the second derivative must see them move with x.
std::vector<Tensor> recorded_backward(const Tensor& x, const Tensor& weight, double eps, const Tensor& g,
                                      const std::vector<bool>& needs) {
  const Shape columns{x.shape().back()};
  const Tensor centred = sub(x, mean(x, {-1}, /*keepdim=*/true));
  const Tensor rstd = 1.0 / sqrt(add(mean(mul(centred, centred), {-1}, /*keepdim=*/true), eps));
  const Tensor xhat = mul(centred, rstd);
  std::vector<Tensor> d(3);
  if (needs[0]) {
    const Tensor dxhat = weight.defined() ? mul(g, weight) : g;
    const Tensor mean_dxhat = mean(dxhat, {-1}, /*keepdim=*/true);
    const Tensor mean_dxhat_xhat = mean(mul(dxhat, xhat), {-1}, /*keepdim=*/true);
    d[0] = mul(rstd, sub(sub(dxhat, mean_dxhat), mul(xhat, mean_dxhat_xhat)));
  }
  if (needs[1]) d[1] = sum_to(mul(g, xhat), columns);
  if (needs[2]) d[2] = sum_to(g, columns);
  return d;
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_layer_norm_args(x, weight, bias, eps);
  Normalised n = layer_norm_forward(x, weight, bias, eps);
  // dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dweight = sum_rows g xhat, dbias = sum_rows g
  record("layer_norm", {x, weight, bias}, n.y, {x, weight, n.stats},
         [x, weight, stats = n.stats, eps](std::span<const Tensor> g, const std::vector<bool>& needs) {
           if (creating_graph()) return recorded_backward(x, weight, eps, g[0], needs);
           const LayerNormGrads d = layer_norm_backward(x, weight, stats, g[0]);
           auto column = [&](const std::vector<double>& v) {
             return from_vector(std::span<const double>(v), {x.shape().back()}).to(x.dtype());
           };
           return std::vector<Tensor>{needs[0] ? d.dx : Tensor(), needs[1] ? column(d.dweight) : Tensor(),
                                      needs[2] ? column(d.dbias) : Tensor()};
         });
  return n.y;
}

}  // namespace tapegrad
