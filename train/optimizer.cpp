// Optimizers, gradient clipping and the warm-up + cosine schedule (see optimizer.hpp).
#include "tapegrad/train/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <numbers>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "autodiff/check.hpp"
#include "tapegrad/autodiff/tape.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/inplace.hpp"
#include "tapegrad/ops/reduction.hpp"

namespace tapegrad {
namespace {
using detail::fail;
using detail::shape_str;

void check_range(const char* kind, const char* name, double value, double high) {
  if (!(value >= 0 && value < high))
    fail<ValueError>("{}: option '{}' must be in [0, {}), got {}", kind, name, high, value);
}

// The global norm of the parameters' gradients and the factor clip_grad_norm scales them by (1
// when none, or when the norm is not finite).
std::pair<double, double> clip_factor(const std::vector<Tensor>& parameters, double max_norm, const char* op) {
  if (!(max_norm > 0) || !std::isfinite(max_norm)) fail<ValueError>("{}: argument 'max_norm' must be finite and > 0, got {}", op, max_norm);
  double squares = 0;
  std::set<const detail::TensorImpl*> seen;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    detail::check_defined(op, fmt::format("parameters[{}]", i).c_str(), parameters[i]);
    if (!seen.insert(parameters[i].impl()).second) continue;  // a tied parameter counts once
    if (const Tensor g = parameters[i].grad(); g.defined()) squares += sum_of_squares(g);
  }
  const double total = std::sqrt(squares);
  // PyTorch's rule: the factor max_norm / (total + 1e-6), applied when below 1.
  const double factor = max_norm / (total + 1e-6);
  return {total, std::isfinite(total) && factor < 1 ? factor : 1.0};
}

}  // namespace

Optimizer::Optimizer(const char* kind, std::vector<NamedTensor> parameters, double lr)
    : kind_(kind), params_(std::move(parameters)), lr_(0) {
  set_learning_rate(lr);
  std::set<std::string> names;
  std::map<const detail::TensorImpl*, std::string> seen;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& [name, t] = params_[i];
    if (name.empty() || !names.insert(name).second)
      fail<ValueError>("{}: parameter {} has {} name '{}'; names must be unique and non-empty", kind, i,
                       name.empty() ? "an empty" : "a repeated", name);
    detail::check_floating(kind, name.c_str(), t);
    if (const auto [it, fresh] = seen.emplace(t.impl(), name); !fresh)
      fail<ValueError>("{}: parameters '{}' and '{}' are the same tensor; list a shared parameter once", kind, it->second, name);
    if (!t.requires_grad() || !t.is_leaf())
      fail<GraphError>("{}: parameter '{}' (shape {}) must be a leaf that requires grad{}", kind, name,
                       shape_str(t.shape()), t.is_leaf() ? "; call set_requires_grad()" : ", not the output of an op");
  }
}

void Optimizer::set_learning_rate(double lr) {
  if (!(lr >= 0) || !std::isfinite(lr)) fail<ValueError>("{}: the learning rate must be finite and >= 0, got {}", kind_, lr);
  lr_ = lr;
}

void Optimizer::check_step_count() const {
  if (steps_ == std::numeric_limits<std::int64_t>::max())
    fail<ValueError>("{}::step: steps() is already {}, the largest count an int64 holds (from load_state); load a smaller count",
                     kind_, steps_);
}

void Optimizer::zero_grad() {
  for (auto& p : params_) p.tensor.zero_grad();
}

std::size_t Optimizer::add_slot(const char* name, bool counter) {
  std::vector<Tensor> zeros;
  for (const auto& p : params_)
    zeros.push_back(counter ? tapegrad::zeros({}, DType::int64) : tapegrad::zeros(p.tensor.shape(), p.tensor.dtype()));
  slots_.emplace_back(name, std::move(zeros));
  return slots_.size() - 1;
}

std::vector<NamedTensor> Optimizer::state() const {
  std::vector<NamedTensor> out;
  for (const auto& [slot, tensors] : slots_)
    for (std::size_t i = 0; i < params_.size(); ++i) out.push_back({std::string(slot) + "." + params_[i].name, tensors[i]});
  return out;
}

void Optimizer::load_state(const std::vector<NamedTensor>& state, std::int64_t steps) {
  if (steps < 0) fail<ValueError>("{}::load_state: argument 'steps' must be >= 0, got {}", kind_, steps);
  const std::vector<NamedTensor> mine = this->state();
  if (state.size() != mine.size()) {
    std::set<std::string> given, expected;
    for (const auto& t : state) given.insert(t.name);
    for (const auto& t : mine) expected.insert(t.name);
    std::vector<std::string> missing, extra;
    std::set_difference(expected.begin(), expected.end(), given.begin(), given.end(), std::back_inserter(missing));
    std::set_difference(given.begin(), given.end(), expected.begin(), expected.end(), std::back_inserter(extra));
    auto some = [](const std::vector<std::string>& v) {
      const std::size_t shown = std::min<std::size_t>(v.size(), 3);
      return fmt::format("{}", fmt::join(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(shown), ", ")) + (v.size() > shown ? ", ..." : "");
    };
    fail<ValueError>("{}::load_state: expected {} state tensors, got {} ({} missing{}{}; {} not expected{}{})", kind_, mine.size(),
                     state.size(), missing.size(), missing.empty() ? "" : ": ", some(missing), extra.size(), extra.empty() ? "" : ": ",
                     some(extra));
  }
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const auto& [name, t] = state[i];
    if (name != mine[i].name)
      fail<ValueError>("{}::load_state: state tensor {} is '{}', expected '{}'", kind_, i, name, mine[i].name);
    detail::check_defined(fmt::format("{}::load_state", kind_).c_str(), name.c_str(), t);
    if (t.shape() != mine[i].tensor.shape() || t.dtype() != mine[i].tensor.dtype())
      fail<ShapeError>("{}::load_state: state tensor '{}' must be {} {}, got {} {}", kind_, name,
                       mine[i].tensor.dtype(), shape_str(mine[i].tensor.shape()), t.dtype(), shape_str(t.shape()));
    // A parameter's step count (the int64 slots) is at most the optimizer's: a step updates it once or not at all.
    if (t.dtype() == DType::int64)
      if (const auto count = t.to_vector<std::int64_t>()[0]; count < 0 || count > steps)
        fail<ValueError>("{}::load_state: state tensor '{}' counts {} steps; expected 0 to steps = {}", kind_, name, count,
                         steps);
  }
  for (std::size_t i = 0; i < mine.size(); ++i) copy_(mine[i].tensor, state[i].tensor);
  steps_ = steps;
}

SGD::SGD(std::vector<NamedTensor> parameters, const SgdOptions& options)
    : Optimizer("SGD", std::move(parameters), options.lr), options_(options) {
  check_range(kind_, "momentum", options.momentum, 1);
  check_range(kind_, "weight_decay", options.weight_decay, INFINITY);
  if (options.nesterov && options.momentum == 0)
    fail<ValueError>("SGD: option 'nesterov' needs momentum > 0, got momentum = 0");
  if (options.momentum > 0) velocity_ = add_slot("momentum");
}

void SGD::step() {
  check_step_count();
  NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i].tensor;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (options_.weight_decay != 0) g = g + p * options_.weight_decay;
    if (options_.momentum > 0) {
      const Tensor& v = slot(velocity_)[i];
      mul_(v, options_.momentum);  // v = momentum v + g
      add_(v, g);
      g = options_.nesterov ? g + v * options_.momentum : v;
    }
    add_(p, g, -lr_);
  }
  ++steps_;
}

Adam::Adam(std::vector<NamedTensor> parameters, const AdamOptions& options) : Adam("Adam", std::move(parameters), options, false) {}

Adam::Adam(const char* kind, std::vector<NamedTensor> parameters, const AdamOptions& options, bool decoupled)
    : Optimizer(kind, std::move(parameters), options.lr), options_(options), decoupled_(decoupled) {
  check_range(kind_, "beta1", options.beta1, 1);
  check_range(kind_, "beta2", options.beta2, 1);
  check_range(kind_, "weight_decay", options.weight_decay, INFINITY);
  check_range(kind_, "max_grad_norm", options.max_grad_norm, INFINITY);
  grad_norm_ = std::numeric_limits<double>::quiet_NaN();
  if (!(options.eps > 0) || !std::isfinite(options.eps)) fail<ValueError>("{}: option 'eps' must be finite and > 0, got {}", kind_, options.eps);
  exp_avg_ = add_slot("exp_avg");
  exp_avg_sq_ = add_slot("exp_avg_sq");
  step_ = add_slot("step", /*counter=*/true);
}

void Adam::step() {
  check_step_count();
  NoGradGuard no_grad;
  double scale = 1;
  if (options_.max_grad_norm > 0) {
    std::vector<Tensor> params;
    for (const auto& p : params_) params.push_back(p.tensor);
    std::tie(grad_norm_, scale) = clip_factor(params, options_.max_grad_norm, "Adam::step");
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i].tensor;
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    const Tensor& count = slot(step_)[i];
    const double t = count.item() + 1;
    fill_(count, t);
    adam_update_(p, g, slot(exp_avg_)[i], slot(exp_avg_sq_)[i],
                 {lr_, options_.beta1, options_.beta2, options_.eps, options_.weight_decay, decoupled_, t, scale});
  }
  ++steps_;
}

AdamW::AdamW(std::vector<NamedTensor> parameters, const AdamWOptions& o)
    : Adam("AdamW", std::move(parameters), {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.max_grad_norm}, true) {}

double clip_grad_norm(const std::vector<Tensor>& parameters, double max_norm) {
  NoGradGuard no_grad;
  const auto [total, factor] = clip_factor(parameters, max_norm, "clip_grad_norm");
  if (factor != 1) {
    std::set<const detail::TensorImpl*> seen;
    for (const Tensor& p : parameters)
      if (seen.insert(p.impl()).second)
        if (const Tensor g = p.grad(); g.defined()) mul_(g, factor);
  }
  return total;
}

WarmupCosine::WarmupCosine(double peak_lr, std::int64_t warmup, std::int64_t total, double final_lr)
    : peak_(peak_lr), final_(final_lr), warmup_(warmup), total_(total) {
  if (!(peak_lr >= 0) || !std::isfinite(peak_lr) || !(final_lr >= 0) || !std::isfinite(final_lr))
    fail<ValueError>("WarmupCosine: learning rates must be finite and >= 0, got peak_lr = {}, final_lr = {}", peak_lr, final_lr);
  if (warmup < 0 || total < warmup)
    fail<ValueError>("WarmupCosine: expected 0 <= warmup <= total, got warmup = {}, total = {}", warmup, total);
}

double WarmupCosine::operator()(std::int64_t step) const {
  if (step < 0) fail<ValueError>("WarmupCosine: argument 'step' must be >= 0, got {}", step);
  if (step < warmup_) return peak_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
  if (step >= total_) return final_;
  const double progress = static_cast<double>(step - warmup_) / static_cast<double>(std::max<std::int64_t>(total_ - warmup_, 1));
  return final_ + (peak_ - final_) * 0.5 * (1 + std::cos(std::numbers::pi * progress));
}

}  // namespace tapegrad
