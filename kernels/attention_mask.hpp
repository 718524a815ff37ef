// Internal: which (query, key) pairs may attend, described rather than materialised. Attention
// kernels (the weights paths and the fused paths) ask for one row's mask at a time; nothing of
// size [B, H, Q, K] or [B, 1, Q, K] is ever built from the masks. The parts come validated
// (ops/attention_masking.cpp checks an AttentionMasking and builds its RowMasks, once per call).
#pragma once

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "autodiff/loops.hpp"

namespace tapegrad::detail {

// With ALiBi, |causal_offset| is at most 2^52: every distance |i + causal_offset - j| is then an
// exact integer in a double (i and j stay below 2^48, the largest tensor's size).
inline constexpr std::int64_t kMaxAlibiOffset = std::int64_t{1} << 52;

// The validated parts of one call's masking, for scores [..., Q, K]. key_mask and query_mask
// refer to the first leading dim of the scores as the batch B (the scores of
// multihead_attention are [B, H, Q, K]).
struct MaskParts {
  Tensor allowed{};                // optional bool, broadcasts to [..., Q, K]
  Tensor key_mask{};               // optional bool [B, K]
  Tensor query_mask{};             // optional bool [B, Q]
  bool causal = false;             // key j is allowed for query i only if j <= i + causal_offset
  std::int64_t causal_offset = 0;  // query i sits at position i + causal_offset (ALiBi's distances too)
  std::int64_t window = 0;         // > 0, with causal only: also j > i + causal_offset - window
  Tensor slopes{};                 // optional floating [H], finite: ALiBi
};

// One row of the mask: query i of one [..., Q, K] slice. Keys outside [begin, end) are never
// allowed (the causal rule and the window); inside, key j is allowed when keys (if any) and pairs
// (if any) allow it. begin <= end always; end 0 for a masked query.
struct RowMask {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  const bool* keys = nullptr;           // contiguous [K] row of key_mask, or null
  const bool* pairs = nullptr;          // the row of `allowed`, read as pairs[j * pairs_stride], or null
  std::int64_t pairs_stride = 0;
  // ALiBi (when `alibi`): the row's scores get -slope |position - j| added, position = i + causal_offset.
  // The position is set with ALiBi only (0 otherwise).
  bool alibi = false;
  double slope = 0;
  std::int64_t position = 0;

  // -slope |position - j| in T: the distance is an exact integer, one rounding of the product.
  template <class T> T alibi_bias(std::int64_t j) const noexcept {
    const std::int64_t d = position - j;
    return -(static_cast<T>(slope) * static_cast<T>(d < 0 ? -d : d));
  }
  // Whether the distances |position - j| for j < n are exact in float (and so in T): below 2^23.
  bool alibi_in_float(std::int64_t n) const noexcept {
    return position > -(std::int64_t{1} << 23) && position < (std::int64_t{1} << 23) && n < (std::int64_t{1} << 23);
  }
  bool dense() const noexcept { return keys == nullptr && pairs == nullptr; }  // all of [begin, end) allowed
  bool operator()(std::int64_t j) const noexcept {
    return j >= begin && j < end && (keys == nullptr || keys[j]) && (pairs == nullptr || pairs[j * pairs_stride]);
  }
};

// 0, 1, ..., n - 1 in T, in a buffer of the calling thread (valid until its next call): the key
// indices that ALiBi's loops read instead of converting j, so that they vectorise on every CPU.
template <class T> const T* index_ramp(std::int64_t n) {
  thread_local std::vector<T> ramp;
  for (auto j = static_cast<std::int64_t>(ramp.size()); j < n; ++j) ramp.push_back(static_cast<T>(j));
  return ramp.data();
}

// Row lookup for scores of a given shape, from validated parts: the bool tensors are made
// contiguous once, the slopes read once. Cheap to copy between threads: row() is const and
// allocation-free. Row r of the scores (rows numbered over [..., Q]) belongs to head (r / Q) mod H.
// A grouped view of the same scores ([B, Hkv, G, Q, K] for [B, H, Q, K]) numbers its rows alike.
class RowMasks {
 public:
  RowMasks() = default;  // no masking, no scores: call the other constructor for rows
  RowMasks(MaskParts parts, const Shape& scores_shape);
  // r numbers the rows of the scores in row-major order over [..., Q].
  RowMask row(std::int64_t r) const noexcept;
  bool empty() const noexcept { return empty_; }  // every pair allowed (ALiBi aside)
  std::int64_t window() const noexcept { return window_; }
  const Tensor& slopes() const noexcept { return slopes_tensor_; }  // ALiBi's [H], undefined without
  std::int64_t alibi_heads() const noexcept { return static_cast<std::int64_t>(slopes_.size()); }  // 0: no ALiBi
  // `saved` and the bool tensors that a node's backward reads through row(): all of them for a
  // backward that makes the weights again from the masks (the fused paths), or with ends_only
  // only what a row's end depends on (the query mask), for one that reads the weights and asks
  // the masks only how far each row goes. A write into one of them before backward is refused.
  std::vector<Tensor> saved_with(std::vector<Tensor> saved, bool ends_only = false) const;
  // The tensors a second-order pass reads whole (the masks and the slopes), for its version check.
  std::vector<Tensor> tensors() const;
  // Which queries have an allowed key in some head, and which keys some query may attend to in
  // some head, for scores [B, H, Q, K]: bool [B, Q] and [B, K], each undefined when all do.
  // `per_head`: the rows differ between heads (a pair mask); else head 0's rows stand for all.
  std::pair<Tensor, Tensor> taking(std::int64_t heads, bool per_head) const;
  // The allowed pairs as a bool tensor of `shape`: the scores' or a view of them numbering its rows
  // alike (the grouped [B, Hkv, G, Q, K]), for a path that reads them whole.
  Tensor materialise(const Shape& shape) const;

 private:
  Shape shape_;            // the scores' shape
  std::int64_t q_ = 0, k_ = 0, rows_per_batch_ = 0;  // rows_per_batch_: slices [Q, K] per batch entry
  bool empty_ = true, causal_ = false;
  std::int64_t offset_ = 0, window_ = 0;
  std::vector<double> slopes_;
  Tensor slopes_tensor_, keys_, queries_, allowed_;
  Dims8 allowed_strides_;  // broadcast strides of `allowed` against the scores' shape
};

}  // namespace tapegrad::detail
