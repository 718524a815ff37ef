// LayerNorm over the last dim: y = (x - mean) / sqrt(var + eps) * weight + bias, with the
// biased variance (as PyTorch). The hand-derived backward is layer_norm()'s (ops/layer_norm.hpp).
#pragma once

#include <cstdint>

#include "tapegrad/layers/module.hpp"

namespace tapegrad {

struct LayerNormConfig {
  std::int64_t dim = 0;  // required, >= 1
  double eps = 1e-5;     // > 0
  bool affine = true;    // learn weight (starts at 1) and bias (starts at 0)
  DType dtype = float32;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(const LayerNormConfig& config);
  Tensor forward(const Tensor& x) const;  // x [..., dim]
  void visit(ModuleVisitor& v) override;
  Tensor weight, bias;  // [dim] each; undefined when !affine

 private:
  LayerNormConfig config_;
};

}  // namespace tapegrad
