#include "kernels/attention_mask.hpp"

#include <algorithm>

namespace tapegrad::detail {

RowMasks::RowMasks(MaskParts m, const Shape& scores_shape)
    : shape_(scores_shape), causal_(m.causal), offset_(m.causal_offset), window_(m.window) {
  const std::size_t rank = shape_.size();
  q_ = shape_[rank - 2];
  k_ = shape_[rank - 1];
  rows_per_batch_ = 1;
  for (std::size_t d = 1; d + 2 < rank; ++d) rows_per_batch_ *= shape_[d];  // the dims between B and Q
  keys_ = !m.key_mask.defined() || m.key_mask.is_contiguous() ? m.key_mask : copy_of(m.key_mask);
  queries_ = !m.query_mask.defined() || m.query_mask.is_contiguous() ? m.query_mask : copy_of(m.query_mask);
  if (m.allowed.defined()) {
    allowed_ = m.allowed;
    allowed_strides_ = broadcast_strides(allowed_, shape_);
  }
  empty_ = !allowed_.defined() && !keys_.defined() && !queries_.defined() && !causal_;
  if (m.slopes.defined()) {
    slopes_tensor_ = m.slopes;
    const Tensor c = m.slopes.detach().to(DType::float64).contiguous();
    slopes_.assign(c.data<double>(), c.data<double>() + c.numel());
  }
}

std::vector<Tensor> RowMasks::saved_with(std::vector<Tensor> saved, bool ends_only) const {
  for (const Tensor* t : {&queries_, &keys_, &allowed_})
    if (t->defined() && (t == &queries_ || !ends_only)) saved.push_back(*t);
  return saved;
}

std::vector<Tensor> RowMasks::tensors() const {
  std::vector<Tensor> out;
  for (const Tensor* t : {&allowed_, &keys_, &queries_, &slopes_tensor_})
    if (t->defined()) out.push_back(*t);
  return out;
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

// Rows numbered head-major (b H + h) Q + i. Without a pair mask the heads share their rows, so
// head 0's are read: a row's allowed keys are the key mask's in [begin, end) (the causal end, the
// window's begin), the row is active when the first allowed key from its begin is below its end,
// and the keys used are the allowed ones that some active row's [begin, end) covers (with a
// window and a query mask those intervals may leave gaps). With a pair mask each row is read.
std::pair<Tensor, Tensor> RowMasks::taking(std::int64_t heads, bool per_head) const {
  if (empty_) return {};
  const std::int64_t batch = shape_[0], q = q_, k = k_;
  Tensor active_t = new_tensor({batch, q}, DType::bool_, "multihead_attention"), used_t = new_tensor({batch, k}, DType::bool_, "multihead_attention");
  bool* active = static_cast<bool*>(mutable_data(active_t));
  bool* used = static_cast<bool*>(mutable_data(used_t));
  std::fill(active, active + batch * q, false);
  std::fill(used, used + batch * k, false);
  const auto nk = static_cast<std::size_t>(k);
  std::vector<std::int64_t> next(nk + 1);   // next[j]: the first key >= j the key mask allows (k: none)
  std::vector<std::int64_t> cover(nk + 1);  // +1 where an active row's [begin, end) opens, -1 where it closes
  const std::int64_t read = per_head ? heads : 1;
  for (std::int64_t b = 0; b < batch; ++b) {
    const bool* keys = row(b * heads * q).keys;  // the batch's key mask row, or null
    next[nk] = k;
    for (std::size_t j = nk; j-- > 0;) next[j] = keys == nullptr || keys[j] ? static_cast<std::int64_t>(j) : next[j + 1];
    std::fill(cover.begin(), cover.end(), 0);
    for (std::int64_t r = b * heads * q; r < (b * heads + read) * q; ++r) {
      const RowMask m = row(r);
      bool* act = active + b * q + r % q;
      if (m.pairs == nullptr) {
        if (next[static_cast<std::size_t>(m.begin)] < m.end) {
          *act = true;
          ++cover[static_cast<std::size_t>(m.begin)];
          --cover[static_cast<std::size_t>(m.end)];
        }
        continue;
      }
      for (std::int64_t j = m.begin; j < m.end; ++j)
        if (m(j)) *act = used[b * k + j] = true;
    }
    std::int64_t open = 0;  // active rows covering key j
    for (std::size_t j = 0; j < nk; ++j)
      if ((open += cover[j]) > 0 && next[j] == static_cast<std::int64_t>(j)) used[b * k + static_cast<std::int64_t>(j)] = true;
  }
  auto all = [](const bool* p, std::int64_t n) { return std::all_of(p, p + n, [](bool x) { return x; }); };
  return {all(active, batch * q) ? Tensor() : active_t, all(used, batch * k) ? Tensor() : used_t};
}

Tensor RowMasks::materialise(const Shape& shape) const {
  Tensor m = new_tensor(shape, DType::bool_, "attention");
  bool* p = static_cast<bool*>(mutable_data(m));
  const std::int64_t rows = k_ == 0 ? 0 : shape_numel(shape) / k_;
  for (std::int64_t r = 0; r < rows; ++r) {
    const RowMask row = this->row(r);
    for (std::int64_t j = 0; j < k_; ++j) p[r * k_ + j] = row(j);
  }
  return m;
}

}  // namespace tapegrad::detail
