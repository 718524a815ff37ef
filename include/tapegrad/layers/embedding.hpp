// Embedding: a table of `vocab` rows of width `dim`; forward(ids) picks rows.
#pragma once

#include <cstdint>

#include "tapegrad/layers/module.hpp"

namespace tapegrad {

struct EmbeddingConfig {
  std::int64_t vocab = 0;  // required, >= 1
  std::int64_t dim = 0;    // required, >= 1
  DType dtype = float32;
  std::uint64_t seed = 0;
};

class Embedding : public Module {
 public:
  // weight ~ N(0, 1) from the seed (PyTorch's default for nn.Embedding), requires grad.
  explicit Embedding(const EmbeddingConfig& config);
  // ids: int64 [...] in [0, vocab) -> [..., dim]. The weight's gradient adds up the rows of
  // every position that used an id (a repeated id gets the sum).
  Tensor forward(const Tensor& ids) const;
  void visit(ModuleVisitor& v) override { v.parameter("weight", weight); }
  const EmbeddingConfig& config() const noexcept { return config_; }
  Tensor weight;  // [vocab, dim]

 private:
  EmbeddingConfig config_;
};

}  // namespace tapegrad
