// Attention: docs/semantics.md §3-§5 and §8-§10 (masked softmax, scaled_dot_product_attention,
// causal_mask, the verbatim examples and the validation layers T0-T3).
#define BOOST_TEST_MODULE attention
#include <cfloat>
#include <limits>

#include "support.hpp"

namespace tg = tapegrad;
using namespace tg_test;
using tg::Shape;
using tg::Tensor;

namespace {
std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }
Tensor f64(const tg::Literal& v) { return tg::tensor(v, tg::float64); }
Tensor f64(const std::vector<double>& v, const Shape& shape) { return tg::from_vector(v, shape); }
bool bitwise_equal(const Tensor& a, const Tensor& b) { return a.to_vector<double>() == b.to_vector<double>(); }
}  // namespace

BOOST_AUTO_TEST_SUITE(small_examples)  // docs/semantics.md §9, verbatim

BOOST_AUTO_TEST_CASE(two_keys_one_query) {
  check_close(tg::attention(tg::tensor({{1, 0}}), tg::tensor({{1, 0}, {0, 1}}), tg::tensor({{10}, {20}})), {13.3024}, 5e-5, "attention");
  auto [out, w] = tg::scaled_dot_product_attention(tg::tensor({{1, 0}}), tg::tensor({{1, 0}, {0, 1}}), tg::tensor({{10}, {20}}));
  check_close(out, {13.3024}, 5e-5, "output");
  check_close(w, {0.67, 0.33}, 5e-3, "weights");
}

BOOST_AUTO_TEST_CASE(masked_two_by_two) {
  check_close(tg::attention(tg::tensor({{1, 1}, {2, 0}}), tg::tensor({{1, 1}, {2, 0}}), tg::tensor({{1, 0}, {0, 1}}),
                            tg::mask({{true, false}, {true, true}})),
              {1, 0, 0.19557, 0.80443}, 5e-6, "attention");
  auto [out, w] = tg::scaled_dot_product_attention(tg::tensor({{1, 1}, {2, 0}}), tg::tensor({{1, 1}, {2, 0}}),
                                                   tg::tensor({{1, 0}, {0, 1}}), tg::mask({{true, false}, {true, true}}));
  check_close(out, {1, 0, 0.19557, 0.80443}, 5e-6, "output");
}

BOOST_AUTO_TEST_CASE(scaled_scores_and_a_masked_key) {
  const Tensor q = tg::tensor({{2, 0, 0, 0}}), k = tg::tensor({{1, 0, 0, 0}, {0, 0, 0, 0}}), v = tg::tensor({{1}, {2}});
  // Scaled scores [1, 0] (q k^T / sqrt(4)), read back from the library's weights: their log ratio
  // is the score gap, which is 2 without the scale.
  const auto w = values(tg::scaled_dot_product_attention(q, k, v).weights);
  check_close({std::log(w[0] / w[1])}, {1.0}, 1e-6, 0, "scaled score gap");
  check_close(w, {0.7311, 0.2689}, 5e-5, 0, "weights");
  check_close(tg::attention(q, k, v), {0.7311 + 2 * 0.2689}, 5e-5, "fused output");
  BOOST_TEST(values(tg::scaled_dot_product_attention(q, k, v, tg::mask({{true, false}})).weights) == (std::vector<double>{1, 0}));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(masked_softmax_clauses)  // docs/semantics.md §3

BOOST_AUTO_TEST_CASE(maximum_over_allowed_entries_only) {
  // The disallowed 1e30 must not set the maximum: the allowed entries still get exp(0)-scale values.
  const Tensor s = tg::tensor({{1e30, 0.0, 0.0}}, tg::float64);
  BOOST_TEST(values(tg::masked_softmax(s, tg::mask({{false, true, true}}))) == (std::vector<double>{0, 0.5, 0.5}));
  // A genuinely very negative allowed score is kept, not wiped out by a sentinel.
  const auto w = values(tg::masked_softmax(tg::tensor({{-1e9, -1e9 - 1.0}}, tg::float64)));
  check_close(w, {1 / (1 + std::exp(-1.0)), 1 / (1 + std::exp(1.0))}, 1e-12, 0, "very negative");
}

BOOST_AUTO_TEST_CASE(huge_scores_stay_finite) {
  for (double big : {1e4, 1e6, static_cast<double>(FLT_MAX) / 2}) {
    for (auto dtype : {tg::float32, tg::float64}) {
      const Tensor s = tg::tensor({{big, -big, 0.0}, {-big, -big, -big}, {big, big, -big}}, dtype);
      const auto w = values(tg::masked_softmax(s));
      for (double x : w) BOOST_TEST(std::isfinite(x));
      check_close(w, {1, 0, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3, 0.5, 0.5, 0}, 1e-6, 0, fmt::format("big={} {}", big, dtype));
    }
  }
}

BOOST_AUTO_TEST_CASE(empty_rows_are_zero_with_zero_finite_gradient) {
  Tensor s = tg::tensor({{3.0, -2.0, 5.0}, {1.0, 2.0, 3.0}}, tg::float64).set_requires_grad();
  const Tensor allowed = tg::mask({{false, false, false}, {true, false, true}});
  const Tensor w = tg::masked_softmax(s, allowed);
  BOOST_TEST(values(tg::select(w, 0, 0)) == (std::vector<double>{0, 0, 0}));
  tg::backward({w}, {tg::tensor({{1.0, 2.0, 3.0}, {4.0, 5.0, 6.0}}, tg::float64)});
  const auto g = values(s.grad());
  BOOST_TEST((g[0] == 0 && g[1] == 0 && g[2] == 0));  // empty row
  BOOST_TEST(g[4] == 0);                              // disallowed entry
  for (double x : g) BOOST_TEST(std::isfinite(x));
  // dS = A (dA - sum A dA) on the live row
  const auto a = values(tg::select(w, 0, 1));
  const double dot = a[0] * 4 + a[2] * 6;
  check_close({g[3], g[5]}, {a[0] * (4 - dot), a[2] * (6 - dot)}, 1e-15, 0, "formula");
  tg::clear_tape();
}

BOOST_AUTO_TEST_CASE(gradient_stays_finite_when_a_masked_entry_has_a_non_finite_upstream_gradient) {
  Tensor s = tg::tensor({{1.0, 2.0, 3.0}}, tg::float64).set_requires_grad();
  const Tensor w = tg::masked_softmax(s, tg::mask({{true, false, true}}));
  tg::backward({w}, {tg::tensor({{1.0, std::numeric_limits<double>::infinity(), 2.0}}, tg::float64)});
  for (double g : values(s.grad())) BOOST_TEST(std::isfinite(g));
  BOOST_TEST(values(s.grad())[1] == 0.0);
  tg::clear_tape();
}

BOOST_AUTO_TEST_CASE(all_minus_infinity_is_an_empty_row_and_nan_propagates) {
  const double inf = std::numeric_limits<double>::infinity();
  BOOST_TEST(values(tg::masked_softmax(tg::tensor({{-inf, -inf}}, tg::float64))) == (std::vector<double>{0, 0}));
  const auto w = values(tg::masked_softmax(tg::tensor({{-inf, 0.0}}, tg::float64)));
  BOOST_TEST(w == (std::vector<double>{0, 1}));
  for (double x : values(tg::masked_softmax(tg::tensor({{std::nan(""), 0.0}}, tg::float64)))) BOOST_TEST(std::isnan(x));
}

BOOST_AUTO_TEST_CASE(gradcheck_with_broadcast_masks) {
  Tensor s = tg::randn({2, 3, 5}, 1, tg::float64).set_requires_grad();
  for (const Tensor& m : {tg::Tensor(), tg::from_bools({true, false, true, true, false}, {5}),
                          tg::from_bools({true, false, false, true, false, false}, {2, 3, 1})}) {
    const auto r = tg::gradcheck([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{tg::masked_softmax(in[0], m)}; }, {s});
    BOOST_TEST(r.ok, r.report());
  }
  // Non-contiguous scores.
  Tensor st = tg::transpose(tg::randn({5, 3}, 2, tg::float64), 0, 1).set_requires_grad();
  const auto r = tg::gradcheck([](const std::vector<Tensor>& in) { return std::vector<Tensor>{tg::masked_softmax(in[0])}; }, {st});
  BOOST_TEST(r.ok, r.report());
  tg::clear_tape();
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(causal_mask_clauses)  // docs/semantics.md §5

BOOST_AUTO_TEST_CASE(true_exactly_where_j_le_i_plus_offset) {
  for (std::int64_t q : {1, 3, 4}) {
    for (std::int64_t k : {1, 2, 4, 6}) {
      for (std::int64_t offset = -5; offset <= 7; ++offset) {
        const auto m = tg::causal_mask(q, k, offset).to_vector<bool>();
        BOOST_TEST(tg::causal_mask(q, k, offset).shape() == (Shape{q, k}));
        for (std::int64_t i = 0; i < q; ++i)
          for (std::int64_t j = 0; j < k; ++j) BOOST_TEST(m[static_cast<std::size_t>(i * k + j)] == (j <= i + offset));
      }
    }
  }
  BOOST_TEST(tg::causal_mask(2, 2).to_vector<bool>() == (std::vector<bool>{true, false, true, true}));
  // Any integer offset, without overflow at the extremes.
  const auto big = std::numeric_limits<std::int64_t>::max(), small = std::numeric_limits<std::int64_t>::min();
  BOOST_TEST(tg::causal_mask(3, 4, big).to_vector<bool>() == std::vector<bool>(12, true));
  BOOST_TEST(tg::causal_mask(3, 4, small).to_vector<bool>() == std::vector<bool>(12, false));
  BOOST_TEST(!tg::causal_mask(2, 2).requires_grad());
  check_throws<tg::ValueError>([] { tg::causal_mask(-1, 2); }, {"causal_mask", "'queries'", "-1"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(validation_layers)  // docs/semantics.md §10

BOOST_AUTO_TEST_CASE(T0_shapes_dtypes_and_inputs_unmodified) {
  for (auto dtype : {tg::float32, tg::float64}) {
    const Tensor q = tg::randn({2, 3, 4, 5}, 1, dtype), k = tg::randn({2, 1, 6, 5}, 2, dtype), v = tg::randn({6, 7}, 3, dtype);
    const auto before = std::vector{values(q), values(k), values(v)};
    auto [out, w] = tg::scaled_dot_product_attention(q, k, v, tg::causal_mask(4, 6, 1));
    BOOST_TEST(out.shape() == (Shape{2, 3, 4, 7}));
    BOOST_TEST(w.shape() == (Shape{2, 3, 4, 6}));
    BOOST_TEST((out.dtype() == dtype && w.dtype() == dtype));
    BOOST_TEST((values(q) == before[0] && values(k) == before[1] && values(v) == before[2]));
  }
}

BOOST_AUTO_TEST_CASE(T1_two_keys_analytic) {
  // One query, two keys: weights are a logistic of the score gap q.(k0 - k1) / sqrt(D); D = 1,
  // and D = 4, where the scale is 1/2.
  const double a = 0.7, b = -0.4, qv = 1.3;
  auto [out, w] = tg::scaled_dot_product_attention(f64({{qv}}), f64({{a}, {b}}), f64({{2.0}, {-3.0}}));
  const double p = 1 / (1 + std::exp(-(qv * a - qv * b)));
  check_close(w, {p, 1 - p}, 1e-15, "weights");
  check_close(out, {2 * p - 3 * (1 - p)}, 1e-14, "output");
  const std::vector<double> q4{1.3, -0.2, 0.5, 2.0}, k0{0.7, 1.0, -1.5, 0.25}, k1{-0.4, 0.3, 0.0, -0.5};
  double gap = 0;
  for (std::size_t i = 0; i < 4; ++i) gap += q4[i] * (k0[i] - k1[i]) / 2;
  const double p4 = 1 / (1 + std::exp(-gap));
  const Tensor keys = tg::stack({f64(k0, {4}), f64(k1, {4})}, 0), vals = f64({{2.0}, {-3.0}});
  auto [out4, w4] = tg::scaled_dot_product_attention(f64(q4, {1, 4}), keys, vals);
  check_close(w4, {p4, 1 - p4}, 1e-15, "weights, D = 4");
  check_close(out4, {2 * p4 - 3 * (1 - p4)}, 1e-14, "output, D = 4");
  check_close(tg::attention(f64(q4, {1, 4}), keys, vals), {2 * p4 - 3 * (1 - p4)}, 1e-14, "fused output, D = 4");
}

BOOST_AUTO_TEST_CASE(T2_broadcast_masks_and_empty_rows) {
  const Tensor q = tg::randn({2, 3, 4}, 4, tg::float64), k = tg::randn({2, 5, 4}, 5, tg::float64), v = tg::randn({2, 5, 3}, 6, tg::float64);
  const Tensor key_mask = tg::from_bools({true, false, true, false, true}, {5});  // broadcast over batch and queries
  auto [out, w] = tg::scaled_dot_product_attention(q, k, v, key_mask);
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t i = 0; i < 3; ++i) {
      const auto row = values(tg::select(tg::select(w, 0, b), 0, i));
      BOOST_TEST((row[1] == 0 && row[3] == 0));
      check_close({row[0] + row[2] + row[4]}, {1.0}, 1e-15, 0, "row sums to 1");
    }
  // A per-query mask emptying query 1 of batch 0.
  std::vector<bool> m(2 * 3, true);
  m[1] = false;
  auto [out2, w2] = tg::scaled_dot_product_attention(q, k, v, tg::from_bools(m, {2, 3, 1}));
  BOOST_TEST(values(tg::select(tg::select(w2, 0, 0), 0, 1)) == std::vector<double>(5, 0.0));
  BOOST_TEST(values(tg::select(tg::select(out2, 0, 0), 0, 1)) == std::vector<double>(3, 0.0));
  // The fused path: the same empty row, exactly zero, and the same outputs elsewhere.
  const Tensor fused = tg::attention(q, k, v, tg::from_bools(m, {2, 3, 1}));
  BOOST_TEST(values(tg::select(tg::select(fused, 0, 0), 0, 1)) == std::vector<double>(3, 0.0));
  check_close(fused, values(out2), 1e-14, "fused output");
  check_close(tg::attention(q, k, v, key_mask), values(out), 1e-14, "fused output, key mask");
}

BOOST_AUTO_TEST_CASE(T2_leading_dims_of_v_broadcast_the_weights) {
  // v has a batch dim that q and k lack: weights are [2, Q, K], one copy per batch entry.
  Tensor q = tg::randn({3, 4}, 30, tg::float64).set_requires_grad();
  Tensor k = tg::randn({5, 4}, 31, tg::float64).set_requires_grad();
  Tensor v = tg::randn({2, 5, 3}, 32, tg::float64).set_requires_grad();
  const Tensor mask = tg::from_bools({true, false, true, true, true, true, true, false, true, false}, {2, 1, 5});
  auto [out, w] = tg::scaled_dot_product_attention(q, k, v, mask);
  BOOST_TEST(w.shape() == (Shape{2, 3, 5}));
  BOOST_TEST(out.shape() == (Shape{2, 3, 3}));
  for (std::int64_t b = 0; b < 2; ++b) {
    auto [ob, wb] = tg::scaled_dot_product_attention(q, k, tg::select(v, 0, b), tg::select(mask, 0, b));
    check_close(tg::select(w, 0, b), values(wb), 1e-15, "weights per batch entry");
    check_close(tg::select(out, 0, b), values(ob), 1e-15, "output per batch entry");
  }
  const auto r = tg::gradcheck([&](const std::vector<Tensor>& in) {
    auto [o, ww] = tg::scaled_dot_product_attention(in[0], in[1], in[2], mask);
    return std::vector<Tensor>{o, ww};
  }, {q, k, v});
  BOOST_TEST(r.ok, r.report());
  // The fused path (attention) gives the same output and passes the same check.
  check_close(tg::attention(q, k, v, mask), values(out), 1e-14, "fused output");
  const auto fused = tg::gradcheck([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{tg::attention(in[0], in[1], in[2], mask)}; },
                                   {q, k, v});
  BOOST_TEST(fused.ok, fused.report());
  tg::clear_tape();
}

// T2 and T3 run on both paths: scaled_dot_product_attention (the weights path, the reference)
// and attention (the fused path, which keeps no weights and is a kernel of its own).
struct Path {
  const char* name;
  bool weights;  // whether the path returns the weights (sdpa) or the output only
  tg::AttentionResult run(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask = Tensor()) const {
    if (weights) return tg::scaled_dot_product_attention(q, k, v, mask);
    return {tg::attention(q, k, v, mask), Tensor()};
  }
};
const Path kPaths[] = {{"weights path", true}, {"fused path", false}};

BOOST_AUTO_TEST_CASE(T2_permutation_invariance) {
  const Tensor q = tg::randn({3, 4}, 7, tg::float64), k = tg::randn({5, 4}, 8, tg::float64), v = tg::randn({5, 2}, 9, tg::float64);
  const std::vector<std::int64_t> perm_k{3, 0, 4, 1, 2}, perm_q{2, 0, 1};
  auto pick = [](const Tensor& x, const std::vector<std::int64_t>& rows) {
    std::vector<Tensor> parts;
    for (auto r : rows) parts.push_back(tg::select(x, 0, r));
    return tg::stack(parts, 0);
  };
  for (const Path& path : kPaths) {
    BOOST_TEST_CONTEXT(path.name) {
      const Tensor base = path.run(q, k, v).output;
      // Permuting keys and values together changes nothing.
      check_close(path.run(q, pick(k, perm_k), pick(v, perm_k)).output, values(base), 1e-14, "keys permuted");
      // Permuting queries permutes the outputs.
      check_close(path.run(pick(q, perm_q), k, v).output, values(pick(base, perm_q)), 1e-14, "queries permuted");
    }
  }
}

BOOST_AUTO_TEST_CASE(T2_shift_invariance) {
  // Adding a per-query constant to every score of that query changes nothing: first on
  // masked_softmax(S + c_i) directly.
  const Tensor s = tg::randn({4, 6}, 10, tg::float64);
  const Tensor c = tg::tensor({{3.0}, {-100.0}, {1e3}, {0.5}}, tg::float64);
  const Tensor m = tg::from_bools({true, true, false, true, false, true}, {6});
  check_close(tg::masked_softmax(s + c, m), values(tg::masked_softmax(s, m)), 1e-13, "shifted scores");
  // Through attention: a key-independent term added to every key (k + u) shifts query i's
  // scores by q_i . u / sqrt(D), a per-query constant.
  const Tensor q = tg::randn({3, 4}, 11, tg::float64), k = tg::randn({5, 4}, 12, tg::float64), v = tg::randn({5, 2}, 13, tg::float64);
  const Tensor u = tg::randn({4}, 14, tg::float64);
  for (const Path& path : kPaths)
    check_close(path.run(q, k + u, v).output, values(path.run(q, k, v).output), 1e-13, std::string("keys shifted, ") + path.name);
}

BOOST_AUTO_TEST_CASE(T2_independent_gradients) {
  // Output row i depends on no other query: the gradient of output i w.r.t. q is zero off row i.
  const Tensor k = tg::randn({5, 3}, 16, tg::float64), v = tg::randn({5, 2}, 17, tg::float64);
  for (const Path& path : kPaths) {
    Tensor q = tg::randn({4, 3}, 15, tg::float64).set_requires_grad();
    for (std::int64_t i = 0; i < 4; ++i) {
      q.zero_grad();
      const auto [out, w] = path.run(q, k, v);
      tg::backward(path.weights ? tg::sum(tg::select(out, 0, i)) + tg::sum(tg::select(w, 0, i)) : tg::sum(tg::select(out, 0, i)));
      const auto g = values(q.grad());
      for (std::int64_t r = 0; r < 4; ++r)
        for (std::int64_t c = 0; c < 3; ++c) {
          const double x = g[static_cast<std::size_t>(r * 3 + c)];
          if (r == i) BOOST_TEST(x != 0.0, path.name << ": dq[" << r << ", " << c << "] from output " << i);
          else BOOST_TEST(x == 0.0, path.name << ": dq[" << r << ", " << c << "] from output " << i);
        }
      tg::clear_tape();
    }
  }
}

BOOST_AUTO_TEST_CASE(T2_causal_isolation) {
  // With causal offset o, nothing from output i reaches keys or values j > i + o.
  for (const Path& path : kPaths)
    for (std::int64_t offset : {-1, 0, 2}) {
      Tensor q = tg::randn({4, 3}, 18, tg::float64).set_requires_grad();
      Tensor k = tg::randn({6, 3}, 19, tg::float64).set_requires_grad();
      Tensor v = tg::randn({6, 2}, 20, tg::float64).set_requires_grad();
      for (std::int64_t i = 0; i < 4; ++i) {
        k.zero_grad();
        v.zero_grad();
        const auto [out, w] = path.run(q, k, v, tg::causal_mask(4, 6, offset));
        const Tensor from_out = tg::sum(tg::select(out, 0, i)) * 1.7;
        tg::backward(path.weights ? from_out + tg::sum(tg::select(w, 0, i)) : from_out);
        const auto gk = values(k.grad()), gv = values(v.grad());
        for (std::int64_t j = 0; j < 6; ++j)
          if (j > i + offset) {
            BOOST_TEST((gk[static_cast<std::size_t>(3 * j)] == 0 && gk[static_cast<std::size_t>(3 * j + 1)] == 0 && gk[static_cast<std::size_t>(3 * j + 2)] == 0),
                       path.name << ", offset " << offset << ": dk[" << j << "] from output " << i);
            BOOST_TEST((gv[static_cast<std::size_t>(2 * j)] == 0 && gv[static_cast<std::size_t>(2 * j + 1)] == 0),
                       path.name << ", offset " << offset << ": dv[" << j << "] from output " << i);
          }
        tg::clear_tape();
      }
    }
}

BOOST_AUTO_TEST_CASE(T3_prefix_averaging_experiment) {
  // docs/semantics.md §8 through the public functions: zero queries and keys, causal mask.
  const std::vector<double> vals{3, -1, 4, 1, -5, 9};
  const Tensor q = tg::zeros({6, 2}, tg::float64), k = tg::zeros({6, 2}, tg::float64);
  const Tensor v = tg::from_vector(vals, {6, 1});
  for (const Path& path : kPaths) {
    BOOST_TEST_CONTEXT(path.name) {
      const auto [out, w] = path.run(q, k, v, tg::causal_mask(6, 6));
      double running = 0;
      for (std::size_t i = 0; i < 6; ++i) {
        running += vals[i];
        BOOST_TEST(std::abs(values(out)[i] - running / static_cast<double>(i + 1)) < 1e-15);
        for (std::size_t j = 0; path.weights && j < 6; ++j)
          BOOST_TEST(values(w)[i * 6 + j] == (j <= i ? 1.0 / static_cast<double>(i + 1) : 0.0), boost::test_tools::tolerance(1e-15));
      }
      double leakage = 0;
      for (std::size_t i = 0; i < 6; ++i) {
        std::vector<double> raised = vals;
        for (std::size_t j = i + 1; j < 6; ++j) raised[j] += 1000;
        const Tensor out2 = path.run(q, k, tg::from_vector(raised, {6, 1}), tg::causal_mask(6, 6)).output;
        leakage = std::max(leakage, std::abs(values(out2)[i] - values(out)[i]));
      }
      BOOST_TEST(leakage == 0.0);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(exact_masking)

BOOST_AUTO_TEST_CASE(masked_weights_and_gradients_are_exactly_zero_and_masked_values_do_not_matter) {
  for (auto dtype : {tg::float32, tg::float64}) {
    Tensor q = tg::randn({2, 4, 3}, 21, tg::float64).to(dtype).detach().set_requires_grad();
    Tensor k = tg::randn({2, 5, 3}, 22, tg::float64).to(dtype).detach().set_requires_grad();
    Tensor v = tg::randn({2, 5, 2}, 23, tg::float64).to(dtype).detach().set_requires_grad();
    const Tensor m = tg::from_bools({true, false, true, true, false}, {5});
    auto [out, w] = tg::scaled_dot_product_attention(q, k, v, m);
    tg::backward({out, w}, {tg::ones_like(out), tg::randn(w.shape(), 24, tg::float64).to(dtype)});
    const auto wv = values(w), gk = values(k.grad()), gv = values(v.grad());
    for (std::size_t r = 0; r < 8; ++r) BOOST_TEST((wv[r * 5 + 1] == 0 && wv[r * 5 + 4] == 0));
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t j : {1, 4}) {
        for (std::int64_t c = 0; c < 3; ++c) BOOST_TEST(gk[static_cast<std::size_t>((b * 5 + j) * 3 + c)] == 0);
        for (std::int64_t c = 0; c < 2; ++c) BOOST_TEST(gv[static_cast<std::size_t>((b * 5 + j) * 2 + c)] == 0);
      }
    // Changing masked keys and values by 1000 leaves the results bitwise unchanged.
    const Tensor bump = tg::tensor({{0}, {1000}, {0}, {0}, {1000}}, dtype);
    tg::NoGradGuard no_grad;
    auto [out2, w2] = tg::scaled_dot_product_attention(q, k + bump, v + bump, m);
    BOOST_TEST(bitwise_equal(out, out2));
    BOOST_TEST(bitwise_equal(w, w2));
    tg::clear_tape();
  }
}

BOOST_AUTO_TEST_CASE(float32_agrees_with_float64) {
  const Tensor q = tg::randn({2, 3, 7, 8}, 25, tg::float64), k = tg::randn({2, 3, 9, 8}, 26, tg::float64),
               v = tg::randn({2, 3, 9, 5}, 27, tg::float64);
  const Tensor m = tg::causal_mask(7, 9, 1);
  auto [o64, w64] = tg::scaled_dot_product_attention(q, k, v, m);
  auto [o32, w32] = tg::scaled_dot_product_attention(q.to(tg::float32), k.to(tg::float32), v.to(tg::float32), m);
  check_close(values(o32), values(o64), 2e-6, 1e-5, "output");
  check_close(values(w32), values(w64), 2e-6, 1e-5, "weights");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(non_finite_masked_entries)

// Keys masked for every query and queries with no allowed key take no part in attention: a NaN
// or an infinity there must change no output and no gradient. Each run poisons those entries
// and compares with the same run where they are 0. The comparison is exact (== on every value):
// the products by the weights run the same matmul on the same finite values in both runs.
// Every test here runs on both paths: the weights path (scaled_dot_product_attention, with an
// upstream gradient for the weights too) and the fused one (attention, output only).
struct SdpaRun {
  std::vector<std::vector<double>> results;  // output, [weights,] dq, dk, dv
  std::vector<const char*> names;
};

SdpaRun run_attention(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& mask, const Tensor& d_out, const Tensor& d_weights,
                 bool need_weights) {
  Tensor q = q0.detach().set_requires_grad(), k = k0.detach().set_requires_grad(), v = v0.detach().set_requires_grad();
  SdpaRun r;
  if (need_weights) {
    auto [out, w] = tg::scaled_dot_product_attention(q, k, v, mask);
    tg::backward({out, w}, {d_out, d_weights});
    r = {{values(out), values(w)}, {"output", "weights"}};
  } else {
    const Tensor out = tg::attention(q, k, v, mask);
    tg::backward({out}, {d_out});
    r = {{values(out)}, {"output"}};
  }
  for (const Tensor* x : {&q, &k, &v}) r.results.push_back(values(x->grad()));
  r.names.insert(r.names.end(), {"dq", "dk", "dv"});
  tg::clear_tape();
  return r;
}

// x [..., L, C] with rows `rows` (indices into the flattened [..., L]) set to `value`.
Tensor with_rows(const Tensor& x, const std::vector<std::int64_t>& rows, double value) {
  std::vector<double> v = values(x);
  const std::int64_t c = x.shape().back();
  for (auto r : rows)
    for (std::int64_t j = 0; j < c; ++j) v[static_cast<std::size_t>(r * c + j)] = value;
  return tg::from_vector(v, x.shape()).to(x.dtype());
}

void check_same(const SdpaRun& poisoned, const SdpaRun& zeroed, const std::string& what) {
  const auto& names = poisoned.names;
  for (std::size_t i = 0; i < poisoned.results.size(); ++i) {
    for (double x : poisoned.results[i]) BOOST_TEST_REQUIRE(std::isfinite(x), what << ": " << names[i] << " is not finite");
    BOOST_TEST((poisoned.results[i] == zeroed.results[i]), what << ": " << names[i] << " differs from the zeroed run");
  }
}

const double kPoisons[] = {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity()};

BOOST_AUTO_TEST_CASE(masked_keys_and_empty_rows_change_no_output_and_no_gradient) {
  // [B=2, Q=4, K=5]. Batch 0: key 1 is masked for every query, query 2 has no allowed key.
  // Batch 1: keys 0 and 4 are masked for every query, queries 0 and 3 have no allowed key, and
  // key 2 is masked for query 1 only (it stays finite: query 2 attends to it).
  std::vector<bool> m(2 * 4 * 5, true);
  auto set = [&](std::int64_t b, std::int64_t i, std::int64_t j) { m[static_cast<std::size_t>((b * 4 + i) * 5 + j)] = false; };
  for (std::int64_t i = 0; i < 4; ++i) set(0, i, 1), set(1, i, 0), set(1, i, 4);
  for (std::int64_t j = 0; j < 5; ++j) set(0, 2, j), set(1, 0, j), set(1, 3, j);
  set(1, 1, 2);
  const Tensor mask = tg::from_bools(m, {2, 4, 5});
  const std::vector<std::int64_t> masked_keys{1, 5 + 0, 5 + 4}, empty_rows{2, 4 + 0, 4 + 3};  // flattened [B, L]
  for (auto [dtype, nw] : {std::pair{tg::float32, true}, {tg::float64, true}, {tg::float32, false}, {tg::float64, false}}) {
    const bool need_weights = nw;  // a structured binding cannot be captured by the lambda below
    auto run_sdpa = [&](auto&&... a) { return run_attention(a..., need_weights); };
    const Tensor q = tg::randn({2, 4, 3}, 40, tg::float64).to(dtype), k = tg::randn({2, 5, 3}, 41, tg::float64).to(dtype);
    const Tensor v = tg::randn({2, 5, 2}, 42, tg::float64).to(dtype);
    const Tensor d_out = tg::randn({2, 4, 2}, 43, tg::float64).to(dtype), d_w = tg::randn({2, 4, 5}, 44, tg::float64).to(dtype);
    const SdpaRun zeroed = run_sdpa(with_rows(q, empty_rows, 0), with_rows(k, masked_keys, 0), with_rows(v, masked_keys, 0), mask, d_out, d_w);
    for (double poison : kPoisons) {
      const std::string what = fmt::format("{} need_weights {} poison {}", dtype, need_weights, poison);
      check_same(run_sdpa(with_rows(q, empty_rows, poison), with_rows(k, masked_keys, 0), with_rows(v, masked_keys, 0), mask, d_out, d_w),
                 zeroed, what + " in empty rows' q");
      check_same(run_sdpa(with_rows(q, empty_rows, 0), with_rows(k, masked_keys, poison), with_rows(v, masked_keys, 0), mask, d_out, d_w),
                 zeroed, what + " in masked keys' k");
      check_same(run_sdpa(with_rows(q, empty_rows, 0), with_rows(k, masked_keys, 0), with_rows(v, masked_keys, poison), mask, d_out, d_w),
                 zeroed, what + " in masked keys' v");
      check_same(run_sdpa(with_rows(q, empty_rows, poison), with_rows(k, masked_keys, -poison), with_rows(v, masked_keys, poison), mask,
                          d_out, d_w),
                 zeroed, what + " everywhere at once");
      // A non-finite upstream gradient of an empty row's output reaches no dv either.
      check_same(run_sdpa(with_rows(q, empty_rows, 0), with_rows(k, masked_keys, 0), with_rows(v, masked_keys, 0), mask,
                          with_rows(d_out, empty_rows, poison), d_w),
                 zeroed, what + " in empty rows' upstream gradient");
    }
  }
}

BOOST_AUTO_TEST_CASE(broadcast_keys_and_strided_values) {
  // k and v shared by the batch ([1, K, *], v transposed in memory), a mask broadcast from [K]:
  // key 3 is masked for every query of both batch entries.
  const Tensor mask = tg::from_bools({true, true, false, false, true}, {5});
  for (auto [dtype, nw] : {std::pair{tg::float32, true}, {tg::float64, true}, {tg::float32, false}, {tg::float64, false}}) {
    const bool need_weights = nw;
    auto run_sdpa = [&](auto&&... a) { return run_attention(a..., need_weights); };
    const Tensor q = tg::randn({2, 3, 4}, 45, tg::float64).to(dtype), k = tg::randn({1, 5, 4}, 46, tg::float64).to(dtype);
    const Tensor v = tg::randn({1, 5, 3}, 47, tg::float64).to(dtype);
    const Tensor d_out = tg::randn({2, 3, 3}, 48, tg::float64).to(dtype), d_w = tg::randn({2, 3, 5}, 49, tg::float64).to(dtype);
    auto transposed = [](const Tensor& x) { return tg::transpose(tg::contiguous(tg::transpose(x, 1, 2)), 1, 2); };
    const SdpaRun zeroed = run_sdpa(q, with_rows(k, {2, 3}, 0), transposed(with_rows(v, {2, 3}, 0)), mask, d_out, d_w);
    for (double poison : kPoisons)
      check_same(run_sdpa(q, with_rows(k, {2, 3}, poison), transposed(with_rows(v, {2, 3}, -poison)), mask, d_out, d_w), zeroed,
                 fmt::format("{} need_weights {} poison {}", dtype, need_weights, poison));
  }
}

BOOST_AUTO_TEST_CASE(strided_values_with_few_queries_and_many_keys) {
  // v with its keys at stride 1 (transposed in memory, or the first keys of a longer transposed
  // cache), one to five queries, up to 20 keys, key 3 masked for all: the product by the weights
  // must run the same loops on the finite copy as on v itself (one dot product per output for
  // fewer than four rows, whose sums are ordered unlike a contiguous operand's).
  const auto transposed = [](const Tensor& x) { return tg::transpose(tg::contiguous(tg::transpose(x, 1, 2)), 1, 2); };
  const auto cache_prefix = [](const Tensor& x) {  // x's keys as the first of 40 in a [1, 3, 40] cache
    const Tensor cache = tg::concat({tg::transpose(x, 1, 2), tg::zeros({1, x.shape()[2], 40 - x.shape()[1]}, x.dtype())}, 2);
    return tg::slice(tg::transpose(cache, 1, 2), 1, 0, x.shape()[1]);
  };
  for (const std::int64_t queries : {1, 2, 3, 5})
    for (const std::int64_t keys : {9, 20})
      for (const bool sliced : {false, true})
      for (auto [dtype, nw] : {std::pair{tg::float32, true}, {tg::float32, false}, {tg::float64, true}}) {
        std::vector<bool> allowed(static_cast<std::size_t>(keys), true);
        allowed[3] = false;
        const Tensor mask = tg::from_bools(allowed, {keys});
        const Tensor q = tg::randn({2, queries, 4}, 61, tg::float64).to(dtype), k = tg::randn({1, keys, 4}, 62, tg::float64).to(dtype);
        const Tensor v = tg::randn({1, keys, 3}, 63, tg::float64).to(dtype);
        const Tensor d_out = tg::randn({2, queries, 3}, 64, tg::float64).to(dtype), d_w = tg::randn({2, queries, keys}, 65, tg::float64).to(dtype);
        const auto layout = [&](const Tensor& x) { return sliced ? cache_prefix(x) : transposed(x); };
        BOOST_TEST_REQUIRE(layout(v).strides()[1] == 1);
        const SdpaRun zeroed = run_attention(q, k, layout(with_rows(v, {3}, 0)), mask, d_out, d_w, nw);
        for (double poison : kPoisons)
          check_same(run_attention(q, with_rows(k, {3}, poison), layout(with_rows(v, {3}, poison)), mask, d_out, d_w, nw), zeroed,
                     fmt::format("Q {} K {} {} {} need_weights {} poison {}", queries, keys, sliced ? "sliced" : "transposed", dtype, nw, poison));
      }
}

BOOST_AUTO_TEST_CASE(a_key_poisons_exactly_the_rows_that_attend_to_it) {
  // Causal, Q = K = 4: key 3 is masked for queries 0-2 and allowed for query 3. An infinite value
  // there leaves rows 0-2 exactly as with 0 and makes row 3 non-finite, as it should.
  for (auto dtype : {tg::float32, tg::float64}) {
    const Tensor q = tg::randn({4, 2}, 50, tg::float64).to(dtype), k = tg::randn({4, 2}, 51, tg::float64).to(dtype);
    const Tensor v = tg::randn({4, 3}, 52, tg::float64).to(dtype);
    const Tensor mask = tg::causal_mask(4, 4);
    // attention() is the fused path, scaled_dot_product_attention's output the weights path.
    auto paths = {+[](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& m) { return tg::attention(q, k, v, m); },
                  +[](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& m) {
                    return tg::scaled_dot_product_attention(q, k, v, m).output;
                  }};
    for (auto attend : paths)
      for (double poison : kPoisons) {
        const auto clean = values(attend(q, k, with_rows(v, {3}, 0), mask));
        const auto out = values(attend(q, k, with_rows(v, {3}, poison), mask));
        BOOST_TEST(std::vector<double>(out.begin(), out.begin() + 9) == std::vector<double>(clean.begin(), clean.begin() + 9));
        for (std::size_t c = 9; c < 12; ++c) BOOST_TEST(!std::isfinite(out[c]));
      }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(bad_inputs)

// No scores: an empty batch with 2^46 keys (a fuzz finding). Counted with 0 as 1 the scores
// [0, 4, 2^46] pass 2^48 bytes, so no path may form them: attention() returns its empty output,
// and scaled_dot_product_attention(), which must return those weights, refuses them. With
// K = 0 the output is zeros and so is every gradient.
BOOST_AUTO_TEST_CASE(no_scores_form_nothing_of_the_scores_shape) {
  const std::int64_t k = std::int64_t{1} << 46;
  auto view = [](const tg::Shape& s) { return tg::expand(tg::zeros({1, 1, 1}), s); };
  const Tensor q = view({0, 4, 1}), kk = view({0, k, 1}), v = view({0, k, 0});
  BOOST_TEST(tg::attention(q, kk, v).shape() == (tg::Shape{0, 4, 0}));
  check_throws<tg::ShapeError>([&] { tg::scaled_dot_product_attention(q, kk, v); }, {"scaled_dot_product_attention", "weights"});
  Tensor q2 = tg::randn({2, 3, 4}, 1, tg::float64).set_requires_grad();
  Tensor k2 = tg::zeros({2, 0, 4}, tg::float64).set_requires_grad(), v2 = tg::zeros({2, 0, 5}, tg::float64).set_requires_grad();
  for (bool weights : {true, false}) {
    const Tensor out = weights ? tg::scaled_dot_product_attention(q2, k2, v2).output : tg::attention(q2, k2, v2);
    BOOST_TEST(out.to_vector<double>() == std::vector<double>(30, 0.0));
    const auto g = tg::grad({tg::sum(out * out + out)}, {q2, k2, v2});
    BOOST_TEST(g[0].to_vector<double>() == std::vector<double>(24, 0.0));
    BOOST_TEST(g[1].shape() == k2.shape());
  }
}

BOOST_AUTO_TEST_CASE(scaled_dot_product_attention_errors) {
  auto sdpa = [](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& m = {}) { tg::scaled_dot_product_attention(q, k, v, m); };
  const Tensor q = tg::zeros({2, 3}), k = tg::zeros({4, 3}), v = tg::zeros({4, 5});
  check_throws<tg::ShapeError>([&] { sdpa(tg::zeros({3}), k, v); }, {"scaled_dot_product_attention", "'q'", "rank >= 2", "[3]"});
  check_throws<tg::ShapeError>([&] { sdpa(q, tg::zeros({4, 2}), v); }, {"'q'", "[2, 3]", "'k'", "[4, 2]"});
  check_throws<tg::ShapeError>([&] { sdpa(q, k, tg::zeros({5, 5})); }, {"'k'", "[4, 3]", "'v'", "[5, 5]"});
  check_throws<tg::DTypeError>([&] { sdpa(q, k, v.to(tg::float64)); }, {"'q'", "'v'", "float32", "float64"});
  check_throws<tg::DTypeError>([&] { sdpa(q, k, v, tg::zeros({2, 4})); }, {"'mask'", "bool", "float32"});
  check_throws<tg::ShapeError>([&] { sdpa(q, k, v, tg::zeros({3, 4}, tg::bool_)); }, {"'mask'", "[3, 4]", "[2, 4]"});
  check_throws<tg::ShapeError>([&] { sdpa(tg::zeros({2, 2, 3}), tg::zeros({3, 4, 3}), tg::zeros({4, 5})); }, {"leading dims", "[2]", "[3]"});
  check_throws<tg::DTypeError>([&] { tg::masked_softmax(tg::zeros({2}, tg::int64)); }, {"masked_softmax", "'scores'", "int64"});
  check_throws<tg::ShapeError>([&] { tg::masked_softmax(tg::zeros({2, 3}), tg::zeros({4, 2, 3}, tg::bool_)); },
                               {"masked_softmax", "'allowed'", "[4, 2, 3]", "[2, 3]"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(row_kernels)

// The softmax rows run in parallel and in vector lanes: a masked key must stay an exact zero
// even in a row that a NaN score turns NaN (a lane multiplying 0 by the NaN normaliser would not).
BOOST_AUTO_TEST_CASE(nan_row_keeps_masked_entries_exactly_zero) {
  for (auto dtype : {tg::float32, tg::float64}) {
    Tensor s = tg::zeros({1, 40}, dtype);
    tg::fill_(tg::slice(s, 1, 3, 4), std::nan(""));
    Tensor allowed = tg::ones({1, 40}, tg::bool_);
    tg::fill_(tg::slice(allowed, 1, 10, 30), 0.0);
    const auto w = values(tg::masked_softmax(s, allowed));
    for (std::size_t j = 0; j < w.size(); ++j) {
      if (j >= 10 && j < 30) BOOST_TEST(w[j] == 0.0);
      else BOOST_TEST(std::isnan(w[j]));
    }
  }
}

// Rows split over two threads give bitwise the results of one thread, forward and backward.
BOOST_AUTO_TEST_CASE(two_threads_match_one_thread) {
  const int before = tg::num_threads();
  const Tensor q = tg::randn({4, 96, 32}, 1).set_requires_grad(), k = tg::randn({4, 80, 32}, 2).set_requires_grad(),
               v = tg::randn({4, 80, 16}, 3).set_requires_grad();
  const Tensor allowed = tg::gt(tg::randn({4, 96, 80}, 4), tg::scalar(-0.5));
  const Tensor x = tg::randn({300, 200}, 5).set_requires_grad();
  const Tensor x_mask = tg::gt(tg::randn({300, 200}, 6), tg::scalar(-1.0));
  auto run = [&](int threads) {
    tg::set_num_threads(threads);
    std::vector<Tensor> out;
    auto [o, w] = tg::scaled_dot_product_attention(q, k, v, allowed);
    const Tensor sm = tg::masked_softmax(x, x_mask), ls = tg::log_softmax(x, x_mask);
    tg::backward({o, w, sm, ls}, {tg::ones_like(o), tg::randn(w.shape(), 7), tg::randn(sm.shape(), 8), tg::randn(ls.shape(), 9)});
    tg::clear_tape();
    out = {o, w, sm, ls, q.grad(), k.grad(), v.grad(), x.grad()};
    for (Tensor t : {q, k, v, x}) t.zero_grad();
    return out;
  };
  const auto one = run(1), two = run(2);
  tg::set_num_threads(before);
  for (std::size_t i = 0; i < one.size(); ++i) BOOST_TEST(bitwise_equal(one[i], two[i]), "result " << i);
}

BOOST_AUTO_TEST_SUITE_END()
