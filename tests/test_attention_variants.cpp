// The attention variants of small language models (docs/semantics.md §14):
// grouped-query heads, a sliding window and ALiBi, through scaled_dot_product_attention's
// options, the functional multihead_attention, the MultiHeadAttention layer and its KV cache,
// and the Decoder. Each is checked against its explicit construction: k and v heads repeated,
// the window as a bool mask, ALiBi as an additive bias.
#define BOOST_TEST_MODULE attention_variants
#include <boost/test/data/test_case.hpp>
#include <algorithm>
#include <functional>

#include "ops/attention_core.hpp"
#include "ops/grouped_heads.hpp"
#include "support.hpp"

namespace tg = tapegrad;
namespace bdata = boost::unit_test::data;
using namespace tg_test;
using tg::Shape;
using tg::Tensor;

namespace {

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

// k [..., Hkv, K, W] with each head repeated g times: [..., Hkv g, K, W], head h = hkv g + r.
// Recorded (expand, reshape), so gradients flow back summed over each group.
Tensor repeat_heads(const Tensor& k, std::int64_t g) {
  const Tensor u = tg::unsqueeze(k, -3);
  Shape wide = u.shape(), out = k.shape();
  wide[wide.size() - 3] = g;
  out[out.size() - 3] *= g;
  return tg::reshape(tg::expand(u, wide), out);
}

// The window as a bool [Q, K] mask: j <= i + offset and j > i + offset - window.
Tensor window_mask(std::int64_t q, std::int64_t k, std::int64_t offset, std::int64_t window) {
  std::vector<bool> m;
  for (std::int64_t i = 0; i < q; ++i)
    for (std::int64_t j = 0; j < k; ++j) m.push_back(j <= i + offset && (window == 0 || j > i + offset - window));
  return tg::from_bools(m, {q, k});
}

// ALiBi as a bias [H, Q, K]: -slopes[h] |i + offset - j|, recorded in the slopes.
Tensor alibi_bias(const Tensor& slopes, std::int64_t q, std::int64_t k, std::int64_t offset) {
  std::vector<double> d;
  for (std::int64_t i = 0; i < q; ++i)
    for (std::int64_t j = 0; j < k; ++j) d.push_back(static_cast<double>(std::abs(i + offset - j)));
  const Tensor dist = tg::from_vector(d, {q, k}).to(slopes.dtype());
  return tg::neg(tg::reshape(slopes, {slopes.size(0), 1, 1}) * dist);
}

using AttentionFn = std::function<tg::AttentionResult(const std::vector<Tensor>&)>;

// f's output and weights (when defined), then the gradients of every input under seeded
// upstream gradients: the numbers two constructions of one computation must share.
std::vector<std::vector<double>> run(const AttentionFn& f, const std::vector<Tensor>& inputs, std::uint64_t seed) {
  std::vector<Tensor> xs;
  for (const Tensor& x : inputs) xs.push_back(x.detach().set_requires_grad());
  const auto r = f(xs);
  std::vector<Tensor> outs{r.output};
  if (r.weights.defined()) outs.push_back(r.weights);
  std::vector<Tensor> ups;
  for (const Tensor& o : outs) ups.push_back(tg::randn(o.shape(), seed++, tg::float64).to(o.dtype()));
  std::vector<std::vector<double>> result;
  for (const Tensor& o : outs) result.push_back(values(o));
  for (const Tensor& g : tg::grad(outs, xs, ups)) result.push_back(values(g));
  return result;
}

void check_runs(const std::vector<std::vector<double>>& got, const std::vector<std::vector<double>>& want, double tol, const std::string& what) {
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) check_close(got[i], want[i], tol, tol, fmt::format("{}: result {}", what, i));
}

// Seeded normal values, drawn in float64 whatever the dtype (so both dtypes see the same numbers).
Tensor draw(const Shape& s, std::uint64_t seed, tg::DType dtype = tg::float64) { return tg::randn(s, seed, tg::float64).to(dtype); }

}  // namespace

BOOST_AUTO_TEST_SUITE(grouped_query_heads)

struct GqaCase {
  std::int64_t kv_heads;
  int mask;  // 0 none, 1 per head [B, H, Q, K], 2 shared [B, 1, Q, K], 3 [Q, K]
  bool causal, need_weights;
};
std::ostream& operator<<(std::ostream& os, const GqaCase& c) {
  return os << "Hkv " << c.kv_heads << " mask " << c.mask << " causal " << c.causal << " need_weights " << c.need_weights;
}
std::vector<GqaCase> gqa_cases() {
  std::vector<GqaCase> cases;
  for (std::int64_t kv : {1, 2, 4})
    for (int mask : {0, 1, 2, 3})
      for (bool need_weights : {true, false}) cases.push_back({kv, mask, mask % 2 == 0, need_weights});
  return cases;
}

Tensor gqa_mask(int kind, std::int64_t b, std::int64_t h, std::int64_t q, std::int64_t k, std::uint64_t seed) {
  const std::vector<Shape> shapes{{}, {b, h, q, k}, {b, 1, q, k}, {q, k}};
  if (kind == 0) return Tensor();
  return tg::gt(tg::randn(shapes[static_cast<std::size_t>(kind)], seed), tg::scalar(-0.8));
}

BOOST_DATA_TEST_CASE(equals_the_repeated_key_value_heads, bdata::make(gqa_cases()), c) {
  // B 2, H 4, Q 5, K 6, D 3, Dv 2: outputs, weights and every gradient equal those of k and v
  // repeated per group; dk and dv are the repeated gradients summed over the group.
  for (auto dtype : {tg::float64, tg::float32}) {
    const double tol = dtype == tg::float64 ? 1e-12 : 2e-6;
    const Tensor q = draw({2, 4, 5, 3}, 1, dtype), k = draw({2, c.kv_heads, 6, 3}, 2, dtype), v = draw({2, c.kv_heads, 6, 2}, 3, dtype);
    const Tensor mask = gqa_mask(c.mask, 2, 4, 5, 6, 4);
    const tg::AttentionOptions grouped{.mask = mask, .causal = c.causal, .causal_offset = 1, .enable_gqa = true, .need_weights = c.need_weights};
    tg::AttentionOptions plain = grouped;
    plain.enable_gqa = false;
    const auto got = run([&](const std::vector<Tensor>& x) { return tg::scaled_dot_product_attention(x[0], x[1], x[2], grouped); }, {q, k, v}, 5);
    const auto want = run(
        [&](const std::vector<Tensor>& x) {
          return tg::scaled_dot_product_attention(x[0], repeat_heads(x[1], 4 / c.kv_heads), repeat_heads(x[2], 4 / c.kv_heads), plain);
        },
        {q, k, v}, 5);
    check_runs(got, want, tol, fmt::format("{}", dtype));
  }
}

BOOST_AUTO_TEST_CASE(shapes_without_a_batch_and_broadcast_queries) {
  // Rank 3 (no batch) and a q whose batch broadcasts against k's.
  const Tensor q3 = draw({6, 3, 4}, 10), k3 = draw({2, 5, 4}, 11), v3 = draw({2, 5, 3}, 12);
  auto r = tg::scaled_dot_product_attention(q3, k3, v3, {.enable_gqa = true});
  BOOST_TEST(r.output.shape() == (Shape{6, 3, 3}));
  BOOST_TEST(r.weights.shape() == (Shape{6, 3, 5}));
  check_close(values(r.output), values(tg::scaled_dot_product_attention(q3, repeat_heads(k3, 3), repeat_heads(v3, 3)).output), 1e-12, 1e-12,
              "rank 3");
  const Tensor q = draw({1, 4, 3, 4}, 13), k = draw({3, 2, 5, 4}, 14), v = draw({3, 2, 5, 3}, 15);
  r = tg::scaled_dot_product_attention(q, k, v, {.enable_gqa = true, .need_weights = false});
  BOOST_TEST(r.output.shape() == (Shape{3, 4, 3, 3}));
  BOOST_TEST(!r.weights.defined());
  check_close(values(r.output), values(tg::attention(q, repeat_heads(k, 2), repeat_heads(v, 2))), 1e-12, 1e-12, "broadcast batch");
}

BOOST_AUTO_TEST_CASE(every_path_of_the_core_takes_the_grouped_views) {
  // The views of ops/grouped_heads.hpp on each path forced, against repeated heads on the
  // weights path; blocks of 2 rows so that the pipelined paths run several.
  using tg::detail::AttentionPath;
  const Tensor q = draw({2, 4, 7, 3}, 20, tg::float32), k = draw({2, 2, 9, 3}, 21, tg::float32), v = draw({2, 2, 9, 2}, 22, tg::float32);
  tg::detail::AttentionMask mask;
  mask.key_mask = tg::gt(tg::randn({2, 9}, 23), tg::scalar(-1.0));
  mask.causal = true;
  mask.causal_offset = 2;
  mask.allowed = tg::gt(tg::randn({2, 4, 7, 9}, 24), tg::scalar(-1.0));
  for (auto [path, need_weights] : {std::pair{AttentionPath::weights, true}, {AttentionPath::pipelined, true}, {AttentionPath::tiles, false},
                                    {AttentionPath::fused_blocks, false}}) {
    const auto got = run(
        [&](const std::vector<Tensor>& x) {
          tg::detail::AttentionMask grouped = mask;
          grouped.allowed = tg::detail::group_pairs("test", "mask", mask.allowed, 4, 2);
          auto r = tg::detail::attention_core({"grouped", tg::detail::group_queries(x[0], 2), tg::detail::group_keys(x[1]),
                                               tg::detail::group_keys(x[2]), Tensor(), grouped, need_weights},
                                              path, 2);
          return tg::AttentionResult{tg::detail::merge_groups(r.output), tg::detail::merge_groups(r.weights)};
        },
        {q, k, v}, 25);
    // The reference: repeated heads on the weights path (its weights dropped when not asked for).
    const auto want = run(
        [&](const std::vector<Tensor>& x) {
          return tg::detail::attention_core({"ref", x[0], repeat_heads(x[1], 2), repeat_heads(x[2], 2), Tensor(), mask, need_weights},
                                            AttentionPath::weights);
        },
        {q, k, v}, 25);
    check_runs(got, want, 2e-5, fmt::format("path {}", static_cast<int>(path)));
  }
}

BOOST_AUTO_TEST_CASE(gradcheck_on_both_paths) {
  for (std::int64_t kv : {1, 2})
    for (bool need_weights : {true, false}) {
      const Tensor q = draw({2, 4, 3, 3}, 30).set_requires_grad(), k = draw({2, kv, 4, 3}, 31).set_requires_grad();
      const Tensor v = draw({2, kv, 4, 2}, 32).set_requires_grad();
      const Tensor mask = tg::gt(tg::randn({2, 4, 3, 4}, 33), tg::scalar(-1.0));
      const auto r = tg::gradcheck(
          [&](const std::vector<Tensor>& x) {
            auto [o, w] = tg::scaled_dot_product_attention(x[0], x[1], x[2], {.mask = mask, .causal = true, .causal_offset = 1, .enable_gqa = true,
                                                                              .need_weights = need_weights});
            return need_weights ? std::vector<Tensor>{o, w} : std::vector<Tensor>{o};
          },
          {q, k, v});
      BOOST_TEST(r.ok, "Hkv " << kv << " need_weights " << need_weights << ": " << r.report());
    }
}

BOOST_AUTO_TEST_CASE(gradgradcheck_on_both_paths) {
  // The core's create_graph backward on the grouped views: second order exact too.
  for (bool need_weights : {true, false}) {
    const Tensor q = draw({1, 4, 3, 2}, 34).set_requires_grad(), k = draw({1, 2, 4, 2}, 35).set_requires_grad();
    const Tensor v = draw({1, 2, 4, 2}, 36).set_requires_grad();
    const auto r = tg::gradgradcheck(
        [&](const std::vector<Tensor>& x) {
          auto [o, w] = tg::scaled_dot_product_attention(x[0], x[1], x[2], {.causal = true, .enable_gqa = true, .need_weights = need_weights});
          return need_weights ? std::vector<Tensor>{o, w} : std::vector<Tensor>{o};
        },
        {q, k, v});
    BOOST_TEST(r.ok, "need_weights " << need_weights << ": " << r.report());
  }
}

BOOST_AUTO_TEST_CASE(bad_arguments_name_themselves) {
  const Tensor q = draw({2, 4, 3, 3}, 1), k = draw({2, 3, 5, 3}, 2), v = draw({2, 3, 5, 2}, 3);
  auto sdpa = [](const Tensor& a, const Tensor& b, const Tensor& c, const tg::AttentionOptions& o) { tg::scaled_dot_product_attention(a, b, c, o); };
  check_throws<tg::ShapeError>([&] { sdpa(q, k, v, {.enable_gqa = true}); },
                               {"scaled_dot_product_attention", "Hkv = 3", "[2, 3, 5, 3]", "H = 4", "[2, 4, 3, 3]"});
  const Tensor k2 = draw({2, 2, 5, 3}, 4);
  check_throws<tg::ShapeError>([&] { sdpa(q, k2, v, {.enable_gqa = true}); }, {"'k' [2, 2, 5, 3]", "'v' [2, 3, 5, 2]", "dim -3"});
  check_throws<tg::ShapeError>([&] { sdpa(draw({3, 3}, 5), draw({5, 3}, 6), draw({5, 2}, 7), {.enable_gqa = true}); },
                               {"argument 'q'", "rank >= 3", "[3, 3]"});
  check_throws<tg::ShapeError>([&] { sdpa(q, k2, draw({2, 2, 5, 2}, 8), {.mask = tg::ones({2, 3, 3, 5}, tg::bool_), .enable_gqa = true}); },
                               {"'options.mask'", "[2, 3, 3, 5]", "H = 4"});
  check_throws<tg::ValueError>([&] { sdpa(q, q, q, {.window = 2}); }, {"options.window = 2", "causal"});
  check_throws<tg::ValueError>([&] { sdpa(q, q, q, {.causal = true, .window = -1}); }, {"options.window", ">= 0", "-1"});
  check_throws<tg::ShapeError>([&] { sdpa(q, q, q, {.alibi_slopes = tg::alibi_slopes(3, tg::float64)}); },
                               {"'options.alibi_slopes'", "[H] = [4]", "[3]"});
  check_throws<tg::DTypeError>([&] { sdpa(q, q, q, {.alibi_slopes = tg::alibi_slopes(4)}); }, {"'options.alibi_slopes'", "float32", "float64"});
  check_throws<tg::DTypeError>([&] { sdpa(q, q, q, {.alibi_slopes = tg::zeros({4}, tg::int64)}); }, {"'options.alibi_slopes'", "int64"});
  check_throws<tg::ShapeError>([&] { sdpa(draw({3, 3}, 5), draw({5, 3}, 6), draw({5, 2}, 7), {.alibi_slopes = tg::alibi_slopes(1, tg::float64)}); },
                               {"'options.alibi_slopes'", "rank >= 3", "[3, 3]"});
  // Every error is an invalid_argument.
  BOOST_CHECK_THROW(sdpa(q, k, v, {.enable_gqa = true}), std::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(window_and_alibi)

BOOST_AUTO_TEST_CASE(default_slopes_follow_the_reference) {
  std::vector<double> eight;
  for (int h = 1; h <= 8; ++h) eight.push_back(std::exp2(-h));
  BOOST_TEST(values(tg::alibi_slopes(8, tg::float64)) == eight, boost::test_tools::per_element());
  // 6 heads: those of 4 (2^-2, 2^-4, 2^-6, 2^-8), then slopes 0 and 2 of 8 (2^-1, 2^-3).
  BOOST_TEST(values(tg::alibi_slopes(6, tg::float64)) == (std::vector<double>{0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125}),
             boost::test_tools::per_element());
  BOOST_TEST(values(tg::alibi_slopes(1, tg::float64)) == (std::vector<double>{std::exp2(-8)}));
  BOOST_TEST(tg::alibi_slopes(12).dtype() == tg::float32);
  check_throws<tg::ValueError>([] { tg::alibi_slopes(0); }, {"alibi_slopes", "'heads'", ">= 1", "0"});
  check_throws<tg::DTypeError>([] { tg::alibi_slopes(4, tg::int64); }, {"alibi_slopes", "'dtype'", "int64"});
}

struct VariantCase {
  std::int64_t window, kv_heads, offset;
  bool alibi, need_weights;
};
std::ostream& operator<<(std::ostream& os, const VariantCase& c) {
  return os << "window " << c.window << " Hkv " << c.kv_heads << " offset " << c.offset << " alibi " << c.alibi << " need_weights "
            << c.need_weights;
}
std::vector<VariantCase> variant_cases() {
  std::vector<VariantCase> cases;
  for (std::int64_t window : {0, 1, 3})
    for (bool alibi : {false, true})
      for (std::int64_t kv : {2, 4})
        for (bool need_weights : {true, false}) cases.push_back({window, kv, window == 3 ? 2 : -1, alibi, need_weights});
  return cases;
}

BOOST_DATA_TEST_CASE(equal_their_explicit_construction, bdata::make(variant_cases()), c) {
  // The window as a bool mask and ALiBi as a bias on the scores, on repeated k/v heads,
  // through the core's weights path: outputs, weights and the gradients of q, k, v and the slopes.
  const std::int64_t q_len = 5, k_len = 8;
  const Tensor q = draw({2, 4, q_len, 3}, 40), k = draw({2, c.kv_heads, k_len, 3}, 41), v = draw({2, c.kv_heads, k_len, 2}, 42);
  const Tensor slopes = c.alibi ? tg::alibi_slopes(4, tg::float64) * 2.0 : Tensor();
  std::vector<Tensor> inputs{q, k, v};
  if (c.alibi) inputs.push_back(slopes);
  const auto got = run(
      [&](const std::vector<Tensor>& x) {
        return tg::scaled_dot_product_attention(x[0], x[1], x[2],
                                                {.causal = true, .causal_offset = c.offset, .window = c.window,
                                                 .alibi_slopes = c.alibi ? x[3] : Tensor(), .enable_gqa = true, .need_weights = c.need_weights});
      },
      inputs, 43);
  const auto want = run(
      [&](const std::vector<Tensor>& x) {
        tg::detail::AttentionMask m;
        m.allowed = window_mask(q_len, k_len, c.offset, c.window);
        const Tensor bias = c.alibi ? alibi_bias(x[3], q_len, k_len, c.offset) : Tensor();
        const std::int64_t g = 4 / c.kv_heads;
        return tg::detail::attention_core({"reference", x[0], repeat_heads(x[1], g), repeat_heads(x[2], g), bias, m, c.need_weights});
      },
      inputs, 43);
  check_runs(got, want, 1e-12, "float64");
}

BOOST_AUTO_TEST_CASE(gradcheck_of_the_slopes_on_both_paths) {
  for (bool need_weights : {true, false}) {
    const Tensor q = draw({1, 2, 4, 3}, 50).set_requires_grad(), k = draw({1, 2, 6, 3}, 51).set_requires_grad();
    const Tensor v = draw({1, 2, 6, 2}, 52).set_requires_grad(), slopes = tg::tensor({0.7, 0.3}, tg::float64).set_requires_grad();
    const auto r = tg::gradcheck(
        [&](const std::vector<Tensor>& x) {
          auto [o, w] = tg::scaled_dot_product_attention(
              x[0], x[1], x[2], {.causal = true, .causal_offset = 2, .window = 4, .alibi_slopes = x[3], .need_weights = need_weights});
          return need_weights ? std::vector<Tensor>{o, w} : std::vector<Tensor>{o};
        },
        {q, k, v, slopes});
    BOOST_TEST(r.ok, "need_weights " << need_weights << ": " << r.report());
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(functional_multihead_attention)

// w [C, Hkv W] with each head's columns repeated g times: [C, Hkv g W] (recorded).
Tensor repeat_columns(const Tensor& w, std::int64_t kv_heads, std::int64_t g) {
  if (!w.defined()) return w;
  const bool vec = w.dim() == 1;
  const std::int64_t rows = vec ? 1 : w.size(0), width = w.size(-1) / kv_heads;
  const Tensor r = tg::reshape(tg::expand(tg::reshape(w, {rows, kv_heads, 1, width}), {rows, kv_heads, g, width}), {rows, kv_heads * g * width});
  return vec ? tg::reshape(r, {kv_heads * g * width}) : r;
}

struct Problem {
  tg::MhaActivations act;
  tg::MhaParameters par;
  tg::MhaMasks masks;
  std::vector<Tensor> inputs() const {
    return {act.query, act.context, act.bias, par.w_q, par.w_k, par.w_v, par.w_o, par.b_q, par.b_k, par.b_v, par.b_o};
  }
};

// B 2, Q 4, K 6, H 4, D 3, Dv 2, every bias, an attention mask and a bias per query head.
Problem problem(std::int64_t kv, tg::DType dtype) {
  Problem p;
  p.act = {draw({2, 4, 5}, 60, dtype), draw({2, 6, 7}, 61, dtype), draw({2, 4, 4, 6}, 62, dtype)};
  p.par = {draw({5, 12}, 63, dtype), draw({7, kv * 3}, 64, dtype), draw({7, kv * 2}, 65, dtype), draw({8, 3}, 66, dtype),
           draw({12}, 67, dtype), draw({kv * 3}, 68, dtype), draw({kv * 2}, 69, dtype), draw({3}, 70, dtype)};
  p.masks = {tg::from_bools({true, true, false, true, true, true, true, true, true, true, true, false}, {2, 6}),
             tg::from_bools({true, true, true, true, true, false, true, true}, {2, 4}), tg::gt(tg::randn({2, 4, 4, 6}, 71), tg::scalar(-1.0))};
  return p;
}

tg::AttentionResult call(const Problem& p, const std::vector<Tensor>& x, const tg::MhaOptions& o, std::int64_t repeat = 0) {
  const std::int64_t kv = o.kv_heads == 0 ? o.heads : o.kv_heads, g = repeat ? o.heads / kv : 1;
  auto rep = [&](const Tensor& t) { return repeat ? repeat_columns(t, kv, g) : t; };
  tg::MhaOptions options = o;
  if (repeat) options.kv_heads = 0;
  return tg::multihead_attention({x[0], x[1], x[2]}, {x[3], rep(x[4]), rep(x[5]), x[6], x[7], rep(x[8]), rep(x[9]), x[10]}, p.masks, options);
}

BOOST_AUTO_TEST_CASE(kv_heads_equal_repeated_projections) {
  for (auto dtype : {tg::float64, tg::float32})
    for (std::int64_t kv : {1, 2, 4})
      for (bool need_weights : {true, false}) {
        const Problem p = problem(kv, dtype);
        const tg::MhaOptions o{.heads = 4, .kv_heads = kv, .causal = true, .causal_offset = 2, .need_weights = need_weights};
        const auto got = run([&](const std::vector<Tensor>& x) { return call(p, x, o); }, p.inputs(), 72);
        const auto want = run([&](const std::vector<Tensor>& x) { return call(p, x, o, 1); }, p.inputs(), 72);
        check_runs(got, want, dtype == tg::float64 ? 1e-12 : 5e-5, fmt::format("{} Hkv {} need_weights {}", dtype, kv, need_weights));
      }
}

BOOST_AUTO_TEST_CASE(the_options_overload_is_the_plain_call_with_defaults) {
  const Problem p = problem(4, tg::float64);
  for (bool need_weights : {true, false}) {
    auto a = tg::multihead_attention(p.act, p.par, p.masks, 4, true, 1, need_weights);
    auto b = tg::multihead_attention(p.act, p.par, p.masks, {.heads = 4, .causal = true, .causal_offset = 1, .need_weights = need_weights});
    BOOST_TEST(values(a.output) == values(b.output));
    if (need_weights) BOOST_TEST(values(a.weights) == values(b.weights));
  }
}

BOOST_AUTO_TEST_CASE(gradcheck_with_kv_heads_window_and_slopes) {
  for (bool need_weights : {true, false}) {
    Problem p = problem(2, tg::float64);
    std::vector<Tensor> xs = p.inputs();
    const Tensor slopes = tg::tensor({0.5, 0.25, 0.125, 0.0625}, tg::float64);
    xs.push_back(slopes);
    for (Tensor& x : xs) x = x.detach().set_requires_grad();
    const auto r = tg::gradcheck(
        [&](const std::vector<Tensor>& x) {
          auto [o, w] = call(p, x, {.heads = 4, .kv_heads = 2, .causal = true, .causal_offset = 2, .window = 3, .alibi_slopes = x[11],
                                    .need_weights = need_weights});
          return need_weights ? std::vector<Tensor>{o, w} : std::vector<Tensor>{o};
        },
        xs);
    BOOST_TEST(r.ok, "need_weights " << need_weights << ": " << r.report());
  }
}

BOOST_AUTO_TEST_CASE(window_and_alibi_equal_a_mask_and_a_bias) {
  for (bool need_weights : {true, false}) {
    const Problem p = problem(2, tg::float64);
    const Tensor slopes = tg::alibi_slopes(4, tg::float64);
    const tg::MhaOptions o{.heads = 4, .kv_heads = 2, .causal = true, .causal_offset = 2, .window = 3, .alibi_slopes = slopes,
                           .need_weights = need_weights};
    const auto got = run([&](const std::vector<Tensor>& x) { return call(p, x, o); }, p.inputs(), 73);
    Problem explicit_ = p;
    explicit_.masks.attention_mask = tg::logical_and(p.masks.attention_mask, window_mask(4, 6, 2, 3));
    const auto want = run(
        [&](const std::vector<Tensor>& x) {
          std::vector<Tensor> y = x;
          y[2] = x[2] + alibi_bias(slopes, 4, 6, 2);
          return call(explicit_, y, {.heads = 4, .kv_heads = 2, .need_weights = need_weights});
        },
        p.inputs(), 73);
    check_runs(got, want, 1e-12, fmt::format("need_weights {}", need_weights));
  }
}

BOOST_AUTO_TEST_CASE(keys_outside_every_window_change_nothing) {
  // Keys 0 and 1 are outside the window of every query (query i at 3 + i sees keys > i + 1):
  // NaN there reaches no output and no gradient, and they get exactly zero gradients.
  Problem p = problem(2, tg::float64);
  p.masks = {};
  p.act.bias = Tensor();
  const tg::MhaOptions o{.heads = 4, .kv_heads = 2, .causal = true, .causal_offset = 3, .window = 2};
  auto with_context = [&](double poison) {
    std::vector<double> c = values(p.act.context);
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t j = 0; j < 2; ++j)
        for (std::size_t ch = 0; ch < 7; ++ch) c[(b * 6 + j) * 7 + ch] = poison;
    std::vector<Tensor> xs = p.inputs();
    xs[1] = tg::from_vector(c, {2, 6, 7});
    xs.erase(xs.begin() + 2);  // no bias
    return run(
        [&](const std::vector<Tensor>& x) {
          return tg::multihead_attention({x[0], x[1]}, {x[2], x[3], x[4], x[5], x[6], x[7], x[8], x[9]}, {}, o);
        },
        xs, 74);
  };
  const auto zeroed = with_context(0.0), poisoned = with_context(std::numeric_limits<double>::quiet_NaN());
  BOOST_REQUIRE_EQUAL(zeroed.size(), poisoned.size());
  for (std::size_t i = 0; i < zeroed.size(); ++i) BOOST_TEST((zeroed[i] == poisoned[i]), "result " << i);
  const auto& d_context = poisoned[3];  // output, weights, d query, d context
  for (std::size_t n = 0; n < 14; ++n) BOOST_TEST(d_context[n] == 0.0);
}

BOOST_AUTO_TEST_CASE(bad_options_name_themselves) {
  const Problem p = problem(2, tg::float64);
  auto mha = [&](const tg::MhaParameters& par, const tg::MhaOptions& o) { tg::multihead_attention(p.act, par, p.masks, o); };
  check_throws<tg::ValueError>([&] { mha(p.par, {.heads = 4, .kv_heads = 3}); }, {"multihead_attention", "'kv_heads'", "heads = 4", "got 3"});
  check_throws<tg::ShapeError>([&] { mha(p.par, {.heads = 4, .kv_heads = 1}); }, {"'w_k' [7, 6]", "kv_heads * D = 1 * 3 = 3", "'w_q' [5, 12]"});
  tg::MhaParameters odd = p.par;
  odd.w_v = draw({7, 3}, 1);
  odd.b_v = Tensor();
  check_throws<tg::ShapeError>([&] { mha(odd, {.heads = 4, .kv_heads = 2}); }, {"kv_heads = 2", "'w_v'", "[7, 3]"});
  check_throws<tg::ShapeError>([&] { mha(p.par, {.heads = 4}); }, {"'w_q' [5, 12]", "'w_k' [7, 6]", "same width"});
  check_throws<tg::ValueError>([&] { mha(p.par, {.heads = 4, .kv_heads = 2, .window = 2}); }, {"'window' = 2", "causal"});
  check_throws<tg::ValueError>([&] { mha(p.par, {.heads = 4, .kv_heads = 2, .causal = true, .window = -3}); }, {"'window'", "-3"});
  check_throws<tg::ShapeError>([&] { mha(p.par, {.heads = 4, .kv_heads = 2, .alibi_slopes = tg::alibi_slopes(2, tg::float64)}); },
                               {"'alibi_slopes'", "[heads] = [4]", "[2]"});
  check_throws<tg::DTypeError>([&] { mha(p.par, {.heads = 4, .kv_heads = 2, .alibi_slopes = tg::alibi_slopes(4)}); },
                               {"'alibi_slopes'", "float32", "float64"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(layer_and_cache)

struct LayerCase {
  std::int64_t kv_heads, window;
  tg::Alibi alibi;
  bool rotary;
};
std::ostream& operator<<(std::ostream& os, const LayerCase& c) {
  return os << "Hkv " << c.kv_heads << " window " << c.window << " alibi " << static_cast<int>(c.alibi) << " rotary " << c.rotary;
}
std::vector<LayerCase> layer_cases() {
  std::vector<LayerCase> cases;
  for (std::int64_t kv : {1, 2, 4})
    for (std::int64_t window : {0, 3})
      for (auto alibi : {tg::Alibi::none, tg::Alibi::fixed})
        for (bool rotary : {false, true}) cases.push_back({kv, window, alibi, rotary});
  return cases;
}

tg::MultiHeadAttention make_layer(const LayerCase& c, tg::DType dtype) {
  tg::MultiHeadAttention layer({.query_dim = 8, .heads = 4, .kv_heads = c.kv_heads, .dtype = dtype, .seed = 80,
                                .rotary = c.rotary ? std::optional<tg::RotaryOptions>(tg::RotaryOptions{}) : std::nullopt,
                                .window = c.window, .alibi = c.alibi});
  for (const Tensor& w : layer.parameters()) tg::copy_(w, tg::randn(w.shape(), 81, tg::float64).to(dtype) * 0.5);
  return layer;
}

BOOST_DATA_TEST_CASE(decoding_equals_the_full_forward, bdata::make(layer_cases()), c) {
  for (auto dtype : {tg::float64, tg::float32}) {
    const double tol = dtype == tg::float64 ? 1e-12 : 1e-5;
    const tg::MultiHeadAttention layer = make_layer(c, dtype);
    const std::int64_t len = 11;
    const Tensor x = draw({2, len, 8}, 82, dtype);
    auto [full, full_attn] = layer.forward(x, {.causal = true, .need_weights = true});
    for (std::int64_t chunk : {1, 3})
      for (bool need_weights : {true, false}) {
        tg::KVCache cache;
        std::vector<Tensor> outs;
        for (std::int64_t t = 0; t < len; t += chunk) {
          const std::int64_t n = std::min(chunk, len - t);
          auto [o, a] = layer.decode(tg::slice(x, 1, t, t + n), cache, {.need_weights = need_weights});
          BOOST_TEST(cache.length() == t + n);
          if (need_weights)  // the held keys' columns of the full weights
            check_close(values(a), values(tg::slice(tg::slice(full_attn, 2, t, t + n), 3, cache.start(), t + n)), tol, tol, "step weights");
          outs.push_back(o);
        }
        check_close(values(tg::concat(outs, 1)), values(full), tol, tol, fmt::format("{} chunks of {} need_weights {}", dtype, chunk, need_weights));
        BOOST_TEST(cache.key_width() == c.kv_heads * 2);  // kv_heads * head_dim
        BOOST_TEST(cache.value_width() == c.kv_heads * 2);
      }
  }
}

BOOST_AUTO_TEST_CASE(a_window_bounds_the_cache) {
  const tg::MultiHeadAttention layer = make_layer({2, 5, tg::Alibi::fixed, true}, tg::float64);
  const std::int64_t len = 300;
  const Tensor x = draw({1, len, 8}, 90);
  const Tensor full = layer.forward(x, {.causal = true}).output;
  tg::KVCache cache;
  std::int64_t largest = 0;
  std::vector<Tensor> outs;
  for (std::int64_t t = 0; t < len; ++t) {
    outs.push_back(layer.decode(tg::slice(x, 1, t, t + 1), cache).output);
    largest = std::max(largest, cache.capacity());
    BOOST_TEST(cache.held() >= std::min<std::int64_t>(5, t + 1));  // every key the next query may see is kept
  }
  BOOST_TEST(largest == 16);  // never grown: 5 held keys and one new fit, the rest is dropped
  BOOST_TEST(cache.length() == len);
  BOOST_TEST(cache.start() > len - 16);
  check_close(values(tg::concat(outs, 1)), values(full), 1e-12, 1e-12, "300 positions through a bounded cache");
  // Copies carry the kept positions and where they start.
  tg::KVCache copy = cache;
  BOOST_TEST((copy.start() == cache.start() && copy.held() == cache.held()));
}

BOOST_AUTO_TEST_CASE(decode_masks_cover_every_position_decoded) {
  // With a window, masks and bias still cover K = L + n; only the held keys' part is read.
  const tg::MultiHeadAttention layer = make_layer({2, 3, tg::Alibi::none, false}, tg::float64);
  const std::int64_t len = 40;
  const Tensor x = draw({2, len, 8}, 91);
  std::vector<bool> keep;
  for (std::int64_t n = 0; n < 2 * len; ++n) keep.push_back(n % 7 != 3);
  const Tensor key_mask = tg::from_bools(keep, {2, len}), bias = draw({2, 4, len, len}, 92);
  const Tensor full = layer.forward(x, {.masks = {.key_mask = key_mask}, .bias = bias, .causal = true}).output;
  tg::KVCache cache;
  std::vector<Tensor> outs;
  for (std::int64_t t = 0; t < len; ++t)
    outs.push_back(layer.decode(tg::slice(x, 1, t, t + 1), cache,
                                {.masks = {.key_mask = tg::slice(key_mask, 1, 0, t + 1)}, .bias = tg::slice(tg::slice(bias, 2, t, t + 1), 3, 0, t + 1)})
                       .output);
  BOOST_TEST(cache.start() > 0);
  check_close(values(tg::concat(outs, 1)), values(full), 1e-12, 1e-12, "masked, biased, windowed decoding");
  check_throws<tg::ShapeError>([&] { layer.decode(tg::slice(x, 1, 0, 1), cache, {.masks = {.key_mask = tg::ones({2, 3}, tg::bool_)}}); },
                               {"MultiHeadAttention::decode", "key_mask", "[2, 41]"});
}

BOOST_AUTO_TEST_CASE(learnable_slopes_are_a_parameter_with_a_gradient) {
  tg::MultiHeadAttention layer({.query_dim = 8, .heads = 4, .kv_heads = 2, .dtype = tg::float64, .seed = 93, .window = 4,
                                .alibi = tg::Alibi::learnable});
  const auto named = layer.named_parameters();
  BOOST_TEST(named.back().name == "alibi_slopes");
  BOOST_TEST(values(named.back().tensor) == values(tg::alibi_slopes(4, tg::float64)));
  BOOST_TEST(layer.weights().w_k.shape() == (Shape{8, 4}));
  tg::MultiHeadAttention fixed({.query_dim = 8, .heads = 4, .alibi = tg::Alibi::fixed});
  BOOST_TEST(fixed.alibi_slopes().defined());
  BOOST_TEST(!fixed.alibi_slopes().requires_grad());
  BOOST_TEST(fixed.parameters().size() == 8u);
  const Tensor x = draw({2, 6, 8}, 94);
  for (bool need_weights : {true, false}) {
    const auto r = tg::gradcheck_parameters(
        [&] { return std::vector<Tensor>{layer.forward(x, {.causal = true, .need_weights = need_weights}).output}; }, layer.parameters());
    BOOST_TEST(r.ok, "need_weights " << need_weights << ": " << r.report());
  }
  const Tensor out = layer.forward(x, {.causal = true}).output;
  BOOST_TEST(tg::grad({tg::sum(out * out)}, {layer.alibi_slopes()})[0].shape() == (Shape{4}));
}

BOOST_AUTO_TEST_CASE(the_config_is_validated) {
  auto fails = [](tg::MultiHeadAttentionConfig c, std::vector<std::string> fragments) {
    check_throws<tg::ValueError>([&] { tg::MultiHeadAttention{c}; }, fragments);
  };
  fails({.query_dim = 8, .heads = 4, .kv_heads = 3}, {"MultiHeadAttention", "config.kv_heads", "config.heads = 4", "got 3"});
  fails({.query_dim = 8, .heads = 4, .kv_heads = -1}, {"config.kv_heads", "-1"});
  fails({.query_dim = 8, .heads = 4, .window = -2}, {"config.window", ">= 0", "-2"});
  check_throws<tg::ValueError>([] { tg::Decoder({.vocab = 4, .max_len = 4, .dim = 8, .heads = 4, .kv_heads = 3}); },
                               {"Decoder", "config.kv_heads = 3", "config.heads = 4"});
  check_throws<tg::ValueError>([] { tg::Decoder({.vocab = 4, .max_len = 4, .dim = 8, .heads = 4, .window = -1}); }, {"Decoder", "config.window"});
  const tg::MultiHeadAttention mqa({.query_dim = 8, .heads = 4, .kv_heads = 1, .value_head_dim = 3});
  BOOST_TEST(mqa.weights().w_k.shape() == (Shape{8, 2}));
  BOOST_TEST(mqa.weights().w_v.shape() == (Shape{8, 3}));
  BOOST_TEST(mqa.weights().w_o.shape() == (Shape{12, 8}));
  BOOST_TEST(mqa.weights().b_v.shape() == (Shape{3}));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(decoder)

BOOST_AUTO_TEST_CASE(cached_decoding_and_generation_equal_the_full_forward) {
  struct Variant {
    tg::PositionKind positions;
    std::int64_t kv_heads, window;
  };
  for (auto [positions, kv, window] : {Variant{tg::PositionKind::alibi, 1, 0}, Variant{tg::PositionKind::alibi, 2, 3},
                                       Variant{tg::PositionKind::rotary, 1, 4}, Variant{tg::PositionKind::learned, 2, 2}}) {
    const std::string what = fmt::format("positions {} Hkv {} window {}", static_cast<int>(positions), kv, window);
    tg::Decoder model({.vocab = 7, .max_len = 12, .dim = 8, .heads = 2, .layers = 2, .hidden = 16, .positions = positions, .dtype = tg::float64,
                       .seed = 11, .kv_heads = kv, .window = window});
    for (const auto& block : model.blocks) {
      BOOST_TEST(block.attn.config().kv_heads == kv);
      BOOST_TEST(block.attn.alibi_slopes().defined() == (positions == tg::PositionKind::alibi));
    }
    const auto names = model.named_parameters();
    BOOST_TEST(std::none_of(names.begin(), names.end(), [](const tg::NamedTensor& n) { return n.name.find("alibi") != std::string::npos; }));
    std::vector<std::int64_t> v{1, 5, 2, 6, 0, 3, 3, 4, 2, 2};
    const Tensor ids = tg::from_vector(std::span<const std::int64_t>(v), {1, 10});
    tg::NoGradGuard no_grad;
    const Tensor full = model.forward(ids);
    std::vector<tg::KVCache> caches(model.blocks.size());
    for (std::int64_t t = 0; t < 10; t += t == 0 ? 3 : 1) {
      const std::int64_t end = t == 0 ? 3 : t + 1;
      Tensor x = model.tok.forward(tg::slice(ids, 1, t, end));
      if (positions == tg::PositionKind::learned) x = std::get<tg::LearnedPositions>(model.pos).forward(x, t);
      for (std::size_t i = 0; i < model.blocks.size(); ++i) x = model.blocks[i].decode(x, caches[i]);
      check_close(values(model.head.forward(model.ln_f.forward(x))), values(tg::slice(full, 1, t, end)), 1e-12, 1e-12,
                  fmt::format("{}: step at {}", what, t));
    }
    // Greedy generation is argmax of the full forward, token by token.
    model.eval();
    const Tensor out = model.generate(tg::slice(ids, 1, 0, 2), {.new_tokens = 6, .temperature = 0});
    std::vector<std::int64_t> row{1, 5};
    for (int step = 0; step < 6; ++step) {
      const Tensor logits = model.forward(tg::from_vector(std::span<const std::int64_t>(row), {1, static_cast<std::int64_t>(row.size())}));
      row.push_back(tg::argmax(tg::select(logits, 1, -1), -1).to_vector<std::int64_t>()[0]);
    }
    BOOST_TEST(out.to_vector<std::int64_t>() == row, what);
  }
}

BOOST_AUTO_TEST_CASE(gradcheck_of_an_alibi_decoder_with_grouped_heads) {
  tg::Decoder model({.vocab = 5, .max_len = 6, .dim = 8, .heads = 2, .layers = 1, .hidden = 8, .positions = tg::PositionKind::alibi,
                     .dtype = tg::float64, .seed = 12, .kv_heads = 1, .window = 3});
  const Tensor ids = tg::from_vector(std::span<const std::int64_t>(std::vector<std::int64_t>{1, 4, 2, 0, 3}), {1, 5});
  const Tensor targets = tg::from_vector(std::span<const std::int64_t>(std::vector<std::int64_t>{4, 2, 0, 3, 1}), {1, 5});
  const auto r = tg::gradcheck_parameters([&] { return std::vector<Tensor>{tg::cross_entropy(model.forward(ids), targets)}; }, model.parameters(),
                                          {.atol = 1e-6, .rtol = 1e-5});
  BOOST_TEST(r.ok, r.report());
}

BOOST_AUTO_TEST_SUITE_END()
