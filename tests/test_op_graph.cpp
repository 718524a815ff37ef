// The op table, seen from the tape: every differentiable entry frees its graph with its
// tensors, and an in-place write to anything its backward reads is caught rather than turned
// into a wrong gradient.
#define BOOST_TEST_MODULE op_graph
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>

#include <map>

#include "autodiff/node.hpp"
#include "op_table.hpp"
#include "support.hpp"
#include "write_after_record.hpp"

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

namespace {

// One recording of an entry's op on a sample: its inputs, its outputs and the tensor arguments
// it made itself (masks, ids, targets, a layer's parameters), all writable; gradients compared
// on the inputs and on every argument that requires grad.
Recording record_entry(const OpInfo& info, const std::vector<Shape>& shapes, std::uint64_t seed) {
  Recording r;
  r.grad_leaves = fresh_leaves(info, shapes, seed);
  ArgCollector collector;
  r.outputs = info.op(r.grad_leaves);
  for (std::size_t k = 0; k < r.grad_leaves.size(); ++k) r.writable.emplace_back(fmt::format("input {}", k), r.grad_leaves[k]);
  for (std::size_t k = 0; k < r.outputs.size(); ++k)
    if (r.outputs[k].defined() && tg::is_floating(r.outputs[k].dtype())) r.writable.emplace_back(fmt::format("output {}", k), r.outputs[k]);
  for (std::size_t k = 0; k < collector.args.size(); ++k) {
    const Tensor& a = collector.args[k];
    r.writable.emplace_back(fmt::format("argument {} ({})", k, a.dtype()), a);
    if (a.requires_grad()) r.grad_leaves.push_back(a);
  }
  return r;
}

// write_after_record over every writable sample of an entry; each write's name gets its sample.
std::vector<std::pair<std::string, Write>> check_entry(const OpInfo& info, bool omit_written) {
  std::vector<std::pair<std::string, Write>> all;
  std::uint64_t seed = 500;
  for (const auto& shapes : writable_samples(info)) {
    ++seed;
    for (Write& w : write_after_record([&] { return record_entry(info, shapes, seed); }, seed, omit_written))
      all.emplace_back(fmt::format("{}", fmt::join(shapes, " ")), std::move(w));
  }
  return all;
}

}  // namespace

// For each input, output and argument in turn: record, write into it, run backward. Either
// backward refuses (the op saved what was written) or the gradients are exactly those of an
// untouched run (the op never reads it). A wrong gradient without an error fails.
BOOST_DATA_TEST_CASE(in_place_writes_after_recording_are_caught, bdata::make(op_names()), name) {
  const OpInfo& info = find_op(name);
  if (!info.differentiable) return;
  std::size_t caught = 0;
  for (const auto& [sample, w] : check_entry(info, false)) {
    BOOST_CHECK_MESSAGE(w.outcome != Outcome::wrong,
                        name << ": writing " << w.name << " (sample " << sample << ") after recording changed the gradient without an error");
    if (w.outcome != Outcome::caught) continue;
    ++caught;
    BOOST_CHECK_MESSAGE(w.message.find("modified in place") != std::string::npos, name << ": " << w.message);
  }
  BOOST_TEST_MESSAGE(name << ": " << caught << " writes caught");
}

// The check above can fail: with a written tensor's saved entries left out of the version check
// (as if its ops had not declared it), a write into each declared tensor changes a gradient in
// some sample (in others the write may change nothing the gradient depends on: a rank-0 index
// rotated, a query with one allowed key). So every declaration is needed, and the check notices
// it missing.
BOOST_DATA_TEST_CASE(the_check_catches_a_saved_entry_left_out, bdata::make(op_names()), name) {
  const OpInfo& info = find_op(name);
  if (!info.differentiable) return;
  std::map<std::string, bool> wrong_somewhere;  // per declared tensor
  for (const auto& [sample, w] : check_entry(info, true))
    if (w.declared) wrong_somewhere[w.name] |= w.outcome == Outcome::wrong;
  for (const auto& [tensor, wrong] : wrong_somewhere)
    BOOST_CHECK_MESSAGE(wrong, name << ": " << tensor << " is declared saved, but with the declaration left out no write into it "
                                    << "changed a gradient in any sample");
  BOOST_TEST_MESSAGE(name << ": " << wrong_somewhere.size() << " declared tensors, each a wrong gradient when left out");
}
