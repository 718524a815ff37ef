// Tensor storage: a few bytes inline, anything larger a block of the runtime's cache.
#include "autodiff/tensor_impl.hpp"
#include "runtime/block_cache.hpp"

namespace tapegrad::detail {

Storage::Storage(std::size_t n) : bytes(n) {
  data = n <= kInlineBytes ? inline_bytes : static_cast<std::byte*>(take_block(n));
}

Storage::~Storage() {
  delete derived.load(std::memory_order_acquire);
  if (data != inline_bytes) give_block(data, bytes);
}

}  // namespace tapegrad::detail
