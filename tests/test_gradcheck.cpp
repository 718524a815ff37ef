// The public gradient checker: it passes correct gradients, catches wrong ones, and reports
// where.
#define BOOST_TEST_MODULE gradcheck
#include "support.hpp"

namespace tg = tapegrad;
using namespace tg_test;
using tg::Tensor;

namespace {

// x^3 with a backward that is wrong by `error` (relative) on element 2 only.
Tensor cube_with_bug(const Tensor& x, double error) {
  Tensor y = tg::pow(x.detach(), 3.0);
  std::vector<Tensor> outs{y};
  const std::vector<Tensor> ins{x};
  tg::record_op("cube_with_bug", ins, outs, [x, error](std::span<const Tensor> g, const std::vector<bool>&) {
    Tensor d = tg::mul(g[0], tg::mul(tg::pow(x, 2.0), 3.0));
    std::vector<double> v = d.to_vector<double>();
    v[2] *= 1 + error;
    return std::vector<Tensor>{tg::from_vector(v, d.shape())};
  });
  return outs[0];
}

}  // namespace

BOOST_AUTO_TEST_CASE(passes_a_correct_gradient) {
  Tensor x = tg::randn({2, 3}, 1, tg::float64).set_requires_grad();
  Tensor w = tg::randn({3, 4}, 2, tg::float64).set_requires_grad();
  const auto r = tg::gradcheck([](const std::vector<Tensor>& in) { return std::vector<Tensor>{tg::tanh(tg::matmul(in[0], in[1]))}; }, {x, w});
  BOOST_TEST(r.ok, r.report());
  BOOST_TEST(r.elements_checked == 18u);
  BOOST_TEST(r.report().find("passed") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(catches_a_deliberately_wrong_backward) {
  Tensor x = tg::tensor({0.5, -1.0, 1.5, 2.0}, tg::float64).set_requires_grad();
  const auto good = tg::gradcheck([](const std::vector<Tensor>& in) { return std::vector<Tensor>{cube_with_bug(in[0], 0.0)}; }, {x});
  BOOST_TEST(good.ok, good.report());
  const auto bad = tg::gradcheck([](const std::vector<Tensor>& in) { return std::vector<Tensor>{cube_with_bug(in[0], 1e-3)}; }, {x});
  BOOST_TEST(!bad.ok);
  BOOST_TEST(bad.input == 0u);
  BOOST_TEST(bad.index == (tg::Shape{2}));
  // Both are d<w, f(x)>/dx with the same random w, so they differ by exactly the injected 0.1%.
  BOOST_TEST(std::abs(bad.analytic / bad.numeric - 1.001) < 1e-7);
  const std::string report = bad.report();
  BOOST_TEST(report.find("FAILED") != std::string::npos, report);
  BOOST_TEST(report.find("input 0 at [2]") != std::string::npos, report);
  tg::clear_tape();
}

// The worst element is the one furthest past its own tolerance: an input whose gradient is 0
// everywhere (unused here) must not displace the element with the real error.
BOOST_AUTO_TEST_CASE(reports_the_element_furthest_past_its_tolerance) {
  Tensor x = tg::tensor({0.5, -1.0, 1.5, 2.0}, tg::float64).set_requires_grad();
  Tensor unused = tg::tensor({1.0, 2.0, 3.0}, tg::float64).set_requires_grad();
  for (double error : {0.0, 1e-3}) {
    const auto r = tg::gradcheck([error](const std::vector<Tensor>& in) { return std::vector<Tensor>{cube_with_bug(in[1], error)}; }, {unused, x});
    BOOST_TEST_CONTEXT("backward wrong by " << error) {
      BOOST_TEST(r.ok == (error == 0.0), r.report());
      BOOST_TEST(r.input == 1u, r.report());  // the unused input's exact zeros are never the worst
      BOOST_TEST(r.abs_error > 0.0, r.report());
      if (error > 0) BOOST_TEST(r.index == (tg::Shape{2}));
    }
  }
  tg::clear_tape();
}

// A masked log-softmax is -inf at its masked entries: no finite difference exists there, so
// those outputs are left out and the gradient of the rest is checked. A NaN output still fails.
BOOST_AUTO_TEST_CASE(infinite_outputs_are_left_out_and_nan_outputs_fail) {
  Tensor s = tg::randn({2, 4}, 3, tg::float64).set_requires_grad();
  const Tensor allowed = tg::from_bools({true, false, true, true, false, true, true, true}, {2, 4});
  const auto r = tg::gradcheck([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{tg::log_softmax(in[0], allowed)}; }, {s});
  BOOST_TEST(r.ok, r.report());
  const auto nan = tg::gradcheck([](const std::vector<Tensor>& in) { return std::vector<Tensor>{tg::log(tg::sub(in[0], 10.0))}; }, {s});
  BOOST_TEST(!nan.ok, nan.report());
  tg::clear_tape();
}

BOOST_AUTO_TEST_CASE(checks_only_inputs_that_require_grad_and_keeps_their_layout) {
  Tensor base = tg::randn({4, 3}, 3, tg::float64);
  Tensor xt = base.transpose(0, 1).set_requires_grad();  // a non-contiguous leaf
  Tensor c = tg::randn({3, 4}, 4, tg::float64);            // a constant
  const auto before = xt.to_vector<double>();
  bool saw_strided = false;
  const auto r = tg::gradcheck(
      [&](const std::vector<Tensor>& in) {
        saw_strided = saw_strided || !in[0].is_contiguous();
        return std::vector<Tensor>{tg::exp(in[0]) * in[1], tg::sum(in[0] * in[0], {0})};
      },
      {xt, c});
  BOOST_TEST(r.ok, r.report());
  BOOST_TEST(r.elements_checked == 12u);
  BOOST_TEST(saw_strided);
  BOOST_TEST(xt.to_vector<double>() == before);
  BOOST_TEST(!xt.grad().defined());  // the caller's leaf is not touched either
}

BOOST_AUTO_TEST_CASE(works_inside_a_no_grad_scope) {
  Tensor x = tg::randn({3}, 5, tg::float64).set_requires_grad();
  tg::NoGradGuard no_grad;
  const auto r = tg::gradcheck([](const std::vector<Tensor>& in) { return std::vector<Tensor>{tg::exp(in[0])}; }, {x});
  BOOST_TEST(r.ok, r.report());
  BOOST_TEST(!tg::is_grad_enabled());
  tg::clear_tape();
}

BOOST_AUTO_TEST_CASE(rejects_what_it_cannot_check) {
  Tensor f = tg::randn({2}, 1, tg::float32).set_requires_grad();
  auto id = [](const std::vector<Tensor>& in) { return in; };
  check_throws<tg::DTypeError>([&] { tg::gradcheck(id, {f}); }, {"gradcheck", "'inputs[0]'", "float64", "float32"});
  Tensor e = tg::expand(tg::randn({1}, 1, tg::float64), {3}).detach().set_requires_grad();
  check_throws<tg::ValueError>([&] { tg::gradcheck(id, {e}); }, {"gradcheck", "'inputs[0]'", "expand"});
  Tensor x = tg::randn({2}, 1, tg::float64).set_requires_grad();
  check_throws<tg::ValueError>([&] { tg::gradcheck(id, {x}, {.eps = 0}); }, {"gradcheck", "eps"});
}

// A check that compared nothing would pass any gradient: every checker refuses it, whether no
// input requires grad or those that do are empty.
BOOST_AUTO_TEST_CASE(a_check_with_nothing_to_compare_is_a_value_error) {
  auto id = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * 2.0}; };
  const Tensor constant = tg::randn({3}, 1, tg::float64);
  const Tensor empty = tg::zeros({0, 2}, tg::float64).set_requires_grad();
  for (const auto& c : std::vector<std::pair<std::string, std::vector<Tensor>>>{
           {"no input requires grad", {constant}}, {"every input that requires grad is empty", {empty}}}) {
    const std::vector<Tensor>& inputs = c.second;  // (not a structured binding: clang 14 cannot capture those)
    check_throws<tg::ValueError>([&] { tg::gradcheck(id, inputs); }, {"gradcheck", "nothing to check", c.first});
    check_throws<tg::ValueError>([&] { tg::gradgradcheck(id, inputs); }, {"gradgradcheck", "nothing to check", c.first});
  }
  check_throws<tg::ValueError>([&] { tg::gradcheck_parameters([&] { return std::vector<Tensor>{constant * 2.0}; }, {}); },
                               {"gradcheck_parameters", "nothing to check", "no parameter"});
  check_throws<tg::ValueError>([&] { tg::gradgradcheck_parameters([&] { return std::vector<Tensor>{empty * 2.0}; }, {empty}); },
                               {"gradgradcheck_parameters", "nothing to check", "every parameter that requires grad is empty"});
  BOOST_TEST(!tg::GradcheckResult{}.ok);  // a result no check produced does not pass either
}

// f may write into its argument (a clone filled in place): whichever checker runs it, the
// caller's tensors keep their values and their version.
BOOST_AUTO_TEST_CASE(the_callers_inputs_are_never_handed_to_f) {
  const Tensor x = tg::tensor({1.0, 2.0, 3.0}, tg::float64).set_requires_grad();
  const Tensor c = tg::tensor({4.0, 5.0, 6.0}, tg::float64);
  const std::uint64_t x_version = x.version(), c_version = c.version();
  auto writes_its_arguments = [](const std::vector<Tensor>& in) {
    for (const Tensor& t : in) {
      tg::NoGradGuard off;
      tg::fill_(t.requires_grad() ? t.detach() : t, 42.0);
    }
    return std::vector<Tensor>{tg::sum(in[0] * in[0])};
  };
  (void)tg::gradcheck(writes_its_arguments, {x, c});
  (void)tg::gradgradcheck(writes_its_arguments, {x, c});
  BOOST_TEST(x.to_vector<double>() == (std::vector<double>{1, 2, 3}));
  BOOST_TEST(c.to_vector<double>() == (std::vector<double>{4, 5, 6}));
  BOOST_TEST(x.version() == x_version);
  BOOST_TEST(c.version() == c_version);
  BOOST_TEST(!x.grad().defined());
}

BOOST_AUTO_TEST_SUITE(value_dependent_outputs)

// The outputs a perturbation would change: gradcheck must refuse them, not read past the
// projection weights drawn for the first shapes.
BOOST_AUTO_TEST_CASE(a_shape_or_count_that_depends_on_the_values_is_a_value_error) {
  Tensor x = tg::tensor({0.0, 1.0}, tg::float64).set_requires_grad();
  auto longer_when_positive = [](const std::vector<Tensor>& in) {
    const bool positive = in[0].to_vector<double>()[0] > 0;
    return std::vector<Tensor>{positive ? tg::concat({in[0], in[0]}, 0) : in[0] * 1.0};
  };
  check_throws<tg::ValueError>([&] { tg::gradcheck(longer_when_positive, {x}); },
                               {"gradcheck", "[4] float64", "[2] float64", "do not depend on the input values"});
  auto more_when_positive = [](const std::vector<Tensor>& in) {
    std::vector<Tensor> out{in[0] * 2.0};
    if (in[0].to_vector<double>()[0] > 0) out.push_back(in[0] * 3.0);
    return out;
  };
  check_throws<tg::ValueError>([&] { tg::gradcheck(more_when_positive, {x}); }, {"gradcheck", "number"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(parameters_in_place)

BOOST_AUTO_TEST_CASE(checks_tensors_the_function_captures_and_restores_them) {
  Tensor w = tg::randn({3, 2}, 1, tg::float64).set_requires_grad();
  Tensor b = tg::randn({2}, 2, tg::float64).set_requires_grad();
  const Tensor x = tg::randn({4, 3}, 3, tg::float64);
  tg::backward(tg::sum(b * 5.0));  // a gradient the caller already has
  const auto before_w = w.to_vector<double>();
  const auto r = tg::gradcheck_parameters([&] { return std::vector<Tensor>{tg::tanh(tg::matmul(x, w) + b)}; }, {w, b});
  BOOST_TEST(r.ok, r.report());
  BOOST_TEST(r.elements_checked == 8u);
  BOOST_TEST(w.to_vector<double>() == before_w);        // values restored exactly
  check_close(b.grad(), {5, 5}, 0, "caller's gradient kept");
  BOOST_TEST(!w.grad().defined());
}

// The analytic pass takes gradients with grad(), so no leaf's .grad changes: not those of
// leaves f uses without their being checked, not those of the checked ones, and not when an
// argument is refused or listed twice.
BOOST_AUTO_TEST_CASE(no_gradient_of_any_leaf_changes) {
  Tensor w = tg::randn({3, 3}, 1, tg::float64).set_requires_grad();
  Tensor b = tg::randn({3}, 2, tg::float64).set_requires_grad();
  const Tensor x = tg::randn({2, 3}, 3, tg::float64).set_requires_grad();
  tg::backward(tg::sum(b * 5.0));
  auto uses_w_and_b = [&] { return std::vector<Tensor>{tg::matmul(x, w) + b}; };

  BOOST_TEST(tg::gradcheck([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{tg::matmul(in[0], w) + b}; }, {x}).ok);
  BOOST_TEST(tg::gradcheck_parameters(uses_w_and_b, {w}).ok);
  BOOST_TEST(!w.grad().defined());
  BOOST_TEST(!x.grad().defined());
  check_close(b.grad(), {5, 5, 5}, 0, "b's gradient, b not checked");

  BOOST_TEST(tg::gradcheck_parameters(uses_w_and_b, {b, b}).ok);
  check_close(b.grad(), {5, 5, 5}, 0, "b's gradient, b listed twice");

  check_throws<tg::GraphError>([&] { tg::gradcheck_parameters(uses_w_and_b, {b, w * 1.0}); }, {"parameters[1]", "leaf"});
  check_close(b.grad(), {5, 5, 5}, 0, "b's gradient, parameters[1] refused");
}

BOOST_AUTO_TEST_CASE(parameters_are_restored_when_the_function_throws) {
  Tensor w = tg::tensor({1.0, 2.0, 3.0}, tg::float64).set_requires_grad();
  int calls = 0;
  auto fails_later = [&] {
    if (++calls > 1) throw tg::ValueError("f: deliberately failing");
    return std::vector<Tensor>{w * 2.0};
  };
  BOOST_CHECK_THROW(tg::gradcheck_parameters(fails_later, {w}), tg::ValueError);
  BOOST_TEST(w.to_vector<double>() == (std::vector<double>{1, 2, 3}));  // exactly, not w + eps
  auto grows = [&] { return std::vector<Tensor>{w.to_vector<double>()[0] > 1 ? tg::concat({w, w}, 0) : w * 1.0}; };
  check_throws<tg::ValueError>([&] { tg::gradcheck_parameters(grows, {w}); }, {"gradcheck_parameters: f returned"});
  BOOST_TEST(w.to_vector<double>() == (std::vector<double>{1, 2, 3}));
}

BOOST_AUTO_TEST_CASE(catches_a_wrong_gradient) {
  Tensor w = tg::tensor({0.5, -1.0}, tg::float64).set_requires_grad();
  auto wrong_square = [&] {
    std::vector<Tensor> out{tg::zeros({2}, tg::float64)};
    tg::copy_(out[0], tg::pow(w.detach(), 2.0));
    tg::record_op("wrong_square", std::vector<Tensor>{w}, out, [w = w.detach()](std::span<const Tensor> g, const std::vector<bool>&) {
      return std::vector<Tensor>{g[0] * w * 2.001};  // 0.05% off
    });
    return out;
  };
  const auto r = tg::gradcheck_parameters(wrong_square, {w});
  BOOST_TEST(!r.ok);
  check_throws<tg::GraphError>([&] { tg::gradcheck_parameters(wrong_square, {w * 1.0}); }, {"gradcheck_parameters", "leaf"});
}

BOOST_AUTO_TEST_SUITE_END()
