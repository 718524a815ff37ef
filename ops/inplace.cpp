// In-place updates (see inplace.hpp): checked, never recorded, and counted in the version of
// the storage they write.
#include "tapegrad/ops/inplace.hpp"

#include <cmath>
#include <type_traits>

#include "autodiff/node.hpp"
#include "kernels/optimizer_loops.hpp"
#include "kernels/rounded_copy.hpp"
#include "ops/op.hpp"

namespace tapegrad {
namespace {
using namespace detail;

void check_dst(const char* op, const Tensor& dst, bool floating, const char* name = "dst") {
  if (floating) check_floating(op, name, dst);
  else check_defined(op, name, dst);
  if (const Node* n = live_node(*dst.impl()))
    fail<GraphError>("{}: argument '{}' (shape {}) is the output of recorded op {}, whose graph is still alive; "
                     "in-place updates apply to leaves (parameters, gradients, optimizer state) or tensors made "
                     "under NoGradGuard",
                     op, name, shape_str(dst.shape()), n->name);
  for (std::size_t d = 0; d < dst.shape().size(); ++d)
    if (dst.strides()[d] == 0 && dst.shape()[d] > 1)
      fail<ShapeError>("{}: argument '{}' (shape {}, strides {}) is an expanded view whose elements share memory; "
                       "write into the unexpanded tensor",
                       op, name, shape_str(dst.shape()), shape_str(dst.strides()));
}

// A source operand, broadcast to dst and of dst's dtype. When it shares memory with dst in a
// different layout, a copy is read instead: writing dst must not change what is still to be read.
Tensor source(const char* op, const char* name, const Tensor& dst, const Tensor& src) {
  check_defined(op, name, src);
  if (src.dtype() != dst.dtype())
    fail<DTypeError>("{}: argument '{}' ({} {}) must have the dtype of 'dst' ({} {}); convert it with to()", op, name,
                     src.dtype(), shape_str(src.shape()), dst.dtype(), shape_str(dst.shape()));
  check_broadcasts_to(op, name, src.shape(), "dst", dst.shape());
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

void adam_update_(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq, const AdamStep& s) {
  const char* op = "adam_update_";
  for (auto [name, t] : {std::pair{"param", &param}, {"exp_avg", &exp_avg}, {"exp_avg_sq", &exp_avg_sq}}) check_dst(op, *t, true, name);
  check_floating(op, "grad", grad);
  for (auto [name, t] : {std::pair{"grad", &grad}, {"exp_avg", &exp_avg}, {"exp_avg_sq", &exp_avg_sq}})
    check_like(op, name, *t, "param", param);
  if (!(s.step >= 1)) fail<ValueError>("{}: the step count t must be >= 1, got {}", op, s.step);
  if (!std::isfinite(s.grad_scale)) fail<ValueError>("{}: grad_scale must be finite, got {}", op, s.grad_scale);
  // One pass over contiguous arrays that share no memory; anything else runs on copies, which
  // go back afterwards (every input read before anything is written).
  const Tensor* all[] = {&param, &grad, &exp_avg, &exp_avg_sq};
  bool direct = true;
  for (std::size_t i = 0; i < 4; ++i) {
    direct = direct && all[i]->is_contiguous();
    for (std::size_t j = 0; j < i; ++j) direct = direct && !all[i]->shares_storage_with(*all[j]);
  }
  const Tensor p = direct ? param : copy_of(param), g = direct ? grad : copy_of(grad);
  const Tensor m = direct ? exp_avg : copy_of(exp_avg), v = direct ? exp_avg_sq : copy_of(exp_avg_sq);
  const double bias1 = 1 - std::pow(s.beta1, s.step), bias2 = 1 - std::pow(s.beta2, s.step);
  // A weight's bfloat16 copy is rewritten in the same pass (rounded_copy.hpp).
  std::uint16_t* const rounded = direct ? rounded_copy_to_write(param) : nullptr;
  visit_float(param.dtype(), op, [&]<class T>(Tag<T>) {
    const double decay = s.decoupled ? 1 - s.lr * s.weight_decay : s.weight_decay;
    const AdamScalars<T> k{static_cast<T>(decay), static_cast<T>(s.beta1), static_cast<T>(1 - s.beta1), static_cast<T>(s.beta2),
                           static_cast<T>(1 - s.beta2), static_cast<T>(std::sqrt(bias2)), static_cast<T>(s.eps),
                           static_cast<T>(-s.lr / bias1), static_cast<T>(s.grad_scale), s.decoupled && s.weight_decay != 0,
                           !s.decoupled && s.weight_decay != 0, s.grad_scale != 1};
    if constexpr (std::is_same_v<T, float>)
      adam_update(static_cast<T*>(mutable_data(p)), static_cast<const T*>(g.raw_data()), static_cast<T*>(mutable_data(m)),
                  static_cast<T*>(mutable_data(v)), p.numel(), k, rounded);
    else
      adam_update(static_cast<T*>(mutable_data(p)), static_cast<const T*>(g.raw_data()), static_cast<T*>(mutable_data(m)),
                  static_cast<T*>(mutable_data(v)), p.numel(), k);
  });
  if (!direct)
    for (auto [dst, src] : {std::pair{&param, &p}, {&exp_avg, &m}, {&exp_avg_sq, &v}}) copy_into(*dst, *src);
  for (const Tensor* t : {&param, &exp_avg, &exp_avg_sq}) bump_version(*t);
  if (rounded != nullptr) rounded_copy_written(param);
}

}  // namespace tapegrad
