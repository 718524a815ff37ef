// Module: a trainable piece of a model, in the libtorch / Flashlight sense.
//
// A layer owns its parameters (leaf tensors that require grad) and its child modules by value,
// as ordinary members, and lists them in one method, visit(): every other service (named
// parameter collection, counting, zeroing gradients, train/eval mode, checkpoints, optimizers)
// is derived from that list. Nothing stores pointers into a module, so modules move freely
// (a std::vector<TransformerBlock> is fine); copying is disabled because a copy would share its
// parameters with the original.
//
//   class Scale : public tg::Module {
//    public:
//     explicit Scale(std::int64_t n) : w(tg::ones({n}).set_requires_grad()) {}
//     tg::Tensor forward(const tg::Tensor& x) const { return x * w; }
//     void visit(tg::ModuleVisitor& v) override { v.parameter("w", w); }
//     tg::Tensor w;
//   };
//
// Parameter names are hierarchical, joined by '.', with list children numbered:
// "blocks.0.attn.w_q". Update parameters in place (ops/inplace.hpp); do not rebind the members,
// or a checkpoint loaded into the module would not reach what forward uses.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

class Module;

// What visit() reports to. Names must be non-empty and must not contain '.'.
class ModuleVisitor {
 public:
  virtual void parameter(std::string_view name, Tensor& t) = 0;
  virtual void module(std::string_view name, Module& m) = 0;
  // A random stream the module's forward draws from (Dropout's), so a checkpoint can resume it.
  virtual void generator(std::string_view name, Generator& g) = 0;
  // A list of children, named "<name>.0", "<name>.1"...
  template <class M> void modules(std::string_view name, std::vector<M>& list) {
    for (std::size_t i = 0; i < list.size(); ++i) list_child(name, i, list[i]);
  }

 protected:
  virtual void list_child(std::string_view list, std::size_t index, Module& m) = 0;
  ~ModuleVisitor() = default;
};

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

struct NamedGenerator {
  std::string name;
  std::reference_wrapper<Generator> generator;
};

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(Module&&) = default;
  Module& operator=(Module&&) = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Lists this module's own parameters and its direct children, always in the same order.
  virtual void visit(ModuleVisitor& v) = 0;

  // Every parameter of this module and its descendants, depth first in visit() order, with its
  // full name. The tensors are handles to the parameters themselves (not copies). A tensor
  // reached twice (a parameter shared by two layers) is listed once, under its first name.
  std::vector<NamedTensor> named_parameters();
  std::vector<Tensor> parameters();
  // The parameter called `name` (full dotted name), or a ValueError listing the names there are.
  Tensor parameter(std::string_view name);
  std::int64_t parameter_count();  // elements, over all parameters
  // Every generator visit() reports (a Dropout's), depth first with its full name
  // ("blocks.0.drop.generator"): the random state a checkpoint needs besides the parameters.
  std::vector<NamedGenerator> named_generators();
  void zero_grad();                // drops every parameter's accumulated gradient

  // Training mode (the default) or evaluation mode, for this module and every descendant:
  // dropout is the identity in evaluation mode.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const noexcept { return training_; }

 private:
  bool training_ = true;
};

}  // namespace tapegrad
