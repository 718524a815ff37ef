// Internal: what a Tensor handle points at. Not installed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad::detail {

// The bytes behind one or more tensors. Up to kInlineBytes live inside the Storage object itself
// (one allocation for a small tensor); larger buffers are 64-byte aligned and come from a cache
// of freed blocks (storage.cpp), so repeated shapes reuse memory instead of faulting in fresh
// pages every call.
struct Storage {
  static constexpr std::size_t kInlineBytes = 64;
  explicit Storage(std::size_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  std::byte* data = nullptr;
  std::size_t bytes = 0;
  alignas(16) std::byte inline_bytes[kInlineBytes];
};

struct TapeRef;  // defined in tape.cpp

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;  // in elements
  std::int64_t offset = 0;
  DType dtype = DType::float32;

  // Autograd. A leaf requires grad when `leaf_requires_grad`; a non-leaf when it was produced by
  // node `node` of tape `tape` and that tape has not been cleared since (epoch matches).
  bool leaf_requires_grad = false;
  Tensor grad;
  std::int64_t node = -1;
  std::int32_t slot = 0;
  const void* tape = nullptr;
  std::uint64_t epoch = 0;
};

std::int64_t shape_numel(const Shape& shape) noexcept;
// The element count of a shape a tensor may have: no negative size, and a byte count that fits
// in memory's address range. Throws a ShapeError naming `op` otherwise.
std::int64_t checked_numel(const char* op, const Shape& shape, DType dtype);
Shape contiguous_strides(const Shape& shape);
Tensor make_view(const Tensor& base, Shape shape, Shape strides, std::int64_t offset);
// True when this non-leaf still links to a live node of this thread's tape.
bool has_live_node(const TensorImpl& impl) noexcept;

}  // namespace tapegrad::detail
