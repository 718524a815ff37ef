// Cross-check against an independent implementation: data/torch_reference.txt holds 260 random
// problems (200 multi-head, 60 scaled dot-product) solved by data/gen_torch_reference.py in
// PyTorch float64 with autograd. Outputs and every gradient must agree to 1e-10.
#define BOOST_TEST_MODULE torch_reference
#include <fstream>
#include <map>
#include <sstream>

#include "support.hpp"

namespace tg = tapegrad;
using namespace tg_test;
using tg::Tensor;

namespace {

struct Case {
  std::string kind;
  std::int64_t heads = 0, offset = 0;
  bool causal = false;
  std::map<std::string, Tensor> t;
  Tensor get(const std::string& name) const {
    auto it = t.find(name);
    return it == t.end() ? Tensor() : it->second;
  }
};

std::vector<Case> load() {
  std::ifstream in(TAPEGRAD_TEST_DATA "/torch_reference.txt");
  BOOST_REQUIRE_MESSAGE(in, "cannot open " TAPEGRAD_TEST_DATA "/torch_reference.txt");
  std::vector<Case> cases;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#' || line == "end") continue;
    std::istringstream ss(line);
    std::string head;
    ss >> head;
    if (head == "case") {
      cases.emplace_back();
      int causal = 0;
      ss >> cases.back().kind >> cases.back().heads >> causal >> cases.back().offset;
      cases.back().causal = causal != 0;
      continue;
    }
    std::string dtype;
    std::size_t rank = 0;
    ss >> dtype >> rank;
    tg::Shape shape(rank);
    for (auto& d : shape) ss >> d;
    std::vector<double> v;
    for (double x; ss >> x;) v.push_back(x);
    if (dtype == "bool") cases.back().t[head] = tg::from_bools(std::vector<bool>(v.begin(), v.end()), shape);
    else cases.back().t[head] = tg::from_vector(v, shape);
  }
  return cases;
}

void check(const Tensor& got, const Tensor& want, const std::string& what) {
  BOOST_REQUIRE_MESSAGE(got.defined(), what << " missing");
  BOOST_REQUIRE_MESSAGE(got.shape() == want.shape(), what << " shape " << fmt::format("{}", got.shape()) << " vs " << fmt::format("{}", want.shape()));
  const auto a = got.to_vector<double>(), b = want.to_vector<double>();
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(std::abs(a[i] - b[i]) <= 1e-10 * std::max(1.0, std::abs(b[i])))) {
      BOOST_ERROR(what << " element " << i << ": " << a[i] << " vs torch " << b[i]);
      return;
    }
}

}  // namespace

BOOST_AUTO_TEST_CASE(agrees_with_pytorch_float64) {
  const auto cases = load();
  BOOST_TEST(cases.size() >= 260u);
  std::size_t compared = 0;
  for (std::size_t n = 0; n < cases.size(); ++n) {
    const Case& c = cases[n];
    BOOST_TEST_CONTEXT("case " << n << " (" << c.kind << ")") {
      std::map<std::string, Tensor> leaves;
      for (const auto& [name, t] : c.t)
        if (t.dtype() == tg::float64 && name.rfind("d_", 0) != 0 && name.rfind("grad_", 0) != 0 && name != "output" && name != "attention")
          leaves[name] = t.detach().set_requires_grad();
      auto leaf = [&](const char* name) { return leaves.count(name) ? leaves[name] : Tensor(); };
      tg::AttentionResult r;
      if (c.kind == "mha") {
        r = tg::multihead_attention({leaf("query"), leaf("context"), leaf("bias")},
                                    {leaf("w_q"), leaf("w_k"), leaf("w_v"), leaf("w_o"), leaf("b_q"), leaf("b_k"), leaf("b_v"), leaf("b_o")},
                                    {c.get("key_mask"), c.get("query_mask"), c.get("attention_mask")}, c.heads, c.causal, c.offset);
      } else {
        r = tg::scaled_dot_product_attention(leaf("q"), leaf("k"), leaf("v"), c.get("mask"));
      }
      check(r.output, c.get("output"), "output");
      check(r.weights, c.get("attention"), "attention");
      tg::backward({r.output, r.weights}, {c.get("grad_output"), c.get("grad_attention")});
      for (auto& [name, x] : leaves) {
        const Tensor g = x.grad().defined() ? x.grad() : tg::zeros_like(x);
        check(g, c.get("d_" + name), "gradient of " + name);
        ++compared;
      }
      tg::clear_tape();
    }
  }
  BOOST_TEST_MESSAGE("compared " << compared << " gradients over " << cases.size() << " cases");
}
