// Internal: what every op source shares on top of the loop engine: recording an op (of one input,
// one output or several), the argument checks several ops make, and the reduction that undoes a
// broadcast.
#pragma once

#include <initializer_list>
#include <span>

#include "autodiff/loops.hpp"
#include "autodiff/saved_output.hpp"
#include "tapegrad/autodiff/tape.hpp"

namespace tapegrad::detail {

// Sums g over the dims that broadcasting added or stretched, giving a tensor of `shape`
// (the backward of every broadcasting op).
Tensor sum_to(const Tensor& g, const Shape& shape);

// Records an op, of one output or several (see record_op); the backward is only wrapped in a
// std::function when the op is actually recorded. `saved` lists exactly the tensors the backward
// captures (and so reads): the op table's in-place test fails for an op that leaves one out.
template <class Backward>
void record(const char* name, std::span<const Tensor> inputs, std::span<Tensor> outs,
            std::initializer_list<Tensor> saved, Backward&& backward) {
  if (should_record(inputs))
    record_op(name, inputs, outs, std::forward<Backward>(backward),
              std::span<const Tensor>(saved.begin(), saved.size()));
}
template <class Backward>
void record(const char* name, std::initializer_list<Tensor> inputs, Tensor& out, std::initializer_list<Tensor> saved,
            Backward&& backward) {
  record(name, std::span<const Tensor>(inputs.begin(), inputs.size()), std::span<Tensor>(&out, 1), saved,
         std::forward<Backward>(backward));
}

// Records an op of one input whose backward is dx = backward(g), g the gradient of its output.
template <class Backward>
void record_one(const char* name, const Tensor& x, Tensor& out, std::initializer_list<Tensor> saved,
                Backward&& backward) {
  record(name, {x}, out, saved,
         [backward = std::forward<Backward>(backward)](std::span<const Tensor> g, const std::vector<bool>&) {
           return std::vector<Tensor>{backward(g[0])};
         });
}

// a and b defined and of one dtype, any (compare's and where's operands); errors name `op`.
inline void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  check_defined(op, "a", a);
  check_defined(op, "b", b);
  if (a.dtype() != b.dtype())
    fail<DTypeError>("{}: arguments 'a' ({} {}) and 'b' ({} {}) must have the same dtype", op, a.dtype(),
                     shape_str(a.shape()), b.dtype(), shape_str(b.shape()));
}

// Argument `name` (of `shape`) broadcasts to argument `to_name`'s shape `to` without enlarging it.
inline void check_broadcasts_to(const char* op, const char* name, const Shape& shape, const char* to_name,
                                const Shape& to) {
  if (broadcast_args(op, to_name, to, name, shape) != to)
    fail<ShapeError>("{}: argument '{}' with shape {} must broadcast to the shape of '{}', {}", op, name,
                     shape_str(shape), to_name, shape_str(to));
}

// t, after check_self: what a Tensor member that calls its op passes it.
inline const Tensor& checked_self(const char* member, const Tensor& t) {
  check_self(member, t);
  return t;
}

}  // namespace tapegrad::detail
