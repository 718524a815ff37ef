// The norm a transformer block or decoder is configured with: LayerNorm (GPT) or RMSNorm (Llama).
#pragma once

#include <cstdint>
#include <variant>

#include "tapegrad/layers/layer_norm.hpp"
#include "tapegrad/layers/module.hpp"
#include "tapegrad/layers/rms_norm.hpp"

namespace tapegrad {

enum class NormKind { layer, rms };

class Norm : public Module {
 public:
  // Either norm over [..., dim] with its default eps, weight 1 (and LayerNorm's bias 0).
  Norm(NormKind kind, std::int64_t dim, DType dtype);
  Tensor forward(const Tensor& x) const;
  // The chosen norm's parameters under this module's own name ("ln1.weight", "ln1.bias").
  void visit(ModuleVisitor& v) override;
  std::variant<LayerNorm, RMSNorm> norm;
};

}  // namespace tapegrad
