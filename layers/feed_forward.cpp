// Dropout and the feed-forward network: linear, GELU (or ReLU), linear, dropout. Their backward
// passes are those of the ops they use, except the GELU's (below).
#include "tapegrad/layers/feed_forward.hpp"

#include <cmath>

#include "runtime/parallel.hpp"
#include "layers/layer_support.hpp"
#include "kernels/gelu_f32.hpp"
#include "ops/op.hpp"
#include "tapegrad/ops/dropout.hpp"
#include "tapegrad/ops/elementwise.hpp"

namespace tapegrad {
namespace {

// Validates the config and returns the hidden width (0 means 4 * dim).
std::int64_t hidden_of(const FeedForwardConfig& c) {
  detail::check_field("FeedForward", "dim", c.dim);
  detail::check_field("FeedForward", "hidden", c.hidden, 0);
  detail::check_float_dtype("FeedForward", c.dtype);
  if (c.hidden == 0 && c.dim > INT64_MAX / 4)
    detail::fail<ValueError>("FeedForward: the default hidden width 4 * config.dim = 4 * {} overflows; give config.hidden", c.dim);
  return c.hidden == 0 ? 4 * c.dim : c.hidden;
}

// y = x Phi(x) and its slope y' = Phi(x) + x phi(x) (Phi, phi: the standard normal cdf and
// density), with the formulas of the gelu op.
template <class T> void gelu_and_slope(const T* __restrict x, T* __restrict y, T* __restrict slope, std::int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    detail::gelu_slope_f32(x, y, slope, n);
  } else {
    for (std::int64_t i = 0; i < n; ++i) {
      const T cdf = detail::normal_cdf(x[i]);
      y[i] = x[i] * cdf;
      slope[i] = cdf + x[i] * detail::normal_pdf(x[i]);
    }
  }
}

// gelu(h) for the hidden layer. The forward has Phi and phi at hand (one exponential makes
// both), so the node keeps the slope instead of h and its backward is dh = g y', one multiply,
// where the gelu op's recomputes both. It keeps as much memory (one tensor of h's size).
Tensor gelu_keeping_slope(const Tensor& h_in) {
  if (!should_record({&h_in, 1})) return gelu(h_in);
  const Tensor h = h_in.is_contiguous() ? h_in : detail::copy_of(h_in);
  Tensor y = detail::new_tensor(h.shape(), h.dtype()), slope = detail::new_tensor(h.shape(), h.dtype());
  detail::visit_float(h.dtype(), "gelu", [&]<class T>(detail::Tag<T>) {
    const T* px = static_cast<const T*>(h.raw_data());
    T* py = static_cast<T*>(detail::mutable_data(y));
    T* ps = static_cast<T*>(detail::mutable_data(slope));
    detail::parallel_for(h.numel(), 10, [&](std::int64_t i0, std::int64_t i1) { gelu_and_slope<T>(px + i0, py + i0, ps + i0, i1 - i0); });
  });
  // dh = g (Phi(h) + h phi(h))
  detail::record("gelu", {h_in}, y, {slope}, [slope](std::span<const Tensor> g, const std::vector<bool>&) {
    return std::vector<Tensor>{g[0] * slope};
  });
  return y;
}

}  // namespace

Dropout::Dropout(double p, std::uint64_t seed) : p_(p), gen_(seed) {
  if (!(p >= 0 && p < 1)) detail::fail<ValueError>("Dropout: p must be in [0, 1), got {}", p);
}

Tensor Dropout::forward(const Tensor& x) const { return dropout(x, p_, gen_, is_training()); }

FeedForward::FeedForward(const FeedForwardConfig& c)
    : up({.in = c.dim, .out = hidden_of(c), .bias = c.bias, .dtype = c.dtype, .seed = detail::child_seed(c.seed, 0)}),
      down({.in = up.config().out, .out = c.dim, .bias = c.bias, .dtype = c.dtype, .seed = detail::child_seed(c.seed, 1)}),
      drop(c.dropout, detail::child_seed(c.seed, 2)),
      activation_(c.activation) {}

Tensor FeedForward::forward(const Tensor& x) const {
  const Tensor h = up.forward(x);
  return drop.forward(down.forward(activation_ == Activation::gelu ? gelu_keeping_slope(h) : relu(h)));
}

void FeedForward::visit(ModuleVisitor& v) {
  v.module("up", up);
  v.module("down", down);
  v.module("drop", drop);
}

}  // namespace tapegrad
