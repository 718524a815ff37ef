// RMSNorm: the layer owns its weight; the normalisation and its backward are rms_norm()'s.
#include "tapegrad/layers/rms_norm.hpp"

#include "layers/layer_support.hpp"
#include "tapegrad/ops/rms_norm.hpp"

namespace tapegrad {

RMSNorm::RMSNorm(const RMSNormConfig& config) : config_(config) {
  detail::check_norm_config("RMSNorm", config.dim, config.eps, config.dtype);
  if (config.affine) weight = ones({config.dim}, config.dtype).set_requires_grad();
}

Tensor RMSNorm::forward(const Tensor& x) const {
  detail::check_layer_input("RMSNorm::forward", x, "dim", config_.dim, config_.dtype);
  return rms_norm(x, weight, config_.eps);
}

void RMSNorm::visit(ModuleVisitor& v) {
  if (config_.affine) v.parameter("weight", weight);
}

}  // namespace tapegrad
