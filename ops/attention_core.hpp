// Internal: attention with an optional additive bias on the scores, as one tape node. Both the
// public scaled_dot_product_attention (no bias) and multihead_attention (bias allowed) use it.
#pragma once

#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "kernels/attention_paths.hpp"
#include "tapegrad/ops/attention.hpp"

namespace tapegrad::detail {

// The single entry: validates, computes the weights (when asked for) and the output on the
// path attention_path() chooses, records one node. `path` forces one (the tests run each on
// every shape; block_rows > 0: the pipelined paths' blocks of that many rows).
// What only a create_graph pass reads (the bias, the masks whole: first-order backwards read the
// weights or the rows' ends instead, and declare only those), with their storage versions when
// recorded. check() refuses an in-place write since, as the tape does for declared tensors.
class SecondOrderReads {
 public:
  explicit SecondOrderReads(const AttentionArgs& a);
  void check(const char* op) const;

 private:
  std::vector<std::pair<Tensor, std::uint64_t>> read_;
};

// The node's backward in a create_graph pass (attention_second_order.cpp): gradients of q, k, v
// and bias (where `needs`) that can be differentiated again, from the reference composite.
std::vector<Tensor> attention_backward_with_graph(const AttentionArgs& a, const Shape& scores_shape, const RowMasks& masks,
                                                  double scale, const SecondOrderReads& reads, std::span<const Tensor> g,
                                                  const std::vector<bool>& needs);

AttentionResult attention_core(const AttentionArgs& args, std::optional<AttentionPath> path = std::nullopt, std::int64_t block_rows = 0);

}  // namespace tapegrad::detail
