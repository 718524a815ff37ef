// layer_norm's and rms_norm's rows, forward and backward, on the threads (formulas in
// ops/layer_norm.cpp, which holds rms_norm too). rms_norm is the uncentred case: mu = 0.
#include "kernels/layer_norm.hpp"

#include <algorithm>
#include <cmath>

#include "runtime/cpu.hpp"
#include "runtime/parallel.hpp"
#include "autodiff/loops.hpp"

namespace tapegrad::detail {
namespace {

// A contiguous [E] copy of an optional parameter, or `fallback` everywhere when it is undefined.
std::vector<double> per_column(const Tensor& t, std::int64_t e, double fallback) {
  return t.defined() ? t.to_vector<double>() : std::vector<double>(static_cast<std::size_t>(e), fallback);
}

// Rows [r0, r1) of the contiguous x into y, and their (mu, rstd) into stats.
template <class T>
TAPEGRAD_CPU_CLONES void normalise_rows(const T* px, T* py, const double* pw, const double* pb, double* stats, std::int64_t r0,
                                         std::int64_t r1, std::int64_t e, double eps, bool centred) {
  for (std::int64_t r = r0; r < r1; ++r) {
    const T* __restrict xr = px + r * e;
    T* __restrict yr = py + r * e;
    double mu = 0, var = 0;
    if (centred) {
#pragma omp simd reduction(+ : mu)
      for (std::int64_t j = 0; j < e; ++j) mu += static_cast<double>(xr[j]);
      mu /= static_cast<double>(e);
    }
#pragma omp simd reduction(+ : var)
    for (std::int64_t j = 0; j < e; ++j) var += (static_cast<double>(xr[j]) - mu) * (static_cast<double>(xr[j]) - mu);
    const double rstd = 1.0 / std::sqrt(var / static_cast<double>(e) + eps);
#pragma omp simd
    for (std::int64_t j = 0; j < e; ++j) yr[j] = static_cast<T>((static_cast<double>(xr[j]) - mu) * rstd * pw[j] + pb[j]);
    stats[2 * r] = mu;
    stats[2 * r + 1] = rstd;
  }
}

// dweight and dbias are sums over rows: each block of kBlockRows rows sums into its own
// partial, and the partials are added in block order, so the result does not depend on how
// many threads ran the blocks.
constexpr std::int64_t kBlockRows = 32;

// dx for rows [r0, r1), and their sums of g * xhat and g added into dw and db.
template <class T>
TAPEGRAD_CPU_CLONES void backward_rows(const T* px, const T* pg, T* pd, const double* pw, const double* st, double* __restrict dw,
                                        double* __restrict db, std::int64_t r0, std::int64_t r1, std::int64_t e, bool centred) {
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
    mean_dxhat = centred ? mean_dxhat / static_cast<double>(e) : 0.0;
    mean_dxhat_xhat /= static_cast<double>(e);
#pragma omp simd
    for (std::int64_t j = 0; j < e; ++j) {
      const double xhat = (static_cast<double>(xr[j]) - mu) * rstd;
      dr[j] = static_cast<T>(rstd * (static_cast<double>(gr[j]) * pw[j] - mean_dxhat - xhat * mean_dxhat_xhat));
    }
  }
}

}  // namespace

// Rows are read contiguously (a strided x is copied once), so every per-row loop below is a
// unit-stride loop the compiler vectorises; the sums stay in double.
Normalised layer_norm_rows_forward(const Tensor& x_in, const Tensor& weight, const Tensor& bias, double eps, bool centred) {
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
    parallel_for(rows, 4 * e, [&](std::int64_t r0, std::int64_t r1) { normalise_rows<T>(px, py, pw, pb, stats, r0, r1, e, eps, centred); });
  });
  return out;
}

LayerNormGrads layer_norm_rows_backward(const Tensor& x_in, const Tensor& weight, const Tensor& stats, const Tensor& grad, bool centred) {
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
        backward_rows<T>(px, pg, pd, pw, st, dw, dw + ue, blk * kBlockRows, std::min(rows, (blk + 1) * kBlockRows), e, centred);
      }
    });
  });
  std::vector<double> dw(ue, 0.0), db(ue, 0.0);
  for (std::int64_t blk = 0; blk < blocks; ++blk)
    for (std::size_t j = 0; j < ue; ++j) {
      dw[j] += partial[static_cast<std::size_t>(blk) * 2 * ue + j];
      db[j] += partial[static_cast<std::size_t>(blk) * 2 * ue + ue + j];
    }
  return {dx, std::move(dw), std::move(db)};
}

}  // namespace tapegrad::detail
