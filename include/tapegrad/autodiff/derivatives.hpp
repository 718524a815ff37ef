// Second derivatives and whole Jacobians, built on grad() and create_graph (tape.hpp).
//
// Each function differentiates f at fresh leaves holding the values of the tensors given, so the
// caller's tensors, their .grad and their graphs are left alone. f is run with grad mode on.
// Results carry no history.
#pragma once

#include <functional>
#include <vector>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

// H v, the Hessian of the one-element f(xs) at xs applied to vs (one per x, of its shape and
// dtype), without forming H: one backward with create_graph for the gradient, then one backward
// of the gradient with upstream vs (H is symmetric, so the vector-Jacobian product is H v).
// Gives one tensor per x; an x that f does not depend on gets zeros.
std::vector<Tensor> hessian_vector_product(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                           const std::vector<Tensor>& xs, const std::vector<Tensor>& vs);
Tensor hessian_vector_product(const std::function<Tensor(const Tensor&)>& f, const Tensor& x, const Tensor& v);

// The Jacobian of y = f(x): shape y.shape() + x.shape(), entry [i..., j...] = dy[i...] / dx[j...].
// One backward per element of y: meant for small tensors.
Tensor jacobian(const std::function<Tensor(const Tensor&)>& f, const Tensor& x);

// The Hessian of the one-element f(x): shape x.shape() + x.shape(). One backward per element of x
// through the gradient's graph: meant for small tensors. Zeros when f depends on x through no
// recorded op (but on other tensors that require grad).
Tensor hessian(const std::function<Tensor(const Tensor&)>& f, const Tensor& x);

}  // namespace tapegrad
