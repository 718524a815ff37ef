// bfloat16 copies of weights (rounded_copy.hpp).
#include "kernels/rounded_copy.hpp"

#include <atomic>
#include <limits>
#include <memory>
#include <mutex>
#include <new>

#include "autodiff/tensor_impl.hpp"
#include "kernels/matmul_dnnl.hpp"
#include "runtime/block_cache.hpp"
#include "runtime/parallel.hpp"

namespace tapegrad::detail {
namespace {

std::atomic<std::int64_t> live_copies{0};

struct RoundedCopy final : Storage::Derived {
  explicit RoundedCopy(std::int64_t elements)
      : n(elements), bits(static_cast<std::uint16_t*>(take_block(bytes()))) {
    live_copies.fetch_add(1, std::memory_order_relaxed);
  }
  ~RoundedCopy() override {
    give_block(bits, bytes());
    live_copies.fetch_sub(1, std::memory_order_relaxed);
  }
  RoundedCopy(const RoundedCopy&) = delete;
  RoundedCopy& operator=(const RoundedCopy&) = delete;
  std::size_t bytes() const { return static_cast<std::size_t>(n) * sizeof(std::uint16_t); }

  const std::int64_t n;
  std::uint16_t* const bits;
  std::mutex lock;
  // The storage version the bits were rounded from.
  std::uint64_t version = std::numeric_limits<std::uint64_t>::max();
  // Whether a product has read the copy since the last update wrote it: an update rewrites only
  // a copy that is being read (one bfloat16 evaluation does not tax every later float32 step).
  std::atomic<bool> read{false};
};

// The storage's copy, if what it holds is one (another kind of derived data is not).
RoundedCopy* existing(const Storage& s) { return dynamic_cast<RoundedCopy*>(s.derived.load(std::memory_order_acquire)); }

// The storage's copy, made when the storage holds nothing derived yet; null when it holds
// another kind, or when the copy's memory cannot be had: the product then rounds into scratch
// as it would without a copy.
RoundedCopy* copy_of_storage(Storage& s) {
  Storage::Derived* expected = s.derived.load(std::memory_order_acquire);
  if (expected != nullptr) return dynamic_cast<RoundedCopy*>(expected);
  std::unique_ptr<RoundedCopy> fresh;
  try {
    fresh = std::make_unique<RoundedCopy>(static_cast<std::int64_t>(s.bytes / sizeof(float)));
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
  if (s.derived.compare_exchange_strong(expected, fresh.get(), std::memory_order_acq_rel)) return fresh.release();
  return dynamic_cast<RoundedCopy*>(expected);  // another thread stored something first
}

}  // namespace

const std::uint16_t* rounded_copy(const Tensor& x) {
  if (x.dtype() != DType::float32 || x.numel() == 0) return nullptr;
  Storage& s = *x.impl()->storage;
  RoundedCopy* c = existing(s);
  if (c == nullptr) {
    if (!x.is_leaf() || !x.requires_grad()) return nullptr;
    c = copy_of_storage(s);
    if (c == nullptr) return nullptr;
  }
  const std::lock_guard hold(c->lock);
  const std::uint64_t now = s.version.load(std::memory_order_acquire);
  if (c->version != now) {
    const float* src = reinterpret_cast<const float*>(s.data);
    parallel_for(c->n, 2, [&](std::int64_t begin, std::int64_t end) { round_bf16(src + begin, c->bits + begin, end - begin); });
    c->version = now;
  }
  c->read.store(true, std::memory_order_relaxed);
  return c->bits;
}

std::uint16_t* rounded_copy_to_write(const Tensor& param) {
  if (param.dtype() != DType::float32 || param.offset() != 0 || !param.is_contiguous()) return nullptr;
  const Storage& s = *param.impl()->storage;
  RoundedCopy* c = existing(s);
  return c != nullptr && c->n == param.numel() && c->read.exchange(false, std::memory_order_relaxed) ? c->bits : nullptr;
}

void rounded_copy_written(const Tensor& param) noexcept {
  const Storage& s = *param.impl()->storage;
  if (RoundedCopy* c = existing(s)) {
    const std::lock_guard hold(c->lock);
    c->version = s.version.load(std::memory_order_acquire);
  }
}

std::int64_t rounded_copies() noexcept { return live_copies.load(std::memory_order_relaxed); }

}  // namespace tapegrad::detail
