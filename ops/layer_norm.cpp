// layer_norm: forward and its hand-derived backward (see docs/gradients.md for the derivation).
//
// forward, per row of E elements          backward, per row (reverse order)
//   mu = mean(x), var = mean((x - mu)^2)    dbias += g,  dweight += g * xhat
//   rstd = 1 / sqrt(var + eps)              dxhat = g * weight
//   xhat = (x - mu) * rstd                  dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
//   y = xhat * weight + bias
// The node keeps x, weight and (mu, rstd) per row, and recomputes xhat in the backward.
#include "tapegrad/ops/layer_norm.hpp"

#include <cmath>

#include "ops/kernel.hpp"
#include "ops/softmax_kernels.hpp"

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

// A contiguous [E] copy of an optional parameter, or `fallback` everywhere when it is undefined.
std::vector<double> per_column(const Tensor& t, std::int64_t e, double fallback) {
  return t.defined() ? t.to_vector<double>() : std::vector<double>(static_cast<std::size_t>(e), fallback);
}

struct Normalised {
  Tensor y;
  Tensor stats;  // float64 [rows, 2]: mu, rstd
};

Normalised layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const std::int64_t e = x.shape().back();
  const std::int64_t rows = e == 0 ? 0 : x.numel() / e;
  Normalised out{new_tensor(x.shape(), x.dtype()), new_tensor({rows, 2}, DType::float64)};
  const std::vector<double> w = per_column(weight, e, 1.0), b = per_column(bias, e, 0.0);
  auto* stats = static_cast<double*>(mutable_data(out.stats));
  visit_float(x.dtype(), "layer_norm", [&]<class T>(Tag<T>) {
    T* py = static_cast<T*>(mutable_data(out.y));
    for_each_row<T>(x, Tensor(), [&](std::int64_t r, const T* xr, std::int64_t xs, const bool*, std::int64_t) {
      if (e == 0) return;
      double mu = 0, var = 0;
      for (std::int64_t j = 0; j < e; ++j) mu += static_cast<double>(xr[j * xs]);
      mu /= static_cast<double>(e);
      for (std::int64_t j = 0; j < e; ++j) var += (static_cast<double>(xr[j * xs]) - mu) * (static_cast<double>(xr[j * xs]) - mu);
      const double rstd = 1.0 / std::sqrt(var / static_cast<double>(e) + eps);
      for (std::int64_t j = 0; j < e; ++j)
        py[r * e + j] = convert<T>((static_cast<double>(xr[j * xs]) - mu) * rstd * w[static_cast<std::size_t>(j)] + b[static_cast<std::size_t>(j)]);
      stats[2 * r] = mu;
      stats[2 * r + 1] = rstd;
    });
  });
  return out;
}

struct LayerNormGrads {
  Tensor dx, dweight, dbias;
};

LayerNormGrads layer_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& stats, const Tensor& grad,
                                   const std::vector<bool>& needs) {
  const std::int64_t e = x.shape().back();
  const Tensor g = grad.is_contiguous() ? grad : copy_of(grad);
  const std::vector<double> w = per_column(weight, e, 1.0);
  std::vector<double> dw(static_cast<std::size_t>(e), 0.0), db(static_cast<std::size_t>(e), 0.0);
  Tensor dx = new_tensor(x.shape(), x.dtype());
  const auto* st = static_cast<const double*>(stats.raw_data());
  visit_float(x.dtype(), "layer_norm", [&]<class T>(Tag<T>) {
    const T* pg = static_cast<const T*>(g.raw_data());
    T* pd = static_cast<T*>(mutable_data(dx));
    for_each_row<T>(x, Tensor(), [&](std::int64_t r, const T* xr, std::int64_t xs, const bool*, std::int64_t) {
      if (e == 0) return;
      const double mu = st[2 * r], rstd = st[2 * r + 1];
      const T* gr = pg + r * e;
      auto xhat = [&](std::int64_t j) { return (static_cast<double>(xr[j * xs]) - mu) * rstd; };
      double mean_dxhat = 0, mean_dxhat_xhat = 0;
      for (std::int64_t j = 0; j < e; ++j) {
        const auto k = static_cast<std::size_t>(j);
        const double gj = static_cast<double>(gr[j]), dxhat = gj * w[k];
        mean_dxhat += dxhat;
        mean_dxhat_xhat += dxhat * xhat(j);
        dw[k] += gj * xhat(j);
        db[k] += gj;
      }
      mean_dxhat /= static_cast<double>(e);
      mean_dxhat_xhat /= static_cast<double>(e);
      for (std::int64_t j = 0; j < e; ++j) {
        const double dxhat = static_cast<double>(gr[j]) * w[static_cast<std::size_t>(j)];
        pd[r * e + j] = convert<T>(rstd * (dxhat - mean_dxhat - xhat(j) * mean_dxhat_xhat));
      }
    });
  });
  auto column = [&](const std::vector<double>& v) { return from_vector(std::span<const double>(v), {e}).to(x.dtype()); };
  return {needs[0] ? dx : Tensor(), needs[1] ? column(dw) : Tensor(), needs[2] ? column(db) : Tensor()};
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_layer_norm_args(x, weight, bias, eps);
  Normalised n = layer_norm_forward(x, weight, bias, eps);
  // dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dweight = sum_rows g xhat, dbias = sum_rows g
  record("layer_norm", {x, weight, bias}, n.y, {x, weight, n.stats},
         [x, weight, stats = n.stats](std::span<const Tensor> g, const std::vector<bool>& needs) {
           const LayerNormGrads d = layer_norm_backward(x, weight, stats, g[0], needs);
           return std::vector<Tensor>{d.dx, d.dweight, d.dbias};
         });
  return n.y;
}

}  // namespace tapegrad
