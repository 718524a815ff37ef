// Internal: attention's fast paths, and the one function that says when each pays.
// ops/attention_reference.cpp is the reference every fast path is tested against, and
// ops/attention.cpp records the tape node for all of them; a fast path here computes the forward
// and, given the upstream gradients, the backward's gradients, recording nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/attention_mask.hpp"

namespace tapegrad::detail {

// Validated arguments of one attention call. The masks and ALiBi's slopes come as its RowMasks:
// row r of the scores (rows numbered over [..., Q]) belongs to head (r / Q) mod H, and its scores
// get -slopes[head] |i + causal_offset - j| added after the scaling (and with the bias). For
// [B, H, Q, K] scores that is head h; for [B, Hkv, G, Q, K] (grouped queries) head hkv G + g.
struct AttentionArgs {
  const char* op;  // for error messages and the node's name
  Tensor q, k, v;
  Tensor bias;  // optional, floating, broadcasts to [..., Q, K]
  // false: only the output is wanted (a fused path, which never holds the [..., Q, K] weights;
  // the result's weights are then undefined).
  bool need_weights = true;
};

// batch + [rows, cols]: the shape of a [..., rows, cols] operand or result.
inline Shape with_matrix(const Shape& batch, std::int64_t rows, std::int64_t cols) {
  Shape s = batch;
  s.push_back(rows);
  s.push_back(cols);
  return s;
}

enum class AttentionPath {
  reference,       // the computation as written down, in ops (ops/attention_reference.cpp): chosen only to be tested
  weights,         // whole-tensor products and one fused pass over the scores each way (attention_weights.cpp)
  weights_bf16,    // the same steps on bfloat16 products (attention_weights_bf16.cpp)
  blocks,          // the weights path in blocks of query rows that stay in cache (attention_blocks.cpp)
  tiles,           // fused: an online softmax over tiles of keys, no weights kept (attention_tiles.cpp)
  fused_blocks,    // fused on the blocks path's blocks, each block's weights made again in backward
};

// The path's name, its file's (attention_<name>.cpp; the blocks' two in attention_blocks.cpp).
const char* path_name(AttentionPath path) noexcept;

// The path a call takes, the one place that chooses. With need_weights, or at most 32 keys (one
// tile: the weights are then dropped): the weights path, or in blocks when the float32 scores are
// too large for the cache (8 MiB and up: whole-tensor passes would stream them through memory), or
// on bfloat16 products under that precision. Otherwise: the tiles, or the blocks for large
// float32 scores when the bias needs no gradient (dbias would make the blocks hold dS whole).
// `bf16`: float32 operands under a bfloat16 matmul precision.
AttentionPath attention_path(const AttentionArgs& args, const Shape& scores_shape, const RowMasks& masks, bool bf16);
// The backward a node of path `forward` runs: its own, or in a create_graph pass the reference's,
// whose every line is an op that records (the fast paths' kernels have no differentiable form).
AttentionPath attention_backward_path(AttentionPath forward);

// A fast path's gradients of q, k, v and the bias, as the node's backward finishes them: dq, dk
// and dv in the scores' batch shape [batch..., rows, width] (summed to each input's own shape
// after), dbias in the scores' shape or already the bias's; dq and dk hold the factor 1/sqrt(D)
// unless `scaled` is false (then it multiplies them after the sums). Undefined where not needed.
struct AttentionGrads {
  Tensor dq, dk, dv, dbias;
  Tensor dslopes;  // ALiBi's slopes, [H]
  bool scaled = true;
};

// needs[i], for a needs list of any length (the node's inputs: q, k, v, bias, ALiBi's slopes).
inline bool wants(const std::vector<bool>& needs, std::size_t i) { return i < needs.size() && needs[i]; }
// Whether the backward reads dS itself, unscaled: the bias's gradient is dS summed, the slopes'
// is dS weighted by the distances (kernels/attention_alibi.hpp).
inline bool wants_raw_ds(const std::vector<bool>& needs) { return wants(needs, 3) || wants(needs, 4); }

// What a fast path's backward keeps (detached tensors only, so the node does not hold itself).
class AttentionBackward {
 public:
  virtual ~AttentionBackward() = default;
  // d_out and d_weights may be undefined (no gradient reached that output); needs: q, k, v, bias, slopes.
  virtual AttentionGrads operator()(const Tensor& d_out, const Tensor& d_weights, const std::vector<bool>& needs) const = 0;
};

struct AttentionRun {
  Tensor output, weights;     // weights undefined on the fused paths
  std::vector<Tensor> saved;  // every tensor the backward reads, for the node's version check
  std::shared_ptr<const AttentionBackward> backward;
};

// Runs a fast path (not the reference) on validated arguments, their masks and 1/sqrt(D).
// block_rows > 0: the blocks paths' blocks of that many rows (tests ask for small ones).
AttentionRun run_attention(AttentionPath path, const AttentionArgs& args, const Shape& scores_shape, const RowMasks& masks, double scale,
                           bool bf16, std::int64_t block_rows = 0);

// The fast paths, one file each.
AttentionRun attention_weights(const AttentionArgs& args, const Shape& scores_shape, const RowMasks& masks, double scale);
AttentionRun attention_weights_bf16(const AttentionArgs& args, const Shape& scores_shape, const RowMasks& masks, double scale);
AttentionRun attention_blocks(const AttentionArgs& args, const Shape& scores_shape, const RowMasks& masks, double scale, bool bf16,
                                 bool keep_weights, std::int64_t block_rows);
AttentionRun attention_tiles(const AttentionArgs& args, const Shape& scores_shape, const RowMasks& masks, bool bf16);

}  // namespace tapegrad::detail
