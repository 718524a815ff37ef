// In-place updates (see inplace.hpp): checked, never recorded, and counted in the version of
// the storage they write.
#include "tapegrad/ops/inplace.hpp"

#include <cmath>

#include "autodiff/node.hpp"
#include "ops/op.hpp"

namespace tapegrad {
namespace {
using namespace detail;

void check_dst(const char* op, const Tensor& dst, bool floating) {
  if (floating) check_floating(op, "dst", dst);
  else check_defined(op, "dst", dst);
  if (const Node* n = live_node(*dst.impl()))
    fail<GraphError>("{}: argument 'dst' (shape {}) is the output of recorded op {}, whose graph is still alive; "
                     "in-place updates apply to leaves (parameters, gradients, optimizer state) or tensors made "
                     "under NoGradGuard",
                     op, shape_str(dst.shape()), n->name);
  for (std::size_t d = 0; d < dst.shape().size(); ++d)
    if (dst.strides()[d] == 0 && dst.shape()[d] > 1)
      fail<ShapeError>("{}: argument 'dst' (shape {}, strides {}) is an expanded view whose elements share memory; "
                       "write into the unexpanded tensor",
                       op, shape_str(dst.shape()), shape_str(dst.strides()));
}

// A source operand, broadcast to dst and of dst's dtype. When it shares memory with dst in a
// different layout, a copy is read instead: writing dst must not change what is still to be read.
Tensor source(const char* op, const char* name, const Tensor& dst, const Tensor& src) {
  check_defined(op, name, src);
  if (src.dtype() != dst.dtype())
    fail<DTypeError>("{}: argument '{}' ({} {}) must have the dtype of 'dst' ({} {}); convert it with to()", op, name,
                     src.dtype(), shape_str(src.shape()), dst.dtype(), shape_str(dst.shape()));
  if (broadcast_args(op, "dst", dst.shape(), name, src.shape()) != dst.shape())
    fail<ShapeError>("{}: argument '{}' with shape {} must broadcast to the shape of 'dst', {}", op, name,
                     shape_str(src.shape()), shape_str(dst.shape()));
  const bool same_layout = src.offset() == dst.offset() && src.shape() == dst.shape() && src.strides() == dst.strides();
  return src.shares_storage_with(dst) && !same_layout ? copy_of(src) : src;
}

// dst[i] = f(dst[i], srcs[i]...) over dst's elements, then the version bump.
template <class... Srcs, class F> void update(const Tensor& dst, F f, const Srcs&... srcs) {
  visit_float(dst.dtype(), "in-place update", [&]<class T>(Tag<T>) {
    map_into<T, T, decltype(sizeof(Srcs), T())...>(dst, [&](T d, auto... s) { return f(d, s...); }, dst, srcs...);
  });
  bump_version(dst);
}

}  // namespace

void copy_(const Tensor& dst, const Tensor& src) {
  check_dst("copy_", dst, /*floating=*/false);
  copy_into(dst, source("copy_", "src", dst, src));
  bump_version(dst);
}

void fill_(const Tensor& dst, double value) {
  check_dst("fill_", dst, /*floating=*/false);
  visit_any(dst.dtype(), [&]<class T>(Tag<T>) { map_into<T>(dst, [v = convert<T>(value)] { return v; }); });
  bump_version(dst);
}

void zero_(const Tensor& dst) {
  check_dst("zero_", dst, /*floating=*/false);
  fill_(dst, 0.0);
}

void add_(const Tensor& dst, const Tensor& src, double alpha) {
  check_dst("add_", dst, true);
  update(dst, [alpha](auto d, auto s) { return d + static_cast<decltype(d)>(alpha) * s; }, source("add_", "src", dst, src));
}

void mul_(const Tensor& dst, double factor) {
  check_dst("mul_", dst, true);
  update(dst, [factor](auto d) { return d * static_cast<decltype(d)>(factor); });
}

void mul_(const Tensor& dst, const Tensor& src) {
  check_dst("mul_", dst, true);
  update(dst, [](auto d, auto s) { return d * s; }, source("mul_", "src", dst, src));
}

void addcmul_(const Tensor& dst, const Tensor& a, const Tensor& b, double value) {
  check_dst("addcmul_", dst, true);
  update(dst, [value](auto d, auto x, auto y) { return d + static_cast<decltype(d)>(value) * x * y; },
         source("addcmul_", "a", dst, a), source("addcmul_", "b", dst, b));
}

void addcdiv_(const Tensor& dst, const Tensor& a, const Tensor& b, double value) {
  check_dst("addcdiv_", dst, true);
  update(dst, [value](auto d, auto x, auto y) { return d + static_cast<decltype(d)>(value) * x / y; },
         source("addcdiv_", "a", dst, a), source("addcdiv_", "b", dst, b));
}

void lerp_(const Tensor& dst, const Tensor& end, double weight) {
  check_dst("lerp_", dst, true);
  // PyTorch's two forms, so that the result is PyTorch's and weight 1 gives `end` exactly.
  update(dst,
         [weight](auto d, auto e) {
           using T = decltype(d);
           const T w = static_cast<T>(weight);
           return std::abs(w) < T(0.5) ? d + w * (e - d) : e - (e - d) * (T(1) - w);
         },
         source("lerp_", "end", dst, end));
}

}  // namespace tapegrad
