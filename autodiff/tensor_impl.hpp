// Internal: what a Tensor handle points at. Not installed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "autodiff/check.hpp"
#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad::detail {

// The bytes behind one or more tensors. Up to kInlineBytes live inside the Storage object itself
// (one allocation for a small tensor); larger buffers, 64-byte aligned, come from the cache of freed
// blocks (runtime/block_cache.hpp), so repeated shapes reuse memory instead of faulting in fresh pages.
struct Storage {
  static constexpr std::size_t kInlineBytes = 64;
  explicit Storage(std::size_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  std::byte* data = nullptr;
  std::size_t bytes = 0;
  // Counts in-place writes to these bytes (by any view of them). A recorded op notes the
  // version of what its backward reads, and backward refuses to run on changed values.
  std::atomic<std::uint64_t> version{0};
  // What a kernel derives from these bytes and keeps while they live (a weight's bfloat16 copy,
  // kernels/rounded_copy.cpp). Set at most once; deleted with the storage.
  struct Derived {
    virtual ~Derived() = default;
  };
  std::atomic<Derived*> derived{nullptr};
  alignas(16) std::byte inline_bytes[kInlineBytes];
};

struct Node;  // autodiff/node.hpp

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;  // in elements
  std::int64_t offset = 0;
  DType dtype = DType::float32;

  // Autograd. A leaf requires grad when `leaf_requires_grad`; a non-leaf is output `slot` of the
  // node that made it, and requires grad while that node has not been released by clear_tape().
  bool leaf_requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;
  std::int32_t slot = 0;
};

// The element count of a shape that keeps the invariant (no check).
std::int64_t shape_numel(const Shape& shape) noexcept;
Shape contiguous_strides(const Shape& shape);
// Dense strides for `shape` that lay its dims out in memory in the order of the strides `like` (one
// per dim): the largest outermost, a 0 (a broadcast dim) outermost of all, ties in dim order. For a
// fresh tensor laid out as another one (a transposed operand stays transposed).
Shape dense_strides_like(const Shape& shape, const Shape& like);
// A view of base's storage. `op` is named if `shape` breaks the invariant. A view with elements
// must lie inside the storage: anything else is a tapegrad bug, reported as std::logic_error.
Tensor make_view(const Tensor& base, Shape shape, Shape strides, std::int64_t offset, const char* op);
// The node behind a non-leaf, or null for a leaf and for an output whose node was released.
Node* live_node(const TensorImpl& impl) noexcept;
// Pointer to element [0, ...] for kernels that fill a tensor they own (no version bump).
void* mutable_data(const Tensor& t);
// Marks an in-place write to t's storage (every view of it sees the new version).
void bump_version(const Tensor& t) noexcept;

}  // namespace tapegrad::detail
