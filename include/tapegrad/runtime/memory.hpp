// The memory tensors hold, as the runtime's cache of blocks counts it.
#pragma once

#include <cstdint>

namespace tapegrad {

// Freed tensor buffers are kept (up to 2 GiB in all) for reuse by later tensors of a similar
// size; this returns them to the system.
void release_cached_memory();

// Bytes held by tensor storage now, and the most held at once since the last
// reset_peak_memory() (or since the start), summed over all threads. Counts what tensors use,
// rounded as allocated: not the cache of freed blocks above, not oneDNN's scratch buffers.
struct MemoryStats {
  std::int64_t current_bytes = 0;
  std::int64_t peak_bytes = 0;
};
// Every snapshot has peak_bytes >= current_bytes, also while other threads allocate.
MemoryStats memory_stats() noexcept;
// Starts the peak again from what is held now. With other threads allocating meanwhile, what
// they allocate while the reset runs may count toward the old peak or the new one; once it has
// returned, the peak is at least what is held, and grows with every allocation after it.
void reset_peak_memory() noexcept;

}  // namespace tapegrad
