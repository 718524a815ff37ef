// In-place updates: values, broadcasting, overlap, version counting, and refusal where a write
// would corrupt a graph or a gradient.
#define BOOST_TEST_MODULE inplace
#include "support.hpp"

namespace tg = tapegrad;
using namespace tg_test;
using tg::Tensor;

BOOST_AUTO_TEST_SUITE(values)

BOOST_AUTO_TEST_CASE(each_update_computes_its_formula) {
  for (auto dtype : {tg::float32, tg::float64}) {
    const Tensor d = tg::tensor({1, 2, 3}, dtype), a = tg::tensor({2, 2, 2}, dtype), b = tg::tensor({4, 5, 8}, dtype);
    tg::add_(d, a, 0.5);  // [2, 3, 4]
    check_close(d, {2, 3, 4}, 0, "add_");
    tg::mul_(d, 2.0);  // [4, 6, 8]
    check_close(d, {4, 6, 8}, 0, "mul_ scalar");
    tg::mul_(d, a);  // [8, 12, 16]
    check_close(d, {8, 12, 16}, 0, "mul_ tensor");
    tg::addcmul_(d, a, b, -1.0);  // [0, 2, 0]
    check_close(d, {0, 2, 0}, 0, "addcmul_");
    tg::addcdiv_(d, b, a, 0.5);  // [1, 3.25, 2]
    check_close(d, {1, 3.25, 2}, 0, "addcdiv_");
    tg::lerp_(d, b, 0.5);  // [2.5, 4.125, 5]
    check_close(d, {2.5, 4.125, 5}, 0, "lerp_");
    tg::copy_(d, a);
    check_close(d, {2, 2, 2}, 0, "copy_");
    tg::fill_(d, 7.0);
    check_close(d, {7, 7, 7}, 0, "fill_");
    tg::zero_(d);
    check_close(d, {0, 0, 0}, 0, "zero_");
  }
}

BOOST_AUTO_TEST_CASE(lerp_takes_pytorchs_two_forms) {
  // d + w (e - d) below 0.5, e - (e - d) (1 - w) from 0.5: at w = 1 the result is e exactly,
  // where d + (e - d) rounds 1e16 + (1 - 1e16) to 0.
  const Tensor d = tg::tensor({1e16, 1e16}, tg::float64), e = tg::tensor({1.0, 1.0}, tg::float64);
  tg::lerp_(d, e, 1.0);
  BOOST_TEST(d.to_vector<double>() == std::vector<double>({1.0, 1.0}));
  const Tensor f = tg::tensor({0.1}, tg::float64);
  tg::lerp_(f, tg::tensor({0.7}, tg::float64), 0.3);
  BOOST_TEST(f.item() == 0.1 + 0.3 * (0.7 - 0.1));
}

BOOST_AUTO_TEST_CASE(sources_broadcast_and_views_are_written_through) {
  const Tensor m = tg::zeros({2, 3}, tg::float64);
  tg::add_(m, tg::tensor({1, 2, 3}, tg::float64));
  tg::add_(tg::select(m, 0, 1), tg::scalar(10.0, tg::float64));  // a view writes into m
  check_close(m, {1, 2, 3, 11, 12, 13}, 0, "broadcast + view");
  const Tensor t = tg::transpose(m, 0, 1);  // strided dst
  tg::mul_(t, 2.0);
  check_close(m, {2, 4, 6, 22, 24, 26}, 0, "strided dst");
}

BOOST_AUTO_TEST_CASE(an_overlapping_source_is_read_before_dst_is_written) {
  const Tensor x = tg::tensor({1, 2, 3, 4}, tg::float64);
  tg::add_(tg::slice(x, 0, 1, 4), tg::slice(x, 0, 0, 3));  // x[1:] += x[:3] with the old x[:3]
  check_close(x, {1, 3, 5, 7}, 0, "shifted overlap");
  tg::add_(x, x);  // the same view: elementwise, no copy needed
  check_close(x, {2, 6, 10, 14}, 0, "identical view");
}

BOOST_AUTO_TEST_CASE(non_floating_tensors_take_copy_and_fill) {
  const Tensor ids = tg::zeros({3}, tg::int64);
  tg::fill_(ids, 4.0);
  BOOST_TEST(ids.to_vector<std::int64_t>() == (std::vector<std::int64_t>{4, 4, 4}));
  const Tensor m = tg::mask({true, false});
  tg::copy_(m, tg::mask({false, true}));
  BOOST_TEST(m.to_vector<bool>() == (std::vector<bool>{false, true}));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(versions_and_graphs)

BOOST_AUTO_TEST_CASE(every_update_and_every_writable_pointer_bumps_the_version) {
  const Tensor x = tg::zeros({4}, tg::float64);
  const Tensor view = tg::slice(x, 0, 1, 3);
  std::uint64_t v = x.version();
  tg::fill_(view, 1.0);
  BOOST_TEST(x.version() == ++v);  // views share the counter
  tg::add_(view, view);
  BOOST_TEST(x.version() == ++v);
  x.data<double>()[0] = 5;
  BOOST_TEST(x.version() == ++v);
  (void)x.data<const double>();  // reading is not writing
  BOOST_TEST(x.version() == v);
}

BOOST_AUTO_TEST_CASE(updating_a_saved_leaf_before_backward_is_a_graph_error) {
  const Tensor w = tg::tensor({1.0, 2.0, 3.0}, tg::float64).set_requires_grad();
  const Tensor x = tg::tensor({4.0, 5.0, 6.0}, tg::float64);
  const Tensor loss = tg::sum(w * w * x);  // mul saves w
  tg::add_(w, tg::ones({3}, tg::float64), -0.1);
  check_throws<tg::GraphError>([&] { tg::backward(loss); }, {"backward of mul", "input", "modified in place", "version"});
  BOOST_TEST(!w.grad().defined());  // nothing was applied
}

BOOST_AUTO_TEST_CASE(writing_through_data_is_caught_too) {
  // The case that motivated version counters: a wrong gradient (200 instead of 6) without them.
  const Tensor w = tg::tensor({3.0}, tg::float64).set_requires_grad();
  const Tensor loss = tg::sum(w * w);
  w.data<double>()[0] = 100.0;
  check_throws<tg::GraphError>([&] { tg::backward(loss); }, {"backward of mul", "modified in place"});
}

BOOST_AUTO_TEST_CASE(updating_after_backward_is_the_optimizer_pattern) {
  const Tensor w = tg::tensor({1.0, 2.0}, tg::float64).set_requires_grad();
  for (int step = 0; step < 3; ++step) {
    const Tensor loss = tg::sum(w * w);
    tg::backward(loss);
    tg::add_(w, w.grad(), -0.25);  // w -= 0.25 * 2w: halves w
    tg::zero_(w.grad());
  }
  check_close(w, {0.125, 0.25}, 0, "three halvings");
  BOOST_TEST(w.requires_grad());
  BOOST_TEST(w.is_leaf());
}

BOOST_AUTO_TEST_CASE(an_update_that_the_backward_does_not_read_is_allowed) {
  const Tensor w = tg::tensor({1.0, 2.0}, tg::float64).set_requires_grad();
  const Tensor loss = tg::sum(w + 1.0);  // add saves nothing
  tg::mul_(w, 3.0);
  tg::backward(loss);
  check_close(w.grad(), {1, 1}, 0, "d sum(w + 1) / dw");
}

BOOST_AUTO_TEST_CASE(outputs_of_live_graphs_and_expanded_views_are_refused) {
  const Tensor w = tg::ones({2}, tg::float64).set_requires_grad();
  const Tensor y = tg::exp(w);
  check_throws<tg::GraphError>([&] { tg::mul_(y, 2.0); }, {"mul_", "'dst'", "recorded op exp"});
  check_throws<tg::ShapeError>([&] { tg::fill_(tg::expand(tg::zeros({1}), {3}), 1.0); }, {"fill_", "'dst'", "expanded"});
  // Through a detached view the write is allowed, and the saved output catches it.
  tg::mul_(y.detach(), 2.0);
  check_throws<tg::GraphError>([&] { tg::backward(tg::sum(y)); }, {"backward of exp", "output 0", "modified in place"});
}

BOOST_AUTO_TEST_CASE(bad_arguments_are_named) {
  const Tensor d = tg::zeros({2, 3});
  check_throws<tg::DTypeError>([&] { tg::add_(d, tg::zeros({3}, tg::float64)); }, {"add_", "'src'", "float64", "float32"});
  check_throws<tg::ShapeError>([&] { tg::add_(d, tg::zeros({4})); }, {"add_", "'src'", "[4]", "[2, 3]"});
  check_throws<tg::ShapeError>([&] { tg::copy_(tg::zeros({3}), tg::zeros({2, 3})); }, {"copy_", "'src'", "[2, 3]", "[3]"});
  check_throws<tg::DTypeError>([&] { tg::mul_(tg::zeros({2}, tg::int64), 2.0); }, {"mul_", "'dst'", "int64"});
  check_throws<tg::Error>([&] { tg::zero_(Tensor()); }, {"zero_", "'dst'", "undefined"});
  check_throws<tg::Error>([&] { tg::addcdiv_(d, d, Tensor()); }, {"addcdiv_", "'b'", "undefined"});
}

BOOST_AUTO_TEST_SUITE_END()
