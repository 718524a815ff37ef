// Tensors: factories, layout and views, conversion, printing, argument checks.
#define BOOST_TEST_MODULE tensor
#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support.hpp"

namespace tg = tapegrad;
using namespace tg_test;
using tg::Shape;
using tg::Tensor;

BOOST_AUTO_TEST_SUITE(factories)

BOOST_AUTO_TEST_CASE(filled_and_ranges) {
  BOOST_TEST(tg::zeros({2, 3}).to_vector<double>() == std::vector<double>(6, 0.0));
  BOOST_TEST(tg::ones({2}, tg::float64).to_vector<double>() == std::vector<double>(2, 1.0));
  BOOST_TEST(tg::full({3}, 2.5).to_vector<double>() == std::vector<double>(3, 2.5));
  BOOST_TEST(tg::arange(4).to_vector<std::int64_t>() == (std::vector<std::int64_t>{0, 1, 2, 3}));
  BOOST_TEST(tg::arange(1.0, 2.0, 0.25, tg::float64).to_vector<double>() == (std::vector<double>{1, 1.25, 1.5, 1.75}));
  BOOST_TEST(tg::scalar(3.0).dim() == 0);
  BOOST_TEST(tg::scalar(3.0).item() == 3.0);
  BOOST_CHECK(tg::zeros({0, 3}).numel() == 0);
  check_throws<tg::ValueError>([] { tg::arange(0, 1, 0); }, {"arange", "step"});
  // int64 (the default) would truncate fractional values into another sequence: refused.
  check_throws<tg::ValueError>([] { tg::arange(0.0, 1.0, 0.25); }, {"arange", "int64", "whole", "step=0.25"});
  check_throws<tg::ValueError>([] { tg::arange(0.5, 3.0); }, {"arange", "int64", "start=0.5"});
  BOOST_TEST(tg::arange(-2.0, 2.5, 2.0).to_vector<std::int64_t>() == (std::vector<std::int64_t>{-2, 0, 2}));
  BOOST_TEST(tg::arange(0.5, 3.0, 1.0, tg::float32).to_vector<float>() == (std::vector<float>{0.5f, 1.5f, 2.5f}));
  check_throws<tg::ShapeError>([] { tg::zeros({2, -1}); }, {"[2, -1]"});
  // Element counts that overflow are errors, not tiny allocations.
  check_throws<tg::ShapeError>([] { tg::zeros({std::int64_t{1} << 62}); }, {"zeros", "'shape'", "addressed"});
  check_throws<tg::ShapeError>([] { tg::empty({std::int64_t{1} << 40, std::int64_t{1} << 40}); }, {"empty", "addressed"});
  check_throws<tg::ShapeError>([] { tg::expand(tg::zeros({1, 1}), {std::int64_t{1} << 40, std::int64_t{1} << 40}); }, {"expand", "addressed"});
  check_throws<tg::DTypeError>([] { tg::randn({2}, 1, tg::int64); }, {"randn", "'dtype'", "int64"});
}

BOOST_AUTO_TEST_CASE(from_buffers_and_literals_in_every_dtype) {
  const std::vector<float> f{1, 2, 3, 4, 5, 6};
  const Tensor t = tg::from_vector(f, {2, 3});
  BOOST_TEST(t.dtype() == tg::float32);
  BOOST_TEST(t.shape() == (Shape{2, 3}));
  BOOST_TEST(t.to_vector<float>() == f);
  const std::vector<double> d{1.5, -2};
  BOOST_TEST(tg::from_vector(d, {2}).to_vector<double>() == d);
  const std::vector<std::int64_t> i{7, 8, 9};
  BOOST_TEST(tg::from_vector(i, {3, 1}).to_vector<std::int64_t>() == i);
  BOOST_TEST(tg::from_bools({true, false}, {2}).to_vector<bool>() == (std::vector<bool>{true, false}));
  check_throws<tg::ShapeError>([&] { tg::from_vector(f, {4}); }, {"from_vector", "'values'", "6", "[4]"});

  const Tensor lit = tg::tensor({{1, 2}, {3, 4}, {5, 6}});
  BOOST_TEST(lit.shape() == (Shape{3, 2}));
  BOOST_TEST(tg::tensor({{{1, 0}, {2, 0}}}, tg::float64).shape() == (Shape{1, 2, 2}));
  BOOST_TEST(tg::mask({{true, false}, {false, true}}).dtype() == tg::bool_);
  BOOST_TEST(tg::tensor({{10}, {20}}).shape() == (Shape{2, 1}));  // every brace pair is a dim
  BOOST_TEST(tg::tensor(5.0).dim() == 0);
  check_throws<tg::ShapeError>([] { tg::tensor({{1, 2}, {3}}); }, {"tensor:", "ragged"});
  check_throws<tg::ShapeError>([] { tg::mask({{true}, {false, true}}); }, {"mask:", "ragged"});
}

BOOST_AUTO_TEST_CASE(random_is_seeded_and_reproducible) {
  const auto a = tg::randn({1000}, 42, tg::float64).to_vector<double>();
  BOOST_TEST(a == tg::randn({1000}, 42, tg::float64).to_vector<double>());
  BOOST_TEST(a != tg::randn({1000}, 43, tg::float64).to_vector<double>());
  double mean = 0, var = 0;
  for (double v : a) mean += v / 1000;
  for (double v : a) var += (v - mean) * (v - mean) / 1000;
  BOOST_TEST(std::abs(mean) < 0.1);
  BOOST_TEST(std::abs(var - 1.0) < 0.15);
  for (double v : tg::rand({500}, 1, tg::float64, -2, 3).to_vector<double>()) BOOST_TEST((v >= -2 && v < 3));
  // One generator gives a stream: two draws differ.
  tg::Generator gen(5);
  BOOST_TEST(tg::randn({4}, gen).to_vector<float>() != tg::randn({4}, gen).to_vector<float>());
}

BOOST_AUTO_TEST_CASE(rand_stays_in_its_interval) {
  constexpr double dmax = std::numeric_limits<double>::max();
  constexpr double fmax = std::numeric_limits<float>::max();
  auto in_interval = [](const Tensor& t, double low, double high) {
    for (double v : t.to_vector<double>())
      if (!(v >= low && v < high)) return false;
    return true;
  };
  // Bounds whose difference overflows, in both dtypes.
  BOOST_TEST(in_interval(tg::rand({1000}, 1, tg::float64, -dmax, dmax), -dmax, dmax));
  BOOST_TEST(in_interval(tg::rand({1000}, 2, tg::float64, 0.5 * dmax, dmax), 0.5 * dmax, dmax));
  BOOST_TEST(in_interval(tg::rand({1000}, 3, tg::float32, -fmax, fmax), -fmax, fmax));
  // float32 rounding of the bounds: float(0.1) > 0.1 and float(0.7) < 0.7, and an interval
  // narrow enough that most draws round onto a bound.
  BOOST_TEST(in_interval(tg::rand({10000}, 4, tg::float32, 0.0, 0.1), 0.0, 0.1));
  BOOST_TEST(in_interval(tg::rand({10000}, 5, tg::float32, 0.7, 0.7000001), 0.7, 0.7000001));
  BOOST_TEST(in_interval(tg::rand({1000}, 6, tg::float64, 1.0, std::nextafter(1.0, 2.0)), 1.0, std::nextafter(1.0, 2.0)));
  // low == high gives low.
  BOOST_TEST(tg::rand({3}, 7, tg::float64, 0.1, 0.1).to_vector<double>() == std::vector<double>(3, 0.1));
  BOOST_TEST(tg::rand({3}, 7, tg::float32, 0.1, 0.1).to_vector<float>() == std::vector<float>(3, 0.1f));
  // The same seed gives the same stream whatever the bounds.
  tg::Generator a(8), b(8);
  tg::rand({5}, a, tg::float64, 2.0, 2.0);
  tg::rand({5}, b, tg::float64, 0.0, 1.0);
  BOOST_TEST(a.uniform() == b.uniform());
  // A copy continues from the same point on its own: drawing from it leaves the original where it was.
  a.normal();  // a spare normal is part of the state too
  tg::Generator c = a;
  const double from_copy = c.normal(), second = c.uniform();
  BOOST_TEST(a.normal() == from_copy);
  BOOST_TEST(a.uniform() == second);
  c = b;
  BOOST_TEST(c.next_u64() == b.next_u64());

  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  check_throws<tg::ValueError>([&] { tg::rand({2}, 1, tg::float64, -inf, 0.0); }, {"rand", "'low'", "finite"});
  check_throws<tg::ValueError>([&] { tg::rand({2}, 1, tg::float64, 0.0, nan); }, {"rand", "'high'", "finite"});
  check_throws<tg::ValueError>([] { tg::rand({2}, 1, tg::float64, 1.0, 0.0); }, {"rand", "low <= high"});
  check_throws<tg::ValueError>([&] { tg::rand({2}, 1, tg::float32, 0.0, dmax); }, {"rand", "float32", "represent"});
  check_throws<tg::ValueError>([] { tg::rand({2}, 1, tg::float32, 0.1, 0.1 + 1e-12); }, {"rand", "no float32 value"});
  check_throws<tg::DTypeError>([] { tg::rand({2}, 1, tg::int64); }, {"rand", "'dtype'", "int64"});
}

BOOST_AUTO_TEST_SUITE_END()

// Sizes that multiply past int64 (or past the 2^48 addressable bytes) are ShapeErrors naming the
// function, also when a zero makes the element count 0: strides and offsets still multiply the
// other sizes. Zero-size shapes within the limit work everywhere.
BOOST_AUTO_TEST_SUITE(shape_arithmetic)

constexpr std::int64_t operator""_p2(unsigned long long e) { return std::int64_t{1} << e; }

// A saved state resumes the stream exactly, a spare normal included, in this generator or another.
BOOST_AUTO_TEST_CASE(generator_state_resumes_the_stream) {
  for (const bool spare : {false, true}) {
    tg::Generator gen(11);
    tg::randn({8}, gen, tg::float64);  // an even count of normals: none cached
    if (spare) gen.normal();  // an odd count of normals leaves one cached
    const Tensor state = gen.get_state();
    BOOST_TEST(state.to_vector<std::int64_t>()[0] == (spare ? 1 : 0));
    auto draw = [](tg::Generator& g) {
      std::vector<double> v{g.normal(), g.uniform(), g.normal()};
      for (double x : tg::randn({5}, g, tg::float64).to_vector<double>()) v.push_back(x);
      v.push_back(static_cast<double>(g.next_u64() >> 11));
      return v;
    };
    const std::vector<double> after = draw(gen);
    gen.set_state(state);
    BOOST_TEST(draw(gen) == after);  // bitwise: operator== on doubles
    tg::Generator other(99);
    other.set_state(state);
    BOOST_TEST(draw(other) == after);
    BOOST_TEST(other.get_state().to_vector<std::int64_t>() == gen.get_state().to_vector<std::int64_t>());
  }
}

BOOST_AUTO_TEST_CASE(generator_state_refuses_what_get_state_cannot_give) {
  tg::Generator gen(3);
  gen.normal();
  const Tensor good = gen.get_state();
  const std::int64_t n = good.size(0);
  auto with = [&](std::int64_t flag, std::int64_t bits) {
    std::vector<std::int64_t> v = good.to_vector<std::int64_t>();
    v[0] = flag;
    v[1] = bits;
    return tg::from_vector(v, {n});
  };
  const std::string size = std::to_string(n);
  check_throws<tg::Error>([&] { gen.set_state(Tensor()); }, {"Generator::set_state", "'state'", "undefined"});
  check_throws<tg::DTypeError>([&] { gen.set_state(good.to(tg::float64)); }, {"Generator::set_state", "'state'", "int64"});
  check_throws<tg::ShapeError>([&] { gen.set_state(tg::slice(good, 0, 0, n - 1)); }, {"Generator::set_state", "int64 [" + size + "]"});
  check_throws<tg::ShapeError>([&] { gen.set_state(tg::reshape(good, {1, n})); }, {"Generator::set_state", "[1, " + size + "]"});
  check_throws<tg::ValueError>([&] { gen.set_state(with(2, 0)); }, {"Generator::set_state", "got 2 and 0"});
  check_throws<tg::ValueError>([&] { gen.set_state(with(0, 5)); }, {"Generator::set_state", "got 0 and 5"});
  const auto inf_bits = std::bit_cast<std::int64_t>(std::numeric_limits<double>::infinity());
  check_throws<tg::ValueError>([&] { gen.set_state(with(1, inf_bits)); }, {"Generator::set_state", "finite", "inf"});
  std::vector<std::int64_t> zero_engine(static_cast<std::size_t>(n), 0);
  zero_engine.back() = good.to_vector<std::int64_t>().back();  // the engine's position, as saved
  check_throws<tg::ValueError>([&] { gen.set_state(tg::from_vector(zero_engine, {n})); }, {"Generator::set_state", "all-zero engine state"});
  BOOST_TEST(gen.get_state().to_vector<std::int64_t>() == good.to_vector<std::int64_t>());  // every refusal left it as it was
}

BOOST_AUTO_TEST_CASE(factories_check_zero_size_shapes_too) {
  const Shape huge{0, 62_p2, 4};
  check_throws<tg::ShapeError>([&] { tg::zeros(huge); }, {"zeros", "'shape'", "[0, 4611686018427387904, 4]", "addressed"});
  check_throws<tg::ShapeError>([&] { tg::ones(huge); }, {"ones", "'shape'", "addressed"});
  check_throws<tg::ShapeError>([&] { tg::full(huge, 1.0); }, {"full", "'shape'", "addressed"});
  check_throws<tg::ShapeError>([&] { tg::empty(huge, tg::bool_); }, {"empty", "'shape'", "addressed"});
  check_throws<tg::ShapeError>([&] { tg::randn(huge, 1); }, {"randn", "'shape'", "addressed"});
  check_throws<tg::ShapeError>([&] { tg::rand(huge, 1); }, {"rand", "'shape'", "addressed"});
  check_throws<tg::ShapeError>([&] { tg::from_vector(std::vector<double>{}, huge); }, {"from_vector", "'shape'", "addressed"});
  check_throws<tg::ShapeError>([&] { tg::from_bools({}, huge); }, {"from_bools", "'shape'", "addressed"});
  check_throws<tg::ShapeError>([] { tg::zeros({0, -3}); }, {"zeros", "[0, -3]", "negative"});
  // The limit counts bytes: 2^46 float32 elements fit, 2^47 do not, 2^48 bools do.
  BOOST_TEST(tg::zeros({0, 46_p2}).numel() == 0);
  check_throws<tg::ShapeError>([] { tg::zeros({0, 47_p2}); }, {"zeros", "float32", "addressed"});
  BOOST_TEST(tg::empty({48_p2, 0}, tg::bool_).strides() == (Shape{1, 1}));
  BOOST_TEST(tg::zeros({0, 20_p2, 20_p2}).strides() == (Shape{40_p2, 20_p2, 1}));
}

BOOST_AUTO_TEST_CASE(ranges_and_masks_name_themselves) {
  check_throws<tg::ShapeError>([] { tg::arange(0, 1e14); }, {"arange", "[100000000000000]", "addressed"});
  check_throws<tg::ShapeError>([] { tg::arange(-1e308, 1e308, 1e-10, tg::float64); }, {"arange", "would make", "addressed"});
  check_throws<tg::ShapeError>([] { tg::causal_mask(40_p2, 40_p2); }, {"causal_mask", "[1099511627776, 1099511627776]", "addressed"});
  check_throws<tg::ShapeError>([] { tg::causal_mask(0, 62_p2); }, {"causal_mask", "addressed"});
  BOOST_TEST(tg::causal_mask(0, 40_p2).shape() == (Shape{0, 40_p2}));
  BOOST_TEST(tg::causal_mask(40_p2, 0).numel() == 0);
}

BOOST_AUTO_TEST_CASE(views_of_zero_size_tensors) {
  const Tensor e = tg::zeros({0, 1, 1});
  check_throws<tg::ShapeError>([&] { tg::expand(e, {0, 40_p2, 40_p2}); }, {"expand", "[0, 1099511627776, 1099511627776]", "addressed"});
  check_throws<tg::ShapeError>([&] { tg::broadcast_to(e, {0, 62_p2, 4}); }, {"broadcast_to", "addressed"});
  check_throws<tg::ShapeError>([&] { tg::reshape(e, {0, 62_p2, 4}); }, {"reshape", "'shape'", "addressed"});
  check_throws<tg::ShapeError>([&] { tg::reshape(e, {-1, 62_p2}); }, {"reshape", "'shape'", "addressed"});
  check_throws<tg::ShapeError>([&] { tg::reshape(e, {0, -1}); }, {"reshape", "cannot infer"});
  // Within the limit every view works and reduces to the right empty or zero result.
  const Tensor big = tg::expand(e, {0, 20_p2, 20_p2});
  BOOST_TEST(big.numel() == 0);
  BOOST_TEST(tg::sum(big, {1, 2}).shape() == (Shape{0}));
  BOOST_TEST(tg::sum(big, {0, 2}).to_vector<double>() == std::vector<double>(20_p2, 0.0));
  BOOST_TEST(std::isnan(tg::mean(big, {0, 2}).to_vector<double>()[0]));
  BOOST_TEST(tg::reshape(big, {20_p2, 0, 20_p2}).shape() == (Shape{20_p2, 0, 20_p2}));
  BOOST_TEST(tg::flatten(big).shape() == (Shape{0}));
  // Offsets of slices and selects along a long empty tensor's dims.
  const Tensor wide = tg::zeros({0, 40_p2});
  BOOST_TEST(tg::slice(wide, 1, 5, 40_p2, 39_p2).shape() == (Shape{0, 2}));
  BOOST_TEST(tg::slice(wide, 1, 40_p2, 40_p2).shape() == (Shape{0, 0}));
  BOOST_TEST(tg::select(wide, 1, -1).shape() == (Shape{0}));
  BOOST_TEST(tg::narrow(wide, 1, 40_p2 - 3, 3).shape() == (Shape{0, 3}));
  BOOST_TEST(tg::permute(wide, {1, 0}).contiguous().shape() == (Shape{40_p2, 0}));
}

BOOST_AUTO_TEST_CASE(joins_add_sizes_with_a_check) {
  // concat({a, a}, 1) with a = zeros({0, 2^62}) cannot happen: a itself is refused.
  check_throws<tg::ShapeError>([] { tg::zeros({0, 62_p2}); }, {"zeros", "addressed"});
  const Tensor a = tg::zeros({0, 45_p2});
  check_throws<tg::ShapeError>([&] { tg::concat({a, a, a}, 1); }, {"concat", "result shape", "addressed"});
  check_throws<tg::ShapeError>([&] { tg::stack({a, a, a, a}, -1); }, {"stack", "result shape", "addressed"});
  BOOST_TEST(tg::concat({a, a}, 1).shape() == (Shape{0, 46_p2}));
  BOOST_TEST(tg::stack({a, a}, 0).shape() == (Shape{2, 0, 45_p2}));
  // 2^15 views of 2^48 bools each: the sum itself leaves int64.
  const Tensor widest = tg::expand(tg::zeros({0, 1}, tg::bool_), {0, 48_p2});
  check_throws<tg::ShapeError>([&] { tg::concat(std::vector<Tensor>(15_p2, widest), 1); }, {"concat", "add up", "'tensors[32767]'"});
}

BOOST_AUTO_TEST_CASE(matmul_checks_the_shape_it_makes) {
  const Tensor a = tg::zeros({32_p2, 0}), b = tg::zeros({0, 32_p2});
  check_throws<tg::ShapeError>([&] { tg::matmul(a, b); }, {"matmul", "result shape", "[4294967296, 4294967296]", "addressed"});
  check_throws<tg::ShapeError>([&] { tg::matmul(a.to(tg::float64), b.to(tg::float64)); }, {"matmul", "result shape"});
  // Batch dims broadcast into a result too large, with K = 0.
  check_throws<tg::ShapeError>([] { tg::matmul(tg::zeros({24_p2, 1, 2, 0}), tg::zeros({1, 24_p2, 0, 2})); },
                               {"matmul", "result shape", "addressed"});
  BOOST_TEST(tg::matmul(tg::zeros({30_p2, 0}), tg::zeros({0, 0})).shape() == (Shape{30_p2, 0}));
  BOOST_TEST(tg::matmul(tg::zeros({3, 0}), tg::zeros({0, 2})).to_vector<double>() == std::vector<double>(6, 0.0));
}

BOOST_AUTO_TEST_CASE(a_zero_size_product_has_a_backward_that_costs_nothing) {
  // Found by fuzz/fuzz_shapes.cpp: with N = 0 there is nothing to multiply, but da = g b^T was
  // made at the broadcast shape [2^40, 2, 1, 1] (16 TiB of zeros) before being summed to [1, 2, 1, 1].
  Tensor a = tg::ones({1, 2, 1, 1}, tg::float64).set_requires_grad();
  Tensor b = tg::zeros({40_p2, 1, 1, 0}, tg::float64).set_requires_grad();
  const Tensor c = tg::matmul(a, b);
  BOOST_TEST(c.shape() == (Shape{40_p2, 2, 1, 0}));
  tg::backward({c}, {tg::zeros(c.shape(), tg::float64)});
  BOOST_TEST(a.grad().to_vector<double>() == std::vector<double>(2, 0.0));
  BOOST_TEST(b.grad().shape() == b.shape());
  tg::clear_tape();
}

BOOST_AUTO_TEST_CASE(elementwise_results_name_the_op) {
  // 2^50 elements: too many for bool results too.
  const Tensor col = tg::expand(tg::zeros({1, 1}), {25_p2, 1}), row = tg::expand(tg::zeros({1, 1}), {1, 25_p2});
  check_throws<tg::ShapeError>([&] { tg::add(col, row); }, {"add", "result shape", "[33554432, 33554432]", "addressed"});
  check_throws<tg::ShapeError>([&] { tg::lt(col, row); }, {"lt", "result shape", "addressed"});
  check_throws<tg::ShapeError>([&] { tg::where(tg::gt(col, tg::scalar(0.0)), col, row); }, {"where", "result shape", "addressed"});
}

BOOST_AUTO_TEST_CASE(broadcast_shapes_rejects_negative_sizes) {
  check_throws<tg::ShapeError>([] { tg::broadcast_shapes({-5}, {1}); }, {"broadcast_shapes", "'a'", "[-5]", "negative"});
  check_throws<tg::ShapeError>([] { tg::broadcast_shapes({2, 3}, {-1, 3}); }, {"broadcast_shapes", "'b'", "[-1, 3]", "negative"});
  check_throws<tg::ShapeError>([] { tg::broadcast_shapes({-1}, {}, "my_op"); }, {"my_op", "'a'"});
  BOOST_TEST(tg::broadcast_shapes({0, 1}, {1, 5}) == (Shape{0, 5}));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(layout)

BOOST_AUTO_TEST_CASE(views_share_storage) {
  const Tensor x = tg::arange(0, 12, 1, tg::float32).reshape({3, 4});
  BOOST_TEST(x.is_contiguous());
  const Tensor t = x.transpose(0, 1);
  BOOST_TEST(t.shares_storage_with(x));
  BOOST_TEST(!t.is_contiguous());
  BOOST_TEST(t.strides() == (Shape{1, 4}));
  BOOST_TEST(tg::slice(x, 1, 1, 4, 2).shares_storage_with(x));
  // Extreme slice arguments neither overflow nor misbehave.
  BOOST_TEST(tg::slice(x, 1, 1, std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::max()).shape() == (Shape{3, 1}));
  check_throws<tg::ShapeError>([&] { tg::narrow(x, 1, 2, std::numeric_limits<std::int64_t>::max()); }, {"narrow", "size 4"});
  BOOST_TEST(tg::slice(x, 1, 1, 4, 2).to_vector<double>() == (std::vector<double>{1, 3, 5, 7, 9, 11}));
  BOOST_TEST(tg::expand(tg::unsqueeze(x, 0), {2, 3, 4}).shares_storage_with(x));
  BOOST_TEST(tg::select(x, 0, 2).to_vector<double>() == (std::vector<double>{8, 9, 10, 11}));
  BOOST_TEST(x.reshape({2, 6}).shares_storage_with(x));  // a view
  // A transposed tensor cannot be flattened as a view: reshape copies, like torch.reshape.
  const Tensor flat = t.reshape({12});
  BOOST_TEST(!flat.shares_storage_with(x));
  BOOST_TEST(flat.to_vector<double>() == (std::vector<double>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  // ...but splitting a dim of a transposed tensor is still a view.
  BOOST_TEST(t.reshape({2, 2, 3}).shares_storage_with(x));
  BOOST_TEST(t.contiguous().is_contiguous());
  BOOST_TEST(x.contiguous().shares_storage_with(x));
}

BOOST_AUTO_TEST_CASE(conversion_and_item) {
  const Tensor x = tg::tensor({1.5, -2.5});
  BOOST_TEST(x.to(tg::int64).to_vector<std::int64_t>() == (std::vector<std::int64_t>{1, -2}));
  BOOST_TEST(x.to(tg::bool_).to_vector<bool>() == (std::vector<bool>{true, true}));
  BOOST_TEST(x.to(tg::float64).dtype() == tg::float64);
  check_throws<tg::ShapeError>([&] { x.item(); }, {"item", "[2]"});
  check_throws<tg::DTypeError>([&] { x.data<double>(); }, {"float64", "float32", "[2]"});
  BOOST_TEST(x.size(-1) == 2);
  check_throws<tg::ShapeError>([&] { x.size(1); }, {"size", "rank 1"});
  check_throws<tg::Error>([] { Tensor().shape(); }, {"undefined"});
}

BOOST_AUTO_TEST_CASE(members_of_an_undefined_tensor_name_themselves) {
  Tensor u;
  const std::vector<std::pair<std::string, std::function<void()>>> members{
      {"dtype", [&] { u.dtype(); }},
      {"shape", [&] { u.shape(); }},
      {"strides", [&] { u.strides(); }},
      {"offset", [&] { u.offset(); }},
      {"dim", [&] { u.dim(); }},
      {"size", [&] { u.size(0); }},
      {"numel", [&] { u.numel(); }},
      {"is_contiguous", [&] { u.is_contiguous(); }},
      {"data", [&] { u.data<float>(); }},
      {"data", [&] { u.data<const double>(); }},
      {"raw_data", [&] { u.raw_data(); }},
      {"version", [&] { u.version(); }},
      {"to_vector", [&] { u.to_vector<double>(); }},
      {"item", [&] { u.item(); }},
      {"requires_grad", [&] { u.requires_grad(); }},
      {"set_requires_grad", [&] { u.set_requires_grad(); }},
      {"is_leaf", [&] { u.is_leaf(); }},
      {"grad", [&] { u.grad(); }},
      {"zero_grad", [&] { u.zero_grad(); }},
      {"detach", [&] { u.detach(); }},
      {"contiguous", [&] { u.contiguous(); }},
      {"reshape", [&] { u.reshape({1}); }},
      {"permute", [&] { u.permute({0}); }},
      {"transpose", [&] { u.transpose(0, 1); }},
      {"to", [&] { u.to(tg::float64); }},
  };
  for (const auto& [member, call] : members)
    check_throws<tg::Error>(call, {"Tensor::" + member + ": called on an undefined (default-constructed) tensor"});
  BOOST_TEST(!u.shares_storage_with(tg::zeros({1})));
  BOOST_TEST(tg::to_string(u) == "tensor(undefined)");
  check_throws<tg::Error>([&] { tg::zeros_like(u); }, {"zeros_like: argument 't'", "undefined"});
  check_throws<tg::Error>([&] { tg::ones_like(u); }, {"ones_like: argument 't'", "undefined"});
}

BOOST_AUTO_TEST_CASE(broadcast_shapes_follow_numpy) {
  BOOST_TEST(tg::broadcast_shapes({2, 1, 4}, {3, 1}) == (Shape{2, 3, 4}));
  BOOST_TEST(tg::broadcast_shapes({}, {5}) == (Shape{5}));
  check_throws<tg::ShapeError>([] { tg::broadcast_shapes({2, 3}, {4}); }, {"[2, 3]", "[4]"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(printing)

BOOST_AUTO_TEST_CASE(prints_shape_dtype_and_values) {
  const std::string s = fmt::format("{}", tg::tensor({{1, 2}, {3, 4.5}}));
  BOOST_TEST(s.find("shape=[2, 2]") != std::string::npos);
  BOOST_TEST(s.find("float32") != std::string::npos);
  BOOST_TEST(s.find("[[1, 2],\n [3, 4.5]]") != std::string::npos);
  BOOST_TEST(fmt::format("{}", tg::mask({true, false})).find("[True, False]") != std::string::npos);
  BOOST_TEST(fmt::format("{}", tg::float64) == "float64");
}

BOOST_AUTO_TEST_CASE(summarises_zero_size_tensors_with_long_dims) {
  const std::string s = fmt::format("{}", tg::zeros({std::int64_t{1} << 40, 0}));
  BOOST_TEST(s.find("shape=[1099511627776, 0]") != std::string::npos);
  BOOST_TEST(s.find("[[],\n [],\n [],\n ...,\n [],\n [],\n []]") != std::string::npos);
  BOOST_TEST(fmt::format("{}", tg::zeros({2, 0})).find("[[],\n []]") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(summarises_large_tensors) {
  const std::string s = fmt::format("{}", tg::arange(0, 10000, 1, tg::int64));
  BOOST_TEST(s.find("[0, 1, 2, ..., 9997, 9998, 9999]") != std::string::npos);
  BOOST_TEST(s.size() < 200u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(requires_grad)

BOOST_AUTO_TEST_CASE(only_floating_leaves) {
  Tensor i = tg::zeros({2}, tg::int64);
  check_throws<tg::DTypeError>([&] { i.set_requires_grad(); }, {"set_requires_grad", "int64", "[2]"});
  Tensor x = tg::zeros({2}).set_requires_grad();
  Tensor y = x * 2.0;
  BOOST_TEST(y.requires_grad());
  BOOST_TEST(!y.is_leaf());
  check_throws<tg::GraphError>([&] { y.set_requires_grad(false); }, {"set_requires_grad", "detach"});
  BOOST_TEST(!y.detach().requires_grad());
  tg::clear_tape();
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_CASE(storage_moves_between_threads) {
  // Buffers of many sizes made on one thread and freed on another, threads that exit holding
  // freed buffers of their own: every value stays intact, and the count of storage bytes comes
  // back to where it was.
  const std::int64_t before = tg::memory_stats().current_bytes;
  std::vector<Tensor> made(96);
  auto size_of = [](std::size_t i) { return static_cast<std::int64_t>(17 + 37 * i); };  // 68 B to 14 KiB
  std::thread maker([&] {
    for (std::size_t i = 0; i < made.size(); ++i) {
      const Tensor scrap = tg::full({size_of(i)}, -1.0);  // freed here: a block this thread keeps
      made[i] = tg::full({size_of(i)}, static_cast<double>(i));
    }
  });
  maker.join();
  std::thread freer([&] {
    for (std::size_t i = 0; i < made.size(); ++i) {
      const std::vector<float> v = made[i].to_vector<float>();
      BOOST_TEST((std::count(v.begin(), v.end(), static_cast<float>(i)) == size_of(i)));
    }
    made.clear();  // freed on a thread that did not make them
    for (std::size_t i = 0; i < 96; ++i) {  // reused, filled, checked
      const Tensor t = tg::full({size_of(i)}, 2.0);
      BOOST_TEST(tg::sum(t).item() == 2.0 * static_cast<double>(size_of(i)));
    }
  });
  freer.join();
  BOOST_TEST(tg::memory_stats().current_bytes == before);
  tg::release_cached_memory();
}

BOOST_AUTO_TEST_CASE(memory_stats_keep_the_peak_above_the_current_use_under_contention) {
  // Two threads allocate and free while a third resets the peak and takes snapshots: every
  // snapshot has peak >= current, the one right after a reset included.
  std::atomic<bool> stop{false};
  auto churn = [&](std::uint64_t seed) {
    tg::Generator gen(seed);
    std::vector<Tensor> held(8);
    while (!stop.load(std::memory_order_relaxed))
      for (auto& t : held) t = tg::empty({static_cast<std::int64_t>(256 + gen.uniform() * 16384)});
  };
  std::thread a(churn, 1), b(churn, 2);
  std::int64_t snapshots = 0, below = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(400);
  while (std::chrono::steady_clock::now() < end) {
    if (snapshots % 2 == 0) tg::reset_peak_memory();
    const tg::MemoryStats s = tg::memory_stats();
    below += s.peak_bytes < s.current_bytes;
    ++snapshots;
  }
  stop = true;
  a.join();
  b.join();
  BOOST_TEST(below == 0, below << " of " << snapshots << " snapshots had peak_bytes < current_bytes");
  tg::release_cached_memory();
}

BOOST_AUTO_TEST_CASE(memory_stats_track_storage_and_its_peak) {
  tg::reset_peak_memory();
  const tg::MemoryStats before = tg::memory_stats();
  BOOST_TEST(before.peak_bytes == before.current_bytes);
  {
    const Tensor big = tg::zeros({1024, 256});  // 1 MiB
    const tg::MemoryStats during = tg::memory_stats();
    BOOST_TEST(during.current_bytes - before.current_bytes >= 1 << 20);
    BOOST_TEST(during.peak_bytes >= during.current_bytes);
  }
  const tg::MemoryStats after = tg::memory_stats();
  BOOST_TEST(after.current_bytes == before.current_bytes);  // freed, even if the block is cached
  BOOST_TEST(after.peak_bytes - before.current_bytes >= 1 << 20);
  tg::reset_peak_memory();
  BOOST_TEST(tg::memory_stats().peak_bytes == after.current_bytes);
  const Tensor small = tg::zeros({4});  // inline in its storage: no allocation counted
  BOOST_TEST(tg::memory_stats().current_bytes == after.current_bytes);
}
