// Which attention path a call takes, and running the fast ones (attention_paths.hpp).
#include "kernels/attention_paths.hpp"

#include "autodiff/check.hpp"
#include "autodiff/saved_output.hpp"

namespace tapegrad::detail {
namespace {

// float32 scores of 8 MiB and more: past the cache, whole-tensor passes stream them through
// memory, and blocks of rows that stay in cache win (docs/performance-notes.md has the
// crossover as measured).
bool blocks_pay(const AttentionArgs& a, const Shape& scores_shape) {
  return a.q.dtype() == DType::float32 && shape_numel(scores_shape) >= (std::int64_t{2} << 20);
}

// Up to this many keys, one tile of the fused path holds every key of a row, and its per-head
// tile products (thousands of small gemm calls per training step) cost more than the weights
// path's batched products (docs/performance-notes.md); the weights, small at this length, are
// then made and dropped.
constexpr std::int64_t kWeightsPathMaxKeys = 32;

}  // namespace

AttentionPath attention_path(const AttentionArgs& a, const Shape& scores_shape, const RowMasks& masks, bool bf16) {
  // No scores, no work: the fast paths keep per-matrix bookkeeping, and [2^49, 0, 0] would
  // ask them for 2^49 entries of it.
  if (shape_numel(scores_shape) == 0) return AttentionPath::weights;
  // (The weights of a short row are made only where they can be: the output was checked, not them.)
  const bool short_rows = scores_shape.back() <= kWeightsPathMaxKeys &&
                          shape_numel(scores_shape) <= kMaxBytes / static_cast<std::int64_t>(itemsize(a.q.dtype()));
  if (!a.need_weights && !short_rows) {
    // A bias or ALiBi slopes that need a gradient would make the blocks hold dS whole,
    // [..., Q, K] (their gradients are summed from it); the tiles sum them as they go instead.
    // A window: the tiles skip the key tiles before it (cost O(W), not O(K)), the blocks do not.
    const bool ds_grad = (a.bias.defined() && a.bias.requires_grad()) || (masks.slopes().defined() && masks.slopes().requires_grad());
    return blocks_pay(a, scores_shape) && !ds_grad && masks.window() == 0 ? AttentionPath::fused_blocks : AttentionPath::tiles;
  }
  if (blocks_pay(a, scores_shape)) return AttentionPath::blocks;
  return bf16 ? AttentionPath::weights_bf16 : AttentionPath::weights;
}

AttentionRun run_attention(AttentionPath path, const AttentionArgs& a, const Shape& scores_shape, const RowMasks& masks, double scale,
                           bool bf16, std::int64_t block_rows) {
  switch (path) {
    case AttentionPath::weights_bf16: return attention_weights_bf16(a, scores_shape, masks, scale);
    case AttentionPath::blocks: return attention_blocks(a, scores_shape, masks, scale, bf16, true, block_rows);
    case AttentionPath::fused_blocks: return attention_blocks(a, scores_shape, masks, scale, bf16, false, block_rows);
    case AttentionPath::tiles: return attention_tiles(a, scores_shape, masks, bf16);
    case AttentionPath::weights: return attention_weights(a, scores_shape, masks, scale);
    case AttentionPath::reference: break;
  }
  throw std::logic_error("run_attention: the reference runs in ops/attention_reference.cpp");
}

const char* path_name(AttentionPath path) noexcept {
  switch (path) {
    case AttentionPath::reference: return "reference";
    case AttentionPath::weights: return "weights";
    case AttentionPath::weights_bf16: return "weights_bf16";
    case AttentionPath::blocks: return "blocks";
    case AttentionPath::tiles: return "tiles";
    case AttentionPath::fused_blocks: return "fused_blocks";
  }
  return "?";
}

AttentionPath attention_backward_path(AttentionPath forward) { return creating_graph() ? AttentionPath::reference : forward; }

}  // namespace tapegrad::detail
