// Internal: attention with an optional additive bias on the scores, as one tape node. Both the
// public scaled_dot_product_attention (no bias) and multihead_attention (bias allowed) use it.
#pragma once

#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "kernels/attention_paths.hpp"
#include "ops/attention_masking.hpp"
#include "tapegrad/ops/attention.hpp"

namespace tapegrad::detail {

// What only a create_graph pass reads (the bias, the masks whole and ALiBi's slopes: first-order
// backwards read the weights or the rows' ends instead, and declare only those), with their
// storage versions when recorded. check() refuses an in-place write since, as the tape does for
// declared tensors.
class SecondOrderReads {
 public:
  SecondOrderReads(const AttentionArgs& a, const RowMasks& masks);
  void check(const char* op) const;

 private:
  std::vector<std::pair<Tensor, std::uint64_t>> read_;
};

// The node's backward in a create_graph pass (attention_second_order.cpp): gradients of q, k, v,
// bias and slopes (where `needs`) that can be differentiated again, from the reference composite.
std::vector<Tensor> attention_backward_with_graph(const AttentionArgs& a, const Shape& scores_shape, const RowMasks& masks,
                                                  double scale, const SecondOrderReads& reads, std::span<const Tensor> g,
                                                  const std::vector<bool>& needs);

// Validates q, k, v and the bias; returns the scores' shape [..., Q, K].
Shape check_attention(const AttentionArgs& a);

// The single entry, for validated arguments: check_attention's scores shape and the call's
// masks (built once by masking_rows, for these scores or for their ungrouped view: rows are
// numbered alike). Computes the weights (when asked for) and the output on the path
// attention_path() chooses, records one node. `path` forces one (the tests run each on every
// shape; block_rows > 0: the pipelined paths' blocks of that many rows).
AttentionResult attention_core(const AttentionArgs& a, const Shape& scores_shape, const RowMasks& masks,
                               std::optional<AttentionPath> path = std::nullopt, std::int64_t block_rows = 0);
// The same after validating a's tensors and `masking` against a's scores.
AttentionResult attention_core(const AttentionArgs& a, const AttentionMasking& masking, std::optional<AttentionPath> path = std::nullopt,
                               std::int64_t block_rows = 0, const MaskNames& names = {});

}  // namespace tapegrad::detail
