// The layers that train a transformer: each checked for its formula, its initialisation, its
// parameters' names, a float64 gradcheck with respect to its input and every parameter, and its
// configuration and argument errors.
#define BOOST_TEST_MODULE layers
#include <cmath>

#include "support.hpp"

namespace tg = tapegrad;
using namespace tg_test;
using tg::Tensor;

namespace {

std::vector<std::string> names_of(tg::Module& m) {
  std::vector<std::string> out;
  for (const auto& p : m.named_parameters()) out.push_back(p.name);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(linear)

BOOST_AUTO_TEST_CASE(computes_x_w_plus_b_with_pytorch_initialisation) {
  tg::Linear lin({.in = 4, .out = 3, .dtype = tg::float64, .seed = 7});
  BOOST_TEST(names_of(lin) == (std::vector<std::string>{"weight", "bias"}), boost::test_tools::per_element());
  BOOST_TEST(lin.parameter_count() == 15);
  for (double w : lin.weight.to_vector<double>()) BOOST_TEST(std::abs(w) <= 0.5);  // 1/sqrt(4)
  const Tensor x = tg::randn({2, 5, 4}, 1, tg::float64);
  const Tensor expected = tg::matmul(x, lin.weight) + lin.bias;
  check_close(lin.forward(x).to_vector<double>(), expected.to_vector<double>(), 0, 0, "x W + b");
  tg::Linear no_bias({.in = 4, .out = 3, .bias = false});
  BOOST_TEST(names_of(no_bias) == (std::vector<std::string>{"weight"}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(gradcheck_input_and_parameters) {
  tg::Linear lin({.in = 3, .out = 2, .dtype = tg::float64, .seed = 1});
  const Tensor x = tg::randn({2, 3}, 2, tg::float64).set_requires_grad();
  auto params = lin.parameters();
  params.push_back(x);
  const auto r = tg::gradcheck_parameters([&] { return std::vector<Tensor>{lin.forward(x)}; }, params);
  BOOST_TEST(r.ok, r.report());
  BOOST_TEST(r.elements_checked == 6u + 2u + 6u);
}

BOOST_AUTO_TEST_CASE(bad_configuration_and_inputs_are_named) {
  check_throws<tg::ValueError>([] { tg::Linear({.in = 0, .out = 3}); }, {"Linear", "config.in", ">= 1", "0"});
  check_throws<tg::ValueError>([] { tg::Linear({.in = 1LL << 40, .out = 1LL << 40}); }, {"Linear", "config.in * config.out", "overflows"});
  check_throws<tg::DTypeError>([] { tg::Linear({.in = 2, .out = 2, .dtype = tg::int64}); }, {"Linear", "config.dtype", "int64"});
  tg::Linear lin({.in = 4, .out = 3});
  check_throws<tg::ShapeError>([&] { lin.forward(tg::zeros({2, 5})); }, {"Linear::forward", "'x'", "[..., 4]", "[2, 5]"});
  check_throws<tg::DTypeError>([&] { lin.forward(tg::zeros({2, 4}, tg::float64)); }, {"Linear::forward", "'x'", "float64", "float32"});
  check_throws<tg::Error>([&] { lin.forward(Tensor()); }, {"Linear::forward", "'x'", "undefined"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(positions)

BOOST_AUTO_TEST_CASE(sinusoidal_table_matches_the_formula) {
  tg::SinusoidalPositions pos({.max_len = 10, .dim = 6, .dtype = tg::float64});
  BOOST_TEST(pos.parameter_count() == 0);
  const auto t = pos.table.to_vector<double>();
  for (int p : {0, 3, 9})
    for (int i = 0; i < 6; ++i) {
      const double angle = p / std::pow(10000.0, (i - i % 2) / 6.0);
      BOOST_TEST(t[static_cast<std::size_t>(p * 6 + i)] == (i % 2 ? std::cos(angle) : std::sin(angle)));
    }
  const Tensor x = tg::zeros({2, 3, 6}, tg::float64);
  const auto y = pos.forward(x, 4).to_vector<double>();  // rows 4, 5, 6 of the table, each batch
  BOOST_TEST(y[0] == t[4 * 6]);
  BOOST_TEST(y[18 + 2 * 6 + 5] == t[6 * 6 + 5]);
}

BOOST_AUTO_TEST_CASE(learned_table_gets_the_gradient_of_the_rows_used) {
  tg::LearnedPositions pos({.max_len = 5, .dim = 2, .dtype = tg::float64, .seed = 3});
  BOOST_TEST(names_of(pos) == (std::vector<std::string>{"table"}), boost::test_tools::per_element());
  const Tensor x = tg::randn({3, 2, 2}, 1, tg::float64).set_requires_grad();
  tg::backward(tg::sum(pos.forward(x, 1)));
  check_close(pos.table.grad(), {0, 0, 3, 3, 3, 3, 0, 0, 0, 0}, 0, "rows 1 and 2, summed over the batch of 3");
  const auto r = tg::gradcheck_parameters([&] { return std::vector<Tensor>{tg::pow(pos.forward(x, 1), 2.0)}; }, {pos.table, x});
  BOOST_TEST(r.ok, r.report());
}

BOOST_AUTO_TEST_CASE(positions_past_the_table_are_an_error) {
  tg::SinusoidalPositions pos({.max_len = 4, .dim = 2});
  check_throws<tg::ShapeError>([&] { pos.forward(tg::zeros({1, 3, 2}), 2); }, {"SinusoidalPositions::forward", "offset 2", "[0, 4)", "max_len"});
  check_throws<tg::ShapeError>([&] { pos.forward(tg::zeros({1, 3, 5})); }, {"SinusoidalPositions::forward", "'x'", "[B, T, 2]"});
  check_throws<tg::ValueError>([] { tg::LearnedPositions({.max_len = 0, .dim = 2}); }, {"LearnedPositions", "config.max_len"});
}

BOOST_AUTO_TEST_SUITE_END()
