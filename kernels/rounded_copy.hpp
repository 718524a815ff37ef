// Internal: bfloat16 copies of weights, kept beside their float32 values. A bfloat16 product
// rounds its operands first, and a training step reads each weight in two products (y = x w and
// dx = g wᵀ): rounding them afresh each time was most of the rounding a bfloat16 step pays. The
// first bfloat16 product that reads a float32 leaf requiring grad makes the copy; it is used
// while the storage's version is unchanged (any in-place write bumps it), and Adam's update
// writes it in the same pass as the weights while products keep reading it. Its bytes count in
// memory_stats() and are freed with the weight.
#pragma once

#include <cstdint>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad::detail {

// x's storage rounded to bfloat16 bits (nearest even, NaN and infinities kept: what a bfloat16
// product rounds its operands to), current with the storage's version; x's element [0, ..., 0]
// is at the result + x.offset(). nullptr when x is not float32, or when its storage has no copy
// and x is not a leaf that requires grad.
const std::uint16_t* rounded_copy(const Tensor& x);

// For an update that rewrites all of param's storage (contiguous, from offset 0): the copy to
// write the rounded new values into, or nullptr when there is none or no product has read it
// since the last update (then the version makes the next reader round afresh). Once the update
// has bumped the version, rounded_copy_written(param) marks the copy current.
std::uint16_t* rounded_copy_to_write(const Tensor& param);
void rounded_copy_written(const Tensor& param) noexcept;

// How many rounded copies exist (for tests).
std::int64_t rounded_copies() noexcept;

}  // namespace tapegrad::detail
