// Tensor storage and the cache of freed blocks behind it.
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "autodiff/tensor_impl.hpp"

namespace tapegrad {
namespace detail {
namespace {

constexpr std::size_t kAlign = 64;
constexpr std::size_t kClassesFrom = 256;
constexpr std::size_t kCacheLimit = std::size_t{2} << 30;    // at most 2 GiB kept idle

// Every block (all but the few bytes a Storage holds inline) comes from the cache below, not
// only the large ones whose fresh pages cost faults: glibc merges its lists of small free chunks
// whenever a block of 1 KiB or more is asked for, so a step's few mid-sized tensors slowed the
// hundreds of small allocations (shapes, nodes) around them. Caching the blocks below 64 KiB
// too took a toy attention step from 26.8 to 23.0 us (one thread).
//
// Sizes from kClassesFrom are rounded up to one of four classes per power of two (at most 25%
// slack), so a block freed by one op fits the next op of a similar size; smaller ones to 64 bytes.
std::size_t size_class(std::size_t n) {
  if (n < kClassesFrom) return (n + kAlign - 1) / kAlign * kAlign;
  std::size_t p = kClassesFrom;
  while (p * 2 <= n) p *= 2;
  const std::size_t quarter = p / 4;
  return (n + quarter - 1) / quarter * quarter;
}

class BlockCache {
 public:
  void* take(std::size_t size) {
    {
      std::lock_guard lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        idle_ -= size;
        return p;
      }
    }
    void* p = std::aligned_alloc(kAlign, size);
    if (p == nullptr) {
      release();  // memory may be idle in the cache: give it back and try once more
      p = std::aligned_alloc(kAlign, size);
    }
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }

  void give(void* p, std::size_t size) {
    {
      std::lock_guard lock(mutex_);
      if (idle_ + size <= kCacheLimit) {
        try {
          free_[size].push_back(p);
          idle_ += size;
          return;
        } catch (...) {  // no memory for the list itself: the block goes back to the system
        }
      }
    }
    std::free(p);
  }

  void release() {
    std::lock_guard lock(mutex_);
    for (auto& [size, blocks] : free_)
      for (void* p : blocks) std::free(p);
    free_.clear();
    idle_ = 0;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  std::size_t idle_ = 0;
};

// Never destroyed: tensors in static objects may be freed after every other static is gone.
BlockCache& cache() {
  static BlockCache* instance = new BlockCache;
  return *instance;
}

// Storage bytes in use and their high-water mark (memory_stats()). Relaxed: they are statistics,
// and a peak raced by two allocations still ends at the larger of the two sums it saw.
std::atomic<std::int64_t> live_bytes{0}, peak_bytes{0};

void count_allocation(std::int64_t size) noexcept {
  const std::int64_t now = live_bytes.fetch_add(size, std::memory_order_relaxed) + size;
  std::int64_t peak = peak_bytes.load(std::memory_order_relaxed);
  while (now > peak && !peak_bytes.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

}  // namespace

Storage::Storage(std::size_t n) : bytes(n) {
  if (n <= kInlineBytes) {
    data = inline_bytes;
    return;
  }
  const std::size_t size = size_class(n);
  data = static_cast<std::byte*>(cache().take(size));
  count_allocation(static_cast<std::int64_t>(size));
}

Storage::~Storage() {
  if (data == inline_bytes) return;
  const std::size_t size = size_class(bytes);
  live_bytes.fetch_sub(static_cast<std::int64_t>(size), std::memory_order_relaxed);
  cache().give(data, size);
}

}  // namespace detail

void release_cached_memory() { detail::cache().release(); }

MemoryStats memory_stats() noexcept {
  return {detail::live_bytes.load(std::memory_order_relaxed), detail::peak_bytes.load(std::memory_order_relaxed)};
}

void reset_peak_memory() noexcept { detail::peak_bytes.store(detail::live_bytes.load(std::memory_order_relaxed), std::memory_order_relaxed); }

}  // namespace tapegrad
