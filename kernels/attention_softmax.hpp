// Internal: the attention core's pass from scores to weights and back, fused and parallel over
// rows. The forward is one pass over the scores: scale, add the bias, apply the mask (asked row
// by row from RowMasks, never materialised) and the softmax. The backward is one pass too: the
// two upstream gradients of the weights are added on the fly.
#pragma once

#include <cstdint>

#include "kernels/attention_mask.hpp"
#include "kernels/softmax_rows.hpp"

namespace tapegrad::detail {

// weights = masked_softmax(scale * scores + bias, masks) over the last dim. scores: [..., Q, K]
// of the weights' shape, any strides (it may be `weights` itself: rows are rewritten in
// place); bias: undefined or broadcastable to it; weights: contiguous, written whole. With
// `rounded` (float32 only), each row is also written there rounded to bfloat16
// (round_bf16_weights) while it is still in cache: the products by the weights read that copy.
void attention_softmax_forward(const Tensor& scores, double scale, const Tensor& bias, const RowMasks& masks,
                               const Tensor& weights, std::uint16_t* rounded = nullptr);

// dS = factor * A * (dA - rowsum(A * dA)) with dA = grad_a + grad_b (either may be undefined,
// both broadcast to A's shape, any strides), and dS exactly 0 wherever A is 0 (masked keys,
// empty rows), whatever dA holds there. A contiguous; returns a fresh contiguous dS, and with
// `rounded` (float32 only) writes its rows rounded to bfloat16 there too; then with keep_float
// false only there (a pass of [..., Q, K] float32 writes saved), and returns an undefined tensor.
Tensor attention_softmax_backward(const Tensor& weights, const Tensor& grad_a, const Tensor& grad_b, const RowMasks& masks,
                                  double factor, std::uint16_t* rounded = nullptr, bool keep_float = true);

// The same two passes (float32) on rows [begin, stop) of the scores only, on the calling thread:
// for a caller that runs them on a block of rows between the products that write and read it,
// while the block is still in cache. Rows are numbered over the whole [..., Q, K]: scores /
// grad_a / grad_b are RowPointers (RowPointers::block for a buffer that holds these rows only);
// weights, the backward's out and both passes' rounded (if not null) hold rows [begin, stop)
// only (row stride K: a block of a whole tensor, or a buffer), and out may be grad_a's buffer.
// With `stats`, the forward also writes each row's maximum m and log l (l = the sum of exp(x - m)
// over its allowed keys; x the scaled, biased, masked scores) there, two per row from row begin:
// what attention_softmax_recompute_rows needs to make the weights again.
void attention_softmax_forward_rows(const RowPointers& scores, const RowPointers& bias, float scale, const RowMasks& masks,
                                    float* weights, std::uint16_t* rounded, std::int64_t begin, std::int64_t stop,
                                    float* stats = nullptr);
// The fused path's backward pass over rows [begin, stop) (buffers of these rows, row stride ld,
// keys below ld only), on the calling thread: from the scores S (scores, raw q kᵀ, rewritten in
// place) and the forward's stats, P = exp((x - m) - log l), the forward's weights up to rounding
// (0 at masked keys, all 0 in an empty row, NaN at the allowed keys of a NaN row); then, with
// grad (dA = dO vᵀ, rewritten in place) and delta (Δ = rowsum(dO O) per row; null: Δ =
// rowsum(P dA), one more pass), dS = factor P (dA - Δ), exactly 0 where P is 0 whatever dA
// holds there. rounded_p and
// rounded_ds (if not null) get P and dS rounded to bfloat16. Both are 0 in [end, ld).
void attention_softmax_recompute_rows(float* scores, const RowPointers& bias, float scale, const RowMasks& masks, const float* stats,
                                      const float* delta, float* grad, float factor, std::uint16_t* rounded_p,
                                      std::uint16_t* rounded_ds, std::int64_t ld, std::int64_t begin, std::int64_t stop);
void attention_softmax_backward_rows(const float* weights, const RowPointers& grad_a, const RowPointers& grad_b, float factor,
                                     const RowMasks& masks, float* out, std::uint16_t* rounded, std::int64_t begin,
                                     std::int64_t stop);

}  // namespace tapegrad::detail
