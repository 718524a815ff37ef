// The training ops beyond what the op table checks: exact edge-case semantics (empty rows,
// ignored targets, ties and NaN, p = 1), identities, and bad inputs named precisely.
#define BOOST_TEST_MODULE training_ops
#include <limits>

#include "support.hpp"

namespace tg = tapegrad;
using namespace tg_test;
using tg::Tensor;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

BOOST_AUTO_TEST_SUITE(clone_op)

BOOST_AUTO_TEST_CASE(owns_its_storage_and_passes_the_gradient) {
  const Tensor x = tg::tensor({{1, 2, 3}, {4, 5, 6}}, tg::float64).set_requires_grad();
  for (const Tensor& source : {x, tg::transpose(x, 0, 1)}) {
    const Tensor c = tg::clone(source);
    BOOST_TEST(!c.shares_storage_with(x));
    BOOST_TEST(c.is_contiguous());
    BOOST_TEST(c.to_vector<double>() == source.to_vector<double>());
    tg::backward(tg::sum(tg::mul(c, c)));
  }
  // d/dx sum(x^2) twice (once through the transpose) = 4x
  check_close(x.grad(), {4, 8, 12, 16, 20, 24}, 0, "dx");
}

BOOST_AUTO_TEST_CASE(a_clone_can_be_updated_in_place_while_the_original_is_saved) {
  const Tensor x = tg::tensor({1, 2}, tg::float64).set_requires_grad();
  const Tensor y = tg::mul(x, x);  // saves x
  {
    tg::NoGradGuard no_grad;
    const Tensor c = tg::clone(x);
    tg::add_(c, tg::scalar(1.0, tg::float64));
    check_close(c, {2, 3}, 0, "clone updated");
  }
  tg::backward(tg::sum(y));
  check_close(x.grad(), {2, 4}, 0, "gradient of the original");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(indexing)

BOOST_AUTO_TEST_CASE(repeated_ids_accumulate_their_gradients) {
  const Tensor w = tg::tensor({{1, 2}, {3, 4}, {5, 6}}, tg::float64).set_requires_grad();
  const Tensor ids = tg::tensor({{1, 1}, {1, 0}}, tg::int64);
  const Tensor e = tg::embedding(w, ids);  // [2, 2, 2]
  BOOST_TEST(e.shape() == Shape({2, 2, 2}));
  check_close(e, {3, 4, 3, 4, 3, 4, 1, 2}, 0, "rows");
  tg::backward(tg::sum(e));
  check_close(w.grad(), {1, 1, 3, 3, 0, 0}, 0, "row 1 three times, row 0 once, row 2 never");
}

BOOST_AUTO_TEST_CASE(index_select_follows_numpy_take) {
  const Tensor x = tg::reshape(tg::arange(0.0, 24.0, 1.0, tg::float64), {2, 3, 4});
  // Rank-0 ids remove the dim (like select); rank-2 ids insert two dims in its place.
  check_close(tg::index_select(x, 1, tg::scalar(2.0, tg::int64)), tg::select(x, 1, 2).to_vector<double>(), 0, "rank 0");
  const Tensor two = tg::index_select(x, 2, tg::tensor({{3, 0}}, tg::int64));
  BOOST_TEST(two.shape() == Shape({2, 3, 1, 2}));
  check_close(tg::select(tg::select(two, 0, 1), 0, 2), {23, 20}, 0, "x[1, 2, [[3, 0]]]");
  // Any dtype of x: an int64 table is read the same way (and never recorded).
  const Tensor table = tg::tensor({10, 20, 30}, tg::int64);
  BOOST_TEST(tg::index_select(table, 0, tg::tensor({2, 2, 0}, tg::int64)).to_vector<std::int64_t>() ==
             std::vector<std::int64_t>({30, 30, 10}));
}

BOOST_AUTO_TEST_CASE(gather_follows_pytorch) {
  // torch.gather(torch.tensor([[1, 2], [3, 4]]), 1, torch.tensor([[0, 0], [1, 0]])) = [[1, 1], [4, 3]]
  const Tensor x = tg::tensor({{1, 2}, {3, 4}}, tg::float64).set_requires_grad();
  const Tensor out = tg::gather(x, 1, tg::tensor({{0, 0}, {1, 0}}, tg::int64));
  check_close(out, {1, 1, 4, 3}, 0, "gather");
  tg::backward({out}, {tg::tensor({{1, 10}, {100, 1000}}, tg::float64)});
  check_close(x.grad(), {11, 0, 1000, 100}, 0, "scatter-add");
}

BOOST_AUTO_TEST_CASE(ids_changed_in_place_after_recording_are_caught) {
  const Tensor w = tg::ones({3, 2}, tg::float64).set_requires_grad();
  const Tensor ids = tg::tensor({0, 2}, tg::int64);
  const Tensor e = tg::embedding(w, ids);
  tg::fill_(ids, 1.0);
  check_throws<tg::GraphError>([&] { tg::backward(tg::sum(e)); }, {"embedding", "modified in place"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(argmax_op)

BOOST_AUTO_TEST_CASE(ties_give_the_first_index_and_nan_wins) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (auto dtype : {tg::float32, tg::float64}) {
    const Tensor x = tg::tensor({{1, 3, 3, 2}, {kInf, 0, kInf, 5}, {-kInf, -kInf, -kInf, -kInf}, {1, nan, 7, nan}}, dtype);
    const Tensor along = tg::argmax(x, 1);
    BOOST_TEST(along.dtype() == tg::int64);
    BOOST_TEST(along.to_vector<std::int64_t>() == std::vector<std::int64_t>({1, 0, 0, 1}));
    BOOST_TEST(tg::argmax(x).item() == 13.0);  // the first NaN, flattened
    BOOST_TEST(tg::argmax(tg::slice(x, 0, 0, 3)).item() == 4.0);  // the first +inf
    const Tensor kept = tg::argmax(tg::transpose(x, 0, 1), 0, /*keepdim=*/true);  // a strided input
    BOOST_TEST(kept.shape() == Shape({1, 4}));
    BOOST_TEST(kept.to_vector<std::int64_t>() == std::vector<std::int64_t>({1, 0, 0, 1}));
  }
  BOOST_TEST(tg::argmax(tg::tensor({4, 9, 9, -2}, tg::int64)).item() == 1.0);
  BOOST_TEST(tg::argmax(tg::scalar(3.0)).item() == 0.0);
}

BOOST_AUTO_TEST_CASE(is_never_recorded) {
  const Tensor x = tg::randn({3, 4}, 1, tg::float64).set_requires_grad();
  BOOST_TEST(!tg::argmax(x, 1).requires_grad());
  BOOST_TEST(!tg::argmax(x).requires_grad());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(log_softmax_op)

BOOST_AUTO_TEST_CASE(stays_finite_where_log_of_softmax_would_not) {
  for (auto dtype : {tg::float32, tg::float64}) {
    // exp(-1000) underflows, so log(softmax) would be -inf; log_softmax keeps -1000.
    check_close(tg::log_softmax(tg::tensor({0, -1000}, dtype)), {0, -1000}, 1e-6, "[0, -1000]");
    const double big = dtype == tg::float32 ? 1.7e38 : 8e307;  // about FLT_MAX/2 and DBL_MAX/2
    check_close(tg::log_softmax(tg::tensor({big, big}, dtype)), {-std::log(2.0), -std::log(2.0)}, 1e-6, "huge ties");
    const Tensor y = tg::log_softmax(tg::tensor({1e4, 1e4 - 1, 1e4 - 2}, dtype));
    const double lse = std::log(1 + std::exp(-1.0) + std::exp(-2.0));
    check_close(y, {-lse, -1 - lse, -2 - lse}, 1e-5, "1e4");
  }
}

BOOST_AUTO_TEST_CASE(masked_entries_and_empty_rows_are_minus_inf_with_exactly_zero_gradient) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (auto dtype : {tg::float32, tg::float64}) {
    const Tensor x = tg::tensor({{1, 2, 3}, {4, 5, 6}, {-kInf, 0, -kInf}}, dtype).set_requires_grad();
    const Tensor allowed = tg::mask({{true, false, true}, {false, false, false}, {true, true, true}});
    const Tensor y = tg::log_softmax(x, allowed);
    const double lse = std::log(std::exp(1.0) + std::exp(3.0));
    check_close(y, {1 - lse, -kInf, 3 - lse, -kInf, -kInf, -kInf, -kInf, 0, -kInf}, 1e-6, "values");
    // Non-finite upstream gradients where y = -inf must not leak into anything.
    const Tensor g = tg::tensor({{1, nan, 2}, {kInf, nan, -kInf}, {nan, 3, kInf}}, dtype);
    tg::backward({y}, {g});
    const double p0 = std::exp(1 - lse), p2 = std::exp(3 - lse);
    check_close(x.grad(), {1 - p0 * 3, 0, 2 - p2 * 3, 0, 0, 0, 0, 0, 0}, 1e-6, "dx");
  }
}

// A NaN or +inf among a row's allowed scores makes its allowed entries NaN; its disallowed ones
// stay -inf with gradient 0, as in masked_softmax (once the NaN reached them too when the row
// also held a finite allowed score). A NaN at a disallowed entry changes nothing.
BOOST_AUTO_TEST_CASE(a_nan_row_keeps_its_disallowed_entries_minus_inf) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (auto dtype : {tg::float32, tg::float64}) {
    const Tensor x = tg::tensor({{nan, 1, 5}, {kInf, 1, 5}, {nan, 5, 1}, {1, nan, 3}}, dtype).set_requires_grad();
    const Tensor allowed = tg::mask({{true, true, false}, {true, true, false}, {true, false, false}, {true, false, true}});
    const Tensor y = tg::log_softmax(x, allowed);
    const auto v = y.to_vector<double>();
    for (std::size_t i : {0u, 1u, 3u, 4u, 6u}) BOOST_TEST(std::isnan(v[i]), "y[" << i << "] = " << v[i]);
    for (std::size_t i : {2u, 5u, 7u, 8u, 10u}) BOOST_TEST(v[i] == -kInf, "y[" << i << "] = " << v[i]);
    const double lse = std::log(std::exp(1.0) + std::exp(3.0));
    BOOST_TEST(std::abs(v[9] - (1 - lse)) < 1e-6);
    BOOST_TEST(std::abs(v[11] - (3 - lse)) < 1e-6);
    tg::backward({y}, {tg::ones_like(y)});
    const auto g = x.grad().to_vector<double>();
    for (std::size_t i : {2u, 5u, 7u, 8u, 10u}) BOOST_TEST(g[i] == 0.0, "dx[" << i << "] = " << g[i]);
    for (std::size_t i : {9u, 11u}) BOOST_TEST(std::isfinite(g[i]));
  }
}

BOOST_AUTO_TEST_CASE(agrees_with_log_of_masked_softmax_and_its_gradient) {
  Tensor x = tg::randn({4, 7}, 3, tg::float64).set_requires_grad();
  const Tensor allowed = tg::gt(tg::randn({4, 7}, 4, tg::float64), tg::scalar(-0.5, tg::float64));
  const Tensor g = tg::randn({4, 7}, 5, tg::float64);
  const Tensor y = tg::log_softmax(x, allowed);
  tg::backward({tg::where(allowed, y, tg::scalar(0.0, tg::float64))}, {g});
  const Tensor dx = x.grad();
  x.zero_grad();
  const Tensor via_softmax = tg::log(tg::masked_softmax(x, allowed));
  tg::backward({tg::where(allowed, via_softmax, tg::scalar(0.0, tg::float64))}, {g});
  check_close(tg::where(allowed, y, tg::scalar(0.0, tg::float64)).to_vector<double>(),
              tg::where(allowed, via_softmax, tg::scalar(0.0, tg::float64)).to_vector<double>(), 1e-14, 1e-14, "values");
  check_close(dx.to_vector<double>(), x.grad().to_vector<double>(), 1e-13, 1e-13, "gradients");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(losses)

// -log_softmax(x)[t] per row, from the definition.
double nll(const std::vector<double>& row, std::size_t t) {
  double z = 0;
  for (double v : row) z += std::exp(v);
  return std::log(z) - row[t];
}

BOOST_AUTO_TEST_CASE(cross_entropy_matches_its_definition) {
  const Tensor logits = tg::tensor({{1, 2, 3}, {1, 1, 1}}, tg::float64);
  const Tensor targets = tg::tensor({2, 0}, tg::int64);
  const double l0 = nll({1, 2, 3}, 2), l1 = std::log(3.0);
  check_close(tg::cross_entropy(logits, targets), {(l0 + l1) / 2}, 1e-15, "mean");
  check_close(tg::cross_entropy(logits, targets, {.reduction = tg::Reduction::sum}), {l0 + l1}, 1e-15, "sum");
  check_close(tg::cross_entropy(logits, targets, {.reduction = tg::Reduction::none}), {l0, l1}, 1e-15, "none");
  // PyTorch's label smoothing: (1 - eps) nll_t + eps mean_c nll_c.
  const double s0 = 0.9 * l0 + 0.1 * (nll({1, 2, 3}, 0) + nll({1, 2, 3}, 1) + nll({1, 2, 3}, 2)) / 3;
  check_close(tg::cross_entropy(logits, targets, {.label_smoothing = 0.1}), {(s0 + l1) / 2}, 1e-15, "smoothed");
}

BOOST_AUTO_TEST_CASE(cross_entropy_equals_minus_the_mean_gathered_log_softmax) {
  Tensor x = tg::randn({6, 5}, 11, tg::float64).set_requires_grad();
  const Tensor t = tg::tensor({4, 0, 0, 2, 3, 1}, tg::int64);
  tg::backward(tg::cross_entropy(x, t));
  const Tensor direct = x.grad();
  x.zero_grad();
  const Tensor picked = tg::gather(tg::log_softmax(x), 1, tg::reshape(t, {6, 1}));
  tg::backward(tg::neg(tg::mean(picked)));
  check_close(direct.to_vector<double>(), x.grad().to_vector<double>(), 1e-15, 1e-14, "dlogits");
  // Each row of (softmax - one-hot) / N sums to zero.
  for (std::int64_t r = 0; r < 6; ++r) BOOST_TEST(std::abs(tg::sum(tg::select(direct, 0, r)).item()) < 1e-16);
}

BOOST_AUTO_TEST_CASE(every_target_ignored_gives_zero_loss_and_zero_gradient) {
  for (auto reduction : {tg::Reduction::mean, tg::Reduction::sum, tg::Reduction::none}) {
    const Tensor x = tg::randn({3, 4}, 2, tg::float64).set_requires_grad();
    const Tensor loss = tg::cross_entropy(x, tg::full({3}, -100.0, tg::int64), {.reduction = reduction});
    for (double v : loss.to_vector<double>()) BOOST_TEST(v == 0.0);
    tg::backward({loss}, {tg::ones_like(loss)});
    for (double v : x.grad().to_vector<double>()) BOOST_TEST(v == 0.0);
  }
  // No rows at all: the same.
  const Tensor empty = tg::zeros({0, 4}, tg::float32).set_requires_grad();
  BOOST_TEST(tg::cross_entropy(empty, tg::zeros({0}, tg::int64)).item() == 0.0);
}

BOOST_AUTO_TEST_CASE(ignored_rows_get_exact_zeros_whatever_their_upstream_gradient) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor x = tg::randn({3, 4}, 5, tg::float32).set_requires_grad();
  // ignore_index may be a real class (a padding id): those rows are ignored too.
  const Tensor loss = tg::cross_entropy(x, tg::tensor({0, 2, 0}, tg::int64), {.ignore_index = 0, .reduction = tg::Reduction::none});
  check_close(loss.to_vector<double>(), {0, nll(tg::select(x, 0, 1).to_vector<double>(), 2), 0}, 1e-6, 1e-6, "losses");
  tg::backward({loss}, {tg::tensor({nan, 1.0, kInf}, tg::float32)});
  const auto g = x.grad().to_vector<double>();
  for (std::size_t i : {0u, 1u, 2u, 3u, 8u, 9u, 10u, 11u}) BOOST_TEST(g[i] == 0.0);
  for (std::size_t i : {4u, 5u, 6u, 7u}) BOOST_TEST(std::isfinite(g[i]));
}

BOOST_AUTO_TEST_CASE(cross_entropy_is_stable_and_counts_the_mean_over_kept_rows) {
  for (auto dtype : {tg::float32, tg::float64}) {
    // Logits far beyond exp's range, and a -inf logit of another class (no 0 * inf at eps = 0).
    const Tensor x = tg::tensor({{1e4, 1e4 - 1, 0}, {-kInf, 2, 1}, {3, 3, 3}}, dtype).set_requires_grad();
    const Tensor t = tg::tensor({0, 1, -100}, tg::int64);
    const double l0 = std::log(1 + std::exp(-1.0)), l1 = std::log(1 + std::exp(-1.0));
    const Tensor loss = tg::cross_entropy(x, t);
    check_close(loss, {(l0 + l1) / 2}, 1e-6, "mean over the two kept rows");
    tg::backward(loss);
    for (double v : x.grad().to_vector<double>()) BOOST_TEST(std::isfinite(v));
    // With smoothing the -inf logit is in the average: the loss is +inf, as in PyTorch.
    BOOST_TEST(tg::cross_entropy(x.detach(), t, {.label_smoothing = 0.1}).item() == kInf);
  }
}

BOOST_AUTO_TEST_CASE(mse_loss_values_and_gradients) {
  const Tensor p = tg::tensor({1, 2, 4}, tg::float64).set_requires_grad();
  const Tensor y = tg::tensor({0, 2, 1}, tg::float64).set_requires_grad();
  const Tensor loss = tg::mse_loss(p, y);
  check_close(loss, {10.0 / 3}, 1e-15, "mean");
  tg::backward(loss);
  check_close(p.grad(), {2.0 / 3, 0, 2}, 1e-15, "dpred = 2 (p - y) / n");
  check_close(y.grad(), {-2.0 / 3, 0, -2}, 1e-15, "dtarget = -dpred");
  BOOST_TEST(std::isnan(tg::mse_loss(tg::zeros({0}), tg::zeros({0})).item()));  // the mean of nothing, like mean()
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(layer_norm_op)

BOOST_AUTO_TEST_CASE(rows_come_out_with_mean_zero_and_unit_biased_variance) {
  const Tensor x = tg::randn({5, 8}, 7, tg::float64);
  const Tensor y = tg::layer_norm(x, Tensor(), Tensor(), 0.0);
  for (std::int64_t r = 0; r < 5; ++r) {
    const Tensor row = tg::select(y, 0, r);
    BOOST_TEST(std::abs(tg::mean(row).item()) < 1e-15);
    BOOST_TEST(std::abs(tg::mean(tg::mul(row, row)).item() - 1.0) < 1e-14);
  }
}

BOOST_AUTO_TEST_CASE(float32_stays_accurate_far_from_zero) {
  // Statistics in double: a row at 1e4 with unit spread normalises like one at 0.
  const Tensor noise = tg::randn({3, 16}, 8, tg::float64);
  const Tensor y64 = tg::layer_norm(noise);
  const Tensor y32 = tg::layer_norm(tg::to(tg::add(noise, 1e4), tg::float32));
  check_close(y32.to_vector<double>(), y64.to_vector<double>(), 2e-3, 0, "float32 at 1e4");
}

BOOST_AUTO_TEST_CASE(a_constant_row_gives_the_bias_and_finite_gradients) {
  // var = 0, so sigma = sqrt(eps) and xhat = 0: y = bias, dweight = 0, and
  // dx = (dxhat - mean(dxhat)) / sqrt(eps), large but finite and exact.
  const Tensor x = tg::full({2, 3}, 4.0, tg::float64).set_requires_grad();
  const Tensor w = tg::tensor({1, 2, 3}, tg::float64).set_requires_grad();
  const Tensor b = tg::tensor({0.5, -1, 2}, tg::float64).set_requires_grad();
  const Tensor y = tg::layer_norm(x, w, b);
  check_close(y, {0.5, -1, 2, 0.5, -1, 2}, 0, "y = bias");
  const Tensor g = tg::tensor({{1, 1, 1}, {3, 0, -1}}, tg::float64);
  tg::backward({y}, {g});
  const double s = 1 / std::sqrt(1e-5);
  // dxhat rows: [1, 2, 3] (mean 2) and [3, 0, -3] (mean 0)
  check_close(x.grad().to_vector<double>(), {-s, 0, s, 3 * s, 0, -3 * s}, 1e-12, 1e-13, "dx");
  for (double v : w.grad().to_vector<double>()) BOOST_TEST(v == 0.0);
  check_close(b.grad(), {4, 1, 0}, 0, "dbias = column sums of g");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(rms_norm_op)

BOOST_AUTO_TEST_CASE(rows_come_out_with_unit_mean_square_and_keep_their_mean) {
  // Unlike layer_norm, nothing is subtracted: a row of 3 + noise stays positive.
  const Tensor x = tg::add(tg::randn({5, 8}, 7, tg::float64), 3.0);
  const Tensor y = tg::rms_norm(x, Tensor(), 0.0);
  for (std::int64_t r = 0; r < 5; ++r) {
    const Tensor row = tg::select(y, 0, r);
    BOOST_TEST(std::abs(tg::mean(tg::mul(row, row)).item() - 1.0) < 1e-14);
    BOOST_TEST(tg::mean(row).item() > 0.5);
  }
}

BOOST_AUTO_TEST_CASE(a_zero_row_gives_zero_and_a_finite_gradient) {
  // rms = 0, so the scale is 1 / sqrt(eps) and xhat = 0: y = 0, dweight = 0, dx = g w / sqrt(eps).
  const Tensor x = tg::zeros({1, 3}, tg::float64).set_requires_grad();
  const Tensor w = tg::tensor({1, 2, 3}, tg::float64).set_requires_grad();
  const Tensor y = tg::rms_norm(x, w);
  check_close(y, {0, 0, 0}, 0, "y");
  tg::backward({y}, {tg::tensor({{1, -1, 2}}, tg::float64)});
  const double s = 1 / std::sqrt(1e-5);
  check_close(x.grad().to_vector<double>(), {s, -2 * s, 6 * s}, 1e-12, 1e-13, "dx");
  check_close(w.grad(), {0, 0, 0}, 0, "dweight");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(abs_op)

BOOST_AUTO_TEST_CASE(its_gradient_is_the_sign_and_zero_at_zero) {
  // PyTorch's subgradient: sign(x), with 0 at x = 0 (and -0); NaN stays NaN.
  const Tensor x = tg::tensor({-2.0, -0.0, 0.0, 3.0, std::nan("")}, tg::float64).set_requires_grad();
  tg::backward(tg::sum(tg::abs(x) * 1.5));
  const auto g = x.grad().to_vector<double>();
  BOOST_TEST(g[0] == -1.5);
  BOOST_TEST(g[1] == 0.0);
  BOOST_TEST(g[2] == 0.0);
  BOOST_TEST(g[3] == 1.5);
  BOOST_TEST(std::isnan(g[4]));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(dropout_op)

BOOST_AUTO_TEST_CASE(eval_mode_and_p_zero_return_x_itself) {
  const Tensor x = tg::randn({3, 4}, 1, tg::float64).set_requires_grad();
  tg::Generator gen(5);
  const std::size_t nodes = tg::tape_size();
  BOOST_TEST(tg::dropout(x, 0.5, gen, false).impl() == x.impl());
  BOOST_TEST(tg::dropout(x, 0.0, gen, true).impl() == x.impl());
  BOOST_TEST(tg::tape_size() == nodes);
  // Neither call drew from the generator.
  tg::Generator fresh(5);
  BOOST_TEST(gen.next_u64() == fresh.next_u64());
}

BOOST_AUTO_TEST_CASE(a_seed_gives_one_mask_and_the_scale_keeps_the_mean) {
  const Tensor x = tg::ones({100000}, tg::float64);
  tg::Generator a(7), b(7), c(8);
  const auto ya = tg::dropout(x, 0.3, a, true).to_vector<double>();
  BOOST_TEST(ya == tg::dropout(x, 0.3, b, true).to_vector<double>());
  BOOST_TEST(ya != tg::dropout(x, 0.3, c, true).to_vector<double>());
  std::size_t kept = 0, other = 0;
  double total = 0;
  for (double v : ya) {
    kept += v == 1.0 / 0.7;
    other += v != 0.0 && v != 1.0 / 0.7;
    total += v;
  }
  BOOST_TEST(other == 0u);
  // Binomial(1e5, 0.7): standard deviation 145 elements; allow 5 of them.
  BOOST_TEST(std::abs(static_cast<double>(kept) - 70000.0) < 725.0);
  BOOST_TEST(std::abs(total / 1e5 - 1.0) < 0.011);
}

BOOST_AUTO_TEST_CASE(dropped_elements_are_exact_zeros_and_the_gradient_follows_the_mask) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (auto dtype : {tg::float32, tg::float64}) {
    const Tensor x = tg::tensor({kInf, nan, -kInf, 1, 2, 3, 4, 5}, dtype).set_requires_grad();
    tg::Generator gen(3);  // keeps elements 0, 2, 4, 6: the NaN at 1, with an inf upstream gradient, is dropped
    const Tensor y = tg::dropout(x, 0.5, gen, true);
    const Tensor g = tg::tensor({nan, kInf, 1, 1, 1, 1, 1, 1}, dtype);
    tg::backward({y}, {g});
    const auto yv = y.to_vector<double>(), dx = x.grad().to_vector<double>(), xv = x.to_vector<double>();
    BOOST_TEST((yv[1] == 0.0 && dx[1] == 0.0));
    for (std::size_t i = 0; i < yv.size(); ++i) {
      tg::Generator replay(3);
      bool keep = false;
      for (std::size_t k = 0; k <= i; ++k) keep = replay.uniform() >= 0.5;
      if (!keep) {
        BOOST_TEST(yv[i] == 0.0);
        BOOST_TEST(dx[i] == 0.0);
      } else if (i >= 3) {
        BOOST_TEST(yv[i] == xv[i] * 2);
        BOOST_TEST(dx[i] == 2.0);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(p_one_drops_everything_with_a_zero_gradient) {
  const Tensor x = tg::tensor({1, kInf, -3}, tg::float64).set_requires_grad();
  tg::Generator gen(1);
  const Tensor y = tg::dropout(x, 1.0, gen, true);
  check_close(y, {0, 0, 0}, 0, "y");
  tg::backward(tg::sum(y));
  check_close(x.grad(), {0, 0, 0}, 0, "dx");
}

BOOST_AUTO_TEST_SUITE_END()

// All of the above together: a one-block causal transformer, trained from C++ with plain SGD to
// predict the previous token (which needs the positional embedding and attention).
BOOST_AUTO_TEST_SUITE(small_transformer)

namespace {

struct TinyModel {
  static constexpr std::int64_t V = 6, E = 8, T = 6;
  struct Weights {
    Tensor tokens, positions, ln1_w, ln1_b, ln2_w, ln2_b, out;
  };
  explicit TinyModel(tg::DType dtype)
      : mha({.query_dim = E, .heads = 2, .dtype = dtype, .seed = 4}),
        w{tg::randn({V, E}, 1, dtype), tg::randn({T, E}, 2, dtype), tg::ones({E}, dtype), tg::zeros({E}, dtype),
          tg::ones({E}, dtype), tg::zeros({E}, dtype), tg::randn({E, V}, 3, dtype) / std::sqrt(double(E))} {
    for (Tensor p : params()) p.set_requires_grad();  // handles: the flag is the member's
  }
  std::vector<Tensor> params() {
    std::vector<Tensor> ps = mha.parameters();
    for (const Tensor& p : {w.tokens, w.positions, w.ln1_w, w.ln1_b, w.ln2_w, w.ln2_b, w.out}) ps.push_back(p);
    return ps;
  }
  // ids [B, T] -> embedding + positions -> pre-norm causal self-attention with a residual ->
  // layer_norm -> dropout -> logits [B, T, V] -> label-smoothed cross-entropy.
  Tensor loss(const Weights& p, const Tensor& ids, const Tensor& targets, tg::Generator& gen, bool training) const {
    const Tensor x = tg::embedding(p.tokens, ids) + p.positions;
    const Tensor n = tg::layer_norm(x, p.ln1_w, p.ln1_b);
    const Tensor h = x + mha.forward(n, n, {.masking = {.causal = true}, .need_weights = false}).output;
    const Tensor logits = tg::matmul(tg::dropout(tg::layer_norm(h, p.ln2_w, p.ln2_b), 0.1, gen, training), p.out);
    return tg::cross_entropy(logits, targets, {.label_smoothing = 0.05});
  }
  tg::MultiHeadAttention mha;
  Weights w;
};

// Random token sequences and their previous-token targets (position 0 and padding ignored).
std::pair<Tensor, Tensor> batch(std::uint64_t seed) {
  tg::Generator gen(seed);
  std::vector<std::int64_t> ids, targets;
  for (std::int64_t b = 0; b < 8; ++b)
    for (std::int64_t t = 0; t < TinyModel::T; ++t) {
      ids.push_back(static_cast<std::int64_t>(gen.uniform() * TinyModel::V));
      const bool padding = b == 7 && t >= 4;
      targets.push_back(t == 0 || padding ? -100 : ids[ids.size() - 2]);
    }
  return {tg::from_vector(std::span<const std::int64_t>(ids), {8, TinyModel::T}),
          tg::from_vector(std::span<const std::int64_t>(targets), {8, TinyModel::T})};
}

}  // namespace

BOOST_AUTO_TEST_CASE(trains_with_sgd_and_its_gradients_check_out) {
  TinyModel model(tg::float32);
  tg::Generator dropout_gen(9);
  double first = 0, last = 0;
  for (int step = 0; step < 300; ++step) {
    const auto [ids, targets] = batch(100 + static_cast<std::uint64_t>(step));
    const Tensor loss = model.loss(model.w, ids, targets, dropout_gen, true);
    if (step == 0) first = loss.item();
    tg::backward(loss);
    for (Tensor p : model.params()) {
      tg::add_(p, p.grad(), -0.5);
      p.zero_grad();
    }
  }
  tg::Generator unused(0);
  for (std::uint64_t s = 0; s < 4; ++s) {
    const auto [ids, targets] = batch(1000 + s);
    tg::NoGradGuard no_grad;
    last += model.loss(model.w, ids, targets, unused, false).item() / 4;
  }
  BOOST_TEST_MESSAGE("previous-token loss: " << first << " at the start, " << last << " after 300 steps (log 6 = " << std::log(6.0) << ")");
  BOOST_TEST(last < 0.5 * first);

  // The composed gradient in float64 against central differences, for the new ops' parameters.
  TinyModel m64(tg::float64);
  const auto check_batch = batch(7);  // a named pair: clang 14 cannot capture structured bindings
  const Tensor &ids = check_batch.first, &targets = check_batch.second;
  const auto result = tg::gradcheck(
      [&](const std::vector<Tensor>& p) {
        TinyModel::Weights w = m64.w;
        w.tokens = p[0], w.ln1_w = p[1], w.ln2_b = p[2], w.out = p[3];
        tg::Generator gen(5);  // the same dropout mask on every evaluation
        return std::vector<Tensor>{m64.loss(w, ids, targets, gen, true)};
      },
      {m64.w.tokens, m64.w.ln1_w, m64.w.ln2_b, m64.w.out});
  BOOST_TEST(result.ok, result.report());
}

BOOST_AUTO_TEST_SUITE_END()
