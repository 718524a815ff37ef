// Module: names, order, counting, modes and gradients, all derived from visit().
#define BOOST_TEST_MODULE module
#include "support.hpp"

namespace tg = tapegrad;
using namespace tg_test;
using tg::Tensor;

namespace {

struct Leaf final : tg::Module {
  explicit Leaf(std::int64_t n) : w(tg::ones({n, 2}).set_requires_grad()), b(tg::zeros({2}).set_requires_grad()) {}
  void visit(tg::ModuleVisitor& v) override {
    v.parameter("w", w);
    v.parameter("b", b);
  }
  Tensor w, b;
};

struct Tree final : tg::Module {
  Tree() {
    for (int i = 0; i < 2; ++i) blocks.emplace_back(3 + i);
  }
  void visit(tg::ModuleVisitor& v) override {
    v.parameter("scale", scale);
    v.module("head", head);
    v.modules("blocks", blocks);
  }
  Tensor scale = tg::ones({1}).set_requires_grad();
  Leaf head{1};
  std::vector<Leaf> blocks;
};

struct BadName final : tg::Module {
  void visit(tg::ModuleVisitor& v) override { v.parameter("a.b", t); }
  Tensor t = tg::ones({1});
};

}  // namespace

BOOST_AUTO_TEST_CASE(parameters_are_named_hierarchically_in_visit_order) {
  Tree tree;
  std::vector<std::string> names;
  for (const auto& p : tree.named_parameters()) names.push_back(p.name);
  BOOST_TEST(names == (std::vector<std::string>{"scale", "head.w", "head.b", "blocks.0.w", "blocks.0.b", "blocks.1.w", "blocks.1.b"}),
             boost::test_tools::per_element());
  BOOST_TEST(tree.parameter_count() == 1 + 2 + 2 + 6 + 2 + 8 + 2);
  // Handles, not copies: an in-place update through the list reaches the member.
  tg::fill_(tree.parameter("blocks.1.b"), 5.0);
  BOOST_TEST(tree.blocks[1].b.to_vector<float>() == (std::vector<float>{5, 5}));
  check_throws<tg::ValueError>([&] { tree.parameter("blocks.2.w"); }, {"Module::parameter", "'blocks.2.w'", "blocks.1.w"});
}

BOOST_AUTO_TEST_CASE(modules_move_without_losing_their_parameters) {
  std::vector<Tree> trees;
  for (int i = 0; i < 3; ++i) trees.emplace_back();  // reallocations move the modules
  tg::fill_(trees[0].head.w, 2.0);
  BOOST_TEST(trees[0].named_parameters()[1].tensor.to_vector<float>()[0] == 2.0f);
}

BOOST_AUTO_TEST_CASE(train_and_eval_reach_every_descendant) {
  Tree tree;
  BOOST_TEST(tree.is_training());
  tree.eval();
  BOOST_TEST(!tree.is_training());
  BOOST_TEST(!tree.head.is_training());
  BOOST_TEST(!tree.blocks[1].is_training());
  tree.train();
  BOOST_TEST(tree.blocks[1].is_training());
}

BOOST_AUTO_TEST_CASE(zero_grad_drops_every_gradient) {
  Tree tree;
  Tensor loss = tg::sum(tree.scale) + tg::sum(tree.blocks[0].w);
  tg::backward(loss);
  BOOST_TEST(tree.scale.grad().defined());
  tree.zero_grad();
  for (const auto& p : tree.named_parameters()) BOOST_TEST(!p.tensor.grad().defined(), p.name);
}

BOOST_AUTO_TEST_CASE(bad_names_are_refused) {
  BadName bad;
  check_throws<tg::ValueError>([&] { bad.named_parameters(); }, {"Module::visit", "'a.b'"});
}

namespace {
struct Tied final : tg::Module {
  void visit(tg::ModuleVisitor& v) override {
    v.module("first", first);
    v.module("second", second);
  }
  Leaf first{2}, second{2};
};
struct DottedChild final : tg::Module {
  void visit(tg::ModuleVisitor& v) override { v.module("a.b", child); }
  Leaf child{1};
};
}  // namespace

BOOST_AUTO_TEST_CASE(a_shared_parameter_is_listed_once_under_its_first_name) {
  Tied tied;
  tied.second.w = tied.first.w;  // weight tying: one tensor, two layers
  std::vector<std::string> names;
  for (const auto& p : tied.named_parameters()) names.push_back(p.name);
  BOOST_TEST(names == (std::vector<std::string>{"first.w", "first.b", "second.b"}), boost::test_tools::per_element());
  BOOST_TEST(tied.parameter_count() == 4 + 2 + 2);
  tg::SGD opt(tied.named_parameters());  // accepted: each tensor once
}

BOOST_AUTO_TEST_CASE(module_names_with_a_dot_are_refused) {
  DottedChild m;
  check_throws<tg::ValueError>([&] { m.named_parameters(); }, {"Module::visit", "'a.b'"});
}

// A module's generators are reached by name, as references: restoring one through
// named_generators() makes the next dropout draw the same mask again.
BOOST_AUTO_TEST_CASE(named_generators_reach_each_dropout_stream) {
  tg::TransformerBlock block({.dim = 8, .heads = 2, .dropout = 0.5, .seed = 3});
  std::vector<std::string> names;
  for (const auto& g : block.named_generators()) names.push_back(g.name);
  BOOST_TEST(names == (std::vector<std::string>{"drop.generator", "ff.drop.generator"}), boost::test_tools::per_element());
  const Tensor x = tg::randn({2, 3, 8}, 1);
  std::vector<Tensor> states;
  for (const auto& g : block.named_generators()) states.push_back(g.generator.get().get_state());
  const auto first = block.forward(x).to_vector<float>();
  BOOST_TEST(block.forward(x).to_vector<float>() != first);  // the streams moved on
  for (std::size_t i = 0; i < states.size(); ++i) block.named_generators()[i].generator.get().set_state(states[i]);
  BOOST_TEST(block.forward(x).to_vector<float>() == first);
  struct BadGenerator final : tg::Module {
    void visit(tg::ModuleVisitor& v) override { v.generator("a.b", gen); }
    tg::Generator gen{1};
  } bad;
  check_throws<tg::ValueError>([&] { bad.named_generators(); }, {"Module::visit", "generator", "'a.b'"});
}
