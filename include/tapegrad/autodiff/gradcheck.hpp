// Finite-difference gradient checking, part of the public API.
//
// gradcheck compares the tape's gradient with float64 central differences. To check every
// output at the cost of one backward, it differentiates the scalar L = sum_o <w_o, f(x)_o> with
// fixed seeded random weights w_o (a random vector-Jacobian product: a wrong gradient shows up
// with probability 1). An output element that is infinite at the inputs given (a masked
// log-softmax's -inf) has no finite difference and is left out of L (weight 0 in both passes);
// a NaN output fails the check. Each element x of each input that requires grad is then perturbed:
//   numeric = (L(x + eps) - L(x - eps)) / (2 eps),   pass when |analytic - numeric| <= atol + rtol |numeric|.
// Inputs keep their layout (a transposed or sliced input stays one), so the check exercises
// non-contiguous paths. An input whose elements alias each other (an expanded view) cannot be
// perturbed one element at a time: pass the small tensor and expand inside the function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-7;
  double rtol = 1e-5;
  std::uint64_t seed = 0;  // for the projection weights w_o
};

struct GradcheckResult {
  bool ok = false;  // true only from a check that compared at least one element, all within tolerance
  std::size_t elements_checked = 0;
  // The worst element: largest |analytic - numeric| / (atol + rtol |numeric|), its error as a
  // multiple of its own tolerance (the check fails when that is above 1).
  std::size_t input = 0;  // which input
  Shape index;            // its multi-index in that input
  double analytic = 0.0;
  double numeric = 0.0;
  double abs_error = 0.0;
  std::string check = "gradcheck";  // which check ran, for report()
  std::string report() const;  // one paragraph, for failure messages and examples
};

using GradcheckFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// `inputs` must be float64. Those with requires_grad() are checked; the others are passed
// through unchanged. A check with nothing to compare (no input that requires grad, or only empty
// ones) is a ValueError, as in every checker below: it would pass whatever the gradient. f only
// ever sees private copies: the inputs given are not modified. The analytic pass records with grad
// mode on, whatever the caller's; its graph is freed when gradcheck returns. The number, shapes
// and dtypes of f's outputs must not depend on the input values (a ValueError otherwise). It may
// run inside an op's backward. No .grad changes, not even of leaves f uses without taking them.
GradcheckResult gradcheck(const GradcheckFn& f, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options = {});

// The same check for a function of tensors it does not take as arguments, such as a model's
// parameters: f() computes the outputs from `parameters` (float64 leaves that require grad),
// which are perturbed in place one element at a time and restored exactly. No .grad changes (of
// the parameters or of any other leaf). GradcheckResult::input indexes `parameters`.
//   gradcheck_parameters([&] { return std::vector{model.forward(ids)}; }, model.parameters());
GradcheckResult gradcheck_parameters(const std::function<std::vector<Tensor>()>& f, const std::vector<Tensor>& parameters,
                                     const GradcheckOptions& options = {});

// Second order: checks the gradients of f's gradients against float64 finite differences of
// them. It runs gradcheck on
//   h(inputs, grad_outputs) = grad(f(inputs), inputs that require grad, grad_outputs),
// computed with create_graph for the analytic pass, so a backward whose own gradient is wrong
// (or missing: one computed with raw loops) fails. h is differentiated with respect to the
// inputs that require grad and to grad_outputs: empty, they are drawn from `options.seed` (one
// per output of f, float64 normal, 0 where f's output is infinite) and checked; given, each
// must match its output's shape and dtype and is checked when it requires grad.
// GradcheckResult::input then numbers the inputs first and the grad_outputs after them.
GradcheckResult gradgradcheck(const GradcheckFn& f, const std::vector<Tensor>& inputs,
                              const std::vector<Tensor>& grad_outputs = {}, const GradcheckOptions& options = {});

// gradgradcheck for a function of tensors it captures (gradcheck_parameters' second order): the
// gradients of f() with respect to `parameters`, under upstream gradients drawn from
// options.seed, are checked against finite differences of them, each parameter perturbed in
// place and restored exactly; the parameters' .grad are left as they were.
GradcheckResult gradgradcheck_parameters(const std::function<std::vector<Tensor>()>& f, const std::vector<Tensor>& parameters,
                                         const GradcheckOptions& options = {});

}  // namespace tapegrad
