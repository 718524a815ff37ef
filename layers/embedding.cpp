// Embedding: forward and backward are embedding()'s (a row gather and its scatter-add).
#include "tapegrad/layers/embedding.hpp"

#include "layers/layer_support.hpp"
#include "tapegrad/ops/indexing.hpp"

namespace tapegrad {

Embedding::Embedding(const EmbeddingConfig& config) : config_(config) {
  detail::check_field("Embedding", "vocab", config.vocab);
  detail::check_field("Embedding", "dim", config.dim);
  detail::check_float_dtype("Embedding", config.dtype);
  detail::checked_product("Embedding", "vocab", config.vocab, "dim", config.dim);
  weight = randn({config.vocab, config.dim}, config.seed, config.dtype).set_requires_grad();
}

Tensor Embedding::forward(const Tensor& ids) const {
  detail::check_dtype("Embedding::forward", "ids", ids, DType::int64);
  return embedding(weight, ids);
}

}  // namespace tapegrad
