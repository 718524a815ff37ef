// Random multi-head attention problems for the MHA test suites.
#pragma once

#include <cstdint>
#include <vector>

#include "support.hpp"

namespace tg_test {

struct MhaProblem {
  std::int64_t b, q, k, h, d, dv, cq, cctx, cout;
  bool causal = false;
  std::int64_t offset = 0;
  bool need_weights = true;  // false: the fused path, and run() returns no attention
  tapegrad::MhaActivations act;
  tapegrad::MhaParameters par;
  tapegrad::MhaMasks masks;

  // Every floating tensor, in a fixed order: query, context, [bias], w_q, w_k, w_v, w_o, [b_*].
  std::vector<tapegrad::Tensor> inputs() const;
  // The same problem with those tensors replaced (same order as inputs()).
  tapegrad::AttentionResult run(const std::vector<tapegrad::Tensor>& xs) const;
};

enum class MaskKind { none, random, empty_row, empty_query, empty_batch };
enum class BiasKind { none, full, heads_keys, queries_keys };

MhaProblem make_problem(std::uint64_t seed, tapegrad::DType dtype, MaskKind masks, BiasKind bias, bool all_biases,
                        bool non_contiguous);

}  // namespace tg_test
