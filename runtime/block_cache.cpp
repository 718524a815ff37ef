// The cache of freed blocks behind tensor storage, and the memory statistics (block_cache.hpp).
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "runtime/block_cache.hpp"

#include "tapegrad/runtime/memory.hpp"

namespace tapegrad {
namespace detail {
namespace {

constexpr std::size_t kAlign = 64;
constexpr std::size_t kClassesFrom = 256;
constexpr std::size_t kCacheLimit = std::size_t{2} << 30;    // at most 2 GiB kept idle

// Every block (all but the few bytes a Storage holds inline) comes from the cache below, not
// only the large ones whose fresh pages cost faults: glibc merges its lists of small free chunks
// whenever a block of 1 KiB or more is asked for, so a step's few mid-sized tensors slowed the
// hundreds of small allocations (shapes, nodes) around them.
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

// Each thread keeps a few freed blocks of each size below 64 KiB for itself, in front of the
// shared cache, whose lock two threads training at once would otherwise fight over. A block freed on another thread than the
// one that took it joins the freeing thread's blocks; a thread's blocks go to the shared cache
// when it exits.
constexpr std::size_t kLocalBelow = std::size_t{64} << 10;
constexpr int kLocalDepth = 8;
// Classes below kLocalBelow: 64, 128, 192, then four per power of two from 256 to 32 Ki.
constexpr int kLocalClasses = 3 + 4 * 8;

// The class of a size that size_class() returned, below kLocalBelow.
int local_class(std::size_t size) noexcept {
  if (size < kClassesFrom) return static_cast<int>(size / kAlign) - 1;
  const std::size_t p = std::bit_floor(size);
  return 3 + 4 * (std::countr_zero(p) - std::countr_zero(kClassesFrom)) + static_cast<int>((size - p) / (p / 4));
}

// Set when this thread's blocks have been handed back (its exit): later frees on it go to the
// shared cache. Trivially destructible, so it outlives every thread_local that holds a tensor.
thread_local constinit bool t_local_gone = false;

class LocalBlocks {
 public:
  LocalBlocks() = default;
  LocalBlocks(const LocalBlocks&) = delete;
  LocalBlocks& operator=(const LocalBlocks&) = delete;
  ~LocalBlocks() {
    t_local_gone = true;
    release();
  }
  void* take(std::size_t size) noexcept {
    Bin& b = bins_[static_cast<std::size_t>(local_class(size))];
    return b.count > 0 ? b.blocks[--b.count] : nullptr;
  }
  bool give(void* p, std::size_t size) noexcept {
    Bin& b = bins_[static_cast<std::size_t>(local_class(size))];
    if (b.count == kLocalDepth) return false;
    b.blocks[b.count++] = p;
    return true;
  }
  void release() noexcept;  // to the shared cache

 private:
  struct Bin {
    int count = 0;
    void* blocks[kLocalDepth];
  };
  std::array<Bin, kLocalClasses> bins_{};
};

LocalBlocks* local_blocks() noexcept {
  if (t_local_gone) return nullptr;
  thread_local LocalBlocks blocks;
  return &blocks;
}

// Storage bytes in use and their high-water mark (memory_stats()). Two counters, not one
// snapshot: an allocation raises `live` first and `peak` after, and a reset may race both, so
// a reader takes the larger of the two as the peak, and a reset raises the peak again to what
// is in use once it has stored it. Relaxed: they are statistics, ordered by nothing else.
std::atomic<std::int64_t> live_bytes{0}, peak_bytes{0};

void raise_peak(std::int64_t now) noexcept {
  std::int64_t peak = peak_bytes.load(std::memory_order_relaxed);
  while (now > peak && !peak_bytes.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void count_allocation(std::int64_t size) noexcept { raise_peak(live_bytes.fetch_add(size, std::memory_order_relaxed) + size); }

}  // namespace

void LocalBlocks::release() noexcept {
  for (std::size_t c = 0; c < bins_.size(); ++c) {
    Bin& b = bins_[c];
    while (b.count > 0) {
      void* p = b.blocks[--b.count];
      // The class's size: local_class is one-to-one on the sizes size_class gives.
      std::size_t size = 0;
      if (c < 3) size = (c + 1) * kAlign;
      else {
        const std::size_t p2 = kClassesFrom << ((c - 3) / 4);
        size = p2 + (c - 3) % 4 * (p2 / 4);
      }
      cache().give(p, size);
    }
  }
}

void* take_block(std::size_t bytes) {
  const std::size_t size = size_class(bytes);
  void* local = nullptr;
  if (size < kLocalBelow)
    if (LocalBlocks* l = local_blocks()) local = l->take(size);
  void* p = local != nullptr ? local : cache().take(size);
  count_allocation(static_cast<std::int64_t>(size));
  return p;
}

void give_block(void* p, std::size_t bytes) noexcept {
  const std::size_t size = size_class(bytes);
  live_bytes.fetch_sub(static_cast<std::int64_t>(size), std::memory_order_relaxed);
  if (size < kLocalBelow)
    if (LocalBlocks* l = local_blocks(); l != nullptr && l->give(p, size)) return;
  cache().give(p, size);
}

}  // namespace detail

void release_cached_memory() {
  if (detail::LocalBlocks* l = detail::local_blocks()) l->release();
  detail::cache().release();
}

MemoryStats memory_stats() noexcept {
  const std::int64_t live = detail::live_bytes.load(std::memory_order_relaxed);
  return {live, std::max(live, detail::peak_bytes.load(std::memory_order_relaxed))};
}

void reset_peak_memory() noexcept {
  detail::peak_bytes.store(detail::live_bytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
  detail::raise_peak(detail::live_bytes.load(std::memory_order_relaxed));  // what a racing allocation added meanwhile
}

}  // namespace tapegrad
