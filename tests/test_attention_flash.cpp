// The fused attention path (attention_core with need_weights = false, kernels/attention_tiles.cpp)
// against the weights path: outputs and every gradient, across masks given by parts, causal
// offsets, Q != K, bias shapes, non-finite masked keys and sequences spanning several tiles;
// and float64 gradchecks of the fused path alone. Then the weights path in blocks of rows
// (kernels/attention_blocks.cpp) against the weights path on whole tensors.
#define BOOST_TEST_MODULE attention_flash
#include <boost/test/data/test_case.hpp>
#include <limits>

#include "ops/attention_core.hpp"
#include "support.hpp"

namespace tg = tapegrad;
namespace bdata = boost::unit_test::data;
using namespace tg_test;
using tg::Shape;
using tg::Tensor;

namespace {

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

struct Case {
  std::int64_t b, h, q, k, d, dv;
  bool keys, queries, pairs, causal;
  std::int64_t offset;
  int bias;     // 0 none, 1 [B, H, Q, K], 2 [1, H, 1, K], 3 [Q, K], 4 [B, 1, Q, 1]
  bool poison;  // NaN in the k and v rows of the keys the key mask removes
  std::uint64_t seed;
};
std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << "B" << c.b << " H" << c.h << " Q" << c.q << " K" << c.k << " D" << c.d << " Dv" << c.dv << " keys " << c.keys
            << " queries " << c.queries << " pairs " << c.pairs << " causal " << c.causal << " offset " << c.offset << " bias "
            << c.bias << " poison " << c.poison << " seed " << c.seed;
}

// A problem: inputs, the mask in parts (for the fused path) and combined into one bool tensor
// computed here with plain loops (for the weights path), and an upstream gradient.
struct Problem {
  Tensor q, k, v, bias, d_out;
  bool bias_grad = true;  // false: the bias is a constant (no dbias asked for)
  tg::AttentionMasking parts;
  Tensor combined;  // [B, 1, Q, K]
};

std::vector<bool> coin(tg::Generator& gen, std::int64_t n, double p) {
  std::vector<bool> v;
  for (std::int64_t i = 0; i < n; ++i) v.push_back(gen.uniform() < p);
  return v;
}

Problem make(const Case& c, tg::DType dtype) {
  tg::Generator gen(c.seed);
  Problem p;
  auto randn = [&](const Shape& s) { return tg::randn(s, gen, tg::float64).to(dtype); };
  p.q = randn({c.b, c.h, c.q, c.d});
  p.k = randn({c.b, c.h, c.k, c.d});
  p.v = randn({c.b, c.h, c.k, c.dv});
  p.d_out = randn({c.b, c.h, c.q, c.dv});
  const std::vector<Shape> bias_shapes{{}, {c.b, c.h, c.q, c.k}, {1, c.h, 1, c.k}, {c.q, c.k}, {c.b, 1, c.q, 1}};
  if (c.bias > 0) p.bias = randn(bias_shapes[static_cast<std::size_t>(c.bias)]);
  const auto km = coin(gen, c.b * c.k, 0.8), qm = coin(gen, c.b * c.q, 0.85), am = coin(gen, c.b * c.q * c.k, 0.8);
  if (c.keys) p.parts.key_mask = tg::from_bools(km, {c.b, c.k});
  if (c.queries) p.parts.query_mask = tg::from_bools(qm, {c.b, c.q});
  if (c.pairs) p.parts.mask = tg::from_bools(am, {c.b, 1, c.q, c.k});
  p.parts.causal = c.causal;
  p.parts.causal_offset = c.offset;
  std::vector<bool> all(static_cast<std::size_t>(c.b * c.q * c.k));
  for (std::int64_t b = 0; b < c.b; ++b)
    for (std::int64_t i = 0; i < c.q; ++i)
      for (std::int64_t j = 0; j < c.k; ++j) {
        const auto n = static_cast<std::size_t>((b * c.q + i) * c.k + j);
        all[n] = (!c.keys || km[static_cast<std::size_t>(b * c.k + j)]) && (!c.queries || qm[static_cast<std::size_t>(b * c.q + i)]) &&
                 (!c.pairs || am[n]) && (!c.causal || j <= i + c.offset);
      }
  p.combined = tg::from_bools(all, {c.b, 1, c.q, c.k});
  if (c.poison && c.keys) {
    std::vector<bool> rows;  // [B, H, K]
    for (std::int64_t b = 0; b < c.b; ++b)
      for (std::int64_t h = 0; h < c.h; ++h)
        for (std::int64_t j = 0; j < c.k; ++j) rows.push_back(!km[static_cast<std::size_t>(b * c.k + j)]);
    auto poisoned = [&](const Tensor& x) {
      std::vector<double> v = values(x);
      const auto w = static_cast<std::size_t>(x.shape().back());
      for (std::size_t n = 0; n < v.size(); ++n)
        if (rows[n / w]) v[n] = std::numeric_limits<double>::quiet_NaN();
      return tg::from_vector(v, x.shape()).to(dtype);
    };
    p.k = poisoned(p.k);
    p.v = poisoned(p.v);
  }
  return p;
}

// The fused path (float32) on the weights path's blocks of block_rows rows, which attention_core
// takes for large scores only.
tg::AttentionResult fused_blocks(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                                         const tg::AttentionMasking& mask, std::int64_t block_rows) {
  return tg::detail::attention_core({"attention", q, k, v, bias, false}, mask, tg::detail::AttentionPath::fused_blocks, block_rows);
}

// Output and the gradients of q, k, v (and bias) through one path; block_rows > 0: the fused path
// on blocks of that many rows. The weights path takes the combined mask when there is one.
std::vector<std::vector<double>> run(const Problem& p, bool fused, std::int64_t block_rows = 0) {
  Tensor q = p.q.detach().set_requires_grad(), k = p.k.detach().set_requires_grad(), v = p.v.detach().set_requires_grad();
  Tensor bias = p.bias.defined() ? p.bias.detach().set_requires_grad(p.bias_grad) : Tensor();
  tg::AttentionMasking mask;
  if (fused || !p.combined.defined()) mask = p.parts;
  else mask.mask = p.combined;
  const auto r = fused && block_rows > 0 ? fused_blocks(q, k, v, bias, mask, block_rows)
                 : fused ? tg::detail::attention_core({"attention", q, k, v, bias, false}, mask, tg::detail::AttentionPath::tiles)
                         : tg::detail::attention_core({"attention", q, k, v, bias, true}, mask);
  BOOST_TEST(r.weights.defined() == !fused);
  tg::backward({r.output}, {p.d_out});
  std::vector<std::vector<double>> out{values(r.output), values(q.grad()), values(k.grad()), values(v.grad())};
  if (bias.defined() && bias.requires_grad()) out.push_back(values(bias.grad()));
  tg::clear_tape();
  return out;
}

// Largest |fused - weights| per result, with NaN counted as a mismatch unless both are NaN.
void compare(const Problem& p, double atol, double rtol, const std::string& what, std::int64_t block_rows = 0) {
  const auto fused = run(p, true, block_rows), weights = run(p, false);
  const char* names[] = {"output", "dq", "dk", "dv", "dbias"};
  for (std::size_t r = 0; r < fused.size(); ++r) {
    BOOST_TEST_REQUIRE(fused[r].size() == weights[r].size());
    double worst = 0;
    for (std::size_t n = 0; n < fused[r].size(); ++n) {
      const double a = fused[r][n], b = weights[r][n];
      BOOST_TEST_REQUIRE(std::isfinite(a), what << ": " << names[r] << "[" << n << "] of the fused path is " << a);
      BOOST_TEST_REQUIRE(std::isfinite(b), what << ": " << names[r] << "[" << n << "] of the weights path is " << b);
      worst = std::max(worst, std::abs(a - b) / (atol + rtol * std::abs(b)));
    }
    BOOST_TEST(worst <= 1.0, what << ": " << names[r] << " differs by " << worst << " tolerances");
  }
}

std::vector<Case> grid() {
  std::vector<Case> cases;
  std::uint64_t seed = 1;
  // Offsets: far negative (every row empty), negative, zero, positive, past the last key.
  for (std::int64_t offset : {-9, -2, 0, 3, 40})
    for (int masks = 0; masks < 4; ++masks)
      for (int bias = 0; bias < 5; ++bias) {
        const std::int64_t q = 3 + (seed % 5), k = 2 + ((seed * 7) % 9);  // Q != K mostly
        cases.push_back({1 + static_cast<std::int64_t>(seed % 2), 1 + static_cast<std::int64_t>(seed % 3), q, k, 1 + static_cast<std::int64_t>(seed % 4),
                         1 + static_cast<std::int64_t>((seed / 2) % 3), masks & 1 ? true : false, masks == 2, masks >= 2, masks != 1,
                         offset, bias, masks == 1 || masks == 3, seed});
        ++seed;
      }
  return cases;
}

// x ([B, H, rows, width]) as float32, with `value` in every row r of batch entry b where
// keep[b * per_batch + r] is false.
Tensor with_rows_set(const Tensor& x, const std::vector<bool>& keep, std::int64_t heads, std::int64_t per_batch, double value) {
  std::vector<double> v = values(x);
  const auto w = static_cast<std::size_t>(x.shape().back());
  for (std::size_t n = 0; n < v.size(); ++n) {
    const std::size_t row = n / w, b = row / static_cast<std::size_t>(heads * per_batch), i = row % static_cast<std::size_t>(per_batch);
    if (!keep[b * static_cast<std::size_t>(per_batch) + i]) v[n] = value;
  }
  return tg::from_vector(v, x.shape()).to(tg::float32);
}

// `clean` with `value` in the k and v rows of padded keys and in the q and dO rows of queries
// that attend to nothing.
Problem poisoned(const Problem& clean, const Case& c, double value) {
  const auto keys = clean.parts.key_mask.to_vector<bool>(), queries = clean.parts.query_mask.to_vector<bool>();
  Problem p = clean;
  p.k = with_rows_set(clean.k, keys, c.h, c.k, value);
  p.v = with_rows_set(clean.v, keys, c.h, c.k, value);
  p.q = with_rows_set(clean.q, queries, c.h, c.q, value);
  p.d_out = with_rows_set(clean.d_out, queries, c.h, c.q, value);
  return p;
}

// Problems that span many blocks of 16 rows: a batch entry's blocks split into groups (B H < 8),
// every mask kind, a bias and NaN in the padded keys' k and v.
std::vector<Case> block_cases() {
  return {Case{1, 2, 300, 421, 16, 8, true, true, false, true, 37, 2, true, 7}, Case{2, 1, 260, 140, 8, 12, true, false, true, true, -100, 3, false, 8},
          Case{1, 3, 129, 257, 5, 3, false, true, false, false, 0, 1, false, 9}, Case{3, 4, 100, 100, 16, 16, true, true, true, true, 0, 1, true, 10}};
}

// results() on one and then two threads: bitwise the same.
template <class Results> void same_on_one_and_two_threads(Results results) {
  std::vector<std::vector<double>> first;
  for (int threads : {1, 2}) {
    const int before = tg::num_threads();
    tg::set_num_threads(threads);
    BOOST_TEST_CONTEXT("threads " << threads) {
      const auto got = results();
      if (first.empty()) first = got;
      else
        for (std::size_t r = 0; r < got.size(); ++r) BOOST_TEST((got[r] == first[r]), "result " << r << " bitwise on 1 and 2 threads");
    }
    tg::set_num_threads(before);
  }
}

// v with more leading dims than q and k (the weights then carry them), q, k and v strided, and
// queries that attend to nothing.
Problem strided_problem() {
  Problem p;
  p.q = tg::transpose(tg::randn({2, 40, 3, 8}, 51), 1, 2);  // [2, 3, 40, 8], rows 24 apart
  p.k = tg::transpose(tg::randn({2, 33, 3, 8}, 52), 1, 2);
  p.v = tg::randn({4, 2, 3, 33, 5}, 53);
  p.d_out = tg::randn({4, 2, 3, 40, 5}, 54);
  p.parts.causal = true;
  p.parts.causal_offset = -3;  // queries 0-2 attend to nothing
  return p;
}

// NaN or inf in the k and v rows of padded keys and in the q and dO rows of queries that attend
// to nothing: every result of run(problem) bitwise what zeros there give, exact and bfloat16.
template <class Run> void poison_changes_nothing(Run run) {
  const Case c{2, 2, 140, 150, 16, 8, true, true, false, true, 5, 2, false, 31};
  const Problem clean = make(c, tg::float32);
  for (bool bf16 : {false, true}) {
    const tg::MatmulPrecisionGuard precision(bf16 ? tg::MatmulPrecision::bfloat16 : tg::MatmulPrecision::exact);
    const auto zeroed = run(poisoned(clean, c, 0.0));
    for (double x : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()}) {
      const auto results = run(poisoned(clean, c, x));
      for (std::size_t r = 0; r < zeroed.size(); ++r)
        BOOST_TEST((results[r] == zeroed[r]), "bfloat16 " << bf16 << ", poison " << x << ", result " << r);
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(fused_equals_weights_path)

BOOST_DATA_TEST_CASE(small_shapes, bdata::make(grid()), c) {
  compare(make(c, tg::float64), 1e-12, 1e-10, "float64");
  compare(make(c, tg::float32), 2e-5, 2e-4, "float32");
}

BOOST_AUTO_TEST_CASE(several_tiles_in_both_directions) {
  // Q and K span several 128-wide tiles and end mid-tile; every mask kind and a bias at once.
  for (const Case& c : {Case{1, 2, 300, 421, 16, 8, true, true, false, true, 37, 2, true, 7},
                        Case{2, 1, 260, 140, 8, 12, true, false, true, true, -100, 3, false, 8},
                        Case{1, 3, 129, 257, 5, 3, false, true, false, false, 0, 1, false, 9}}) {
    // Two threads as well: the backward then splits key tiles into groups (B H = 3) and sums a
    // broadcast bias's gradient per chunk (B H = 2, bias [Q, K]).
    for (int threads : {1, 2}) {
      const int before = tg::num_threads();
      tg::set_num_threads(threads);
      BOOST_TEST_CONTEXT(c << " threads " << threads) {
        compare(make(c, tg::float64), 1e-12, 1e-10, "float64");
        compare(make(c, tg::float32), 5e-5, 5e-4, "float32");
      }
      tg::set_num_threads(before);
    }
  }
}

// The tiles' backward splits few batch entries into key-tile groups and sums a broadcast bias's
// gradient in chunks: both fixed by the shape, so every result is bitwise the same on one and
// two threads (an odd number of heads once gave two dq groups on two threads and one on one).
BOOST_AUTO_TEST_CASE(tiles_give_the_same_bits_on_any_thread_count) {
  for (const Case& c : block_cases())
    for (auto dtype : {tg::float32, tg::float64}) {
      const Problem p = make(c, dtype);
      BOOST_TEST_CONTEXT(c << " " << dtype) { same_on_one_and_two_threads([&] { return run(p, true); }); }
    }
}

BOOST_AUTO_TEST_CASE(empty_rows_are_exactly_zero_with_zero_gradient) {
  // Query 1 attends to nothing (query mask); query 2's only allowed scores are -inf (bias).
  const double inf = std::numeric_limits<double>::infinity();
  for (auto dtype : {tg::float32, tg::float64}) {
    Tensor q = tg::randn({1, 1, 3, 2}, 3, tg::float64).to(dtype).set_requires_grad();
    Tensor k = tg::randn({1, 1, 4, 2}, 4, tg::float64).to(dtype).set_requires_grad();
    Tensor v = tg::randn({1, 1, 4, 3}, 5, tg::float64).to(dtype).set_requires_grad();
    Tensor bias = tg::tensor({{0, 0, 0, 0}, {0, 0, 0, 0}, {-inf, -inf, 0, 0}}, dtype).set_requires_grad();
    tg::AttentionMasking mask;
    mask.query_mask = tg::from_bools({true, false, true}, {1, 3});
    mask.key_mask = tg::from_bools({true, true, false, true}, {1, 4});
    mask.causal = true;
    mask.causal_offset = 0;  // query 2 may see keys 0 and 1 (key 2 is masked), both -inf
    const Tensor out = tg::detail::attention_core({"attention", q, k, v, bias, false}, mask).output;
    tg::backward({out}, {tg::ones_like(out)});
    const auto o = values(out), gq = values(q.grad());
    for (std::size_t n = 0; n < 9; ++n) BOOST_TEST(o[n] == (n < 3 ? o[n] : 0.0));
    BOOST_TEST(o[0] != 0.0);  // query 0 sees key 0
    for (std::size_t n = 2; n < 6; ++n) BOOST_TEST(gq[n] == 0.0);
    for (double x : values(bias.grad())) BOOST_TEST(std::isfinite(x));
    tg::clear_tape();
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(gradcheck_fused)

// A quarter of the grid, without the NaN-poisoned cases (finite differences need finite inputs).
std::vector<Case> gradcheck_grid() {
  std::vector<Case> cases;
  for (const Case& c : grid())
    if (c.seed % 4 == 0 && !c.poison) cases.push_back(c);
  return cases;
}

BOOST_DATA_TEST_CASE(float64_finite_differences, bdata::make(gradcheck_grid()), c) {
  const Problem p = make(c, tg::float64);
  std::vector<Tensor> xs{p.q, p.k, p.v};
  if (p.bias.defined()) xs.push_back(p.bias);
  for (auto& x : xs) x = x.detach().set_requires_grad();
  BOOST_TEST_CONTEXT(c) {
    const auto r = tg::gradcheck([&](const std::vector<Tensor>& in) {
      const Tensor bias = in.size() > 3 ? in[3] : Tensor();
      return std::vector<Tensor>{tg::detail::attention_core({"attention", in[0], in[1], in[2], bias, false}, p.parts).output};
    }, xs);
    BOOST_TEST(r.ok, r.report());
  }
  tg::clear_tape();
}

BOOST_AUTO_TEST_CASE(broadcast_leading_dims_and_strided_inputs) {
  // q [2, 3, Q, D] against k [3, K, D] (shared by the batch) and v transposed in memory.
  Tensor q = tg::randn({2, 3, 5, 4}, 60, tg::float64).set_requires_grad();
  Tensor k = tg::randn({3, 6, 4}, 61, tg::float64).set_requires_grad();
  Tensor v = tg::transpose(tg::randn({2, 1, 3, 6}, 62, tg::float64), -1, -2).set_requires_grad();
  tg::AttentionMasking mask;
  mask.causal = true;
  mask.causal_offset = 1;
  mask.key_mask = tg::from_bools({true, true, false, true, true, true, true, false, true, true, true, true}, {2, 6});
  const auto r = tg::gradcheck([&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{tg::detail::attention_core({"attention", in[0], in[1], in[2], Tensor(), false}, mask).output};
  }, {q, k, v});
  BOOST_TEST(r.ok, r.report());
  tg::clear_tape();
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(large_scores)

// The backward recomputes P = exp(S - L) with L = m + log(l) rounded to float32: once |m| is
// large enough that log(l) is lost in L's rounding, P sums to l instead of 1. Softmax ignores a
// shift of every score, so the gradients must not depend on it.
BOOST_AUTO_TEST_CASE(uniform_shift_of_every_score_leaves_gradients_unchanged) {
  // Four keys with the same score 1e8 (q = k rows = [1e4, 1e4], D = 2): weights 1/4 each.
  // The tiles (tg::attention at this size) and the blocks.
  for (bool blocks : {false, true}) {
    Tensor q = tg::full({1, 1, 2}, 1e4).set_requires_grad();
    Tensor k = tg::full({1, 4, 2}, 1e4).set_requires_grad();
    Tensor v = tg::randn({1, 4, 3}, 7).set_requires_grad();
    const Tensor out = blocks ? fused_blocks(q, k, v, Tensor(), {}, 1).output : tg::attention(q, k, v);
    tg::backward({out}, {tg::ones_like(out)});
    for (double g : values(v.grad())) BOOST_TEST(std::abs(g - 0.25) <= 1e-6, "blocks " << blocks << ": dv " << g << ", expected 1/4");
    tg::clear_tape();
  }
}

BOOST_AUTO_TEST_CASE(row_masked_by_a_large_negative_bias) {
  // A padding query masked the additive way (bias -1e9 on every key, as -finfo.max or -1e9
  // masks are written): its weights are uniform over the K keys, and the fused path's dbias and
  // dv must equal the weights path's.
  Problem p;
  p.q = tg::randn({1, 1, 2, 4}, 11);
  p.k = tg::randn({1, 1, 5, 4}, 12);
  p.v = tg::randn({1, 1, 5, 3}, 13);
  p.d_out = tg::randn({1, 1, 2, 3}, 14);
  p.bias = tg::tensor({{0, 0, 0, 0, 0}, {-1e9, -1e9, -1e9, -1e9, -1e9}});
  p.combined = tg::from_bools(std::vector<bool>(10, true), {1, 1, 2, 5});
  compare(p, 2e-5, 2e-4, "float32, bias -1e9");
  compare(p, 2e-5, 2e-4, "float32 blocks of 1 row, bias -1e9", 1);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(non_finite_values_with_zero_weight)

// An allowed key whose weight underflows to 0 contributes nothing (the ⊛ product), even when its
// value is NaN or inf. The online softmax gives it weight 1 in the first key tile and scales the
// accumulator by exp(m - m') = 0 when a later tile raises the row's maximum: NaN * 0 must not
// reach the output.
BOOST_AUTO_TEST_CASE(rescaled_accumulator_drops_a_non_finite_value) {
  // D = 1, q = 1: the scores are the keys. Key 0 scores 0 (first tile), key 199 scores 200
  // (second tile), the rest -50: key 0's weight is exp(-200) / l, 0 in float32.
  const std::int64_t K = 200;
  std::vector<double> kv(static_cast<std::size_t>(K), -50.0), vv(static_cast<std::size_t>(K), 1.0);
  kv.front() = 0;
  kv.back() = 200;
  for (double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    vv.front() = bad;
    const Tensor q = tg::full({1, 1, 1}, 1.0), k = tg::from_vector(kv, {1, K, 1}).to(tg::float32),
                 v = tg::from_vector(vv, {1, K, 1}).to(tg::float32);
    const double weights_path = values(tg::scaled_dot_product_attention(q, k, v).output)[0];
    const double fused = values(tg::attention(q, k, v))[0];
    const double blocks = values(fused_blocks(q, k, v, Tensor(), {}, 1).output)[0];  // the fused path on blocks
    BOOST_TEST(weights_path == 1.0);
    BOOST_TEST(fused == 1.0, "v[0] = " << bad << ": the fused output is " << fused);
    BOOST_TEST(blocks == 1.0, "v[0] = " << bad << ": the blocks' output is " << blocks);
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(bfloat16_core)

// Under MatmulPrecisionGuard(bfloat16) both paths round every product's operands to bfloat16
// (8 significant bits, 2^-9 relative each) and accumulate in float32. Held here, in the 2-norm
// relative to float64: on problems of several tiles (measured at most 0.0044) the output and
// every gradient within 2^-6; on the grid's tiny problems (D <= 4, a handful of keys, where one
// rounded score moves a weight by |s| 2^-8 and nothing averages out; measured at most 0.038)
// within 2^-4, except the fused path's gradient of a bias constant along each row, 0 in exact
// arithmetic: its rows sum dS = P (dP - Δ) with Δ from the forward's output, which cancels only to
// bfloat16 rounding (measured 0.079), held to 2^-3. The two paths round different intermediates
// (the weights path A, the fused path its tiles of P), so they agree within the same bounds
// rather than bitwise. On a CPU without AVX512-BF16 the products are emulated (ctest runs this
// suite a second time that way).

// ||got - want|| / ||want||, with ||want|| taken as at least an RMS of 1/16 (these problems' values
// are of order 1): results that are 0 in exact arithmetic (the gradient of a bias constant along
// each row: softmax ignores it) or nearly so (a few cancelling terms in a tiny problem) are held
// to an absolute bound instead.
double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size(); ++i) num += (got[i] - want[i]) * (got[i] - want[i]), den += want[i] * want[i];
  return std::sqrt(num / std::max(den, static_cast<double>(got.size()) / 256));
}

// Float32 copies of a float64 problem (same values, so that both see the same inputs).
Problem as_float32(const Problem& p) {
  Problem r = p;
  for (Tensor* t : {&r.q, &r.k, &r.v, &r.d_out, &r.bias})
    if (t->defined()) *t = t->to(tg::float32);
  return r;
}

struct Bounds {
  double output, gradients, fused_dbias;
};
constexpr Bounds kTiny{0.0625, 0.0625, 0.125}, kTiles{0.015625, 0.015625, 0.015625};

void check_against_float64(const Case& c, const Bounds& bounds, std::int64_t block_rows = 0) {
  const Problem p64 = make(c, tg::float64), p32 = as_float32(p64);
  const auto want = run(p64, false);
  const tg::MatmulPrecisionGuard bf16(tg::MatmulPrecision::bfloat16);
  const char* names[] = {"output", "dq", "dk", "dv", "dbias"};
  std::vector<std::vector<double>> paths[2];
  for (bool fused : {false, true}) {
    paths[fused] = run(p32, fused, block_rows);
    for (std::size_t r = 0; r < want.size(); ++r) {
      for (double x : paths[fused][r]) BOOST_TEST_REQUIRE(std::isfinite(x), (fused ? "fused " : "weights ") << names[r] << " not finite");
      const double err = relative_error(paths[fused][r], want[r]);
      const double bound = r == 0 ? bounds.output : fused && r == 4 ? bounds.fused_dbias : bounds.gradients;
      BOOST_TEST_MESSAGE((fused ? "fused path " : "weights path ") << names[r] << ": relative error " << err);
      BOOST_TEST(err <= bound, (fused ? "fused path " : "weights path ") << names[r] << ": relative error " << err);
    }
  }
  for (std::size_t r = 0; r < want.size(); ++r) {
    const double err = relative_error(paths[1][r], paths[0][r]);
    const double bound = r == 0 ? bounds.output : r == 4 ? bounds.fused_dbias : bounds.gradients;
    BOOST_TEST(err <= bound, "fused against weights path, " << names[r] << ": " << err);
  }
}

BOOST_DATA_TEST_CASE(both_paths_against_float64, bdata::make(grid()), c) {
  BOOST_TEST_MESSAGE("bfloat16 native on this CPU: " << tg::bfloat16_native());
  check_against_float64(c, kTiny);
}

BOOST_AUTO_TEST_CASE(several_tiles_causal_and_padding_masks) {
  // Several 128-wide tiles, causal with key padding (and NaN in the padded keys' k and v), a
  // pair mask, a bias; on one and two threads.
  for (const Case& c : {Case{1, 2, 300, 421, 16, 8, true, true, false, true, 37, 2, true, 7},
                        Case{2, 2, 260, 260, 32, 32, true, false, false, true, 0, 0, true, 8},
                        Case{1, 3, 129, 257, 24, 16, false, true, true, false, 0, 1, false, 9}})
    for (int threads : {1, 2}) {
      const int before = tg::num_threads();
      tg::set_num_threads(threads);
      BOOST_TEST_CONTEXT(c << " threads " << threads) { check_against_float64(c, kTiles); }
      tg::set_num_threads(before);
    }
}

BOOST_AUTO_TEST_CASE(masked_weights_are_exactly_zero) {
  const Case c{2, 2, 150, 140, 16, 8, true, true, true, true, 2, 1, false, 21};
  const Problem p = as_float32(make(c, tg::float64));
  const tg::MatmulPrecisionGuard bf16(tg::MatmulPrecision::bfloat16);
  tg::AttentionMasking mask;
  mask.mask = p.combined;
  const auto r = tg::detail::attention_core({"attention", p.q, p.k, p.v, p.bias, true}, mask);
  const auto w = values(r.weights);
  const auto allowed = p.combined.to_vector<bool>();
  const auto per_head = static_cast<std::size_t>(c.q * c.k);
  std::size_t zeros = 0;
  for (std::size_t n = 0; n < w.size(); ++n) {
    const std::size_t b = n / (per_head * static_cast<std::size_t>(c.h)), pair = n % per_head;
    if (!allowed[b * per_head + pair]) {
      BOOST_TEST(w[n] == 0.0);
      ++zeros;
    }
  }
  BOOST_TEST(zeros > 0u);
}

// NaN or inf in the k and v rows of keys the key mask removes, in the q rows of queries that
// attend to nothing, and in their dO rows: every output and gradient is bitwise what zeros there
// give, on both paths, as in float32.
BOOST_AUTO_TEST_CASE(poison_in_masked_rows_changes_nothing_bitwise) {
  const Case c{2, 2, 140, 150, 16, 8, true, true, false, true, 5, 2, false, 31};
  const Problem clean = as_float32(make(c, tg::float64));
  const tg::MatmulPrecisionGuard bf16(tg::MatmulPrecision::bfloat16);
  auto with = [&](double x) { return poisoned(clean, c, x); };
  for (bool fused : {false, true}) {
    const auto zeroed = run(with(0.0), fused);
    for (double x : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()}) {
      const auto poisoned = run(with(x), fused);
      for (std::size_t r = 0; r < zeroed.size(); ++r)
        BOOST_TEST((poisoned[r] == zeroed[r]), (fused ? "fused" : "weights") << " path, poison " << x << ", result " << r);
    }
  }
}

// A NaN in an allowed key's k reaches the rows that attend to it, as in float32: NaN where
// float32 gives NaN, finite where it is finite.
BOOST_AUTO_TEST_CASE(poison_in_allowed_rows_reaches_the_same_outputs) {
  const Case c{1, 1, 130, 140, 8, 8, false, false, false, true, 0, 0, false, 41};
  Problem p = as_float32(make(c, tg::float64));
  std::vector<double> k = values(p.k);
  k[static_cast<std::size_t>(70 * c.d + 3)] = std::numeric_limits<double>::quiet_NaN();  // key 70: queries 70 and on see it
  p.k = tg::from_vector(k, p.k.shape()).to(tg::float32);
  for (bool fused : {false, true}) {
    const auto exact = run(p, fused);
    const tg::MatmulPrecisionGuard bf16(tg::MatmulPrecision::bfloat16);
    const auto rounded = run(p, fused);
    for (std::size_t r = 0; r < exact.size(); ++r)
      for (std::size_t n = 0; n < exact[r].size(); ++n)
        BOOST_TEST(std::isnan(rounded[r][n]) == std::isnan(exact[r][n]), (fused ? "fused" : "weights") << " result " << r << "[" << n << "]");
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(nan_rows)

// A NaN key makes every row that may see it NaN, but only at the keys that row allows: keys no
// query may see (130-139 under the causal mask) keep exactly zero gradients on every path. The
// tiles once rebuilt such a row's P as NaN at its masked keys too.
BOOST_AUTO_TEST_CASE(a_nan_row_leaves_the_keys_it_may_not_see_at_zero) {
  for (auto dtype : {tg::float64, tg::float32}) {
    const Case c{1, 1, 130, 140, 8, 8, false, false, false, true, 0, 0, false, 43};
    Problem p = make(c, tg::float64);
    std::vector<double> k = values(p.k);
    k[static_cast<std::size_t>(70 * c.d + 3)] = std::numeric_limits<double>::quiet_NaN();
    p.k = tg::from_vector(k, p.k.shape());
    if (dtype == tg::float32) p = bfloat16_core::as_float32(p);
    const auto weights = run(p, false);
    std::vector<std::int64_t> block_rows{0};
    if (dtype == tg::float32) block_rows.push_back(16);
    for (const std::int64_t rows : block_rows)
      for (const bool bf16 : {false, dtype == tg::float32}) {
        const tg::MatmulPrecisionGuard precision(bf16 ? tg::MatmulPrecision::bfloat16 : tg::MatmulPrecision::exact);
        const auto fused = run(p, true, rows);
        const std::string path = std::string(rows == 0 ? "tiles" : "fused blocks") + (bf16 ? " bf16 " : " ");
        for (std::size_t r = 0; r < fused.size(); ++r)
          for (std::size_t n = 0; n < fused[r].size(); ++n)
            BOOST_TEST(std::isnan(fused[r][n]) == std::isnan(weights[r][n]), path << dtype << " result " << r << "[" << n << "]");
        for (std::size_t r : {2u, 3u})  // dk, dv
          for (std::size_t n = 130 * 8; n < 140 * 8; ++n) BOOST_TEST(fused[r][n] == 0.0, path << dtype << " result " << r << "[" << n << "]");
      }
  }
}

BOOST_AUTO_TEST_SUITE_END()

// The weights path in blocks of query rows (kernels/attention_blocks.cpp), which attention_core
// takes for float32 scores of 8 MiB and more, asked for here directly with small blocks so that
// small problems span many of them: against the whole-tensor weights path (attention_core on
// these small shapes), with an upstream gradient of the weights too, exact and bfloat16.
BOOST_AUTO_TEST_SUITE(pipelined_weights_path)

// Output, weights and the gradients of q, k, v (and bias), through the whole-tensor weights
// path or the blocks of block_rows rows, backward from dO and an upstream dA.
std::vector<std::vector<double>> run_weights(const Problem& p, std::int64_t block_rows) {
  Tensor q = p.q.detach().set_requires_grad(), k = p.k.detach().set_requires_grad(), v = p.v.detach().set_requires_grad();
  Tensor bias = p.bias.defined() ? p.bias.detach().set_requires_grad() : Tensor();
  const tg::detail::AttentionArgs args{"attention", q, k, v, bias, true};
  Shape scores{q.size(0), q.size(1), q.size(2), k.size(2)};
  if (v.dim() > q.dim()) scores.insert(scores.begin(), v.size(0));
  const auto r = block_rows == 0 ? tg::detail::attention_core(args, p.parts)
                                 : tg::detail::attention_core(args, p.parts, tg::detail::AttentionPath::blocks, block_rows);
  const Tensor d_weights = tg::randn(scores, 77, tg::float64).to(r.weights.dtype());
  tg::backward({r.output, r.weights}, {p.d_out, d_weights});
  std::vector<std::vector<double>> out{values(r.output), values(r.weights), values(q.grad()), values(k.grad()), values(v.grad())};
  if (bias.defined()) out.push_back(values(bias.grad()));
  tg::clear_tape();
  return out;
}

void compare_pipelined(const Problem& p, std::int64_t block_rows, double atol, double rtol, const std::string& what) {
  const auto whole = run_weights(p, 0), blocks = run_weights(p, block_rows);
  const char* names[] = {"output", "weights", "dq", "dk", "dv", "dbias"};
  for (std::size_t r = 0; r < whole.size(); ++r) {
    BOOST_TEST_REQUIRE(whole[r].size() == blocks[r].size());
    double worst = 0;
    for (std::size_t n = 0; n < whole[r].size(); ++n) {
      const double a = blocks[r][n], b = whole[r][n];
      BOOST_TEST_REQUIRE(std::isfinite(a), what << ": " << names[r] << "[" << n << "] of the blocks is " << a);
      BOOST_TEST_REQUIRE(std::isfinite(b), what << ": " << names[r] << "[" << n << "] of the whole tensors is " << b);
      if (r == 1 && b == 0) BOOST_TEST_REQUIRE(a == 0.0, what << ": masked weight " << n << " is " << a);
      worst = std::max(worst, std::abs(a - b) / (atol + rtol * std::abs(b)));
    }
    BOOST_TEST(worst <= 1.0, what << ": " << names[r] << " differs by " << worst << " tolerances");
  }
}

BOOST_DATA_TEST_CASE(small_shapes, bdata::make(grid()), c) {
  for (std::int64_t rows : {1, 2, 16}) compare_pipelined(make(c, tg::float32), rows, 2e-5, 2e-4, "float32");
}

// Many blocks (block_cases), exact and bfloat16; the results bitwise the same on one and two
// threads.
BOOST_AUTO_TEST_CASE(several_blocks_any_thread_count) {
  for (const Case& c : block_cases())
    for (bool bf16 : {false, true}) {
      const tg::MatmulPrecisionGuard precision(bf16 ? tg::MatmulPrecision::bfloat16 : tg::MatmulPrecision::exact);
      const Problem p = make(c, tg::float32);
      BOOST_TEST_CONTEXT(c << " bfloat16 " << bf16) {
        same_on_one_and_two_threads([&] {
          // bfloat16: both paths round their own intermediates (the whole path dS to bfloat16
          // only where no dbias is asked for), so they agree to bfloat16's precision only.
          if (bf16) compare_pipelined(p, 16, 3e-2, 3e-2, "bfloat16");
          else compare_pipelined(p, 16, 5e-5, 5e-4, "float32");
          return run_weights(p, 16);
        });
      }
    }
}

BOOST_AUTO_TEST_CASE(broadcast_values_and_strided_inputs) {
  const Problem p = strided_problem();
  for (bool bf16 : {false, true}) {
    const tg::MatmulPrecisionGuard precision(bf16 ? tg::MatmulPrecision::bfloat16 : tg::MatmulPrecision::exact);
    BOOST_TEST_CONTEXT("bfloat16 " << bf16) { compare_pipelined(p, 16, bf16 ? 3e-2 : 2e-5, bf16 ? 3e-2 : 2e-4, "strided"); }
  }
}

BOOST_AUTO_TEST_CASE(poison_in_masked_rows_changes_nothing_bitwise) {
  poison_changes_nothing([](const Problem& p) { return run_weights(p, 32); });
}

// q, k and v split into heads from [B, L, H, D] tensors, as the layer's projections give them:
// the blocks (both paths) lay their output out [B, Q, H, Dv] too, so that merging the heads is
// a view, with the values of the whole-tensor path's row-major output.
BOOST_AUTO_TEST_CASE(head_split_inputs_give_a_head_interleaved_output) {
  Problem p;
  p.q = tg::transpose(tg::randn({2, 40, 3, 8}, 61), 1, 2);
  p.k = tg::transpose(tg::randn({2, 33, 3, 8}, 62), 1, 2);
  p.v = tg::transpose(tg::randn({2, 33, 3, 5}, 63), 1, 2);
  p.d_out = tg::transpose(tg::randn({2, 40, 3, 5}, 64), 1, 2);
  p.parts.causal = true;
  p.parts.causal_offset = -3;
  compare_pipelined(p, 16, 2e-5, 2e-4, "weights path, head split");
  compare(p, 2e-5, 2e-4, "fused path, head split", 16);
  for (bool weights : {true, false}) {
    const tg::detail::AttentionArgs args{"attention", p.q, p.k, p.v, Tensor(), weights};
    const auto r = tg::detail::attention_core(args, p.parts, weights ? tg::detail::AttentionPath::blocks : tg::detail::AttentionPath::fused_blocks, 16);
    BOOST_TEST(r.output.strides() == (Shape{40 * 3 * 5, 5, 3 * 5, 1}), "need_weights " << weights);
    const Tensor merged = tg::reshape(tg::permute(r.output, {0, 2, 1, 3}), {80, 15});
    BOOST_TEST(merged.raw_data() == r.output.raw_data(), "need_weights " << weights << ": the merge copied");
  }
}

BOOST_AUTO_TEST_SUITE_END()

// The fused path on the weights path's blocks (attention_pipelined with need_weights false),
// which attention_core takes for float32 scores of 8 MiB and more, asked for here with small
// blocks so that small problems span many: the fused path's checks on it.
BOOST_AUTO_TEST_SUITE(fused_path_in_blocks)

BOOST_DATA_TEST_CASE(small_shapes, bdata::make(grid()), c) {
  Problem p = make(c, tg::float32);
  for (std::int64_t rows : {1, 2, 16}) compare(p, 2e-5, 2e-4, "float32 blocks", rows);
  // A constant bias (what attention_core sends to the blocks): Δ = rowsum(dO O) then
  p.bias_grad = false;
  if (p.bias.defined())
    for (std::int64_t rows : {1, 16}) compare(p, 2e-5, 2e-4, "float32 blocks, constant bias", rows);
  bfloat16_core::check_against_float64(c, bfloat16_core::kTiny, 2);
}

// The blocks are float32: float64 central differences of the float32 function (inputs rounded
// to float32 on the way in, the output widened on the way out), with eps and tolerances wide
// enough for float32 rounding (|L| ~ 10, 2^-24 |L| / eps ~ 1e-5) and the O(eps^2) truncation.
BOOST_DATA_TEST_CASE(float64_finite_differences_of_float32, bdata::make(gradcheck_fused::gradcheck_grid()), c) {
  const Problem p = make(c, tg::float64);
  std::vector<Tensor> xs{p.q, p.k, p.v};
  if (p.bias.defined()) xs.push_back(p.bias);
  for (auto& x : xs) x = x.detach().set_requires_grad();
  BOOST_TEST_CONTEXT(c) {
    for (std::int64_t rows : {1, 2}) {
      const auto r = tg::gradcheck([&](const std::vector<Tensor>& in) {
        const Tensor bias = in.size() > 3 ? in[3].to(tg::float32) : Tensor();
        const Tensor out = fused_blocks(in[0].to(tg::float32), in[1].to(tg::float32), in[2].to(tg::float32), bias, p.parts, rows).output;
        return std::vector<Tensor>{out.to(tg::float64)};
      }, xs, {.eps = 1e-2, .atol = 2e-3, .rtol = 2e-2});
      BOOST_TEST(r.ok, "rows " << rows << ": " << r.report());
    }
  }
  tg::clear_tape();
}

// Many blocks (block_cases), exact and bfloat16 (against float64, as the tiles); the results
// bitwise the same on one and two threads.
BOOST_AUTO_TEST_CASE(several_blocks_any_thread_count) {
  for (const Case& c : block_cases())
    for (bool bf16 : {false, true}) {
      const Problem p = make(c, tg::float32);
      BOOST_TEST_CONTEXT(c << " bfloat16 " << bf16) {
        same_on_one_and_two_threads([&] {
          if (bf16) bfloat16_core::check_against_float64(c, bfloat16_core::kTiles, 16);
          else compare(p, 5e-5, 5e-4, "float32 blocks", 16);
          const tg::MatmulPrecisionGuard precision(bf16 ? tg::MatmulPrecision::bfloat16 : tg::MatmulPrecision::exact);
          return run(p, true, 16);
        });
      }
    }
}

// 8 MiB of float32 scores: attention_core itself takes the blocks (both paths, their own sizes),
// without a bias and with a constant one.
BOOST_AUTO_TEST_CASE(large_scores_through_attention_core) {
  for (const Case& c : {Case{1, 2, 1024, 1024, 16, 8, true, false, false, true, 0, 0, true, 12},
                        Case{1, 2, 1024, 1024, 16, 8, true, true, false, true, 3, 2, false, 13}}) {
    Problem p = make(c, tg::float32);
    p.bias_grad = false;
    for (int threads : {1, 2}) {
      const int before = tg::num_threads();
      tg::set_num_threads(threads);
      BOOST_TEST_CONTEXT(c << " threads " << threads) { compare(p, 5e-5, 5e-4, "float32, 8 MiB of scores"); }
      tg::set_num_threads(before);
    }
  }
}

BOOST_AUTO_TEST_CASE(empty_rows_are_exactly_zero_with_zero_gradient) {
  // As the tiles' test: query 1 attends to nothing (query mask); query 2's only allowed scores
  // are -inf (bias). Blocks of 1 and 2 rows.
  const double inf = std::numeric_limits<double>::infinity();
  for (std::int64_t rows : {1, 2}) {
    Tensor q = tg::randn({1, 1, 3, 2}, 3).set_requires_grad();
    Tensor k = tg::randn({1, 1, 4, 2}, 4).set_requires_grad();
    Tensor v = tg::randn({1, 1, 4, 3}, 5).set_requires_grad();
    Tensor bias = tg::tensor({{0, 0, 0, 0}, {0, 0, 0, 0}, {-inf, -inf, 0, 0}}).set_requires_grad();
    tg::AttentionMasking mask;
    mask.query_mask = tg::from_bools({true, false, true}, {1, 3});
    mask.key_mask = tg::from_bools({true, true, false, true}, {1, 4});
    mask.causal = true;
    mask.causal_offset = 0;
    const Tensor out = fused_blocks(q, k, v, bias, mask, rows).output;
    tg::backward({out}, {tg::ones_like(out)});
    const auto o = values(out), gq = values(q.grad());
    for (std::size_t n = 0; n < 9; ++n) BOOST_TEST(o[n] == (n < 3 ? o[n] : 0.0));
    BOOST_TEST(o[0] != 0.0);
    for (std::size_t n = 2; n < 6; ++n) BOOST_TEST(gq[n] == 0.0);
    for (double x : values(bias.grad())) BOOST_TEST(std::isfinite(x));
    tg::clear_tape();
  }
}

BOOST_AUTO_TEST_CASE(broadcast_values_and_strided_inputs) {
  const Problem p = strided_problem();
  for (bool bf16 : {false, true}) {
    const tg::MatmulPrecisionGuard precision(bf16 ? tg::MatmulPrecision::bfloat16 : tg::MatmulPrecision::exact);
    BOOST_TEST_CONTEXT("bfloat16 " << bf16) { compare(p, bf16 ? 3e-2 : 2e-5, bf16 ? 3e-2 : 2e-4, "strided blocks", 16); }
  }
}

BOOST_AUTO_TEST_CASE(poison_in_masked_rows_changes_nothing_bitwise) {
  poison_changes_nothing([](const Problem& p) { return run(p, true, 32); });
}

BOOST_AUTO_TEST_SUITE_END()
