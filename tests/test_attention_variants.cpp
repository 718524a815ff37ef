// The attention variants of small language models (docs/semantics.md §14):
// grouped-query heads, a sliding window and ALiBi, through scaled_dot_product_attention's
// options, the functional multihead_attention, the MultiHeadAttention layer and its KV cache,
// and the Decoder. Each is checked against its explicit construction: k and v heads repeated,
// the window as a bool mask, ALiBi as an additive bias.
#define BOOST_TEST_MODULE attention_variants
#include <boost/test/data/test_case.hpp>
#include <algorithm>
#include <array>
#include <cfenv>
#include <cmath>
#include <functional>
#include <limits>

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
    const tg::AttentionOptions grouped{.masking = {.mask = mask, .causal = c.causal, .causal_offset = 1}, .enable_gqa = true, .need_weights = c.need_weights};
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
  auto r = tg::scaled_dot_product_attention(q3, k3, v3, {.enable_gqa = true, .need_weights = true});
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
  tg::AttentionMasking mask;
  mask.key_mask = tg::gt(tg::randn({2, 9}, 23), tg::scalar(-1.0));
  mask.causal = true;
  mask.causal_offset = 2;
  mask.mask = tg::gt(tg::randn({2, 4, 7, 9}, 24), tg::scalar(-1.0));
  for (const auto& choice : {std::pair{AttentionPath::weights, true}, {AttentionPath::blocks, true}, {AttentionPath::tiles, false},
                             {AttentionPath::fused_blocks, false}}) {
    const AttentionPath path = choice.first;  // not a structured binding: clang 14 cannot capture those
    const bool need_weights = choice.second;
    const auto got = run(
        [&](const std::vector<Tensor>& x) {
          // The masks checked against the scores [B, H, Q, K] serve their grouped view, whose rows
          // are numbered alike.
          const tg::detail::AttentionArgs args{"grouped", tg::detail::group_queries(x[0], 2), tg::detail::group_keys(x[1]),
                                               tg::detail::group_keys(x[2]), Tensor(), need_weights};
          const Shape scores = tg::detail::check_attention(args);
          auto r = tg::detail::attention_core(args, scores, tg::detail::masking_rows("grouped", mask, tg::detail::ungrouped(scores), tg::float32),
                                              path, 2);
          return tg::AttentionResult{tg::detail::merge_groups(r.output), tg::detail::merge_groups(r.weights)};
        },
        {q, k, v}, 25);
    // The reference: repeated heads on the weights path (its weights dropped when not asked for).
    const auto want = run(
        [&](const std::vector<Tensor>& x) {
          return tg::detail::attention_core({"ref", x[0], repeat_heads(x[1], 2), repeat_heads(x[2], 2), Tensor(), need_weights}, mask,
                                            AttentionPath::weights);
        },
        {q, k, v}, 25);
    check_runs(got, want, 2e-5, fmt::format("path {}", tg::detail::path_name(path)));
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
            auto [o, w] = tg::scaled_dot_product_attention(x[0], x[1], x[2], {.masking = {.mask = mask, .causal = true, .causal_offset = 1}, .enable_gqa = true, .need_weights = need_weights});
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
          auto [o, w] = tg::scaled_dot_product_attention(x[0], x[1], x[2], {.masking = {.causal = true}, .enable_gqa = true, .need_weights = need_weights});
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
  check_throws<tg::ShapeError>(
      [&] { sdpa(q, k2, draw({2, 2, 5, 2}, 8), {.masking = {.mask = tg::ones({2, 3, 3, 5}, tg::bool_)}, .enable_gqa = true}); },
      {"'options.masking.mask'", "[2, 3, 3, 5]", "[2, 4, 3, 5]"});
  check_throws<tg::ValueError>([&] { sdpa(q, q, q, {.masking = {.window = 2}}); }, {"options.masking.window = 2", "causal"});
  check_throws<tg::ValueError>([&] { sdpa(q, q, q, {.masking = {.causal = true, .window = -1}}); }, {"options.masking.window", ">= 0", "-1"});
  check_throws<tg::ShapeError>([&] { sdpa(q, q, q, {.masking = {.alibi_slopes = tg::alibi_slopes(3, tg::float64)}}); },
                               {"'options.masking.alibi_slopes'", "[H]", "[2, 4, 3, 3]", "[3]"});
  check_throws<tg::DTypeError>([&] { sdpa(q, q, q, {.masking = {.alibi_slopes = tg::alibi_slopes(4)}}); },
                               {"'options.masking.alibi_slopes'", "float32", "float64"});
  check_throws<tg::DTypeError>([&] { sdpa(q, q, q, {.masking = {.alibi_slopes = tg::zeros({4}, tg::int64)}}); },
                               {"'options.masking.alibi_slopes'", "int64"});
  check_throws<tg::ShapeError>(
      [&] { sdpa(draw({3, 3}, 5), draw({5, 3}, 6), draw({5, 2}, 7), {.masking = {.alibi_slopes = tg::alibi_slopes(1, tg::float64)}}); },
      {"'options.masking.alibi_slopes'", "[H]", "[3, 5]"});
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
                                                {.masking = {.causal = true, .causal_offset = c.offset, .window = c.window, .alibi_slopes = c.alibi ? x[3] : Tensor()}, .enable_gqa = true, .need_weights = c.need_weights});
      },
      inputs, 43);
  const auto want = run(
      [&](const std::vector<Tensor>& x) {
        tg::AttentionMasking m;
        m.mask = window_mask(q_len, k_len, c.offset, c.window);
        const Tensor bias = c.alibi ? alibi_bias(x[3], q_len, k_len, c.offset) : Tensor();
        const std::int64_t g = 4 / c.kv_heads;
        return tg::detail::attention_core({"reference", x[0], repeat_heads(x[1], g), repeat_heads(x[2], g), bias, c.need_weights}, m);
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
              x[0], x[1], x[2], {.masking = {.causal = true, .causal_offset = 2, .window = 4, .alibi_slopes = x[3]}, .need_weights = need_weights});
          return need_weights ? std::vector<Tensor>{o, w} : std::vector<Tensor>{o};
        },
        {q, k, v, slopes});
    BOOST_TEST(r.ok, "need_weights " << need_weights << ": " << r.report());
  }
}

BOOST_AUTO_TEST_SUITE_END()

// The window and ALiBi inside the core, on each of its paths forced (weights, weights_bf16,
// pipelined and fused_blocks on small blocks, tiles), against an explicit construction on the
// weights path: every rule of the mask (causal, window, key, query and pair masks) folded into one
// bool tensor computed with loops and passed as `allowed`, and ALiBi as a bias tensor built from
// the slopes with recorded ops, so that the slopes' gradient reaches them through mul. The
// reference shares none of the core's window or ALiBi code.
BOOST_AUTO_TEST_SUITE(window_and_alibi_on_every_path)

using tg::detail::AttentionPath;

struct CoreCase {
  std::string name;
  Shape lead;  // the scores' leading dims: [B, H], or [B, Hkv, G] (k and v then [B, Hkv, 1, K, D])
  std::int64_t q, k, d, dv;
  bool causal;
  std::int64_t offset, window;
  bool alibi;  // learnable slopes, one per head: H the product of lead[1:]
  bool masks;  // a key mask, a query mask, a pair mask and a learnable bias [lead[1:]..., Q, K]
  bool bias = false;  // the bias without the masks: rows stay dense (the softmax's unit-stride loops)
};
std::ostream& operator<<(std::ostream& os, const CoreCase& c) { return os << c.name; }

std::vector<CoreCase> core_cases() {
  return {
      {"window 1 (each query sees itself only)", {2, 3}, 6, 6, 4, 3, true, 0, 1, false, false},
      {"window 3, offset 2, Q < K", {2, 2}, 5, 8, 3, 2, true, 2, 3, false, false},
      {"window 20 > K, offset -2 (queries 0-1 empty)", {1, 3}, 7, 5, 4, 3, true, -2, 20, false, false},
      {"ALiBi alone, not causal (symmetric distances)", {2, 3}, 5, 7, 4, 2, false, 0, 0, true, false},
      {"ALiBi alone, causal, offset 3, Q > K", {2, 2}, 6, 4, 3, 3, true, 3, 0, true, false},
      {"window 3, ALiBi, masks, bias, offset 1", {2, 3}, 7, 9, 4, 3, true, 1, 3, true, true},
      {"window 2, ALiBi, masks, bias, offset -3", {2, 2}, 6, 7, 3, 2, true, -3, 2, true, true},
      {"window 4, ALiBi, masks, bias, offset 5, Q < K", {1, 2}, 4, 11, 3, 3, true, 5, 4, true, true},
      {"ALiBi, masks, bias, not causal", {2, 2}, 5, 6, 3, 2, false, 0, 0, true, true},
      {"grouped [B, Hkv, G] = [2, 2, 3]: window 3, ALiBi, masks, bias", {2, 2, 3}, 5, 7, 4, 2, true, 1, 3, true, true},
      {"grouped [B, Hkv, G] = [1, 2, 2]: ALiBi, not causal", {1, 2, 2}, 4, 6, 3, 2, false, 0, 0, true, false},
      // Several 128-key tiles: a small window leaves the tiles before it to be skipped, a wide
      // one spans tile boundaries, and ALiBi alone reaches every key.
      {"K 300, window 5, ALiBi, masks, bias, offset 40", {1, 2}, 260, 300, 8, 4, true, 40, 5, true, true},
      {"K 300, window 150, ALiBi, masks, bias, offset 150", {1, 2}, 140, 300, 8, 4, true, 150, 150, true, true},
      {"K 300, ALiBi alone, causal, offset 170", {1, 1}, 130, 300, 8, 4, true, 170, 0, true, false},
      {"window 3, ALiBi, bias without masks, offset 1", {2, 2}, 6, 6, 4, 3, true, 1, 3, true, false, true},
      {"ALiBi, bias without masks, not causal", {1, 2}, 5, 7, 3, 2, false, 0, 0, true, false, true},
      {"K 300, ALiBi, bias without masks, causal, offset 170", {1, 2}, 130, 300, 8, 4, true, 170, 0, true, false, true},
  };
}

// Small enough for finite differences.
bool small(const CoreCase& c) { return c.q * c.k <= 80; }

std::int64_t heads_of(const CoreCase& c) {
  std::int64_t h = 1;
  for (std::size_t i = 1; i < c.lead.size(); ++i) h *= c.lead[i];
  return h;
}

Shape with_tail(Shape s, std::initializer_list<std::int64_t> tail) {
  s.insert(s.end(), tail);
  return s;
}

struct CoreProblem {
  Tensor q, k, v, bias, slopes;     // bias and slopes undefined when the case has none
  tg::AttentionMasking parts;  // as the core takes them: causal, window and the masks in parts
  Tensor mask;                   // all of those as one bool tensor [B, 1.., Q, K], for the reference
  Shape heads;                      // lead[1:]: the dims the slopes are laid over

  std::vector<Tensor> inputs() const {
    std::vector<Tensor> x{q, k, v};
    for (const Tensor& t : {bias, slopes})
      if (t.defined()) x.push_back(t);
    return x;
  }
  // inputs()' order back to q, k, v, bias, slopes.
  std::array<Tensor, 5> unpack(const std::vector<Tensor>& x) const {
    std::array<Tensor, 5> r{x[0], x[1], x[2], Tensor(), Tensor()};
    std::size_t n = 3;
    if (bias.defined()) r[3] = x[n++];
    if (slopes.defined()) r[4] = x[n++];
    return r;
  }
  CoreProblem as(tg::DType dtype) const {
    CoreProblem p = *this;
    for (Tensor* t : {&p.q, &p.k, &p.v, &p.bias, &p.slopes})
      if (t->defined()) *t = t->to(dtype);
    return p;
  }
};

// float64 values that float32 holds exactly, so both dtypes see the same problem.
Tensor exact_in_float32(const Shape& s, tg::Generator& gen) { return tg::randn(s, gen, tg::float32).to(tg::float64); }

CoreProblem make_core_problem(const CoreCase& c, std::uint64_t seed = 7) {
  tg::Generator gen(seed);
  CoreProblem p;
  const std::int64_t b = c.lead[0], h = heads_of(c);
  const bool grouped = c.lead.size() == 3;
  Shape kv_lead = c.lead;
  if (grouped) kv_lead[2] = 1;  // k and v shared by the G query heads of a group
  p.heads = Shape(c.lead.begin() + 1, c.lead.end());
  p.q = exact_in_float32(with_tail(c.lead, {c.q, c.d}), gen);
  p.k = exact_in_float32(with_tail(kv_lead, {c.k, c.d}), gen);
  p.v = exact_in_float32(with_tail(kv_lead, {c.k, c.dv}), gen);
  if (c.masks || c.bias) p.bias = exact_in_float32(with_tail(p.heads, {c.q, c.k}), gen);
  if (c.alibi) {  // the defaults, doubled so that the distances matter over these short rows
    std::vector<double> s;
    for (std::int64_t i = 0; i < h; ++i) s.push_back(std::exp2(-(i + 1.0) * 2.0 / static_cast<double>(h)));
    p.slopes = tg::from_vector(s, {h}).to(tg::float32).to(tg::float64);
  }
  std::vector<bool> keys(static_cast<std::size_t>(b * c.k), true), queries(static_cast<std::size_t>(b * c.q), true),
      pairs(static_cast<std::size_t>(b * c.q * c.k), true);
  if (c.masks) {
    for (auto* m : {&keys, &queries, &pairs})
      for (std::size_t n = 0; n < m->size(); ++n) (*m)[n] = gen.uniform() < 0.85;
    p.parts.key_mask = tg::from_bools(keys, {b, c.k});
    p.parts.query_mask = tg::from_bools(queries, {b, c.q});
    Shape pair_shape(c.lead.size(), 1);
    pair_shape[0] = b;
    p.parts.mask = tg::from_bools(pairs, with_tail(pair_shape, {c.q, c.k}));
  }
  p.parts.causal = c.causal;
  p.parts.causal_offset = c.offset;
  p.parts.window = c.window;
  // The reference's mask: every rule written out, the window as j > i + offset - W.
  std::vector<bool> all(pairs.size());
  for (std::int64_t n = 0; n < b; ++n)
    for (std::int64_t i = 0; i < c.q; ++i)
      for (std::int64_t j = 0; j < c.k; ++j) {
        const auto at = static_cast<std::size_t>((n * c.q + i) * c.k + j);
        const bool causal = !c.causal || j <= i + c.offset, window = c.window == 0 || j > i + c.offset - c.window;
        all[at] = causal && window && keys[static_cast<std::size_t>(n * c.k + j)] && queries[static_cast<std::size_t>(n * c.q + i)] && pairs[at];
      }
  Shape all_shape(c.lead.size(), 1);
  all_shape[0] = b;
  p.mask = tg::from_bools(all, with_tail(all_shape, {c.q, c.k}));
  return p;
}

// ALiBi as a bias [heads..., Q, K]: -slopes[h] |i + offset - j|, recorded in the slopes.
Tensor alibi_over(const Tensor& slopes, const Shape& heads, std::int64_t q, std::int64_t k, std::int64_t offset) {
  std::vector<double> d;
  for (std::int64_t i = 0; i < q; ++i)
    for (std::int64_t j = 0; j < k; ++j) d.push_back(static_cast<double>(std::abs(i + offset - j)));
  return tg::neg(tg::reshape(slopes, with_tail(heads, {1, 1})) * tg::from_vector(d, {q, k}).to(slopes.dtype()));
}

tg::AttentionResult reference(const CoreCase& c, const CoreProblem& p, const std::vector<Tensor>& x, bool need_weights) {
  const auto [q, k, v, bias, slopes] = p.unpack(x);
  Tensor total = bias;
  if (slopes.defined()) {
    const Tensor a = alibi_over(slopes, p.heads, c.q, c.k, c.offset);
    total = total.defined() ? total + a : a;
  }
  tg::AttentionMasking m;
  m.mask = p.mask;
  return tg::detail::attention_core({"reference", q, k, v, total, need_weights}, m, AttentionPath::weights);
}

// One way through the core: a path forced, the dtype, blocks for the pipelined paths, and
// whether it runs under a bfloat16 matmul precision.
struct CorePath {
  AttentionPath path;
  tg::DType dtype;
  std::int64_t block_rows;
  bool need_weights() const { return path == AttentionPath::weights || path == AttentionPath::weights_bf16 || path == AttentionPath::blocks; }
  bool bf16() const { return path == AttentionPath::weights_bf16; }
};
std::ostream& operator<<(std::ostream& os, const CorePath& p) {
  os << tg::detail::path_name(p.path) << " " << p.dtype;
  if (p.block_rows > 0) os << " blocks of " << p.block_rows;
  return os;
}
std::vector<CorePath> core_paths() {
  return {{AttentionPath::weights, tg::float64, 0},      {AttentionPath::weights, tg::float32, 0},       {AttentionPath::weights_bf16, tg::float32, 0},
          {AttentionPath::blocks, tg::float32, 16},   {AttentionPath::blocks, tg::float32, 5},     {AttentionPath::fused_blocks, tg::float32, 16},
          {AttentionPath::fused_blocks, tg::float32, 5}, {AttentionPath::tiles, tg::float64, 0},         {AttentionPath::tiles, tg::float32, 0}};
}

// As the ops call it: the masking checked against the scores [B, H, Q, K], which a grouped view
// [B, Hkv, G, Q, K] numbers its rows as (its pair mask [B, 1, 1, Q, K] then read as [B, 1, Q, K]).
tg::AttentionResult through(const CorePath& path, const CoreProblem& p, const std::vector<Tensor>& x) {
  const auto [q, k, v, bias, slopes] = p.unpack(x);
  const tg::detail::AttentionArgs args{"path", q, k, v, bias, path.need_weights()};
  const Shape scores = tg::detail::check_attention(args);
  const bool grouped = scores.size() == 5;
  tg::AttentionMasking m = with_slopes(p.parts, slopes);
  if (grouped && m.mask.defined()) m.mask = tg::reshape(m.mask, {m.mask.size(0), 1, m.mask.size(-2), m.mask.size(-1)});
  const auto rows = tg::detail::masking_rows("path", m, grouped ? tg::detail::ungrouped(scores) : scores, q.dtype());
  return tg::detail::attention_core(args, scores, rows, path.path, path.block_rows);
}

// ||got - want|| / ||want||, ||want|| taken as at least an RMS of 1/16 (gradients that are
// nearly 0 are held to an absolute bound instead).
double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size(); ++i) num += (got[i] - want[i]) * (got[i] - want[i]), den += want[i] * want[i];
  return std::sqrt(num / std::max(den, static_cast<double>(got.size()) / 256));
}

BOOST_DATA_TEST_CASE(equal_the_explicit_mask_and_bias, bdata::make(core_cases()) * bdata::make(core_paths()), c, path) {
  // Output, weights (where the path returns them) and the gradients of q, k, v, the bias and the
  // slopes. float64 to 1e-12; float32 within its rounding (fused and weights paths alike), in the
  // 2-norm relative to float64 (measured at most 1.0e-6, held to 4e-6); bfloat16 products within
  // bfloat16's (measured at most 0.011 on these small rows, held to 2^-5; test_attention_flash
  // explains the bounds).
  const CoreProblem p64 = make_core_problem(c), p = p64.as(path.dtype);
  const auto want = run([&](const std::vector<Tensor>& x) { return reference(c, p64, x, path.need_weights()); }, p64.inputs(), 11);
  std::vector<std::vector<double>> got;
  {
    const tg::MatmulPrecisionGuard precision(path.bf16() ? tg::MatmulPrecision::bfloat16 : tg::MatmulPrecision::exact);
    got = run([&](const std::vector<Tensor>& x) {
      const auto r = through(path, p, x);
      BOOST_TEST(r.weights.defined() == path.need_weights());
      return r;
    }, p.inputs(), 11);
  }
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  const std::vector<std::string> names = [&] {
    std::vector<std::string> n{"output"};
    if (path.need_weights()) n.push_back("weights");
    for (const char* g : {"dq", "dk", "dv"}) n.push_back(g);
    if (p.bias.defined()) n.push_back("dbias");
    if (p.slopes.defined()) n.push_back("dslopes");
    return n;
  }();
  for (std::size_t r = 0; r < got.size(); ++r) {
    if (path.dtype == tg::float64) {
      check_close(got[r], want[r], 1e-12, 1e-12, names[r]);
      continue;
    }
    for (double x : got[r]) BOOST_TEST_REQUIRE(std::isfinite(x), names[r] << " not finite");
    const double err = relative_error(got[r], want[r]), bound = path.bf16() ? 0.03125 : 4e-6;
    BOOST_TEST_MESSAGE(names[r] << ": relative error " << err);
    BOOST_TEST(err <= bound, names[r] << ": relative error " << err);
  }
}

// The weights path and the tiles, float64.
std::vector<CorePath> exact_paths() { return {{AttentionPath::weights, tg::float64, 0}, {AttentionPath::tiles, tg::float64, 0}}; }

// The small cases finite differences check here: grouped heads, and negative offsets (the first
// queries see no key). The op table's path entries (tests/op_table/attention_paths.cpp) check
// the others' kinds in every layout.
std::vector<CoreCase> gradcheck_cases() {
  std::vector<CoreCase> out;
  for (const CoreCase& c : core_cases())
    if (small(c) && (c.lead.size() == 3 || c.offset < 0)) out.push_back(c);
  return out;
}

BOOST_DATA_TEST_CASE(float64_gradcheck_on_weights_and_tiles, bdata::make(gradcheck_cases()) * bdata::make(exact_paths()),
                     c, path) {
  const CoreProblem p = make_core_problem(c);
  std::vector<Tensor> xs = p.inputs();
  for (Tensor& x : xs) x = x.detach().set_requires_grad();
  const auto r = tg::gradcheck(
      [&](const std::vector<Tensor>& x) {
        const auto [o, w] = through(path, p, x);
        return w.defined() ? std::vector<Tensor>{o, w} : std::vector<Tensor>{o};
      },
      xs);
  BOOST_TEST(r.ok, r.report());
}

BOOST_DATA_TEST_CASE(create_graph_gradients_equal_the_first_order_ones, bdata::make(core_cases()) * bdata::make(exact_paths()), c, path) {
  // A create_graph pass runs the reference's backward, ALiBi's bias laid over the heads there.
  // gradgradcheck differentiates that backward against itself, so a slope given to the wrong head
  // would pass it: its first-order gradients must be the node's own backward's.
  if (!small(c)) return;
  const CoreProblem p = make_core_problem(c);
  std::vector<Tensor> xs = p.inputs();
  for (Tensor& x : xs) x = x.detach().set_requires_grad();
  const auto r = through(path, p, xs);
  std::vector<Tensor> outs{r.output}, ups;
  if (r.weights.defined()) outs.push_back(r.weights);
  for (const Tensor& o : outs) ups.push_back(tg::randn(o.shape(), 31, tg::float64));
  const auto plain = tg::grad(outs, xs, ups), with_graph = tg::grad(outs, xs, ups, {.create_graph = true});
  for (std::size_t i = 0; i < xs.size(); ++i) check_close(values(with_graph[i]), values(plain[i]), 1e-12, 1e-11, fmt::format("input {}", i));
}

BOOST_DATA_TEST_CASE(float64_gradgradcheck_with_slopes, bdata::make(gradcheck_cases()) * bdata::make(exact_paths()),
                     c, path) {
  // The create_graph backward is the reference's, ALiBi's bias recorded there: second order in
  // q, k, v, the bias and the slopes.
  if (!c.alibi) return;
  const CoreProblem p = make_core_problem(c);
  std::vector<Tensor> xs = p.inputs();
  for (Tensor& x : xs) x = x.detach().set_requires_grad();
  const auto r = tg::gradgradcheck(
      [&](const std::vector<Tensor>& x) {
        const auto [o, w] = through(path, p, x);
        return w.defined() ? std::vector<Tensor>{o, w} : std::vector<Tensor>{o};
      },
      xs);
  BOOST_TEST(r.ok, r.report());
}


// The exact zeros of §4.3-§4.4 with a window: keys outside every query's window (and masked
// keys) and queries left with nothing (suppressed by the query mask, or whose window holds no
// allowed key). Each case names its masked keys and suppressed queries per batch entry.
struct ZeroCase {
  std::string name;
  std::int64_t heads, q, k, offset, window;
  std::vector<std::vector<std::int64_t>> masked_keys, suppressed;  // per batch entry
};
std::ostream& operator<<(std::ostream& os, const ZeroCase& c) { return os << c.name; }

std::vector<ZeroCase> zero_cases() {
  // Query i sees keys i + offset - W + 1 .. i + offset.
  return {// Keys 2..9 are in some window; 0, 1 before every window, 10, 11 past every causal end.
          // Batch 1 masks keys 2-4, all of query 0's window.
          {"Q 6, K 12, window 3, offset 4", 2, 6, 12, 4, 3, {{7}, {2, 3, 4, 8}}, {{3}, {}}},
          // Keys 0..274 before every window: key tiles 0 and 1 whole, and part of tile 2. Keys
          // 275-280 (query 0's window) masked: query 0 empty, query 1 left with key 281.
          {"Q 20, K 300, window 6, offset 280", 2, 20, 300, 280, 6, {{275, 276, 277, 278, 279, 280}}, {{7, 12}}}};
}

struct ZeroProblem {
  CoreProblem p;
  std::vector<std::vector<bool>> dead_keys, empty_queries;  // [b][j], [b][i]: no allowed pair at all
};

ZeroProblem make_zero_problem(const ZeroCase& c) {
  const auto b = static_cast<std::int64_t>(c.masked_keys.size());
  tg::Generator gen(5);
  ZeroProblem z;
  CoreProblem& p = z.p;
  p.heads = {c.heads};
  p.q = exact_in_float32({b, c.heads, c.q, 3}, gen);
  p.k = exact_in_float32({b, c.heads, c.k, 3}, gen);
  p.v = exact_in_float32({b, c.heads, c.k, 2}, gen);
  p.bias = exact_in_float32({c.heads, c.q, c.k}, gen);
  p.slopes = tg::tensor({0.5, 0.125}, tg::float64);
  std::vector<bool> keys(static_cast<std::size_t>(b * c.k), true), queries(static_cast<std::size_t>(b * c.q), true);
  for (std::int64_t n = 0; n < b; ++n) {
    for (std::int64_t j : c.masked_keys[static_cast<std::size_t>(n)]) keys[static_cast<std::size_t>(n * c.k + j)] = false;
    for (std::int64_t i : c.suppressed[static_cast<std::size_t>(n)]) queries[static_cast<std::size_t>(n * c.q + i)] = false;
  }
  p.parts.key_mask = tg::from_bools(keys, {b, c.k});
  p.parts.query_mask = tg::from_bools(queries, {b, c.q});
  p.parts.causal = true;
  p.parts.causal_offset = c.offset;
  p.parts.window = c.window;
  z.dead_keys.assign(static_cast<std::size_t>(b), std::vector<bool>(static_cast<std::size_t>(c.k), true));
  z.empty_queries.assign(static_cast<std::size_t>(b), std::vector<bool>(static_cast<std::size_t>(c.q), true));
  for (std::int64_t n = 0; n < b; ++n)
    for (std::int64_t i = 0; i < c.q; ++i)
      for (std::int64_t j = 0; j < c.k; ++j)
        if (keys[static_cast<std::size_t>(n * c.k + j)] && queries[static_cast<std::size_t>(n * c.q + i)] && j <= i + c.offset &&
            j > i + c.offset - c.window)
          z.dead_keys[static_cast<std::size_t>(n)][static_cast<std::size_t>(j)] = z.empty_queries[static_cast<std::size_t>(n)][static_cast<std::size_t>(i)] = false;
  return z;
}

// x [B, ..., L, W] with `value` in row i of batch entry b wherever rows[b][i].
Tensor with_rows(const Tensor& x, const std::vector<std::vector<bool>>& rows, double value) {
  std::vector<double> v = values(x);
  const std::size_t w = static_cast<std::size_t>(x.shape().back()), len = static_cast<std::size_t>(x.size(-2)), per_batch = v.size() / rows.size();
  for (std::size_t n = 0; n < v.size(); ++n)
    if (rows[n / per_batch][n / w % len]) v[n] = value;
  return tg::from_vector(v, x.shape()).to(x.dtype());
}

std::vector<std::vector<double>> run_path(const CorePath& path, const CoreProblem& p) {
  const tg::MatmulPrecisionGuard precision(path.bf16() ? tg::MatmulPrecision::bfloat16 : tg::MatmulPrecision::exact);
  return run([&](const std::vector<Tensor>& x) { return through(path, p, x); }, p.inputs(), 21);
}

BOOST_DATA_TEST_CASE(unreachable_keys_and_empty_queries_are_exact_zeros, bdata::make(zero_cases()) * bdata::make(core_paths()), c, path) {
  const ZeroProblem z = make_zero_problem(c);
  const CoreProblem clean = z.p.as(path.dtype);
  const auto finite = run_path(path, clean);
  // NaN or inf in k and v at the keys no query may see and in q at the empty queries: every
  // result bitwise that of the finite values (not even 0 * inf may reach a sum).
  for (double x : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()}) {
    CoreProblem poisoned = clean;
    poisoned.k = with_rows(clean.k, z.dead_keys, x);
    poisoned.v = with_rows(clean.v, z.dead_keys, x);
    poisoned.q = with_rows(clean.q, z.empty_queries, x);
    const auto got = run_path(path, poisoned);
    BOOST_REQUIRE_EQUAL(got.size(), finite.size());
    for (std::size_t r = 0; r < got.size(); ++r) BOOST_TEST((got[r] == finite[r]), "poison " << x << ", result " << r);
  }
  // An empty query's output (and weights) row is 0, and so is its dq row; an unreachable key's
  // dk and dv rows are 0.
  const std::size_t w = path.need_weights() ? 1 : 0;
  auto all_zero = [](const std::vector<double>& x, const std::vector<std::vector<bool>>& rows, std::int64_t len, std::int64_t width) {
    const std::size_t per_batch = x.size() / rows.size();
    for (std::size_t n = 0; n < x.size(); ++n)
      if (rows[n / per_batch][n / static_cast<std::size_t>(width) % static_cast<std::size_t>(len)] && x[n] != 0.0) return false;
    return true;
  };
  BOOST_TEST(all_zero(finite[0], z.empty_queries, c.q, 2), "output");
  if (w) BOOST_TEST(all_zero(finite[1], z.empty_queries, c.q, c.k), "weights");
  BOOST_TEST(all_zero(finite[1 + w], z.empty_queries, c.q, 3), "dq");
  BOOST_TEST(all_zero(finite[2 + w], z.dead_keys, c.k, 3), "dk");
  BOOST_TEST(all_zero(finite[3 + w], z.dead_keys, c.k, 2), "dv");
}

BOOST_AUTO_TEST_CASE(the_tiles_skip_key_tiles_before_every_window) {
  // The zero cases show that NaN before every window changes no result, but a key tile read and
  // then masked would give the same bits. What tells the two apart: +inf in k, multiplied into
  // q kᵀ against queries of both signs, makes inf - inf, which raises FE_INVALID. Run on one
  // thread (the flags are per thread), forward and backward, with +inf in the k of keys 0..255
  // (key tiles 0 and 1, before every window of "Q 20, K 300, window 6, offset 280") no flag is
  // raised; with it in key 274 (tile 2, read for the windows it holds) one is, so the check can fail.
  const ZeroProblem z = make_zero_problem(zero_cases()[1]);
  const int before = tg::num_threads();
  tg::set_num_threads(1);
  auto invalid_raised = [&](std::int64_t first, std::int64_t last) {
    std::vector<std::vector<bool>> keys(1, std::vector<bool>(300, false));
    for (std::int64_t j = first; j <= last; ++j) keys[0][static_cast<std::size_t>(j)] = true;
    CoreProblem p = z.p;
    p.k = with_rows(p.k, keys, std::numeric_limits<double>::infinity());
    std::feclearexcept(FE_ALL_EXCEPT);
    run_path({AttentionPath::tiles, tg::float64, 0}, p);
    return std::fetestexcept(FE_INVALID) != 0;
  };
  BOOST_TEST(!invalid_raised(0, -1), "the finite problem raises FE_INVALID: the check below would mean nothing");
  BOOST_TEST(!invalid_raised(0, 255), "a key tile before every window was read");
  BOOST_TEST(invalid_raised(274, 274), "inf in a key tile that is read raised nothing: the check above proves nothing");
  tg::set_num_threads(before);
}

// Positions far past 2^62 keep the window's rule p_i - W < j <= p_i exactly on every path: with
// offset 2^62 + 10 and window 2^62 + 5, query i may see keys j > i + 5 only, so with 6 keys every
// row is empty (zeros); with window 2^62 + 8, keys i + 3 .. 5 are allowed.
BOOST_DATA_TEST_CASE(windows_past_2_62_follow_the_rule_on_every_path, bdata::make(core_paths()), path) {
  const std::int64_t far = std::int64_t{1} << 62, Q = 3, K = 6;
  const Tensor q = tg::randn({1, 2, Q, 4}, 1, path.dtype), k = tg::randn({1, 2, K, 4}, 2, path.dtype), v = tg::randn({1, 2, K, 3}, 3, path.dtype);
  for (const std::int64_t window : {far + 5, far + 8}) {
    tg::AttentionMasking m{.causal = true, .causal_offset = far + 10, .window = window};
    const auto got = tg::detail::attention_core({"path", q, k, v, Tensor(), path.need_weights()}, m, path.path, path.block_rows);
    // Every key is before the causal end; the window leaves j > i + offset - window.
    tg::AttentionMasking explicit_mask{.mask = tg::logical_not(tg::causal_mask(Q, K, window == far + 5 ? 5 : 2))};
    const auto want = tg::detail::attention_core({"path", q, k, v, Tensor(), path.need_weights()}, explicit_mask, path.path, path.block_rows);
    const double tol = path.dtype == tg::float64 ? 1e-13 : 1e-5;
    check_close(values(got.output), values(want.output), tol, tol, fmt::format("window 2^62 + {}", window - far));
    if (window == far + 5)
      for (const double o : values(got.output)) BOOST_TEST_REQUIRE(o == 0.0);
  }
}

BOOST_AUTO_TEST_CASE(slopes_and_bias_gradients_are_deterministic_on_the_tiles) {
  // Two batch entries by heads over three key tiles: the backward splits them into groups and
  // sums the slopes' (and the broadcast bias's) gradient in per-chunk buffers, added in an order
  // fixed by the shape. The same call twice, and on one thread, gives the same bits.
  const CoreCase c{"K 300", {1, 2}, 140, 300, 8, 4, true, 150, 150, true, true};
  for (auto dtype : {tg::float32, tg::float64}) {
    const CoreProblem p = make_core_problem(c).as(dtype);
    const CorePath tiles{AttentionPath::tiles, dtype, 0};
    std::vector<std::vector<std::vector<double>>> runs;
    const int before = tg::num_threads();
    for (int threads : {2, 2, 1}) {
      tg::set_num_threads(threads);
      runs.push_back(run_path(tiles, p));
    }
    tg::set_num_threads(before);
    for (std::size_t n = 1; n < runs.size(); ++n)
      for (std::size_t r = 0; r < runs[0].size(); ++r) BOOST_TEST((runs[n][r] == runs[0][r]), dtype << " run " << n << ", result " << r);
  }
}

BOOST_AUTO_TEST_CASE(a_window_or_learnable_slopes_keep_the_fused_path_on_tiles) {
  // Large float32 scores without weights go to the blocks unless the tiles do better: a window
  // (they skip the key tiles before it) or slopes that need a gradient (the blocks would hold dS whole).
  const Tensor q = tg::zeros({1, 2, 4, 8}, tg::float32), slopes = tg::alibi_slopes(2);
  const Shape large{1, 2, 2048, 2048};
  auto path_of = [&](std::int64_t window, const Tensor& s) {
    const tg::detail::RowMasks rows({.causal = true, .window = window, .slopes = s}, large);
    return tg::detail::attention_path({"path", q, q, q, Tensor(), false}, large, rows, false);
  };
  BOOST_TEST((path_of(0, Tensor()) == AttentionPath::fused_blocks));
  BOOST_TEST((path_of(0, slopes) == AttentionPath::fused_blocks));  // fixed slopes: no dS needed
  BOOST_TEST((path_of(16, Tensor()) == AttentionPath::tiles));
  BOOST_TEST((path_of(0, slopes.detach().set_requires_grad()) == AttentionPath::tiles));
}

struct ErrorCase {
  std::string name;
  std::function<void()> check;  // calls check_throws with the expected type and fragments
};
std::ostream& operator<<(std::ostream& os, const ErrorCase& c) { return os << c.name; }

std::vector<ErrorCase> error_cases() {
  using tg::DTypeError, tg::ShapeError, tg::ValueError;
  // H = 3 heads; both entries to the core: detail::attention_core and the public op.
  static const Tensor q = tg::randn({2, 3, 4, 5}, 1, tg::float64), k = tg::randn({2, 3, 6, 5}, 2, tg::float64), v = tg::randn({2, 3, 6, 2}, 3, tg::float64);
  auto core = [](std::int64_t window, bool causal, const Tensor& slopes) {
    tg::AttentionMasking m;
    m.causal = causal;
    m.window = window;
    tg::detail::attention_core({"attention_core", q, k, v, Tensor(), true}, with_slopes(m, slopes));
  };
  auto sdpa = [](const tg::AttentionOptions& o) { tg::scaled_dot_product_attention(q, k, v, o); };
  return {
      {"core: window < 0", [=] { check_throws<ValueError>([&] { core(-1, true, Tensor()); }, {"attention_core", "masking.window", ">= 0", "-1"}); }},
      {"core: window without causal", [=] { check_throws<ValueError>([&] { core(2, false, Tensor()); }, {"attention_core", "masking.window = 2", "causal"}); }},
      {"core: slopes [H + 1]", [=] { check_throws<ShapeError>([&] { core(0, false, tg::alibi_slopes(4, tg::float64)); }, {"'masking.alibi_slopes'", "[H]", "[4]"}); }},
      {"core: slopes [H, 1]", [=] { check_throws<ShapeError>([&] { core(0, false, tg::ones({3, 1}, tg::float64)); }, {"'masking.alibi_slopes'", "[3, 1]"}); }},
      {"core: float32 slopes", [=] { check_throws<DTypeError>([&] { core(2, true, tg::alibi_slopes(3)); }, {"'masking.alibi_slopes'", "float32", "float64"}); }},
      {"core: int64 slopes", [=] { check_throws<DTypeError>([&] { core(0, true, tg::zeros({3}, tg::int64)); }, {"'masking.alibi_slopes'", "int64"}); }},
      {"op: window < 0", [=] { check_throws<ValueError>([&] { sdpa({.masking = {.causal = true, .window = -1}}); }, {"scaled_dot_product_attention", "options.masking.window", "-1"}); }},
      {"op: window without causal", [=] { check_throws<ValueError>([&] { sdpa({.masking = {.window = 3}}); }, {"options.masking.window = 3", "options.masking.causal"}); }},
      {"op: slopes [H + 1]",
       [=] { check_throws<ShapeError>([&] { sdpa({.masking = {.alibi_slopes = tg::alibi_slopes(4, tg::float64)}}); }, {"'options.masking.alibi_slopes'", "[H]", "[2, 3, 4, 6]", "[4]"}); }},
      {"op: float32 slopes",
       [=] { check_throws<DTypeError>([&] { sdpa({.masking = {.causal = true, .window = 2, .alibi_slopes = tg::alibi_slopes(3)}}); }, {"'options.masking.alibi_slopes'", "float32"}); }},
      {"op: int64 slopes", [=] { check_throws<DTypeError>([&] { sdpa({.masking = {.alibi_slopes = tg::zeros({3}, tg::int64)}}); }, {"'options.masking.alibi_slopes'", "int64"}); }},
      {"op: an infinite slope",
       [=] { check_throws<ValueError>([&] { sdpa({.masking = {.alibi_slopes = tg::tensor({0.5, 0.25, HUGE_VAL}, tg::float64)}}); }, {"alibi_slopes", "inf", "head 2", "finite"}); }},
      {"op: a NaN slope",
       [=] { check_throws<ValueError>([&] { sdpa({.masking = {.alibi_slopes = tg::tensor({std::nan(""), 0.25, 1.0}, tg::float64)}}); }, {"alibi_slopes", "nan", "head 0"}); }},
      {"op: slopes with an offset past 2^52",
       [=] { check_throws<ValueError>([&] { sdpa({.masking = {.causal = true, .causal_offset = (std::int64_t{1} << 52) + 1, .alibi_slopes = tg::alibi_slopes(3, tg::float64)}}); },
                                      {"scaled_dot_product_attention", "causal_offset", "2^52", "4503599627370497"}); }},
      {"mha: an infinite slope",
       [=] { check_throws<ValueError>([&] {
               const Tensor x = tg::randn({1, 2, 6}, 4, tg::float64), w = tg::randn({6, 6}, 5, tg::float64);
               tg::multihead_attention({.query = x, .context = x}, {.w_q = w, .w_k = w, .w_v = w, .w_o = w},
                                       {.heads = 3, .masking = {.alibi_slopes = tg::tensor({0.5, -HUGE_VAL, 1.0}, tg::float64)}});
             }, {"multihead_attention", "-inf", "head 1"}); }},
  };
}

BOOST_DATA_TEST_CASE(bad_window_and_slopes_name_themselves, bdata::make(error_cases()), c) { c.check(); }

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

// o with m's masks in its masking.
tg::MhaOptions masked(tg::MhaOptions o, const tg::MhaMasks& m) {
  o.masking.mask = m.attention_mask;
  o.masking.key_mask = m.key_mask;
  o.masking.query_mask = m.query_mask;
  return o;
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
  return tg::multihead_attention({x[0], x[1], x[2]}, {x[3], rep(x[4]), rep(x[5]), x[6], x[7], rep(x[8]), rep(x[9]), x[10]}, masked(options, p.masks));
}

BOOST_AUTO_TEST_CASE(kv_heads_equal_repeated_projections) {
  for (auto dtype : {tg::float64, tg::float32})
    for (std::int64_t kv : {1, 2, 4})
      for (bool need_weights : {true, false}) {
        const Problem p = problem(kv, dtype);
        const tg::MhaOptions o{.heads = 4, .kv_heads = kv, .masking = {.causal = true, .causal_offset = 2}, .need_weights = need_weights};
        const auto got = run([&](const std::vector<Tensor>& x) { return call(p, x, o); }, p.inputs(), 72);
        const auto want = run([&](const std::vector<Tensor>& x) { return call(p, x, o, 1); }, p.inputs(), 72);
        check_runs(got, want, dtype == tg::float64 ? 1e-12 : 5e-5, fmt::format("{} Hkv {} need_weights {}", dtype, kv, need_weights));
      }
}

BOOST_AUTO_TEST_CASE(the_options_overload_is_the_plain_call_with_defaults) {
  const Problem p = problem(4, tg::float64);
  for (bool need_weights : {true, false}) {
    auto a = tg::multihead_attention(p.act, p.par, p.masks, 4, true, 1, need_weights);
    auto b = tg::multihead_attention(p.act, p.par, masked({.heads = 4, .masking = {.causal = true, .causal_offset = 1}, .need_weights = need_weights}, p.masks));
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
          auto [o, w] = call(p, x, {.heads = 4, .kv_heads = 2, .masking = {.causal = true, .causal_offset = 2, .window = 3, .alibi_slopes = x[11]}, .need_weights = need_weights});
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
    const tg::MhaOptions o{.heads = 4, .kv_heads = 2, .masking = {.causal = true, .causal_offset = 2, .window = 3, .alibi_slopes = slopes}, .need_weights = need_weights};
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
  const tg::MhaOptions o{.heads = 4, .kv_heads = 2, .masking = {.causal = true, .causal_offset = 3, .window = 2}, .need_weights = true};
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
          return tg::multihead_attention({x[0], x[1]}, {x[2], x[3], x[4], x[5], x[6], x[7], x[8], x[9]}, o);
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
  auto mha = [&](const tg::MhaParameters& par, const tg::MhaOptions& o) { tg::multihead_attention(p.act, par, masked(o, p.masks)); };
  check_throws<tg::ValueError>([&] { mha(p.par, {.heads = 4, .kv_heads = 3}); }, {"multihead_attention", "options.kv_heads = 3", "options.heads = 4"});
  check_throws<tg::ShapeError>([&] { mha(p.par, {.heads = 4, .kv_heads = 1}); }, {"'w_k' [7, 6]", "kv_heads * D = 1 * 3 = 3", "'w_q' [5, 12]"});
  tg::MhaParameters odd = p.par;
  odd.w_v = draw({7, 3}, 1);
  odd.b_v = Tensor();
  check_throws<tg::ShapeError>([&] { mha(odd, {.heads = 4, .kv_heads = 2}); }, {"kv_heads = 2", "'w_v'", "[7, 3]"});
  check_throws<tg::ShapeError>([&] { mha(p.par, {.heads = 4}); }, {"'w_q' [5, 12]", "'w_k' [7, 6]", "same width"});
  check_throws<tg::ValueError>([&] { mha(p.par, {.heads = 4, .kv_heads = 2, .masking = {.window = 2}}); }, {"options.masking.window = 2", "options.masking.causal"});
  check_throws<tg::ValueError>([&] { mha(p.par, {.heads = 4, .kv_heads = 2, .masking = {.causal = true, .window = -3}}); }, {"options.masking.window", "-3"});
  check_throws<tg::ShapeError>([&] { mha(p.par, {.heads = 4, .kv_heads = 2, .masking = {.alibi_slopes = tg::alibi_slopes(2, tg::float64)}}); },
                               {"'options.masking.alibi_slopes'", "[H]", "[2, 4, 4, 6]", "[2]"});
  check_throws<tg::DTypeError>([&] { mha(p.par, {.heads = 4, .kv_heads = 2, .masking = {.alibi_slopes = tg::alibi_slopes(4)}}); },
                               {"'options.masking.alibi_slopes'", "float32", "float64"});
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
    auto [full, full_attn] = layer.forward(x, {.masking = {.causal = true}, .need_weights = true});
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
  const Tensor full = layer.forward(x, {.masking = {.causal = true}}).output;
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
  const Tensor full = layer.forward(x, {.masking = {.key_mask = key_mask, .causal = true}, .bias = bias}).output;
  tg::KVCache cache;
  std::vector<Tensor> outs;
  for (std::int64_t t = 0; t < len; ++t)
    outs.push_back(layer.decode(tg::slice(x, 1, t, t + 1), cache,
                                {.masking = {.key_mask = tg::slice(key_mask, 1, 0, t + 1)}, .bias = tg::slice(tg::slice(bias, 2, t, t + 1), 3, 0, t + 1)})
                       .output);
  BOOST_TEST(cache.start() > 0);
  check_close(values(tg::concat(outs, 1)), values(full), 1e-12, 1e-12, "masked, biased, windowed decoding");
  check_throws<tg::ShapeError>([&] { layer.decode(tg::slice(x, 1, 0, 1), cache, {.masking = {.key_mask = tg::ones({2, 3}, tg::bool_)}}); },
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
        [&] { return std::vector<Tensor>{layer.forward(x, {.masking = {.causal = true}, .need_weights = need_weights}).output}; }, layer.parameters());
    BOOST_TEST(r.ok, "need_weights " << need_weights << ": " << r.report());
  }
  const Tensor out = layer.forward(x, {.masking = {.causal = true}}).output;
  BOOST_TEST(tg::grad({tg::sum(out * out)}, {layer.alibi_slopes()})[0].shape() == (Shape{4}));
}

BOOST_AUTO_TEST_CASE(the_config_is_validated) {
  auto fails = [](tg::MultiHeadAttentionConfig c, std::vector<std::string> fragments) {
    check_throws<tg::ValueError>([&] { tg::MultiHeadAttention{c}; }, fragments);
  };
  fails({.query_dim = 8, .heads = 4, .kv_heads = 3}, {"MultiHeadAttention", "config.kv_heads = 3", "config.heads = 4"});
  fails({.query_dim = 8, .heads = 4, .kv_heads = -1}, {"config.kv_heads", "-1"});
  fails({.query_dim = 8, .heads = 4, .window = -2}, {"config.window", ">= 0", "-2"});
  check_throws<tg::ValueError>([] { tg::Decoder({.vocab = 4, .max_len = 4, .dim = 8, .heads = 4, .kv_heads = 3}); },
                               {"Decoder", "config.kv_heads = 3", "config.heads = 4"});
  check_throws<tg::ValueError>([] { tg::Decoder({.vocab = 4, .max_len = 4, .dim = 8, .heads = 4, .window = -1}); }, {"Decoder", "config.window"});
  // Every config takes its rules from the same two checks, which callers of their own can use too.
  check_throws<tg::ValueError>([] { tg::check_kv_heads("mine", "my.", 6, 4); }, {"mine: my.kv_heads = 4 must divide my.heads = 6"});
  check_throws<tg::ValueError>([] { tg::check_window("mine", "my.window", -1); }, {"mine: my.window must be >= 0", "got -1"});
  BOOST_CHECK_NO_THROW(tg::check_kv_heads("mine", "my.", 6, 0));
  BOOST_CHECK_NO_THROW(tg::check_window("mine", "my.window", 0));
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
    check_decoding_equals_forward(model, ids, 3, what);
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
