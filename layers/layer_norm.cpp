// LayerNorm: the layer owns weight and bias; the normalisation and its backward are
// layer_norm()'s.
#include "tapegrad/layers/layer_norm.hpp"

#include <cmath>

#include "layers/layer_support.hpp"
#include "tapegrad/ops/layer_norm.hpp"

namespace tapegrad {

LayerNorm::LayerNorm(const LayerNormConfig& config) : config_(config) {
  detail::check_field("LayerNorm", "dim", config.dim);
  detail::check_float_dtype("LayerNorm", config.dtype);
  if (!(config.eps > 0) || !std::isfinite(config.eps))
    detail::fail<ValueError>("LayerNorm: config.eps must be finite and > 0, got {}", config.eps);
  if (config.affine) {
    weight = ones({config.dim}, config.dtype).set_requires_grad();
    bias = zeros({config.dim}, config.dtype).set_requires_grad();
  }
}

Tensor LayerNorm::forward(const Tensor& x) const {
  detail::check_floating("LayerNorm::forward", "x", x);
  if (x.dim() < 1 || x.size(-1) != config_.dim)
    detail::fail<ShapeError>("LayerNorm::forward: argument 'x' must be [..., {}] (config.dim), got shape {}", config_.dim,
                             detail::shape_str(x.shape()));
  if (x.dtype() != config_.dtype)
    detail::fail<DTypeError>("LayerNorm::forward: argument 'x' ({}) is {} but the layer is {} (config.dtype)",
                             detail::shape_str(x.shape()), x.dtype(), config_.dtype);
  return layer_norm(x, weight, bias, config_.eps);
}

void LayerNorm::visit(ModuleVisitor& v) {
  if (!config_.affine) return;
  v.parameter("weight", weight);
  v.parameter("bias", bias);
}

}  // namespace tapegrad
