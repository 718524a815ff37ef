// KVCache: the keys and values that multihead_attention's decoding form appends to and reads.
#include <algorithm>
#include <utility>

#include "autodiff/check.hpp"
#include "tapegrad/autodiff/tape.hpp"
#include "tapegrad/ops/inplace.hpp"
#include "tapegrad/ops/multihead_attention.hpp"
#include "tapegrad/ops/view.hpp"

namespace tapegrad {
namespace {

// A fresh [B, capacity, width] buffer holding positions [from, from + length) of `buffer` at its
// front (the positions past them are not read: they were never written).
Tensor reallocated(const Tensor& buffer, std::int64_t from, std::int64_t length, std::int64_t capacity) {
  const NoGradGuard no_grad;
  Tensor out = empty({buffer.size(0), capacity, buffer.size(2)}, buffer.dtype());
  if (length > 0) copy_(slice(out, 1, 0, length), slice(buffer, 1, from, from + length));
  return out;
}

}  // namespace

KVCache::KVCache(const KVCache& other)
    : k_(other.k_.defined() ? reallocated(other.k_, 0, other.held_, other.capacity()) : Tensor()),
      v_(other.v_.defined() ? reallocated(other.v_, 0, other.held_, other.capacity()) : Tensor()),
      start_(other.start_),
      held_(other.held_) {}

KVCache& KVCache::operator=(const KVCache& other) {
  if (this != &other) *this = KVCache(other);
  return *this;
}

KVCache::KVCache(KVCache&& other) noexcept
    : k_(std::move(other.k_)), v_(std::move(other.v_)), start_(std::exchange(other.start_, 0)), held_(std::exchange(other.held_, 0)) {}

KVCache& KVCache::operator=(KVCache&& other) noexcept {
  if (this == &other) return *this;
  k_ = std::move(other.k_);  // a moved-from Tensor is undefined
  v_ = std::move(other.v_);
  start_ = std::exchange(other.start_, 0);
  held_ = std::exchange(other.held_, 0);
  return *this;
}

std::int64_t KVCache::start_after(std::int64_t n, std::int64_t keep_from) const noexcept {
  return held_ + n > capacity() ? start_ + std::clamp<std::int64_t>(keep_from - start_, 0, held_) : start_;
}

void KVCache::append(const Tensor& k, const Tensor& v, std::int64_t keep_from) {
  const std::int64_t n = k.size(1);
  const NoGradGuard no_grad;
  if (held_ + n > capacity()) {
    // Full. Positions before keep_from are dropped rather than kept: the kept ones move to the
    // front, in place when at most half the buffer is then in use (they cannot overlap their
    // destination: more than kept + n rows are dropped), else into a buffer twice that size, so
    // each move of `kept` rows is paid for by at least as many appends.
    const std::int64_t drop = std::clamp<std::int64_t>(keep_from - start_, 0, held_), kept = held_ - drop;
    if (drop > 0 && 2 * (kept + n) <= capacity()) {
      copy_(slice(k_, 1, 0, kept), slice(k_, 1, drop, held_));
      copy_(slice(v_, 1, 0, kept), slice(v_, 1, drop, held_));
    } else {
      // Grow by doubling: each position is copied O(1) times on average. Not past what can be
      // allocated, while what is needed still can be.
      std::int64_t grown = drop > 0 ? std::max<std::int64_t>(2 * (kept + n), 16) : std::max<std::int64_t>({2 * capacity(), kept + n, 16});
      try {
        detail::check_shape("KVCache", "buffer", {k.size(0), grown, std::max(k.size(2), v.size(2))}, k.dtype());
      } catch (const ShapeError&) {
        grown = kept + n;
      }
      k_ = reallocated(k_.defined() ? k_ : k, drop, kept, grown);
      v_ = reallocated(v_.defined() ? v_ : v, drop, kept, grown);
    }
    start_ += drop;
    held_ = kept;
  }
  copy_(slice(k_, 1, held_, held_ + n), k);
  copy_(slice(v_, 1, held_, held_ + n), v);
  held_ += n;
}

Tensor KVCache::keys() const { return slice(k_, 1, 0, held_); }
Tensor KVCache::values() const { return slice(v_, 1, 0, held_); }

}  // namespace tapegrad
