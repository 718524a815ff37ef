// Finite-difference gradient checker (see gradcheck.hpp for the method).
#include "tapegrad/autodiff/gradcheck.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "autodiff/loops.hpp"
#include "tapegrad/autodiff/tape.hpp"

namespace tapegrad {
namespace {
using namespace detail;

// A new leaf with its own copy of x's whole storage and x's exact layout, so a strided input
// stays strided and perturbing it never touches the caller's tensor.
Tensor private_copy(const Tensor& x) {
  Tensor copy = x.detach();
  const Storage& src = *x.impl()->storage;
  copy.impl()->storage = std::make_shared<Storage>(src.bytes);
  if (src.bytes) std::memcpy(copy.impl()->storage->data, src.data, src.bytes);
  return copy.set_requires_grad(x.requires_grad());
}

// f's outputs with grad mode on, even if the caller is inside a NoGradGuard.
template <class F> std::vector<Tensor> evaluate_with_grad(const F& f) {
  EnableGradGuard grad_on;
  return f();
}

bool has_aliasing(const Tensor& x) {
  for (std::size_t d = 0; d < x.shape().size(); ++d)
    if (x.strides()[d] == 0 && x.shape()[d] > 1) return true;
  return false;
}

std::string shapes_str(const std::vector<Tensor>& ts) {
  std::string out;
  for (const auto& t : ts) out += t.defined() ? fmt::format("{} {}, ", shape_str(t.shape()), t.dtype()) : "undefined, ";
  return out.empty() ? "nothing" : out.substr(0, out.size() - 2);
}

// <w, f(x)> for outputs that must look exactly like the first evaluation's: the projection
// weights were drawn for those shapes.
double projected_loss(const char* op, const std::vector<Tensor>& outputs, const std::vector<Tensor>& first,
                      const std::vector<std::vector<double>>& w) {
  bool same = outputs.size() == first.size();
  for (std::size_t o = 0; same && o < outputs.size(); ++o)
    same = outputs[o].defined() && outputs[o].shape() == first[o].shape() && outputs[o].dtype() == first[o].dtype();
  if (!same)
    fail<ValueError>("{}: f returned {} for perturbed inputs but {} for the inputs given; {} needs "
                     "outputs whose number, shapes and dtypes do not depend on the input values",
                     op, shapes_str(outputs), shapes_str(first), op);
  double loss = 0.0;
  for (std::size_t o = 0; o < outputs.size(); ++o) {
    const auto v = outputs[o].to_vector<double>();
    for (std::size_t i = 0; i < v.size(); ++i)
      if (w[o][i] != 0.0) loss += v[i] * w[o][i];  // a left-out (infinite) output: 0 * inf would be NaN
  }
  return loss;
}

void check_options(const char* op, const GradcheckOptions& options) {
  if (!(options.eps > 0) || !(options.atol >= 0) || !(options.rtol >= 0))
    fail<ValueError>("{}: options need eps > 0, atol >= 0 and rtol >= 0, got eps={} atol={} rtol={}", op, options.eps,
                     options.atol, options.rtol);
}

void check_perturbable(const char* op, const char* list, std::size_t i, const Tensor& x) {
  const std::string name = fmt::format("{}[{}]", list, i);
  check_dtype(op, name.c_str(), x, DType::float64);
  if (x.requires_grad() && has_aliasing(x))
    fail<ValueError>("{}: argument '{}' (shape {}, strides {}) has elements that share memory (an expanded view); pass "
                     "the unexpanded tensor and expand inside the function",
                     op, name, shape_str(x.shape()), shape_str(x.strides()));
}

// A check over no element would pass whatever the gradient: refused, as PyTorch's gradcheck does.
void check_something_checked(const char* op, const char* list, const std::vector<Tensor>& xs, const std::vector<bool>& checked) {
  std::int64_t elements = 0;
  for (std::size_t i = 0; i < xs.size(); ++i)
    if (checked[i]) elements += xs[i].numel();
  if (elements == 0)
    fail<ValueError>("{}: nothing to check: {}; give at least one {} that requires grad and has elements "
                     "(got {} {}: {})",
                     op, std::count(checked.begin(), checked.end(), true) == 0 ? fmt::format("no {} requires grad", list)
                                                                              : fmt::format("every {} that requires grad is empty", list),
                     list, xs.size(), list, shapes_str(xs));
}

// The checks of gradcheck_parameters and gradgradcheck_parameters.
void check_parameters(const char* op, const std::vector<Tensor>& parameters, const GradcheckOptions& options) {
  check_options(op, options);
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    check_perturbable(op, "parameters", i, parameters[i]);
    if (!parameters[i].requires_grad() || !parameters[i].is_leaf())
      fail<GraphError>("{}: argument 'parameters[{}]' (shape {}) must be a leaf that requires grad", op, i,
                       shape_str(parameters[i].shape()));
  }
  check_something_checked(op, "parameter", parameters, std::vector<bool>(parameters.size(), true));
}

// The checks of gradcheck and gradgradcheck, and private copies of the inputs for f to see (so an
// f that writes its argument never reaches the caller's tensors); checked[i]: input i requires grad.
std::vector<Tensor> private_inputs(const char* op, const std::vector<Tensor>& inputs, const GradcheckOptions& options,
                                   std::vector<bool>& checked) {
  check_options(op, options);
  std::vector<Tensor> own;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    check_perturbable(op, "inputs", i, inputs[i]);
    own.push_back(private_copy(inputs[i]));
    checked.push_back(inputs[i].requires_grad());
  }
  check_something_checked(op, "input", own, checked);
  return own;
}

// Weights for f's outputs (`what`), drawn from `seed`: float64 normal, 0 where an output is
// infinite at the inputs given (a masked log-softmax's -inf), as that element has no finite
// difference; a NaN keeps its weight and fails the check. `checked`: they require grad.
std::vector<Tensor> draw_weights(const char* op, const char* what, const std::vector<Tensor>& outputs,
                                 std::uint64_t seed, bool checked) {
  std::vector<Tensor> ws;
  Generator gen(seed);
  for (std::size_t o = 0; o < outputs.size(); ++o) {
    check_dtype(op, fmt::format("{}[{}]", what, o).c_str(), outputs[o], DType::float64);
    std::vector<double> w = randn(outputs[o].shape(), gen, DType::float64).to_vector<double>();
    const std::vector<double> values = outputs[o].to_vector<double>();
    for (std::size_t i = 0; i < w.size(); ++i)
      if (std::isinf(values[i])) w[i] = 0.0;
    ws.push_back(from_vector(std::span<const double>(w), outputs[o].shape()).set_requires_grad(checked));
  }
  return ws;
}

// The gradients of <gs, ys> (the ys that require grad) with respect to `wanted`, zeros where none
// reaches. With create_graph they are recorded: gradgradcheck's h in gradcheck's analytic pass.
std::vector<Tensor> first_gradients(const std::vector<Tensor>& ys, const std::vector<Tensor>& wanted, const Tensor* gs,
                                    std::size_t count, bool create_graph) {
  std::vector<Tensor> outs, weights;
  for (std::size_t o = 0; o < ys.size() && o < count; ++o)
    if (ys[o].requires_grad()) {
      outs.push_back(ys[o]);
      weights.push_back(gs[o]);
    }
  std::vector<Tensor> grads(wanted.size());
  if (!outs.empty()) grads = grad(outs, wanted, weights, {.create_graph = create_graph, .allow_unused = true});
  for (std::size_t i = 0; i < grads.size(); ++i)
    if (!grads[i].defined()) grads[i] = zeros(wanted[i].shape(), wanted[i].dtype());
  return grads;
}

// The method of gradcheck.hpp. `evaluate` computes f from the tensors in `perturbed`, whose
// elements are changed in place (and restored) one at a time; those with checked[i] are leaves.
// The analytic gradients come from grad(), so no .grad changes: neither the checked tensors'
// nor those of other leaves f uses.
GradcheckResult check(const char* op, const std::function<std::vector<Tensor>()>& evaluate, const std::vector<Tensor>& perturbed,
                      const std::vector<bool>& checked, const GradcheckOptions& options) {
  // Analytic: one backward of L = sum_o <w_o, f(x)_o>, i.e. grad_outputs = w.
  const std::vector<Tensor> outputs = evaluate_with_grad(evaluate);
  const std::vector<Tensor> weights = draw_weights(op, "f(inputs)", outputs, options.seed, /*checked=*/false);
  std::vector<std::vector<double>> w;  // the same, for the numeric passes
  for (const Tensor& wo : weights) w.push_back(wo.to_vector<double>());
  std::vector<Tensor> wanted;
  for (std::size_t i = 0; i < perturbed.size(); ++i)
    if (checked[i]) wanted.push_back(perturbed[i]);
  const std::vector<Tensor> gradients = first_gradients(outputs, wanted, weights.data(), weights.size(), false);

  GradcheckResult result;
  result.ok = true;
  double worst = -std::numeric_limits<double>::infinity();
  NoGradGuard no_grad;
  for (std::size_t i = 0, k = 0; i < perturbed.size(); ++i) {
    if (!checked[i]) continue;
    const Tensor& x = perturbed[i];
    const std::vector<double> analytic = gradients[k++].to_vector<double>();
    double* base = static_cast<double*>(mutable_data(x));
    for (std::int64_t e = 0; e < x.numel(); ++e) {
      const Shape index = unravel_index(e, x.shape());
      std::int64_t at = 0;
      for (std::size_t d = 0; d < index.size(); ++d) at += index[d] * x.strides()[d];
      // Put the element back however the evaluations end (f may throw, and the tensor may be
      // the caller's own parameter).
      struct Restore {
        double* at;
        double value;
        ~Restore() { *at = value; }
      } restore{base + at, base[at]};
      base[at] = restore.value + options.eps;
      const double plus = projected_loss(op, evaluate(), outputs, w);
      base[at] = restore.value - options.eps;
      const double minus = projected_loss(op, evaluate(), outputs, w);
      const double numeric = (plus - minus) / (2 * options.eps);
      const double a = analytic[static_cast<std::size_t>(e)];
      const double err = std::abs(a - numeric);
      const double tolerance = options.atol + options.rtol * std::abs(numeric);
      // The error as a multiple of its element's tolerance (> 1 fails): an element whose
      // gradient is 0 ranks by its error against atol alone, not ahead of every real one.
      const double ratio = !std::isfinite(err) ? std::numeric_limits<double>::infinity()
                           : err == 0.0        ? 0.0
                           : tolerance > 0.0   ? err / tolerance
                                               : std::numeric_limits<double>::infinity();
      ++result.elements_checked;
      if (!(err <= tolerance)) result.ok = false;
      if (ratio > worst) {
        worst = ratio;
        result.input = i;
        result.index = index;
        result.analytic = a;
        result.numeric = numeric;
        result.abs_error = err;
      }
    }
  }
  return result;
}

}  // namespace

std::string GradcheckResult::report() const {
  if (elements_checked == 0) return check + ": nothing was checked";
  return fmt::format(
      "{}: {} over {} element(s); worst: input {} at {}: analytic {:.10g}, numeric {:.10g}, |diff| {:.3g}",
      check, ok ? "passed" : "FAILED", elements_checked, input, shape_str(index), analytic, numeric, abs_error);
}

GradcheckResult gradcheck(const GradcheckFn& f, const std::vector<Tensor>& inputs, const GradcheckOptions& options) {
  std::vector<bool> checked;
  const std::vector<Tensor> xs = private_inputs("gradcheck", inputs, options, checked);
  return check("gradcheck", [&] { return f(xs); }, xs, checked, options);
}

GradcheckResult gradcheck_parameters(const std::function<std::vector<Tensor>()>& f, const std::vector<Tensor>& parameters,
                                     const GradcheckOptions& options) {
  const char* op = "gradcheck_parameters";
  check_parameters(op, parameters, options);
  return check(op, f, parameters, std::vector<bool>(parameters.size(), true), options);
}

GradcheckResult gradgradcheck(const GradcheckFn& f, const std::vector<Tensor>& inputs, const std::vector<Tensor>& grad_outputs,
                              const GradcheckOptions& options) {
  const char* op = "gradgradcheck";
  // f only ever sees private copies: also the first evaluation below, which draws the upstream gradients.
  std::vector<bool> checked;
  const std::vector<Tensor> own = private_inputs(op, inputs, options, checked);
  const std::vector<Tensor> outputs = evaluate_with_grad([&] { return f(own); });
  std::vector<Tensor> gs = grad_outputs;
  if (grad_outputs.empty()) {
    gs = draw_weights(op, "f(inputs)", outputs, options.seed + 1, /*checked=*/true);
  } else {
    if (grad_outputs.size() != outputs.size())
      fail<ValueError>("{}: f returned {} outputs but {} grad_outputs were given; give one per output", op, outputs.size(),
                       grad_outputs.size());
    for (std::size_t o = 0; o < outputs.size(); ++o) {
      check_perturbable(op, "grad_outputs", o, grad_outputs[o]);
      check_like(op, fmt::format("grad_outputs[{}]", o).c_str(), grad_outputs[o], fmt::format("f(inputs)[{}]", o).c_str(), outputs[o]);
    }
  }
  const std::size_t n = inputs.size();
  const GradcheckFn h = [&](const std::vector<Tensor>& all) {
    const bool analytic = is_grad_enabled();
    EnableGradGuard grad_on;
    const std::vector<Tensor> xs(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n));
    std::vector<Tensor> wanted;
    for (const Tensor& x : xs)
      if (x.requires_grad()) wanted.push_back(x);
    return first_gradients(f(xs), wanted, all.data() + n, all.size() - n, analytic);
  };
  std::vector<Tensor> all = own;
  all.insert(all.end(), gs.begin(), gs.end());
  GradcheckResult r = gradcheck(h, all, options);
  r.check = op;
  return r;
}

GradcheckResult gradgradcheck_parameters(const std::function<std::vector<Tensor>()>& f, const std::vector<Tensor>& parameters,
                                         const GradcheckOptions& options) {
  const char* op = "gradgradcheck_parameters";
  check_parameters(op, parameters, options);
  const std::vector<Tensor> gs = draw_weights(op, "f()", evaluate_with_grad(f), options.seed + 1, /*checked=*/false);
  const auto h = [&] {
    const bool analytic = is_grad_enabled();
    EnableGradGuard grad_on;
    return first_gradients(f(), parameters, gs.data(), gs.size(), analytic);
  };
  GradcheckResult r = gradcheck_parameters(h, parameters, options);
  r.check = op;
  return r;
}

}  // namespace tapegrad
