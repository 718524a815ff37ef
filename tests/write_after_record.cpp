#include "write_after_record.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>

#include "autodiff/saved_versions.hpp"

namespace tg_test {
namespace tg = tapegrad;
using tg::Tensor;

namespace {

// Gradients as bits, so that NaN equals NaN and -0 differs from 0: "exactly" means bitwise.
std::vector<std::vector<std::uint64_t>> grads_of(const std::vector<Tensor>& leaves) {
  std::vector<std::vector<std::uint64_t>> out;
  for (const Tensor& l : leaves) {
    std::vector<std::uint64_t> bits;
    if (l.grad().defined())
      for (double x : l.grad().to_vector<double>()) {
        std::uint64_t b = 0;
        std::memcpy(&b, &x, sizeof b);
        bits.push_back(b);
      }
    out.push_back(std::move(bits));
  }
  return out;
}

void run_backward(const std::vector<Tensor>& outs, std::uint64_t seed) {
  std::vector<Tensor> roots, grads;
  tg::Generator gen(seed);
  for (const Tensor& o : outs)
    if (o.defined() && o.requires_grad()) {
      roots.push_back(o);
      grads.push_back(tg::randn(o.shape(), gen, o.dtype()));
    }
  if (!roots.empty()) tg::backward(roots, grads);
}

}  // namespace

void write_into(const Tensor& t) {
  if (t.numel() == 0) return;
  if (!t.is_leaf()) {
    if (t.dtype() == tg::float32) t.data<float>()[0] += 1.0f;
    else t.data<double>()[0] += 1.0;
    return;
  }
  tg::NoGradGuard no_grad;
  Tensor changed;
  if (tg::is_floating(t.dtype())) {
    changed = t.detach() * 1.25 + 0.5;
  } else if (t.dtype() == tg::bool_) {
    changed = tg::logical_not(t);
  } else {
    // Ids in [0, n) stay there: each non-negative v becomes (v + 1) mod (m + 1), m the largest.
    // Negative ones (an ignore_index) are left alone.
    std::vector<std::int64_t> v = t.to_vector<std::int64_t>();
    const std::int64_t m = *std::max_element(v.begin(), v.end());
    for (auto& x : v)
      if (x >= 0) x = (x + 1) % (m + 1);
    changed = tg::from_vector(v, t.shape());
  }
  tg::copy_(t, changed);
}

std::vector<std::pair<std::string, std::size_t>> reachable_saved(const std::vector<Tensor>& outputs,
                                                                 const std::vector<Tensor>& writable) {
  std::set<const tg::detail::Storage*> reachable;
  for (const Tensor& t : writable)
    if (t.defined()) reachable.insert(t.impl()->storage.get());
  std::set<std::pair<std::string, std::size_t>> found;
  std::set<const tg::detail::Node*> seen;
  std::vector<const tg::detail::Node*> todo;
  for (const Tensor& o : outputs)
    if (o.defined() && o.impl()->grad_fn) todo.push_back(o.impl()->grad_fn.get());
  while (!todo.empty()) {
    const tg::detail::Node* n = todo.back();
    todo.pop_back();
    if (!seen.insert(n).second) continue;
    for (const auto& s : n->saved)
      if (const auto storage = s.storage.lock(); storage && reachable.contains(storage.get())) found.emplace(n->name, s.position);
    for (const auto& e : n->inputs)
      if (e.node) todo.push_back(e.node.get());
  }
  return {found.begin(), found.end()};
}


std::vector<Write> write_after_record(const std::function<Recording()>& record, std::uint64_t seed, bool omit_written) {
  std::vector<Write> writes;
  const auto expected = [&] {
    const Recording r = record();
    run_backward(r.outputs, seed);
    return grads_of(r.grad_leaves);
  }();
  const std::size_t targets = record().writable.size();
  for (std::size_t target = 0; target < targets; ++target) {
    const Recording r = record();
    const auto& [name, written] = r.writable[target];
    if (!written.defined() || written.numel() == 0) continue;
    const bool declared = !reachable_saved(r.outputs, {written}).empty();
    write_into(written);
    std::optional<tg::detail::OmitSavedForTesting> omit;
    if (omit_written) omit.emplace(written);
    try {
      run_backward(r.outputs, seed);
    } catch (const tg::GraphError& e) {
      writes.push_back({name, Outcome::caught, declared, e.what()});
      continue;
    }
    writes.push_back({name, grads_of(r.grad_leaves) == expected ? Outcome::harmless : Outcome::wrong, declared, ""});
  }
  return writes;
}

}  // namespace tg_test
