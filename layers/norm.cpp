// Norm: one of two norm layers, chosen by a config; forward and parameters are the chosen one's.
#include "tapegrad/layers/norm.hpp"

#include "layers/layer_support.hpp"

namespace tapegrad {
namespace {

std::variant<LayerNorm, RMSNorm> make_norm(NormKind kind, std::int64_t dim, DType dtype) {
  detail::check_norm_kind("Norm", "argument 'kind'", kind);
  if (kind == NormKind::rms) return RMSNorm({.dim = dim, .dtype = dtype});
  return LayerNorm({.dim = dim, .dtype = dtype});
}

}  // namespace

Norm::Norm(NormKind kind, std::int64_t dim, DType dtype) : norm(make_norm(kind, dim, dtype)) {}

Tensor Norm::forward(const Tensor& x) const {
  return std::visit([&](const auto& n) { return n.forward(x); }, norm);
}

void Norm::visit(ModuleVisitor& v) {
  std::visit([&](auto& n) { n.visit(v); }, norm);
}

}  // namespace tapegrad
