// The op table, seen from the tape: every differentiable entry frees its graph with its
// tensors, and an in-place write to anything its backward reads is caught rather than turned
// into a wrong gradient.
#define BOOST_TEST_MODULE op_graph
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>

#include "op_table.hpp"
#include "support.hpp"

namespace tg = tapegrad;
namespace bdata = boost::unit_test::data;
using namespace tg_test;
using tg::Shape;
using tg::Tensor;

namespace {

std::vector<Tensor> fresh_leaves(const OpInfo& info, const std::vector<Shape>& shapes, std::uint64_t seed) {
  tg::Generator gen(seed);
  std::vector<Tensor> leaves;
  for (const auto& s : shapes)
    leaves.push_back((info.positive ? tg::rand(s, gen, tg::float64, 0.5, 2.0) : tg::randn(s, gen, tg::float64)).set_requires_grad());
  return leaves;
}

// Runs backward from every output that carries gradient, with seeded upstream gradients.
void run_backward(const std::vector<Tensor>& outs, std::uint64_t seed) {
  std::vector<Tensor> roots, grads;
  tg::Generator gen(seed);
  for (const auto& o : outs)
    if (o.defined() && o.requires_grad()) {
      roots.push_back(o);
      grads.push_back(tg::randn(o.shape(), gen, o.dtype()));
    }
  if (!roots.empty()) tg::backward(roots, grads);
}

std::vector<std::vector<double>> grads_of(const std::vector<Tensor>& leaves) {
  std::vector<std::vector<double>> out;
  for (const auto& l : leaves) out.push_back(l.grad().defined() ? l.grad().to_vector<double>() : std::vector<double>{});
  return out;
}

// The samples whose inputs are all non-empty (an in-place write needs an element to write).
std::vector<std::vector<Shape>> writable_samples(const OpInfo& info) {
  std::vector<std::vector<Shape>> out;
  for (const auto& shapes : info.samples) {
    bool all = true;
    for (const auto& s : shapes)
      for (auto d : s) all = all && d > 0;
    if (all) out.push_back(shapes);
  }
  return out;
}

}  // namespace

BOOST_DATA_TEST_CASE(graphs_are_freed_with_their_tensors, bdata::make(op_names()), name) {
  const OpInfo& info = find_op(name);
  if (!info.differentiable) return;
  tg::clear_tape();
  std::uint64_t seed = 100;
  for (const auto& shapes : info.samples) {
    {
      const auto leaves = fresh_leaves(info, shapes, ++seed);
      run_backward(info.op(leaves), seed);
    }
    BOOST_TEST(tg::tape_size() == 0u, name << " on sample " << seed << " left " << tg::tape_size() << " live nodes");
  }
}

// For each input and each output in turn: record, write one element in place, run backward.
// Either backward refuses (the op saved what was written) or the gradients are exactly those of
// an untouched run (the op never reads it). A wrong gradient without an error fails.
BOOST_DATA_TEST_CASE(in_place_writes_after_recording_are_caught, bdata::make(op_names()), name) {
  const OpInfo& info = find_op(name);
  if (!info.differentiable) return;
  std::uint64_t seed = 500;
  std::size_t caught = 0, harmless = 0;
  for (const auto& shapes : writable_samples(info)) {
    ++seed;
    const auto clean = fresh_leaves(info, shapes, seed);
    const std::size_t n_outputs = [&] {
      const auto outs = info.op(clean);
      run_backward(outs, seed);
      return outs.size();
    }();
    const auto expected = grads_of(clean);
    for (std::size_t target = 0; target < shapes.size() + n_outputs; ++target) {
      const auto leaves = fresh_leaves(info, shapes, seed);
      const auto outs = info.op(leaves);
      const bool is_input = target < shapes.size();
      const Tensor written = is_input ? leaves[target] : outs[target - shapes.size()];
      if (!written.defined() || !tg::is_floating(written.dtype()) || written.numel() == 0) continue;
      written.data<double>()[0] += 1.0;
      try {
        run_backward(outs, seed);
      } catch (const tg::GraphError& e) {
        BOOST_CHECK_MESSAGE(std::string(e.what()).find("modified in place") != std::string::npos, e.what());
        ++caught;
        continue;
      }
      BOOST_CHECK_MESSAGE(grads_of(leaves) == expected, name << ": writing " << (is_input ? "input " : "output ")
                                                             << (is_input ? target : target - shapes.size())
                                                             << " after recording changed the gradient without an error");
      ++harmless;
    }
  }
  BOOST_TEST_MESSAGE(name << ": " << caught << " writes caught, " << harmless << " harmless");
}
