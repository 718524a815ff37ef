// Optimizers, clipping and the schedule, against the formulas written out with plain doubles.
#define BOOST_TEST_MODULE optim
#include <cmath>
#include <memory>

#include "support.hpp"

namespace tg = tapegrad;
using namespace tg_test;
using tg::Tensor;

namespace {

// A parameter whose gradient after backward(step) is exactly `grads[step]`: loss = sum(p * c).
struct Problem {
  Tensor p = tg::tensor({1.0, -2.0, 0.5}, tg::float64).set_requires_grad();
  std::vector<std::vector<double>> grads{{0.1, -0.4, 2.0}, {0.3, 0.2, -1.0}, {-0.5, 0.1, 0.25}};
  void backward(std::size_t step) { tg::backward(tg::sum(p * tg::from_vector(grads[step], {3}))); }
};

template <class Opt, class Ref> void check_three_steps(Opt& opt, Problem& pr, Ref reference) {
  std::vector<double> expected = pr.p.to_vector<double>();
  for (std::size_t s = 0; s < 3; ++s) {
    pr.backward(s);
    opt.step();
    opt.zero_grad();
    reference(expected, pr.grads[s], s + 1);
    check_close(pr.p.to_vector<double>(), expected, 1e-15, 1e-14, fmt::format("step {}", s + 1));
  }
  BOOST_TEST(opt.steps() == 3);
}

}  // namespace

BOOST_AUTO_TEST_CASE(sgd_with_momentum_and_weight_decay) {
  Problem pr;
  tg::SGD opt({{"p", pr.p}}, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
  std::vector<double> v(3, 0.0);
  check_three_steps(opt, pr, [&](std::vector<double>& p, const std::vector<double>& g, std::size_t) {
    for (std::size_t i = 0; i < 3; ++i) {
      v[i] = 0.9 * v[i] + g[i] + 0.01 * p[i];
      p[i] -= 0.1 * v[i];
    }
  });
}

BOOST_AUTO_TEST_CASE(sgd_nesterov) {
  Problem pr;
  tg::SGD opt({{"p", pr.p}}, {.lr = 0.05, .momentum = 0.5, .nesterov = true});
  std::vector<double> v(3, 0.0);
  check_three_steps(opt, pr, [&](std::vector<double>& p, const std::vector<double>& g, std::size_t) {
    for (std::size_t i = 0; i < 3; ++i) {
      v[i] = 0.5 * v[i] + g[i];
      p[i] -= 0.05 * (g[i] + 0.5 * v[i]);
    }
  });
}

BOOST_AUTO_TEST_CASE(adam_and_adamw_follow_the_papers) {
  for (bool decoupled : {false, true}) {
    Problem pr;
    const tg::AdamOptions o{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.9, .eps = 1e-6, .weight_decay = 0.1};
    std::unique_ptr<tg::Optimizer> opt = decoupled ? std::unique_ptr<tg::Optimizer>(new tg::AdamW({{"p", pr.p}}, {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay}))
                                                   : std::unique_ptr<tg::Optimizer>(new tg::Adam({{"p", pr.p}}, o));
    std::vector<double> m(3, 0.0), v(3, 0.0);
    check_three_steps(*opt, pr, [&](std::vector<double>& p, const std::vector<double>& grad, std::size_t t) {
      for (std::size_t i = 0; i < 3; ++i) {
        double g = grad[i];
        if (decoupled) p[i] *= 1 - 0.01 * 0.1;
        else g += 0.1 * p[i];
        m[i] = 0.8 * m[i] + 0.2 * g;
        v[i] = 0.9 * v[i] + 0.1 * g * g;
        const double mhat = m[i] / (1 - std::pow(0.8, t)), vhat = v[i] / (1 - std::pow(0.9, t));
        p[i] -= 0.01 * mhat / (std::sqrt(vhat) + 1e-6);
      }
    });
  }
}

// adam_update_ itself, as a public op: the update above on views (a transposed parameter, an
// expanded gradient), the same result as on contiguous copies; its arguments named when wrong.
BOOST_AUTO_TEST_CASE(adam_update_on_views_and_its_bad_arguments) {
  for (auto dtype : {tg::float64, tg::float32}) {
    const Tensor p0 = tg::randn({3, 2}, 1, tg::float64), m0 = tg::randn({3, 2}, 2, tg::float64) * 0.1;
    const Tensor v0 = tg::exp(tg::randn({3, 2}, 3, tg::float64)) * 0.1, g0 = tg::randn({1, 2}, 4, tg::float64);
    const tg::AdamStep step{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.9, .eps = 1e-6, .weight_decay = 0.1, .step = 3, .grad_scale = 0.5};
    std::vector<double> p = p0.to_vector<double>(), m = m0.to_vector<double>(), v = v0.to_vector<double>();
    const std::vector<double> g = g0.to_vector<double>();
    for (std::size_t i = 0; i < 6; ++i) {
      const double gi = g[i % 2] * 0.5 + 0.1 * p[i];
      m[i] = 0.8 * m[i] + 0.2 * gi;
      v[i] = 0.9 * v[i] + 0.1 * gi * gi;
      p[i] -= 0.01 * (m[i] / (1 - std::pow(0.8, 3))) / (std::sqrt(v[i] / (1 - std::pow(0.9, 3))) + 1e-6);
    }
    // Stored transposed, so that param, exp_avg and exp_avg_sq are [3, 2] views with strides (1, 3).
    const Tensor pt = p0.transpose(0, 1).contiguous().to(dtype), mt = m0.transpose(0, 1).contiguous().to(dtype);
    const Tensor vt = v0.transpose(0, 1).contiguous().to(dtype);
    const Tensor param = pt.transpose(0, 1), exp_avg = mt.transpose(0, 1), exp_avg_sq = vt.transpose(0, 1);
    BOOST_TEST(!param.is_contiguous());
    tg::adam_update_(param, tg::expand(g0.to(dtype), {3, 2}), exp_avg, exp_avg_sq, step);
    const double tol = dtype == tg::float64 ? 1e-14 : 1e-6;
    check_close(param.to_vector<double>(), p, tol, tol, "param");
    check_close(exp_avg.to_vector<double>(), m, tol, tol, "exp_avg");
    check_close(exp_avg_sq.to_vector<double>(), v, tol, tol, "exp_avg_sq");
  }
  const Tensor a = tg::zeros({3}), b = tg::zeros({3});
  check_throws<tg::ShapeError>([&] { tg::adam_update_(a, b, tg::zeros({4}), b, {}); }, {"adam_update_", "'exp_avg'", "[3]", "[4]"});
  check_throws<tg::DTypeError>([&] { tg::adam_update_(a, tg::zeros({3}, tg::float64), a, b, {}); }, {"adam_update_", "'grad'", "float64"});
  check_throws<tg::ValueError>([&] { tg::adam_update_(a, b, tg::zeros({3}), tg::zeros({3}), {.step = 0}); }, {"adam_update_", ">= 1", "0"});
  check_throws<tg::ValueError>([&] { tg::adam_update_(a, b, tg::zeros({3}), tg::zeros({3}), {.grad_scale = INFINITY}); }, {"adam_update_", "grad_scale", "inf"});
}

// sum_of_squares (clip_grad_norm's sum): in float64 whatever the dtype, on any layout.
BOOST_AUTO_TEST_CASE(sum_of_squares_on_any_layout) {
  const Tensor x = tg::randn({4, 5}, 6, tg::float64);
  double want = 0;
  for (double e : x.to_vector<double>()) want += e * e;
  for (auto dtype : {tg::float64, tg::float32}) {
    const Tensor y = x.to(dtype);
    const double tol = dtype == tg::float64 ? 1e-14 : 1e-6;
    BOOST_TEST(std::abs(tg::sum_of_squares(y) - want) <= tol * want);
    BOOST_TEST(std::abs(tg::sum_of_squares(y.transpose(0, 1)) - want) <= tol * want);
    BOOST_TEST(std::abs(tg::sum_of_squares(tg::slice(y, 1, 0, 5, 2)) - tg::sum(tg::pow(tg::slice(x, 1, 0, 5, 2), 2.0)).item()) <= tol * want);
  }
  // float32 squares summed in float64: next to a 1, each 1e-8 would vanish from a float32 sum.
  const Tensor small = tg::concat({tg::ones({1}), tg::full({10000}, 1e-4)}, 0);
  double exact = 0;
  for (double e : small.to_vector<double>()) exact += e * e;
  BOOST_TEST(std::abs(tg::sum_of_squares(small) - exact) <= 1e-12);
  check_throws<tg::DTypeError>([] { tg::sum_of_squares(tg::zeros({2}, tg::int64)); }, {"sum_of_squares", "'x'", "int64"});
}

BOOST_AUTO_TEST_CASE(parameters_without_a_gradient_are_skipped) {
  Tensor a = tg::ones({2}).set_requires_grad(), b = tg::ones({2}).set_requires_grad();
  tg::Adam opt({{"a", a}, {"b", b}}, {.lr = 0.1});
  tg::backward(tg::sum(a * 3.0));
  opt.step();
  BOOST_TEST(b.to_vector<float>() == (std::vector<float>{1, 1}));
  BOOST_TEST(a.to_vector<float>()[0] < 1.0f);
}

BOOST_AUTO_TEST_CASE(state_round_trips_and_resumes_identically) {
  auto run = [](int steps_before_reload) {
    Problem pr;
    tg::Adam opt({{"p", pr.p}}, {.lr = 0.01});
    for (std::size_t s = 0; s < 3; ++s) {
      if (static_cast<int>(s) == steps_before_reload) {
        // Rebuild from saved state, as a checkpoint would.
        std::vector<tg::NamedTensor> saved;
        for (const auto& [name, t] : opt.state()) saved.push_back({name, tg::clone(t)});
        const auto steps = opt.steps();
        Problem fresh;
        tg::copy_(fresh.p, pr.p.detach());
        pr.p = fresh.p;
        tg::Adam reloaded({{"p", pr.p}}, {.lr = 0.01});
        reloaded.load_state(saved, steps);
        for (std::size_t r = s; r < 3; ++r) {
          pr.backward(r);
          reloaded.step();
          reloaded.zero_grad();
        }
        return pr.p.to_vector<double>();
      }
      pr.backward(s);
      opt.step();
      opt.zero_grad();
    }
    return pr.p.to_vector<double>();
  };
  BOOST_TEST(run(1) == run(-1));  // bit-identical
  Problem pr;
  tg::Adam opt({{"p", pr.p}});
  BOOST_TEST(opt.state().size() == 3u);  // exp_avg, exp_avg_sq and the step count
  BOOST_TEST(opt.state()[0].name == "exp_avg.p");
  const Tensor zero_step = tg::zeros({}, tg::int64);
  check_throws<tg::ShapeError>([&] { opt.load_state({{"exp_avg.p", tg::zeros({4}, tg::float64)}, {"exp_avg_sq.p", tg::zeros({3}, tg::float64)}, {"step.p", zero_step}}, 1); },
                               {"load_state", "exp_avg.p", "[3]", "[4]"});
  check_throws<tg::ValueError>([&] { opt.load_state({{"m.p", tg::zeros({3}, tg::float64)}, {"exp_avg_sq.p", tg::zeros({3}, tg::float64)}, {"step.p", zero_step}}, 1); },
                               {"load_state", "'m.p'", "exp_avg.p"});
  check_throws<tg::Error>([&] { opt.load_state({{"exp_avg.p", Tensor()}, {"exp_avg_sq.p", tg::zeros({3}, tg::float64)}, {"step.p", zero_step}}, 1); },
                          {"Adam::load_state", "'exp_avg.p'", "undefined"});
  check_throws<tg::ValueError>([&] { opt.load_state({{"exp_avg.p", tg::zeros({3}, tg::float64)}, {"step.p", zero_step}}, 1); },
                               {"Adam::load_state", "expected 3 state tensors, got 2", "1 missing: exp_avg_sq.p", "0 not expected"});
  for (const std::int64_t count : {-1, 2})
    check_throws<tg::ValueError>([&] { opt.load_state({{"exp_avg.p", tg::zeros({3}, tg::float64)}, {"exp_avg_sq.p", tg::zeros({3}, tg::float64)}, {"step.p", tg::full({}, static_cast<double>(count), tg::int64)}}, 1); },
                                 {"Adam::load_state", "'step.p'", fmt::format("counts {} steps", count), "steps = 1"});
}

BOOST_AUTO_TEST_CASE(adam_counts_steps_per_parameter) {
  // b is first reached after 1,000 steps of a: its first update must be a first step (bias
  // correction 1 - beta^1), lr * sign(g) = -0.1, not 2.5 times that.
  Tensor a = tg::ones({1}, tg::float64).set_requires_grad(), b = tg::ones({1}, tg::float64).set_requires_grad();
  tg::Adam opt({{"a", a}, {"b", b}}, {.lr = 0.1});
  for (int i = 0; i < 1000; ++i) {
    tg::backward(tg::sum(a * 2.0));
    opt.step();
    opt.zero_grad();
  }
  tg::backward(tg::sum(b * 3.0));
  opt.step();
  BOOST_TEST(std::abs(b.item() - 0.9) < 1e-6);
}

BOOST_AUTO_TEST_CASE(adamw_keeps_its_default_weight_decay_with_designated_options) {
  Tensor w = tg::ones({1}, tg::float64).set_requires_grad();
  tg::AdamW opt({{"w", w}}, {.lr = 0.1});
  tg::backward(tg::sum(w * 0.0));  // a zero gradient: only the decay moves w
  opt.step();
  BOOST_TEST(std::abs(w.item() - (1 - 0.1 * 0.01)) < 1e-12);
}

BOOST_AUTO_TEST_CASE(a_tensor_listed_twice_is_refused_and_clipped_once) {
  Tensor w = tg::ones({2}, tg::float64).set_requires_grad();
  check_throws<tg::ValueError>([&] { tg::SGD({{"a", w}, {"b", w}}); }, {"SGD", "'a'", "'b'", "same tensor"});
  tg::backward(tg::sum(w));  // gradient [1, 1], norm sqrt(2)
  BOOST_TEST(std::abs(tg::clip_grad_norm({w, w}, 10.0) - std::sqrt(2.0)) < 1e-15);
}

BOOST_AUTO_TEST_CASE(clip_grad_norm_scales_to_the_limit_and_reports_the_norm) {
  Tensor a = tg::tensor({3.0, 0.0}, tg::float64).set_requires_grad(), b = tg::tensor({4.0}, tg::float64).set_requires_grad();
  Tensor unused = tg::ones({2}, tg::float64).set_requires_grad();
  tg::backward(tg::sum(a * a) * 0.5 + tg::sum(b * b) * 0.5);  // grads = values: norm 5
  BOOST_TEST(tg::clip_grad_norm({a, b, unused}, 10.0) == 5.0);
  check_close(a.grad(), {3, 0}, 0, "below the limit: untouched");
  BOOST_TEST(tg::clip_grad_norm({a, b, unused}, 1.0) == 5.0);
  // PyTorch's factor, exactly: max_norm / (total + 1e-6), not max_norm / total.
  const double factor = 1.0 / (5.0 + 1e-6);
  BOOST_TEST(a.grad().to_vector<double>() == std::vector<double>({3.0 * factor, 0.0}));
  BOOST_TEST(b.grad().to_vector<double>() == std::vector<double>({4.0 * factor}));
  check_throws<tg::ValueError>([&] { tg::clip_grad_norm({a}, 0.0); }, {"clip_grad_norm", "'max_norm'"});
}

BOOST_AUTO_TEST_CASE(clip_grad_norm_clips_from_max_norm_less_one_millionth) {
  // A norm within 1e-6 below max_norm is clipped (the factor is below 1), one further below is not.
  for (const double total : {1.0 - 5e-7, 1.0 - 2e-6}) {
    Tensor a = tg::tensor({total}, tg::float64).set_requires_grad();
    tg::backward(tg::sum(a * a) * 0.5);
    BOOST_TEST(tg::clip_grad_norm({a}, 1.0) == total);
    const double expected = total + 1e-6 > 1.0 ? total * (1.0 / (total + 1e-6)) : total;
    BOOST_TEST(a.grad().item() == expected, "norm " << total << ": gradient " << a.grad().item() << ", expected " << expected);
  }
}

BOOST_AUTO_TEST_CASE(clip_grad_norm_has_the_same_bits_on_every_thread_count) {
  // 41 blocks of 2^16 and a part of one: read four at once, then one by one, then a tail, in
  // whatever ranges the threads get. Every split must give the same bits, within float64
  // rounding of the exact norm.
  const std::int64_t n = 41 * 65536 + 12345;
  std::vector<float> values(static_cast<std::size_t>(n));
  long double exact = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    values[static_cast<std::size_t>(i)] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)) * 1.7);  // full mantissas: the order shows
    exact += static_cast<long double>(values[static_cast<std::size_t>(i)]) * values[static_cast<std::size_t>(i)];
  }
  const int before = tg::num_threads();
  std::vector<double> norms;
  for (const int threads : {1, 2, 3}) {
    tg::set_num_threads(threads);
    Tensor w = tg::from_vector(values, {n}).set_requires_grad();
    tg::backward(tg::sum(w * w) * 0.5f);  // gradient = w
    norms.push_back(tg::clip_grad_norm({w}, 1e30));
  }
  tg::set_num_threads(before);
  BOOST_TEST(norms[0] == norms[1]);
  BOOST_TEST(norms[0] == norms[2]);
  BOOST_TEST(std::abs(norms[0] - std::sqrt(static_cast<double>(exact))) <= 1e-12 * norms[0]);
}

namespace {
bool same(const Tensor& x, const Tensor& y) { return x.shape() == y.shape() && x.to_vector<double>() == y.to_vector<double>(); }
}  // namespace

BOOST_AUTO_TEST_CASE(max_grad_norm_clips_inside_the_step_with_clip_grad_norms_bits) {
  // Two float32 models trained side by side on the same batches: one clipped by clip_grad_norm
  // before step(), one by the optimizer's max_grad_norm. Every parameter bit for bit, the same
  // norms, and the gradients left unscaled by the fused clip.
  for (const bool decoupled : {true, false})  // AdamW, and Adam with L2 decay (g * factor + decay p)
  for (const double max_norm : {0.05, 1e3}) {  // clipping at every step, and never
    tg::Decoder a({.vocab = 7, .max_len = 6, .dim = 8, .heads = 2, .layers = 1, .seed = 3});
    tg::Decoder b({.vocab = 7, .max_len = 6, .dim = 8, .heads = 2, .layers = 1, .seed = 3});
    std::unique_ptr<tg::Adam> opt_a, opt_b;
    if (decoupled) {
      opt_a = std::make_unique<tg::AdamW>(a.named_parameters(), tg::AdamWOptions{.lr = 1e-2});
      opt_b = std::make_unique<tg::AdamW>(b.named_parameters(), tg::AdamWOptions{.lr = 1e-2, .max_grad_norm = max_norm});
    } else {
      opt_a = std::make_unique<tg::Adam>(a.named_parameters(), tg::AdamOptions{.lr = 1e-2, .weight_decay = 0.3});
      opt_b = std::make_unique<tg::Adam>(b.named_parameters(), tg::AdamOptions{.lr = 1e-2, .weight_decay = 0.3, .max_grad_norm = max_norm});
    }
    BOOST_TEST(std::isnan(opt_b->grad_norm()));
    tg::Generator gen(1);
    const std::vector<std::int64_t> tokens{1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 2, 4, 6, 1, 3, 5};
    for (int step = 0; step < 4; ++step) {
      const auto [x, y] = tg::random_windows(tokens, 3, 5, gen);
      tg::backward(tg::cross_entropy(a.forward(x), y));
      tg::backward(tg::cross_entropy(b.forward(x), y));
      const Tensor g_before = tg::clone(b.parameters()[0].grad());
      const double norm = tg::clip_grad_norm(a.parameters(), max_norm);
      opt_a->step();
      opt_b->step();
      BOOST_TEST(opt_b->grad_norm() == norm);
      BOOST_TEST(same(b.parameters()[0].grad(), g_before));
      opt_a->zero_grad();
      opt_b->zero_grad();
    }
    for (std::size_t i = 0; i < a.parameters().size(); ++i) BOOST_TEST(same(a.parameters()[i], b.parameters()[i]), "parameter " << i);
  }
  check_throws<tg::ValueError>([] { tg::Decoder m({.vocab = 3, .max_len = 2, .dim = 2}); tg::AdamW(m.named_parameters(), {.max_grad_norm = -1}); },
                               {"AdamW", "'max_grad_norm'"});
}

BOOST_AUTO_TEST_CASE(warmup_cosine_schedule) {
  const tg::WarmupCosine lr(1.0, 4, 14, 0.1);
  BOOST_TEST(lr(0) == 0.25);
  BOOST_TEST(lr(3) == 1.0);
  BOOST_TEST(lr(4) == 1.0);
  BOOST_TEST(std::abs(lr(9) - 0.55) < 1e-12);  // half way down the cosine
  BOOST_TEST(lr(14) == 0.1);
  BOOST_TEST(lr(1000) == 0.1);
  check_throws<tg::ValueError>([] { tg::WarmupCosine(1.0, 5, 4); }, {"WarmupCosine", "warmup = 5", "total = 4"});
  check_throws<tg::ValueError>([&] { lr(-5); }, {"WarmupCosine", "'step'", "-5"});
}

BOOST_AUTO_TEST_CASE(bad_configurations_are_named) {
  Tensor p = tg::ones({2}).set_requires_grad();
  check_throws<tg::ValueError>([&] { tg::SGD({{"p", p}}, {.momentum = 1.0}); }, {"SGD", "'momentum'", "[0, 1)"});
  check_throws<tg::ValueError>([&] { tg::SGD({{"p", p}}, {.nesterov = true}); }, {"SGD", "nesterov"});
  check_throws<tg::ValueError>([&] { tg::Adam({{"p", p}}, {.lr = -1}); }, {"Adam", "learning rate", "-1"});
  check_throws<tg::ValueError>([&] { tg::Adam({{"p", p}}, {.eps = 0}); }, {"Adam", "'eps'"});
  check_throws<tg::ValueError>([&] { tg::AdamW({{"p", p}, {"p", p}}); }, {"AdamW", "repeated", "'p'"});
  check_throws<tg::GraphError>([&] { tg::SGD({{"c", tg::ones({2})}}); }, {"SGD", "'c'", "requires grad"});
  check_throws<tg::GraphError>([&] { tg::SGD({{"y", p * 2.0}}); }, {"SGD", "'y'", "output of an op"});
  check_throws<tg::DTypeError>([&] { tg::SGD({{"i", tg::zeros({2}, tg::int64)}}); }, {"SGD", "'i'", "int64"});
}
