// LayerNorm: the layer owns weight and bias; the normalisation and its backward are
// layer_norm()'s.
#include "tapegrad/layers/layer_norm.hpp"

#include "layers/layer_support.hpp"
#include "tapegrad/ops/layer_norm.hpp"

namespace tapegrad {

LayerNorm::LayerNorm(const LayerNormConfig& config) : config_(config) {
  detail::check_norm_config("LayerNorm", config.dim, config.eps, config.dtype);
  if (config.affine) {
    weight = ones({config.dim}, config.dtype).set_requires_grad();
    bias = zeros({config.dim}, config.dtype).set_requires_grad();
  }
}

Tensor LayerNorm::forward(const Tensor& x) const {
  detail::check_layer_input("LayerNorm::forward", x, "dim", config_.dim, config_.dtype);
  return layer_norm(x, weight, bias, config_.eps);
}

void LayerNorm::visit(ModuleVisitor& v) {
  if (!config_.affine) return;
  v.parameter("weight", weight);
  v.parameter("bias", bias);
}

}  // namespace tapegrad
