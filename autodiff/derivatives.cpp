// Hessian-vector products, Jacobians and Hessians (see derivatives.hpp).
#include "tapegrad/autodiff/derivatives.hpp"

#include "autodiff/check.hpp"
#include "autodiff/loops.hpp"
#include "tapegrad/autodiff/tape.hpp"

namespace tapegrad {
namespace {
using namespace detail;

// A leaf holding x's values, for f to be differentiated at.
Tensor fresh_leaf(const char* op, const char* name, const Tensor& x) {
  check_floating(op, name, x);  // (which names an undefined x too)
  return copy_of(x).set_requires_grad();
}

Tensor scalar_output(const char* op, const Tensor& y) {
  if (!y.defined()) fail<Error>("{}: f returned an undefined tensor", op);
  if (y.numel() != 1)
    fail<ShapeError>("{}: f must return a one-element tensor (a loss), got shape {}", op, shape_str(y.shape()));
  if (!y.requires_grad())
    fail<GraphError>("{}: f's result does not depend on its inputs through recorded ops (it does not require grad)", op);
  return y;
}

// The unit tensor of `shape` with a 1 at flat position i.
Tensor unit(const Shape& shape, DType dtype, std::int64_t i) {
  std::vector<double> v(static_cast<std::size_t>(shape_numel(shape)), 0.0);
  v[static_cast<std::size_t>(i)] = 1.0;
  return from_vector(std::span<const double>(v), shape).to(dtype);
}

// The rows d y[i] / d leaf, stacked into a tensor of shape y's + leaf's: zero rows where no
// gradient reaches the leaf (y does not require grad, or depends on other leaves only).
Tensor jacobian_rows(const Tensor& y, const Tensor& leaf) {
  std::vector<double> v;
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    const Tensor r =
        y.requires_grad() ? grad({y}, {leaf}, {unit(y.shape(), y.dtype(), i)}, {.allow_unused = true})[0] : Tensor();
    const std::vector<double> part = r.defined() ? r.to(DType::float64).to_vector<double>()
                                                 : std::vector<double>(static_cast<std::size_t>(leaf.numel()), 0.0);
    v.insert(v.end(), part.begin(), part.end());
  }
  Shape shape = y.shape();
  shape.insert(shape.end(), leaf.shape().begin(), leaf.shape().end());
  return from_vector(std::span<const double>(v), shape).to(leaf.dtype());
}

}  // namespace

std::vector<Tensor> hessian_vector_product(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                           const std::vector<Tensor>& xs, const std::vector<Tensor>& vs) {
  const char* op = "hessian_vector_product";
  if (xs.size() != vs.size())
    fail<ValueError>("{}: got {} tensors 'xs' but {} directions 'vs'; give one direction per tensor", op, xs.size(), vs.size());
  std::vector<Tensor> leaves;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    leaves.push_back(fresh_leaf(op, fmt::format("xs[{}]", i).c_str(), xs[i]));
    check_like(op, fmt::format("vs[{}]", i).c_str(), vs[i], fmt::format("xs[{}]", i).c_str(), xs[i]);
  }
  EnableGradGuard grad_on;
  const Tensor y = scalar_output(op, f(leaves));
  std::vector<Tensor> g = grad({y}, leaves, {}, {.create_graph = true, .allow_unused = true});
  std::vector<Tensor> outs, directions;
  for (std::size_t i = 0; i < g.size(); ++i)
    if (g[i].defined() && g[i].requires_grad()) {
      outs.push_back(g[i]);
      directions.push_back(vs[i]);
    }
  std::vector<Tensor> hv(xs.size());
  if (!outs.empty()) hv = grad(outs, leaves, directions, {.allow_unused = true});
  for (std::size_t i = 0; i < hv.size(); ++i) hv[i] = hv[i].defined() ? hv[i].detach() : zeros(xs[i].shape(), xs[i].dtype());
  return hv;
}

Tensor hessian_vector_product(const std::function<Tensor(const Tensor&)>& f, const Tensor& x, const Tensor& v) {
  return hessian_vector_product([&](const std::vector<Tensor>& xs) { return f(xs[0]); }, {x}, {v})[0];
}

Tensor jacobian(const std::function<Tensor(const Tensor&)>& f, const Tensor& x) {
  const char* op = "jacobian";
  const Tensor leaf = fresh_leaf(op, "x", x);
  EnableGradGuard grad_on;
  const Tensor y = f(leaf);
  if (!y.defined()) fail<Error>("{}: f returned an undefined tensor", op);
  return jacobian_rows(y, leaf);
}

Tensor hessian(const std::function<Tensor(const Tensor&)>& f, const Tensor& x) {
  const char* op = "hessian";
  const Tensor leaf = fresh_leaf(op, "x", x);
  EnableGradGuard grad_on;
  const Tensor y = scalar_output(op, f(leaf));
  // Undefined when y depends on other leaves only: then H = 0, as jacobian's rows.
  const Tensor g = grad({y}, {leaf}, {}, {.create_graph = true, .allow_unused = true})[0];
  return jacobian_rows(g.defined() ? g : zeros(x.shape(), x.dtype()), leaf);
}

}  // namespace tapegrad
