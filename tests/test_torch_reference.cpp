// Cross-checks against PyTorch. data/torch_reference.txt holds 260 random problems (200
// multi-head, 60 scaled dot-product) solved by data/gen_torch_reference.py, an independent
// implementation in PyTorch float64 with autograd: outputs and every gradient must agree to
// 1e-10. data/torch_optim_reference.txt holds PyTorch's optimizers run on given gradients.
#define BOOST_TEST_MODULE torch_reference
#include <fstream>
#include <map>
#include <memory>
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

// Optimizers and clipping against PyTorch's own (data/gen_torch_optim.py): SGD (momentum,
// Nesterov, weight decay), Adam (L2 weight decay), AdamW, each with and without
// clip_grad_norm, from the same float64 parameters and gradients for six steps, a parameter
// left without a gradient on one of them. Every parameter after every step, and every norm,
// must be PyTorch's to 1e-14 relative: the same formulas evaluated in the same order, so that
// only rounding differs (PyTorch's vector kernels fuse some multiply-adds, and it sums the
// norm's squares in another order). The old clipping rule, max_norm / total, is 1e-9 off.
BOOST_AUTO_TEST_CASE(optimizers_and_clipping_agree_with_pytorch) {
  auto close = [](double a, double b) { return std::abs(a - b) <= 1e-14 * std::max(1.0, std::abs(b)); };
  double worst = 0;
  std::ifstream in(TAPEGRAD_TEST_DATA "/torch_optim_reference.txt");
  BOOST_REQUIRE_MESSAGE(in, "cannot open " TAPEGRAD_TEST_DATA "/torch_optim_reference.txt");
  std::string kind;
  double lr = 0, momentum = 0, beta1 = 0, beta2 = 0, eps = 0, decay = 0, max_norm = 0;
  int nesterov = 0, steps = 0, count = 0;
  std::vector<Tensor> params;
  std::unique_ptr<tg::Optimizer> opt;
  std::map<int, Tensor> grads;
  std::size_t compared = 0;
  auto values = [](std::istringstream& ss) {
    std::vector<double> v;
    for (double x; ss >> x;) v.push_back(x);
    return v;
  };
  for (std::string line; std::getline(in, line);) {
    std::istringstream ss(line);
    std::string head;
    ss >> head;
    if (head == "case") {
      ss >> kind >> lr >> momentum >> nesterov >> beta1 >> beta2 >> eps >> decay >> max_norm >> steps >> count;
      params.clear();
      opt.reset();
    } else if (head == "init") {
      int i = 0, n = 0;
      ss >> i >> n;
      params.push_back(tg::from_vector(values(ss), {n}).set_requires_grad());
    } else if (head == "grad") {
      int step = 0, i = 0;
      ss >> step >> i;
      grads[i] = tg::from_vector(values(ss), params[static_cast<std::size_t>(i)].shape());
    } else if (head == "norm" || head == "after") {
      if (!opt) {
        std::vector<tg::NamedTensor> named;
        for (std::size_t i = 0; i < params.size(); ++i) named.push_back({fmt::format("p{}", i), params[i]});
        if (kind == "SGD") opt = std::make_unique<tg::SGD>(named, tg::SgdOptions{lr, momentum, decay, nesterov != 0});
        else if (kind == "Adam") opt = std::make_unique<tg::Adam>(named, tg::AdamOptions{lr, beta1, beta2, eps, decay});
        else opt = std::make_unique<tg::AdamW>(named, tg::AdamWOptions{lr, beta1, beta2, eps, decay});
      }
      if (!grads.empty()) {  // this step's gradients: backward of sum(p * g) gives exactly g
        opt->zero_grad();
        std::vector<Tensor> roots, ones;
        for (const auto& [i, g] : grads) {
          roots.push_back(tg::sum(params[static_cast<std::size_t>(i)] * g));
          ones.push_back(tg::ones({}, tg::float64));
        }
        tg::backward(roots, ones);
        grads.clear();
        double total = 0;
        if (max_norm > 0) total = tg::clip_grad_norm(params, max_norm);
        if (head == "norm") {
          int step = 0;
          ss >> step;
          const double want = values(ss).at(0);
          worst = std::max(worst, std::abs(total - want) / std::max(1.0, std::abs(want)));
          BOOST_CHECK_MESSAGE(close(total, want), kind << ": clip_grad_norm returned " << fmt::format("{:.17g}", total) << ", torch "
                                                  << fmt::format("{:.17g}", want));
          ++compared;
        }
        opt->step();
        if (head == "norm") continue;
      }
      int step = 0, i = 0;
      ss >> step >> i;
      const std::vector<double> want = values(ss), got = params[static_cast<std::size_t>(i)].to_vector<double>();
      for (std::size_t e = 0; e < want.size(); ++e) {
        worst = std::max(worst, std::abs(got[e] - want[e]) / std::max(1.0, std::abs(want[e])));
        BOOST_CHECK_MESSAGE(close(got[e], want[e]), kind << " (lr " << lr << ", max_norm " << max_norm << ") step " << step << ": parameter " << i
                                                    << " element " << e << " is " << fmt::format("{:.17g}", got[e]) << ", torch "
                                                    << fmt::format("{:.17g}", want[e]));
      }
      ++compared;
    }
  }
  BOOST_TEST(compared > 100u);
  BOOST_TEST_MESSAGE("compared " << compared << " parameters and norms; largest relative difference " << worst);
}
