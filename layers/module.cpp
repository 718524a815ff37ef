// Module services, all derived from visit().
#include "tapegrad/layers/module.hpp"

#include <functional>
#include <set>

#include "autodiff/check.hpp"

namespace tapegrad {
namespace {
using detail::fail;

void check_name(std::string_view kind, std::string_view name) {
  if (name.empty() || name.find('.') != std::string_view::npos)
    fail<ValueError>("Module::visit: a {} name must be non-empty and contain no '.', got '{}'", kind, name);
}

// Walks a module tree, calling `on_parameter(full name, tensor)`, `on_module(module)` and
// `on_generator(full name, generator)`.
struct Walker final : ModuleVisitor {
  Walker(std::function<void(const std::string&, Tensor&)> on_parameter, std::function<void(Module&)> on_module,
         std::function<void(const std::string&, Generator&)> on_generator = nullptr)
      : on_parameter_(std::move(on_parameter)), on_module_(std::move(on_module)), on_generator_(std::move(on_generator)) {}

  void walk(Module& root) {
    if (on_module_) on_module_(root);
    root.visit(*this);
  }
  void parameter(std::string_view name, Tensor& t) override {
    check_name("parameter", name);
    if (on_parameter_) on_parameter_(prefix_ + std::string(name), t);
  }
  void generator(std::string_view name, Generator& g) override {
    check_name("generator", name);
    if (on_generator_) on_generator_(prefix_ + std::string(name), g);
  }
  void module(std::string_view name, Module& m) override {
    check_name("module", name);
    enter(name, m);
  }
  void list_child(std::string_view list, std::size_t index, Module& m) override {
    check_name("module list", list);
    enter(std::string(list) + "." + std::to_string(index), m);
  }
  void enter(std::string_view name, Module& m) {
    const std::size_t size = prefix_.size();
    prefix_ += std::string(name) + ".";
    if (on_module_) on_module_(m);
    m.visit(*this);
    prefix_.resize(size);
  }

  std::function<void(const std::string&, Tensor&)> on_parameter_;
  std::function<void(Module&)> on_module_;
  std::function<void(const std::string&, Generator&)> on_generator_;
  std::string prefix_;
};

}  // namespace

std::vector<NamedTensor> Module::named_parameters() {
  std::vector<NamedTensor> out;
  std::set<const detail::TensorImpl*> seen;  // a shared (tied) parameter is listed once, first name
  Walker([&](const std::string& name, Tensor& t) {
    if (!t.defined() || seen.insert(t.impl()).second) out.push_back({name, t});
  }, nullptr).walk(*this);
  return out;
}

std::vector<Tensor> Module::parameters() {
  std::vector<Tensor> out;
  for (auto& p : named_parameters()) out.push_back(std::move(p.tensor));
  return out;
}

Tensor Module::parameter(std::string_view name) {
  std::string names;
  for (auto& p : named_parameters()) {
    if (p.name == name) return p.tensor;
    if (names.size() < 400) names += (names.empty() ? "" : ", ") + p.name;
  }
  fail<ValueError>("Module::parameter: no parameter named '{}'; this module has: {}", name, names);
}

std::int64_t Module::parameter_count() {
  std::int64_t n = 0;
  for (const auto& p : named_parameters())
    if (__builtin_add_overflow(n, p.tensor.numel(), &n))
      detail::fail<ValueError>("Module::parameter_count: the parameters hold more than {} elements in all", INT64_MAX);
  return n;
}

std::vector<NamedGenerator> Module::named_generators() {
  std::vector<NamedGenerator> out;
  Walker(nullptr, nullptr, [&](const std::string& name, Generator& g) { out.push_back({name, g}); }).walk(*this);
  return out;
}

void Module::zero_grad() {
  for (auto& p : named_parameters()) p.tensor.zero_grad();
}

void Module::train(bool on) {
  Walker(nullptr, [on](Module& m) { m.training_ = on; }).walk(*this);
}

}  // namespace tapegrad
