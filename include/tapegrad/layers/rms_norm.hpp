// RMSNorm over the last dim: y = x / sqrt(mean(x^2) + eps) * weight (Llama's norm: no centring,
// no bias). The hand-derived backward is rms_norm()'s (ops/rms_norm.hpp).
#pragma once

#include <cstdint>

#include "tapegrad/layers/module.hpp"

namespace tapegrad {

struct RMSNormConfig {
  std::int64_t dim = 0;  // required, >= 1
  double eps = 1e-5;     // > 0
  bool affine = true;    // learn weight (starts at 1)
  DType dtype = float32;
};

class RMSNorm : public Module {
 public:
  explicit RMSNorm(const RMSNormConfig& config);
  Tensor forward(const Tensor& x) const;  // x [..., dim]
  void visit(ModuleVisitor& v) override;
  Tensor weight;  // [dim]; undefined when !affine

 private:
  RMSNormConfig config_;
};

}  // namespace tapegrad
