// layer_norm: forward and its hand-derived backward (see docs/gradients.md for the derivation).
//
// forward, per row of E elements          backward, per row (reverse order)
//   mu = mean(x), var = mean((x - mu)^2)    dbias += g,  dweight += g * xhat
//   rstd = 1 / sqrt(var + eps)              dxhat = g * weight
//   xhat = (x - mu) * rstd                  dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
//   y = xhat * weight + bias
// The node keeps x, weight and (mu, rstd) per row, and recomputes xhat in the backward.
#include "tapegrad/ops/layer_norm.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/parallel.hpp"
#include "ops/op.hpp"
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

// A contiguous [E] copy of an optional parameter, or `fallback` everywhere when it is undefined.
std::vector<double> per_column(const Tensor& t, std::int64_t e, double fallback) {
  return t.defined() ? t.to_vector<double>() : std::vector<double>(static_cast<std::size_t>(e), fallback);
}

struct Normalised {
  Tensor y;
  Tensor stats;  // float64 [rows, 2]: mu, rstd
};

// Rows [r0, r1) of the contiguous x into y, and their (mu, rstd) into stats.
template <class T>
TAPEGRAD_CPU_CLONES void normalise_rows(const T* px, T* py, const double* pw, const double* pb, double* stats, std::int64_t r0,
                                         std::int64_t r1, std::int64_t e, double eps) {
  for (std::int64_t r = r0; r < r1; ++r) {
    const T* __restrict xr = px + r * e;
    T* __restrict yr = py + r * e;
    double mu = 0, var = 0;
#pragma omp simd reduction(+ : mu)
    for (std::int64_t j = 0; j < e; ++j) mu += static_cast<double>(xr[j]);
    mu /= static_cast<double>(e);
#pragma omp simd reduction(+ : var)
    for (std::int64_t j = 0; j < e; ++j) var += (static_cast<double>(xr[j]) - mu) * (static_cast<double>(xr[j]) - mu);
    const double rstd = 1.0 / std::sqrt(var / static_cast<double>(e) + eps);
#pragma omp simd
    for (std::int64_t j = 0; j < e; ++j) yr[j] = static_cast<T>((static_cast<double>(xr[j]) - mu) * rstd * pw[j] + pb[j]);
    stats[2 * r] = mu;
    stats[2 * r + 1] = rstd;
  }
}

// Rows are read contiguously (a strided x is copied once), so every per-row loop below is a
// unit-stride loop the compiler vectorises; the sums stay in double.
Normalised layer_norm_forward(const Tensor& x_in, const Tensor& weight, const Tensor& bias, double eps) {
  const std::int64_t e = x_in.shape().back();
  const std::int64_t rows = e == 0 ? 0 : x_in.numel() / e;
  Normalised out{new_tensor(x_in.shape(), x_in.dtype()), new_tensor({rows, 2}, DType::float64)};
  if (rows == 0) return out;
  const Tensor x = x_in.is_contiguous() ? x_in : copy_of(x_in);
  const std::vector<double> w = per_column(weight, e, 1.0), b = per_column(bias, e, 0.0);
  auto* stats = static_cast<double*>(mutable_data(out.stats));
  visit_float(x.dtype(), "layer_norm", [&]<class T>(Tag<T>) {
    const T* px = static_cast<const T*>(x.raw_data());
    T* py = static_cast<T*>(mutable_data(out.y));
    const double* pw = w.data();
    const double* pb = b.data();
    parallel_for(rows, 4 * e, [&](std::int64_t r0, std::int64_t r1) { normalise_rows<T>(px, py, pw, pb, stats, r0, r1, e, eps); });
  });
  return out;
}

struct LayerNormGrads {
  Tensor dx, dweight, dbias;
};

// dweight and dbias are sums over rows: each block of kBlockRows rows sums into its own
// partial, and the partials are added in block order, so the result does not depend on how
// many threads ran the blocks.
constexpr std::int64_t kBlockRows = 32;

// dx for rows [r0, r1), and their sums of g * xhat and g added into dw and db.
template <class T>
TAPEGRAD_CPU_CLONES void backward_rows(const T* px, const T* pg, T* pd, const double* pw, const double* st, double* __restrict dw,
                                        double* __restrict db, std::int64_t r0, std::int64_t r1, std::int64_t e) {
  for (std::int64_t r = r0; r < r1; ++r) {
    const double mu = st[2 * r], rstd = st[2 * r + 1];
    const T* __restrict xr = px + r * e;
    const T* __restrict gr = pg + r * e;
    T* __restrict dr = pd + r * e;
    double mean_dxhat = 0, mean_dxhat_xhat = 0;
#pragma omp simd reduction(+ : mean_dxhat, mean_dxhat_xhat)
    for (std::int64_t j = 0; j < e; ++j) {
      const double gj = static_cast<double>(gr[j]), xhat = (static_cast<double>(xr[j]) - mu) * rstd, dxhat = gj * pw[j];
      mean_dxhat += dxhat;
      mean_dxhat_xhat += dxhat * xhat;
      dw[j] += gj * xhat;
      db[j] += gj;
    }
    mean_dxhat /= static_cast<double>(e);
    mean_dxhat_xhat /= static_cast<double>(e);
#pragma omp simd
    for (std::int64_t j = 0; j < e; ++j) {
      const double xhat = (static_cast<double>(xr[j]) - mu) * rstd;
      dr[j] = static_cast<T>(rstd * (static_cast<double>(gr[j]) * pw[j] - mean_dxhat - xhat * mean_dxhat_xhat));
    }
  }
}

LayerNormGrads layer_norm_backward(const Tensor& x_in, const Tensor& weight, const Tensor& stats, const Tensor& grad,
                                   const std::vector<bool>& needs) {
  const std::int64_t e = x_in.shape().back();
  const std::int64_t rows = e == 0 ? 0 : x_in.numel() / e;
  const auto ue = static_cast<std::size_t>(e);
  const Tensor x = x_in.is_contiguous() ? x_in : copy_of(x_in);
  const Tensor g = grad.is_contiguous() ? grad : copy_of(grad);
  const std::vector<double> w = per_column(weight, e, 1.0);
  const std::int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  std::vector<double> partial(static_cast<std::size_t>(blocks) * 2 * ue, 0.0);  // per block: dw then db
  Tensor dx = new_tensor(x.shape(), x.dtype());
  const auto* st = static_cast<const double*>(stats.raw_data());
  visit_float(x.dtype(), "layer_norm", [&]<class T>(Tag<T>) {
    const T* px = static_cast<const T*>(x.raw_data());
    const T* pg = static_cast<const T*>(g.raw_data());
    T* pd = static_cast<T*>(mutable_data(dx));
    const double* pw = w.data();
    parallel_for(blocks, kBlockRows * 8 * e, [&](std::int64_t b0, std::int64_t b1) {
      for (std::int64_t blk = b0; blk < b1; ++blk) {
        double* dw = partial.data() + static_cast<std::size_t>(blk) * 2 * ue;
        backward_rows<T>(px, pg, pd, pw, st, dw, dw + ue, blk * kBlockRows, std::min(rows, (blk + 1) * kBlockRows), e);
      }
    });
  });
  std::vector<double> dw(ue, 0.0), db(ue, 0.0);
  for (std::int64_t blk = 0; blk < blocks; ++blk)
    for (std::size_t j = 0; j < ue; ++j) {
      dw[j] += partial[static_cast<std::size_t>(blk) * 2 * ue + j];
      db[j] += partial[static_cast<std::size_t>(blk) * 2 * ue + ue + j];
    }
  auto column = [&](const std::vector<double>& v) { return from_vector(std::span<const double>(v), {e}).to(x.dtype()); };
  return {needs[0] ? dx : Tensor(), needs[1] ? column(dw) : Tensor(), needs[2] ? column(db) : Tensor()};
}

// The same formula in recorded ops, for a create_graph pass, with mu and rstd computed again
// from x: `stats` has no history, and the second derivative must see them move with x.
LayerNormGrads recorded_backward(const Tensor& x, const Tensor& weight, double eps, const Tensor& g,
                                 const std::vector<bool>& needs) {
  const Shape columns{x.shape().back()};
  const Tensor centred = sub(x, mean(x, {-1}, /*keepdim=*/true));
  const Tensor rstd = 1.0 / sqrt(add(mean(mul(centred, centred), {-1}, /*keepdim=*/true), eps));
  const Tensor xhat = mul(centred, rstd);
  LayerNormGrads d;
  if (needs[0]) {
    const Tensor dxhat = weight.defined() ? mul(g, weight) : g;
    const Tensor mean_dxhat = mean(dxhat, {-1}, /*keepdim=*/true);
    const Tensor mean_dxhat_xhat = mean(mul(dxhat, xhat), {-1}, /*keepdim=*/true);
    d.dx = mul(rstd, sub(sub(dxhat, mean_dxhat), mul(xhat, mean_dxhat_xhat)));
  }
  if (needs[1]) d.dweight = sum_to(mul(g, xhat), columns);
  if (needs[2]) d.dbias = sum_to(g, columns);
  return d;
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_layer_norm_args(x, weight, bias, eps);
  Normalised n = layer_norm_forward(x, weight, bias, eps);
  // dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dweight = sum_rows g xhat, dbias = sum_rows g
  record("layer_norm", {x, weight, bias}, n.y, {x, weight, n.stats},
         [x, weight, stats = n.stats, eps](std::span<const Tensor> g, const std::vector<bool>& needs) {
           const LayerNormGrads d = creating_graph() ? recorded_backward(x, weight, eps, g[0], needs)
                                                     : layer_norm_backward(x, weight, stats, g[0], needs);
           return std::vector<Tensor>{d.dx, d.dweight, d.dbias};
         });
  return n.y;
}

}  // namespace tapegrad
