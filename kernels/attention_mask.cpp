#include "kernels/attention_mask.hpp"

#include <algorithm>
#include <cmath>

#include "autodiff/check.hpp"
#include "autodiff/loops.hpp"

namespace tapegrad::detail {

RowMasks::RowMasks(const char* op, const AttentionMask& m, const Shape& scores_shape, const Tensor& alibi)
    : shape_(scores_shape), causal_(m.causal), offset_(m.causal_offset), window_(m.window) {
  if (m.window < 0) fail<ValueError>("{}: argument 'window' must be >= 0 (0: no window), got {}", op, m.window);
  if (m.window > 0 && !m.causal)
    fail<ValueError>("{}: argument 'window' ({}) applies to causal attention only: set causal as well", op, m.window);
  const std::size_t rank = shape_.size();
  if (rank < 2) fail<ShapeError>("{}: the scores must have rank >= 2, got shape {}", op, shape_str(shape_));
  q_ = shape_[rank - 2];
  k_ = shape_[rank - 1];
  rows_per_batch_ = 1;
  for (std::size_t d = 1; d + 2 < rank; ++d) rows_per_batch_ *= shape_[d];  // the dims between B and Q
  const std::int64_t batch = rank > 2 ? shape_[0] : 1;
  auto batch_rows = [&](const char* name, const Tensor& t, std::int64_t width) {
    if (!t.defined()) return Tensor();
    check_dtype(op, name, t, DType::bool_);
    if (rank < 3 || t.shape() != Shape{batch, width})
      fail<ShapeError>("{}: argument '{}' must have shape [B, {}] = [{}, {}] for scores {}, got {}", op, name,
                       width == k_ ? "K" : "Q", batch, width, shape_str(shape_), shape_str(t.shape()));
    return t.is_contiguous() ? t : copy_of(t);
  };
  keys_ = batch_rows("key_mask", m.key_mask, k_);
  queries_ = batch_rows("query_mask", m.query_mask, q_);
  if (m.allowed.defined()) {
    check_dtype(op, "mask", m.allowed, DType::bool_);
    if (broadcast_args(op, "scores", shape_, "mask", m.allowed.shape()) != shape_)
      fail<ShapeError>("{}: argument 'mask' with shape {} must broadcast to the scores' shape {}", op,
                       shape_str(m.allowed.shape()), shape_str(shape_));
    allowed_ = m.allowed;
    allowed_strides_ = broadcast_strides(allowed_, shape_);
  }
  empty_ = m.empty();
  if (alibi.defined()) {
    const Tensor c = alibi.detach().to(DType::float64).contiguous();
    slopes_.assign(c.data<double>(), c.data<double>() + c.numel());
    // A non-finite slope has no value at distance 0 (inf * 0); a distance past 2^53 is no longer
    // an exact double. Refused, so every bias is one rounding of slope * |i + offset - j|.
    for (std::size_t h = 0; h < slopes_.size(); ++h)
      if (!std::isfinite(slopes_[h]))
        fail<ValueError>("{}: argument 'alibi_slopes' holds {} for head {}; every slope must be finite", op, slopes_[h], h);
    if (m.causal_offset < -kMaxAlibiOffset || m.causal_offset > kMaxAlibiOffset)
      fail<ValueError>("{}: with alibi_slopes, causal_offset must lie in [-2^52, 2^52] (the distances |i + causal_offset - j| "
                       "stay exact doubles), got {}",
                       op, m.causal_offset);
  }
}

std::vector<Tensor> RowMasks::saved_with(std::vector<Tensor> saved, bool ends_only) const {
  for (const Tensor* t : {&queries_, &keys_, &allowed_})
    if (t->defined() && (t == &queries_ || !ends_only)) saved.push_back(*t);
  return saved;
}

RowMask RowMasks::row(std::int64_t r) const noexcept {
  const std::int64_t i = q_ > 0 ? r % q_ : 0;
  const std::int64_t b = rows_per_batch_ * q_ > 0 ? r / (rows_per_batch_ * q_) : 0;
  RowMask out;
  // j <= i + offset, written so that extreme offsets cannot overflow.
  out.end = !causal_ ? k_ : offset_ >= k_ - i ? k_ : offset_ < -i ? 0 : i + offset_ + 1;
  if (queries_.defined() && !static_cast<const bool*>(queries_.raw_data())[b * q_ + i]) out.end = 0;
  if (window_ > 0) {
    // j > i + offset - window: the first key is i + offset - (window - 1), exactly for any int64
    // offset and window. Below INT64_MIN it stays below 0 after adding i; past INT64_MAX, past K.
    std::int64_t first = 0;
    if (__builtin_sub_overflow(offset_, window_ - 1, &first)) out.begin = 0;
    else if (__builtin_add_overflow(first, i, &first)) out.begin = out.end;
    else out.begin = std::clamp<std::int64_t>(first, 0, out.end);
  }
  if (!slopes_.empty()) {
    out.alibi = true;
    out.slope = slopes_[static_cast<std::size_t>((r / std::max<std::int64_t>(q_, 1)) % static_cast<std::int64_t>(slopes_.size()))];
    out.position = i + offset_;  // |offset| <= 2^52 with ALiBi, and i < 2^48: exact
  }
  if (keys_.defined()) out.keys = static_cast<const bool*>(keys_.raw_data()) + b * k_;
  if (allowed_.defined()) {
    // Row r's offset in `allowed`: unravel r over [..., Q] against the broadcast strides.
    std::int64_t offset = 0, rest = r;
    for (std::size_t d = shape_.size() - 1; d-- > 0;) {
      offset += (rest % shape_[d]) * allowed_strides_[d];
      rest /= shape_[d];
    }
    out.pairs = static_cast<const bool*>(allowed_.raw_data()) + offset;
    out.pairs_stride = allowed_strides_[shape_.size() - 1];
  }
  return out;
}

}  // namespace tapegrad::detail
