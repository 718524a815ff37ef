// Internal: the memory tensors' storage comes from. Freed blocks are kept (up to 2 GiB idle in
// all, and a few small ones per thread in front of the shared cache) for the next tensor of a
// similar size, so a training step's repeated shapes reuse memory instead of asking malloc and
// faulting in fresh pages; the bytes in use and their peak are counted for memory_stats().
#pragma once

#include <cstddef>

namespace tapegrad::detail {

// A 64-byte aligned block of at least `bytes` (rounded up to one of four sizes per power of
// two); throws std::bad_alloc when there is no memory, even after the idle blocks are released.
void* take_block(std::size_t bytes);
// Gives back a block that take_block(bytes) returned, with the same `bytes`.
void give_block(void* block, std::size_t bytes) noexcept;

}  // namespace tapegrad::detail
