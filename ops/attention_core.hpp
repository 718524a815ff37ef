// Internal: attention with an optional additive bias on the scores, as one tape node. Both the
// public scaled_dot_product_attention (no bias) and multihead_attention (bias allowed) use it.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "kernels/attention_paths.hpp"
#include "ops/attention_masking.hpp"
#include "tapegrad/ops/attention.hpp"

namespace tapegrad::detail {

// The reference, one node, and its backward, every line an op, which every path's node runs in a
// create_graph pass (attention_reference.cpp says what each takes).
AttentionResult reference_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                                    const RowMasks& masks, const Shape& scores_shape, double scale);
std::vector<Tensor> reference_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias, const RowMasks& masks,
                                       const Shape& scores_shape, double scale, const Tensor& weights, std::span<const Tensor> g,
                                       const std::vector<bool>& needs);

// Validates q, k, v and the bias; returns the scores' shape [..., Q, K].
Shape check_attention(const AttentionArgs& a);
// An optional floating bias of the activations' dtype that broadcasts to the scores [..., Q, K].
void check_bias(const char* op, const Tensor& bias, const Shape& scores, DType dtype, const char* activations);

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
