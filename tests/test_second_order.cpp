// Gradients of gradients: grad() and create_graph, gradgradcheck catching a wrong second-order
// formula, Hessian-vector products, attention to second order on every path with its exact
// zeros, the tiny decoder, a gradient-penalty loop that stays flat in memory, and the backward
// ops (one formula to every order): the same bits in both passes, third order, exact zeros.
// (Every op of the op table is gradgradchecked by test_ops.)
#define BOOST_TEST_MODULE second_order
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "mha_support.hpp"
#include "ops/attention_core.hpp"
#include "support.hpp"

namespace tg = tapegrad;
using tg::Tensor;
using tg_test::check_close;
using tg_test::check_throws;

namespace {

Tensor f64(std::vector<double> v, tg::Shape shape) { return tg::from_vector(std::span<const double>(v), shape); }

// x^3 as a user op whose backward is 3 x^2 g with a chosen second-order flaw.
enum class Flaw { none, half, missing };
Tensor cube(const Tensor& x, Flaw flaw) {
  std::vector<Tensor> out{tg::pow(x.detach(), 3.0)};
  tg::record_op("cube", std::vector<Tensor>{x}, out, [x, flaw](std::span<const Tensor> g, const std::vector<bool>&) {
    const Tensor xd = x.detach();
    switch (flaw) {
      case Flaw::none: return std::vector<Tensor>{g[0] * 3.0 * x * x};
      case Flaw::half: return std::vector<Tensor>{g[0] * 3.0 * x * xd};  // right value, half its derivative
      case Flaw::missing: break;
    }
    return std::vector<Tensor>{g[0] * 3.0 * xd * xd};  // right value, no derivative in x at all
  });
  return out[0];
}

}  // namespace

BOOST_AUTO_TEST_SUITE(grad_api)

BOOST_AUTO_TEST_CASE(returns_the_gradients_and_leaves_dot_grad_alone) {
  Tensor x = f64({1, -2, 3}, {3}).set_requires_grad();
  const auto g = tg::grad({tg::sum(x * x)}, {x});
  check_close(g[0], {2, -4, 6}, 0, "d sum(x^2) / dx");
  BOOST_TEST(!x.grad().defined());
  BOOST_TEST(!g[0].requires_grad());
  // The same tensor twice gets the same gradient twice; an intermediate is an input too.
  const Tensor h = x * 3.0;
  const auto both = tg::grad({tg::sum(h * h)}, {h, x, h});
  check_close(both[0], {6, -12, 18}, 0, "dL/dh = 2h");
  check_close(both[1], {18, -36, 54}, 0, "dL/dx = 18x");
  check_close(both[2], {6, -12, 18}, 0, "again");
}

BOOST_AUTO_TEST_CASE(create_graph_gives_gradients_with_history_under_a_no_grad_guard_too) {
  Tensor x = f64({0.5, -1.0}, {2}).set_requires_grad();
  const Tensor y = tg::sum(tg::tanh(x));
  std::vector<Tensor> g;
  {
    tg::NoGradGuard off;  // as in an evaluation loop
    g = tg::grad({y}, {x}, {}, {.create_graph = true});
  }
  BOOST_TEST(g[0].requires_grad());
  const auto h = tg::grad({tg::sum(g[0])}, {x});  // d/dx (1 - tanh^2) = -2 tanh (1 - tanh^2)
  const double t0 = std::tanh(0.5), t1 = std::tanh(-1.0);
  check_close(h[0], {-2 * t0 * (1 - t0 * t0), -2 * t1 * (1 - t1 * t1)}, 1e-15, "second derivative");
}

BOOST_AUTO_TEST_CASE(unused_inputs_and_bad_arguments_are_named) {
  Tensor x = f64({1, 2}, {2}).set_requires_grad();
  Tensor z = f64({3}, {1}).set_requires_grad();
  const Tensor y = tg::sum(x * 2.0);
  check_throws<tg::GraphError>([&] { tg::grad({y}, {x, z}); }, {"grad", "inputs[1]", "[1]", "allow_unused"});
  const auto g = tg::grad({y}, {x, z}, {}, {.allow_unused = true});
  BOOST_TEST(g[0].defined());
  BOOST_TEST(!g[1].defined());
  check_throws<tg::GraphError>([&] { tg::grad({y}, {f64({1}, {1})}); }, {"grad", "inputs[0]", "does not require grad"});
  check_throws<tg::ShapeError>([&] { tg::grad({x * 2.0}, {x}); }, {"grad", "outputs[0]", "[2]", "one element"});
  check_throws<tg::ShapeError>([&] { tg::grad({x * 2.0}, {x}, {f64({1}, {1})}); }, {"grad", "grad_outputs[0]", "[2]", "[1]"});
  check_throws<tg::DTypeError>([&] { tg::grad({x * 2.0}, {x}, {tg::ones({2}, tg::float32)}); },
                               {"grad", "grad_outputs[0]", "float64 [2]", "float32 [2]"});
  check_throws<tg::DTypeError>([&] { tg::backward({x * 2.0}, {tg::ones({2}, tg::float32)}); },
                               {"backward", "grad_outputs[0]", "float64 [2]", "float32 [2]"});
  check_throws<tg::Error>([&] { tg::grad({y}, {Tensor()}); }, {"grad", "'inputs[0]'", "undefined"});
}

BOOST_AUTO_TEST_CASE(only_the_nodes_leading_to_the_inputs_run) {
  Tensor x = f64({1, 2}, {2}).set_requires_grad();
  Tensor b = f64({3, 4}, {2}).set_requires_grad();
  int runs = 0;
  std::vector<Tensor> out{b.detach() * 1.0};
  tg::record_op("counted", std::vector<Tensor>{b}, out, [&runs](std::span<const Tensor> g, const std::vector<bool>&) {
    ++runs;
    return std::vector<Tensor>{g[0]};
  });
  const Tensor y = tg::sum(x * x) + tg::sum(out[0]);
  tg::grad({y}, {x});
  BOOST_TEST(runs == 0);
  tg::grad({y}, {b});
  BOOST_TEST(runs == 1);
}

BOOST_AUTO_TEST_CASE(a_first_order_pass_records_nothing_and_create_graph_records_the_pass) {
  Tensor x = f64({0.5, -1.5}, {2}).set_requires_grad();
  {
    const Tensor y = tg::sum(tg::exp(x) * x);
    const std::size_t before = tg::tape_size();
    tg::backward(y);
    BOOST_TEST(tg::tape_size() == before);
    BOOST_TEST(!x.grad().requires_grad());
    x.zero_grad();
  }
  {
    const Tensor y = tg::sum(x * x * x);
    const std::size_t before = tg::tape_size();
    tg::backward({y}, {tg::ones({}, tg::float64)}, {.create_graph = true});
    BOOST_TEST(tg::tape_size() > before);
    const Tensor g = x.grad();  // 3 x^2, with a graph
    BOOST_TEST(g.requires_grad());
    check_close(g, {0.75, 6.75}, 1e-15, "3 x^2");
    x.zero_grad();  // frees the cycle leaf -> .grad -> graph -> leaf
    tg::backward(tg::sum(g));
    check_close(x.grad(), {3, -9}, 1e-15, "6 x");
    x.zero_grad();
  }
  BOOST_TEST(tg::tape_size() == 0u);
}

BOOST_AUTO_TEST_CASE(a_gradient_penalty_loop_stays_flat_in_memory) {
  // loss + 0.1 |d loss / d w|^2, minimised for 3,000 steps: the graph made by create_graph is
  // freed with the step's tensors like any other.
  Tensor w = tg::randn({16, 16}, 3, tg::float64).set_requires_grad();
  const Tensor x = tg::randn({8, 16}, 4, tg::float64);
  std::int64_t after_first = 0;
  for (int step = 0; step < 3000; ++step) {
    {
      const Tensor loss = tg::mean(tg::tanh(tg::matmul(x, w)) * tg::tanh(tg::matmul(x, w)));
      const Tensor g = tg::grad({loss}, {w}, {}, {.create_graph = true})[0];
      tg::backward(loss + 0.1 * tg::sum(g * g));
    }
    {
      tg::NoGradGuard off;
      tg::add_(w, w.grad(), -0.01);
    }
    w.zero_grad();
    BOOST_TEST_REQUIRE(tg::tape_size() == 0u);
    if (step == 0) after_first = tg::memory_stats().current_bytes;
  }
  BOOST_TEST(tg::memory_stats().current_bytes == after_first);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(second_order_checks)

BOOST_AUTO_TEST_CASE(gradgradcheck_catches_a_wrong_second_order_formula) {
  const Tensor x = f64({0.7, -1.2, 0.4}, {3}).set_requires_grad();
  for (Flaw flaw : {Flaw::none, Flaw::half, Flaw::missing}) {
    const auto f = [flaw](const std::vector<Tensor>& in) { return std::vector<Tensor>{cube(in[0], flaw)}; };
    BOOST_TEST(tg::gradcheck(f, {x}).ok);  // every version is right to first order
    const auto r = tg::gradgradcheck(f, {x});
    BOOST_TEST(r.ok == (flaw == Flaw::none), r.report());
    BOOST_TEST(r.report().rfind("gradgradcheck:", 0) == 0u);
  }
  check_throws<tg::DTypeError>([] { tg::gradgradcheck([](const std::vector<Tensor>& in) { return in; }, {tg::zeros({2})}); },
                               {"gradgradcheck", "'inputs[0]'", "float64"});
  check_throws<tg::ShapeError>(
      [&] { tg::gradgradcheck([](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * 2.0}; }, {x}, {f64({1}, {1})}); },
      {"gradgradcheck", "grad_outputs[0]", "[3]", "[1]"});
}

BOOST_AUTO_TEST_CASE(hessian_vector_products_hessians_and_jacobians_are_exact) {
  // f(x) = x^T A x has the Hessian A + A^T.
  const Tensor a = f64({1, 2, 0, -1, 3, 1, 0.5, 0, 2}, {3, 3});
  const Tensor x = f64({0.3, -0.6, 0.9}, {3, 1});
  const auto f = [&](const Tensor& t) { return tg::sum(t * tg::matmul(a, t)); };
  const Tensor v = f64({1, -1, 2}, {3, 1});
  const Tensor hv = tg::hessian_vector_product(f, x, v);
  const std::vector<double> sym = {2, 1, 0.5, 1, 6, 1, 0.5, 1, 4};  // A + A^T
  std::vector<double> expected(3, 0.0);
  const std::vector<double> vv = v.to_vector<double>();
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) expected[static_cast<std::size_t>(i)] += sym[static_cast<std::size_t>(i * 3 + j)] * vv[static_cast<std::size_t>(j)];
  check_close(hv, expected, 1e-14, "H v");
  const Tensor h = tg::hessian(f, x);
  BOOST_TEST(h.shape() == (tg::Shape{3, 1, 3, 1}));
  check_close(h, sym, 1e-14, "H");
  // The Jacobian of tanh is diagonal, 1 - tanh^2.
  const Tensor j = tg::jacobian([](const Tensor& t) { return tg::tanh(t); }, f64({0.2, -0.4}, {2}));
  check_close(j, {1 - std::pow(std::tanh(0.2), 2), 0, 0, 1 - std::pow(std::tanh(-0.4), 2)}, 1e-15, "J");
  // An input that f ignores has a zero product; the caller's tensors are untouched.
  const auto both = tg::hessian_vector_product([&](const std::vector<Tensor>& in) { return f(in[0]); }, {x, v}, {v, v});
  check_close(both[1], {0, 0, 0}, 0, "unused");
  BOOST_TEST(!x.requires_grad());
  check_throws<tg::ShapeError>([&] { tg::hessian_vector_product(f, x, f64({1}, {1})); },
                               {"hessian_vector_product", "vs[0]", "[3, 1]", "[1]"});
  check_throws<tg::DTypeError>([&] { tg::hessian_vector_product(f, x, v.to(tg::float32)); },
                               {"hessian_vector_product", "vs[0]", "float64 [3, 1]", "float32 [3, 1]"});
  check_throws<tg::ShapeError>([&] { tg::hessian([](const Tensor& t) { return t * 2.0; }, x); }, {"hessian", "one-element"});
  // f of a captured leaf only: zeros, as jacobian's and hessian_vector_product's.
  const Tensor w = f64({1.5, -2.0}, {2}).set_requires_grad();
  check_close(tg::hessian([&](const Tensor&) { return tg::sum(w * w); }, x), std::vector<double>(9, 0.0), 0, "H of an unused x");
  BOOST_TEST(!w.grad().defined());
}

BOOST_AUTO_TEST_CASE(the_tiny_decoder_to_second_order_over_its_parameters) {
  // test_layers' tiny decoder (2 blocks, width 8, 2 heads, sequence 5, float64).
  tg::Decoder model({.vocab = 7, .max_len = 9, .dim = 8, .heads = 2, .layers = 2, .hidden = 16, .dtype = tg::float64, .seed = 11});
  std::vector<std::int64_t> ids_v = {1, 5, 2, 6, 0, 3, 3, 4, 0, 1}, targets_v = {5, 2, 6, 0, -100, 3, 4, 0, 1, 2};
  const Tensor ids = tg::from_vector(std::span<const std::int64_t>(ids_v), {2, 5});
  const Tensor targets = tg::from_vector(std::span<const std::int64_t>(targets_v), {2, 5});
  const auto r = tg::gradgradcheck_parameters(
      [&] { return std::vector<Tensor>{tg::cross_entropy(model.forward(ids), targets)}; }, model.parameters(),
      {.atol = 1e-6, .rtol = 1e-5});
  BOOST_TEST(r.ok, r.report());
  BOOST_TEST(r.elements_checked == static_cast<std::size_t>(model.parameter_count()));
}

BOOST_AUTO_TEST_CASE(the_rotary_attention_layer_to_second_order_on_both_paths) {
  // Causal, a padded key and a suppressed query; q and k rotated (both layouts).
  const Tensor key_mask = tg::from_bools({true, true, false, true, true, true, true, true}, {2, 4});
  const Tensor query_mask = tg::from_bools({true, true, true, true, true, false, true, true}, {2, 4});
  for (auto layout : {tg::RotaryLayout::half_split, tg::RotaryLayout::interleaved})
    for (bool need_weights : {true, false}) {
      tg::MultiHeadAttention layer({.query_dim = 4, .heads = 2, .dtype = tg::float64, .seed = 9, .rotary = tg::RotaryOptions{.layout = layout}});
      std::vector<Tensor> params = layer.parameters();
      params.push_back(tg::randn({2, 4, 4}, 10, tg::float64).set_requires_grad());
      const Tensor x = params.back();
      const auto r = tg::gradgradcheck_parameters(
          [&] {
            return std::vector<Tensor>{
                layer.forward(x, {.masking = {.key_mask = key_mask, .query_mask = query_mask, .causal = true}, .need_weights = need_weights}).output};
          },
          params, {.atol = 1e-6, .rtol = 1e-5});
      BOOST_TEST(r.ok, "need_weights " << need_weights << ": " << r.report());
    }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(attention_to_second_order)

namespace {

using tg::detail::AttentionPath;

struct Case {
  Tensor q, k, v, bias;
  tg::AttentionMasking mask;
};

// B = 2, H = 2, Q = 3, K = 4, D = 3: causal with an offset, key 3 of batch 0 masked for every
// query, query 1 of batch 1 suppressed, and a bias.
Case masked_case(std::uint64_t seed) {
  Case c;
  c.q = tg::randn({2, 2, 3, 3}, seed, tg::float64);
  c.k = tg::randn({2, 2, 4, 3}, seed + 1, tg::float64);
  c.v = tg::randn({2, 2, 4, 2}, seed + 2, tg::float64);
  c.bias = tg::randn({1, 2, 3, 4}, seed + 3, tg::float64);
  c.mask.causal = true;
  c.mask.causal_offset = 1;
  c.mask.key_mask = tg::mask({{true, true, true, false}, {true, true, true, true}});
  c.mask.query_mask = tg::mask({{true, true, true}, {true, false, true}});
  return c;
}

tg::AttentionResult run(const Case& c, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias, AttentionPath path) {
  const bool weights = path == AttentionPath::weights || path == AttentionPath::blocks;
  return tg::detail::attention_core({"attention", q, k, v, bias, weights}, c.mask, path, 2);
}

}  // namespace

BOOST_AUTO_TEST_CASE(float64_paths_pass_gradgradcheck_with_masks_and_a_bias) {
  const Case c = masked_case(10);
  for (AttentionPath path : {AttentionPath::weights, AttentionPath::tiles}) {  // the float32-only paths below
    BOOST_TEST_CONTEXT("path " << tg::detail::path_name(path)) {
      const auto f = [&](const std::vector<Tensor>& in) {
        const auto r = run(c, in[0], in[1], in[2], in[3], path);
        std::vector<Tensor> outs{r.output};
        if (r.weights.defined()) outs.push_back(r.weights);
        return outs;
      };
      std::vector<Tensor> in{c.q.detach().set_requires_grad(), c.k.detach().set_requires_grad(),
                             c.v.detach().set_requires_grad(), c.bias.detach().set_requires_grad()};
      const auto r = tg::gradgradcheck(f, in);
      BOOST_TEST(r.ok, r.report());
    }
  }
}

namespace {

// The gradient of |dL/dq|^2 + |dL/dk|^2 + |dL/dv|^2 (L = <w, O>) with respect to q, k and v:
// second-order terms of every input, through the path's create_graph backward.
std::vector<std::vector<double>> second_order_terms(const Case& c, const std::vector<double>& qv, const std::vector<double>& kv,
                                                    const std::vector<double>& vv, AttentionPath path, tg::DType dtype) {
  Tensor q = f64(qv, c.q.shape()).to(dtype).set_requires_grad(), k = f64(kv, c.k.shape()).to(dtype).set_requires_grad(),
         v = f64(vv, c.v.shape()).to(dtype).set_requires_grad();
  const auto r = run(c, q, k, v, c.bias.to(dtype), path);
  const Tensor w = tg::randn(r.output.shape(), 5, tg::float64).to(dtype);
  const auto g = tg::grad({tg::sum(r.output * w)}, {q, k, v}, {}, {.create_graph = true});
  const Tensor penalty = tg::sum(g[0] * g[0]) + tg::sum(g[1] * g[1]) + tg::sum(g[2] * g[2]);
  std::vector<std::vector<double>> out;
  for (const auto& t : tg::grad({penalty}, {q, k, v}, {}, {.allow_unused = true})) out.push_back(t.to_vector<double>());
  return out;
}

const std::pair<AttentionPath, tg::DType> kPaths[] = {{AttentionPath::weights, tg::float64},   {AttentionPath::tiles, tg::float64},
                                                      {AttentionPath::weights, tg::float32},   {AttentionPath::tiles, tg::float32},
                                                      {AttentionPath::blocks, tg::float32}, {AttentionPath::fused_blocks, tg::float32}};

}  // namespace

BOOST_AUTO_TEST_CASE(float32_paths_agree_with_float64_to_second_order) {
  const Case c = masked_case(30);
  const auto exact = second_order_terms(c, c.q.to_vector<double>(), c.k.to_vector<double>(), c.v.to_vector<double>(),
                                        AttentionPath::weights, tg::float64);
  for (auto [path, dtype] : kPaths) {
    BOOST_TEST_CONTEXT("path " << tg::detail::path_name(path) << ", " << dtype) {
      const auto got = second_order_terms(c, c.q.to_vector<double>(), c.k.to_vector<double>(), c.v.to_vector<double>(), path, dtype);
      for (std::size_t i = 0; i < 3; ++i) check_close(got[i], exact[i], 1e-4, 1e-4, fmt::format("input {}", i));
    }
  }
}

BOOST_AUTO_TEST_CASE(masked_keys_and_suppressed_queries_get_exactly_zero_second_order_terms_even_holding_nan) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (auto [path, dtype] : kPaths) {
    BOOST_TEST_CONTEXT("path " << tg::detail::path_name(path) << ", " << dtype) {
      std::vector<std::vector<double>> second[2];
      for (bool poison : {false, true}) {
        const Case c = masked_case(20);
        std::vector<double> qv = c.q.to_vector<double>(), kv = c.k.to_vector<double>(), vv = c.v.to_vector<double>();
        // Batch 0's key 3 (both heads) and batch 1's query 1 (both heads): 0 or NaN.
        for (int h = 0; h < 2; ++h) {
          for (int d = 0; d < 3; ++d) kv[static_cast<std::size_t>(((0 * 2 + h) * 4 + 3) * 3 + d)] = poison ? nan : 0.0;
          for (int d = 0; d < 2; ++d) vv[static_cast<std::size_t>(((0 * 2 + h) * 4 + 3) * 2 + d)] = poison ? nan : 0.0;
          for (int d = 0; d < 3; ++d) qv[static_cast<std::size_t>(((1 * 2 + h) * 3 + 1) * 3 + d)] = poison ? nan : 0.0;
        }
        second[poison ? 1 : 0] = second_order_terms(c, qv, kv, vv, path, dtype);
      }
      for (std::size_t i = 0; i < 3; ++i) {
        BOOST_TEST(second[1][i] == second[0][i], "input " << i << ": NaN in masked places changed a second-order term");
        for (double e : second[1][i]) BOOST_TEST(std::isfinite(e));
      }
      for (int h = 0; h < 2; ++h) {
        for (int d = 0; d < 3; ++d) BOOST_TEST(second[1][1][static_cast<std::size_t>(((0 * 2 + h) * 4 + 3) * 3 + d)] == 0.0);
        for (int d = 0; d < 2; ++d) BOOST_TEST(second[1][2][static_cast<std::size_t>(((0 * 2 + h) * 4 + 3) * 2 + d)] == 0.0);
        for (int d = 0; d < 3; ++d) BOOST_TEST(second[1][0][static_cast<std::size_t>(((1 * 2 + h) * 3 + 1) * 3 + d)] == 0.0);
      }
    }
  }
}

// A path that kept no weights (the tiles) makes them again from its inputs in a create_graph
// pass, so it reads ALiBi's slopes there, which its first-order backward takes from the rows'
// own copy: a write since recording is refused by that pass alone. A path that kept the weights
// reads only them, joined to its node: a write to the masks or the bias changes nothing it reads,
// and both passes run.
BOOST_AUTO_TEST_CASE(a_mask_bias_or_slopes_written_after_recording_is_refused_where_a_create_graph_pass_reads_it) {
  for (int written = 0; written < 2; ++written) {
    Case c = masked_case(40);
    c.mask.key_mask = tg::clone(c.mask.key_mask);
    const Tensor bias = tg::clone(c.bias);
    Tensor q = c.q.detach().set_requires_grad();
    const auto r = run(c, q, c.k, c.v, bias, AttentionPath::weights);
    const Tensor loss = tg::sum(r.output * r.output);
    if (written == 0) tg::fill_(tg::select(c.mask.key_mask, 0, 0), 0.0);
    else tg::add_(bias, bias);
    tg::grad({loss}, {q});
    BOOST_CHECK_NO_THROW(tg::grad({loss}, {q}, {}, {.create_graph = true}));
  }
  Case c = masked_case(41);
  c.mask.alibi_slopes = tg::tensor({0.5, 0.25}, tg::float64);
  Tensor q = c.q.detach().set_requires_grad();
  const auto r = run(c, q, c.k, c.v, c.bias, AttentionPath::tiles);
  const Tensor loss = tg::sum(r.output * r.output);
  tg::fill_(c.mask.alibi_slopes, 1.0);
  tg::grad({loss}, {q});  // first order reads the rows' copy of the slopes: fine
  check_throws<tg::GraphError>([&] { tg::grad({loss}, {q}, {}, {.create_graph = true}); },
                               {"backward of attention", "modified in place", "second-order"});
}

BOOST_AUTO_TEST_CASE(masked_softmax_to_second_order_keeps_masked_entries_and_empty_rows_at_zero) {
  const double inf = std::numeric_limits<double>::infinity();
  Tensor s = f64({0.3, std::nan(""), -0.2, inf, 1.0, 2.0}, {2, 3}).set_requires_grad();
  const Tensor allowed = tg::mask({{true, false, true}, {false, false, false}});  // row 1 empty
  const Tensor a = tg::masked_softmax(s, allowed);
  const Tensor up = f64({1.0, inf, -2.0, 3.0, std::nan(""), 1.0}, {2, 3});
  const Tensor ds = tg::grad({a}, {s}, {up}, {.create_graph = true})[0];
  const auto ds_v = ds.to_vector<double>();
  for (std::size_t i : {1u, 3u, 4u, 5u}) BOOST_TEST(ds_v[i] == 0.0);
  const Tensor dds = tg::grad({tg::sum(ds * ds)}, {s})[0];
  const auto dds_v = dds.to_vector<double>();
  for (std::size_t i : {1u, 3u, 4u, 5u}) BOOST_TEST(dds_v[i] == 0.0);
  for (double e : dds_v) BOOST_TEST(std::isfinite(e));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(multihead_attention_to_second_order)

BOOST_AUTO_TEST_CASE(gradgradcheck_of_every_input_and_parameter_on_both_paths) {
  for (std::uint64_t seed : {1u, 2u, 3u})
    for (bool weights : {true, false}) {
      BOOST_TEST_CONTEXT("seed " << seed << (weights ? ", weights path" : ", fused path")) {
        tg_test::MhaProblem p = tg_test::make_problem(seed, tg::float64, tg_test::MaskKind::empty_query,
                                                      tg_test::BiasKind::heads_keys, /*all_biases=*/true, seed == 2);
        p.need_weights = weights;
        std::vector<Tensor> in = p.inputs();
        for (auto& t : in) t = t.detach().set_requires_grad();
        const auto r = tg::gradgradcheck(
            [&](const std::vector<Tensor>& xs) {
              const auto out = p.run(xs);
              std::vector<Tensor> outs{out.output};
              if (out.weights.defined()) outs.push_back(out.weights);
              return outs;
            },
            in);
        BOOST_TEST(r.ok, r.report());
      }
    }
}

BOOST_AUTO_TEST_CASE(suppressed_queries_and_masked_keys_holding_nan_change_no_second_order_term) {
  // Query 0 of batch 0 suppressed (empty_query), or batch 0's keys all masked (empty_batch), on
  // top of the random masks: NaN in the masked rows of the query and the context leaves every
  // second-order term as with zeros there.
  for (const auto kind : {tg_test::MaskKind::empty_query, tg_test::MaskKind::empty_batch})
    for (bool weights : {true, false}) {
      BOOST_TEST_CONTEXT((weights ? "weights path" : "fused path") << (kind == tg_test::MaskKind::empty_query ? ", empty query" : ", empty batch")) {
        std::vector<std::vector<double>> second[2];
        for (bool poison : {false, true}) {
          tg_test::MhaProblem p = tg_test::make_problem(7, tg::float64, kind, tg_test::BiasKind::none, /*all_biases=*/true, false);
          p.need_weights = weights;
          const auto qm = p.masks.query_mask.to_vector<bool>();
          const auto km = p.masks.key_mask.to_vector<bool>();
          std::vector<Tensor> in = p.inputs();
          auto rows_to = [&](const Tensor& t, const std::vector<bool>& keep) {
            std::vector<double> v = t.to_vector<double>();
            const auto w = static_cast<std::size_t>(t.shape().back());
            for (std::size_t n = 0; n < v.size(); ++n)
              if (!keep[n / w]) v[n] = poison ? std::numeric_limits<double>::quiet_NaN() : 0.0;
            return f64(v, t.shape());
          };
          in[0] = rows_to(in[0], qm);  // query [B, Q, Cq]
          in[1] = rows_to(in[1], km);  // context [B, K, Cctx]
          for (auto& t : in) t = t.detach().set_requires_grad();
          const auto out = p.run(in);
          const Tensor w = tg::randn(out.output.shape(), 9, tg::float64);
          const auto g = tg::grad({tg::sum(out.output * w)}, in, {}, {.create_graph = true, .allow_unused = true});
          Tensor penalty = tg::zeros({}, tg::float64);
          for (const auto& gi : g)
            if (gi.defined() && gi.requires_grad()) penalty = penalty + tg::sum(gi * gi);
          for (const auto& t : tg::grad({penalty}, in, {}, {.allow_unused = true}))
            second[poison ? 1 : 0].push_back(t.defined() ? t.to_vector<double>() : std::vector<double>{});
        }
        for (std::size_t i = 0; i < second[0].size(); ++i) {
          BOOST_TEST(second[1][i] == second[0][i], "input " << i << ": NaN in masked rows changed a second-order term");
          for (double e : second[1][i]) BOOST_TEST(std::isfinite(e));
        }
      }
    }
}

BOOST_AUTO_TEST_SUITE_END()


namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// t's elements as float64 bits: NaN equals NaN and -0 differs from 0.
std::vector<std::uint64_t> bits_of(const Tensor& t) {
  std::vector<std::uint64_t> out;
  for (double x : t.to_vector<double>()) {
    std::uint64_t b = 0;
    std::memcpy(&b, &x, sizeof b);
    out.push_back(b);
  }
  return out;
}

// The cases below in float32 and float64: f of inputs made from seeded draws (positive ones for
// log, sqrt and pow), an upstream gradient u of f's shape that may hold NaN where the first-order
// rule reads nothing.
struct Case {
  std::string name;
  std::vector<tg::Shape> shapes;
  Fn f;
  bool positive = false;
  std::function<void(std::vector<double>&)> poison_upstream;  // NaN and inf where nothing is read
};

std::vector<Case> backward_op_cases() {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  using Poison = std::function<void(std::vector<double>&)>;
  std::vector<Case> cases;
  auto add = [&cases](std::string name, std::vector<tg::Shape> shapes, Fn f, bool positive = false, Poison poison = {}) {
    cases.push_back({std::move(name), std::move(shapes), std::move(f), positive, std::move(poison)});
  };
  const Tensor allowed = tg::mask({{true, false, true, true}, {false, false, false, false}, {true, true, true, false}});
  add("log_softmax", {{3, 4}}, [allowed](const std::vector<Tensor>& in) { return tg::log_softmax(in[0], allowed); }, false,
      [nan, inf](std::vector<double>& u) { u[1] = nan, u[4] = inf, u[6] = nan, u[11] = -inf; });
  const Tensor targets = tg::tensor({2, -1, 0}, tg::int64);  // row 1 ignored
  for (auto reduction : {tg::Reduction::mean, tg::Reduction::sum, tg::Reduction::none}) {
    const tg::CrossEntropyOptions o{.ignore_index = -1, .label_smoothing = 0.1, .reduction = reduction};
    const bool none = reduction == tg::Reduction::none;
    add(fmt::format("cross_entropy (reduction {})", static_cast<int>(reduction)), {{3, 4}},
        [targets, o](const std::vector<Tensor>& in) { return tg::cross_entropy(in[0], targets, o); }, false,
        none ? Poison([nan](std::vector<double>& u) { u[1] = nan; }) : Poison());
  }
  for (auto reduction : {tg::Reduction::mean, tg::Reduction::sum, tg::Reduction::none})
    add(fmt::format("mse_loss (reduction {})", static_cast<int>(reduction)), {{2, 3}, {2, 3}},
        [reduction](const std::vector<Tensor>& in) { return tg::mse_loss(in[0], in[1], reduction); });
  add("layer_norm", {{3, 5}, {5}, {5}}, [](const std::vector<Tensor>& in) { return tg::layer_norm(in[0], in[1], in[2], 0.1); });
  add("layer_norm without weight", {{2, 2, 4}},
      [](const std::vector<Tensor>& in) { return tg::layer_norm(in[0], Tensor(), Tensor(), 0.1); });
  // Each row's values twice, so every maximum is tied and its gradient shared.
  add("max over a dim, tied", {{3, 2}}, [](const std::vector<Tensor>& in) { return tg::max(tg::concat({in[0], in[0] * 1.0}, 1), {1}); });
  add("max", {{2, 3}}, [](const std::vector<Tensor>& in) { return tg::max(in[0]); });
  add("exp", {{2, 3}}, [](const std::vector<Tensor>& in) { return tg::exp(in[0]); });
  add("log", {{2, 3}}, [](const std::vector<Tensor>& in) { return tg::log(in[0]); }, true);
  add("sqrt", {{2, 3}}, [](const std::vector<Tensor>& in) { return tg::sqrt(in[0]); }, true);
  for (double p : {2.5, 2.0, 1.0, 0.0, -1.5})
    add(fmt::format("pow {}", p), {{2, 3}}, [p](const std::vector<Tensor>& in) { return tg::pow(in[0], p); }, true);
  add("tanh", {{2, 3}}, [](const std::vector<Tensor>& in) { return tg::tanh(in[0]); });
  add("relu times x", {{2, 3}}, [](const std::vector<Tensor>& in) { return tg::relu(in[0]) * in[0]; });
  add("neg", {{2, 3}}, [](const std::vector<Tensor>& in) { return tg::neg(in[0]); });
  add("linear", {{2, 3, 4}, {4, 5}, {5}}, [](const std::vector<Tensor>& in) { return tg::linear(in[0], in[1], in[2]); });
  // [2, 3, 4] with strides that do not flatten to rows: the forward copies them
  add("linear of a strided x", {{4, 3, 2}, {4, 5}}, [](const std::vector<Tensor>& in) { return tg::linear(tg::permute(in[0], {2, 1, 0}), in[1]); });
  add("matmul, broadcast batch", {{2, 3, 4}, {4, 2}}, [](const std::vector<Tensor>& in) { return tg::matmul(in[0], in[1]); });
  return cases;
}

std::vector<Tensor> inputs_of(const Case& c, tg::DType dtype, std::uint64_t seed) {
  std::vector<Tensor> in;
  for (const auto& s : c.shapes)
    in.push_back((c.positive ? tg::rand(s, ++seed, dtype, 0.5, 2.0) : tg::randn(s, ++seed, dtype)).set_requires_grad());
  return in;
}

Tensor upstream_of(const Case& c, const Tensor& out, std::uint64_t seed) {
  std::vector<double> u = tg::randn(out.shape(), seed, tg::float64).to_vector<double>();
  if (c.poison_upstream) c.poison_upstream(u);
  return f64(u, out.shape()).to(out.dtype());
}

}  // namespace

BOOST_AUTO_TEST_SUITE(backward_ops_to_every_order)

// A create_graph pass runs the same kernels as a first-order pass (the backward ops record
// beside them): its gradients are the first-order ones bit for bit, NaN where they are NaN.
BOOST_AUTO_TEST_CASE(a_create_graph_pass_gives_the_first_order_bits) {
  for (const Case& c : backward_op_cases())
    for (tg::DType dtype : {tg::float32, tg::float64}) {
      BOOST_TEST_CONTEXT(c.name << ", " << dtype) {
        const std::vector<Tensor> in = inputs_of(c, dtype, 40);
        const Tensor u = upstream_of(c, c.f(in), 50).set_requires_grad();  // so every gradient has a graph
        const auto first = tg::grad({c.f(in)}, in, {u});
        const auto second = tg::grad({c.f(in)}, in, {u}, {.create_graph = true});
        for (std::size_t i = 0; i < in.size(); ++i) {
          BOOST_TEST(second[i].requires_grad());
          BOOST_TEST(bits_of(first[i]) == bits_of(second[i]), "input " << i);
        }
      }
    }
}

// The multi-head layer's projections too (a self-attention, float32 and float64).
BOOST_AUTO_TEST_CASE(the_projections_give_the_first_order_bits_in_a_create_graph_pass) {
  for (tg::DType dtype : {tg::float32, tg::float64}) {
    tg::MultiHeadAttention layer({.query_dim = 8, .heads = 2, .dtype = dtype, .seed = 3});
    std::vector<Tensor> in = layer.parameters();
    in.push_back(tg::randn({2, 5, 8}, 4, dtype).set_requires_grad());
    const auto f = [&] { return layer.forward(in.back(), {.masking = {.causal = true}}).output; };
    const Tensor u = tg::randn({2, 5, 8}, 5, dtype);
    const auto first = tg::grad({f()}, in, {u});
    const auto second = tg::grad({f()}, in, {u}, {.create_graph = true});
    for (std::size_t i = 0; i < in.size(); ++i) BOOST_TEST(bits_of(first[i]) == bits_of(second[i]), dtype << " input " << i);
  }
}

// Third order: gradgradcheck of h(x, u) = grad(f(x), x, u) with create_graph, in x and in the
// upstream u, so the backward ops' own gradients (written in recorded ops) are differentiated.
BOOST_AUTO_TEST_CASE(third_order_through_every_backward_op) {
  for (const Case& c : backward_op_cases()) {
    BOOST_TEST_CONTEXT(c.name) {
      std::vector<Tensor> in = inputs_of(c, tg::float64, 60);
      in.push_back(tg::randn(c.f(in).shape(), 70, tg::float64).set_requires_grad());
      const auto h = [&c](const std::vector<Tensor>& all) {
        const tg::EnableGradGuard on;  // gradcheck's finite differences run f under NoGradGuard
        const std::vector<Tensor> x(all.begin(), all.end() - 1);
        return tg::grad({c.f(x)}, x, {all.back()}, {.create_graph = true});
      };
      const auto r = tg::gradgradcheck(h, in);
      BOOST_TEST(r.ok, r.report());
    }
  }
}

// Where the first-order rule reads nothing (masked entries and empty rows of log_softmax,
// ignored rows of cross_entropy), NaN and inf in the inputs and in the upstream gradients leave
// every second-order term exactly 0 there, and finite elsewhere.
BOOST_AUTO_TEST_CASE(masked_entries_and_ignored_rows_get_exactly_zero_second_order_terms) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  auto check = [](const Tensor& t, const std::vector<std::size_t>& zero_at, const std::string& what) {
    const auto v = t.to_vector<double>();
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (std::find(zero_at.begin(), zero_at.end(), i) != zero_at.end()) BOOST_TEST(v[i] == 0.0, what << " element " << i);
      else BOOST_TEST(std::isfinite(v[i]), what << " element " << i);
    }
  };
  {
    const Tensor allowed = tg::mask({{true, false, true}, {false, false, false}});  // row 1 empty
    Tensor x = f64({0.3, nan, -0.2, inf, nan, 2.0}, {2, 3}).set_requires_grad();
    Tensor g = f64({1.0, nan, -2.0, inf, nan, 1.0}, {2, 3}).set_requires_grad();
    const Tensor dx = tg::grad({tg::log_softmax(x, allowed)}, {x}, {g}, {.create_graph = true})[0];
    check(dx, {1, 3, 4, 5}, "log_softmax dx");
    const auto second = tg::grad({tg::sum(dx * dx) + tg::sum(dx * 0.5)}, {x, g});
    check(second[0], {1, 3, 4, 5}, "log_softmax d2/dx");
    check(second[1], {1, 3, 4, 5}, "log_softmax d2/dg");
  }
  for (auto reduction : {tg::Reduction::mean, tg::Reduction::none}) {
    const Tensor targets = tg::tensor({1, -100, 0}, tg::int64);
    Tensor s = f64({0.2, -0.4, 1.0, nan, inf, -inf, 0.5, 0.1, -0.3}, {3, 3}).set_requires_grad();
    Tensor g = reduction == tg::Reduction::none ? f64({0.7, nan, -1.1}, {3}).set_requires_grad() : f64({0.9}, {}).set_requires_grad();
    const Tensor loss = tg::cross_entropy(s, targets, {.label_smoothing = 0.2, .reduction = reduction});
    const Tensor ds = tg::grad({loss}, {s}, {g}, {.create_graph = true})[0];
    check(ds, {3, 4, 5}, "cross_entropy dlogits");
    const auto second = tg::grad({tg::sum(ds * ds) + tg::sum(ds * 0.5)}, {s, g});
    check(second[0], {3, 4, 5}, "cross_entropy d2/dlogits");
    check(second[1], reduction == tg::Reduction::none ? std::vector<std::size_t>{1} : std::vector<std::size_t>{}, "cross_entropy d2/dg");
  }
  {
    // max over the last dim: row 0 with a tie, row 1 NaN (no winner). The gradient of dx in g
    // reads the upstream only at the winners.
    Tensor x = f64({1.0, 3.0, 3.0, nan, 0.0, 2.0}, {2, 3}).set_requires_grad();
    Tensor g = f64({2.0, 5.0}, {2}).set_requires_grad();
    const Tensor dx = tg::grad({tg::max(x, {1})}, {x}, {g}, {.create_graph = true})[0];
    check_close(dx, {0, 1, 1, 0, 0, 0}, 0, "max dx");
    const Tensor dg = tg::grad({dx}, {g}, {f64({nan, 4.0, 6.0, inf, nan, nan}, {2, 3})})[0];
    check_close(dg, {5.0, 0.0}, 0, "max d2/dg");
  }
}

BOOST_AUTO_TEST_SUITE_END()
