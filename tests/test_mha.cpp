// multihead_attention (docs/semantics.md §6), the MultiHeadAttention layer and its KV cache
// (docs/semantics.md §7).
#define BOOST_TEST_MODULE multihead_attention
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <algorithm>
#include <limits>

#include "ops/multihead_projections.hpp"
#include "mha_support.hpp"

namespace tg = tapegrad;
namespace bdata = boost::unit_test::data;
using namespace tg_test;
using tg::Shape;
using tg::Tensor;

namespace {
std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }
// x w (+ b), and [B, L, H*W] -> [B, H, L, W]: the projections' steps as separate ops.
Tensor project(const Tensor& x, const Tensor& w, const Tensor& b) { return b.defined() ? tg::matmul(x, w) + b : tg::matmul(x, w); }
Tensor split_heads(const Tensor& x, std::int64_t heads) {
  return tg::permute(tg::reshape(x, {x.size(0), x.size(1), heads, x.size(2) / heads}), {0, 2, 1, 3});
}
}  // namespace

BOOST_AUTO_TEST_SUITE(worked_example)

BOOST_AUTO_TEST_CASE(two_heads_with_every_mask) {
  const tg::MhaActivations act{.query = tg::tensor({{{1, 1}, {1, 1}}}),
                               .context = tg::tensor({{{0, 1, 2, 1}, {1, 0, 4, 4}, {100, 100, 99, 99}}})};
  const tg::MhaParameters par{.w_q = tg::tensor({{1, 0}, {0, 1}}),
                              .w_k = tg::tensor({{1, 0}, {0, 1}, {0, 0}, {0, 0}}),
                              .w_v = tg::tensor({{0, 0}, {0, 0}, {1, 0}, {0, 1}}),
                              .w_o = tg::tensor({{1, 2}, {3, -1}}),
                              .b_o = tg::tensor({1, 2})};
  const tg::MhaMasks masks{.key_mask = tg::mask({{true, true, false}}),
                           .query_mask = tg::mask({{true, false}}),
                           .attention_mask = tg::mask({{{true, true, true}, {true, true, true}}, {{false, true, true}, {false, true, true}}})};
  auto [out, attn] = tg::multihead_attention(act, par, masks, /*heads=*/2);
  BOOST_TEST(out.shape() == (Shape{1, 2, 2}));
  BOOST_TEST(attn.shape() == (Shape{1, 2, 2, 3}));
  const auto a = values(attn);  // [b][h][i][j]
  check_close({a[0], a[1], a[2]}, {0.268941, 0.731059, 0}, 5e-7, 0, "query 0, head 0");
  BOOST_TEST((a[6] == 0 && a[7] == 1 && a[8] == 0));  // query 0, head 1: [0, 1, 0]
  const auto o = values(out);
  check_close({o[0], o[1]}, {16.462117, 4.924234}, 5e-6, 0, "query 0 output");
  // Query 1 is masked: zero attention in both heads, output [0, 0] with b_o suppressed.
  BOOST_TEST((a[3] == 0 && a[4] == 0 && a[5] == 0 && a[9] == 0 && a[10] == 0 && a[11] == 0));
  BOOST_TEST((o[2] == 0 && o[3] == 0));
  // Head summaries [3.462117, 4]: the output before w_o and b_o.
  const Tensor summaries = tg::matmul(tg::select(tg::select(attn, 0, 0), 1, 0),
                                      tg::matmul(tg::select(act.context, 0, 0), par.w_v));  // [H, H*Dv]
  check_close({values(summaries)[0], values(summaries)[3]}, {3.462117, 4.0}, 5e-6, 0, "head summaries");
}

BOOST_AUTO_TEST_CASE(b_o_kept_for_a_query_with_one_active_head) {
  // Head 0 has no allowed key for query 0, head 1 has one: the query is active and keeps b_o.
  const tg::MhaActivations act{.query = tg::ones({1, 1, 2}, tg::float64), .context = tg::ones({1, 2, 2}, tg::float64)};
  const tg::MhaParameters par{.w_q = tg::ones({2, 2}, tg::float64), .w_k = tg::ones({2, 2}, tg::float64),
                              .w_v = tg::zeros({2, 2}, tg::float64), .w_o = tg::ones({2, 3}, tg::float64),
                              .b_o = tg::tensor({7, 8, 9}, tg::float64)};
  const tg::MhaMasks m{.attention_mask = tg::mask({{{false, false}}, {{true, false}}})};  // [H=2, Q=1, K=2]
  BOOST_TEST(values(tg::multihead_attention(act, par, m, 2).output) == (std::vector<double>{7, 8, 9}));
  const tg::MhaMasks none{.attention_mask = tg::mask({{{false, false}}, {{false, false}}})};
  BOOST_TEST(values(tg::multihead_attention(act, par, none, 2).output) == (std::vector<double>{0, 0, 0}));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(gradients)

struct GridCase {
  std::uint64_t seed;
  MaskKind masks;
  BiasKind bias;
  bool biases, non_contiguous, need_weights;
};
std::ostream& operator<<(std::ostream& os, const GridCase& c) {
  return os << "seed " << c.seed << " masks " << int(c.masks) << " bias " << int(c.bias) << " biases " << c.biases << " nc "
            << c.non_contiguous << " need_weights " << c.need_weights;
}

std::vector<GridCase> grid() {
  std::vector<GridCase> cases;
  const MaskKind masks[] = {MaskKind::none, MaskKind::random, MaskKind::empty_row, MaskKind::empty_query, MaskKind::empty_batch};
  const BiasKind biases[] = {BiasKind::none, BiasKind::full, BiasKind::heads_keys, BiasKind::queries_keys};
  for (bool need_weights : {true, false})  // the weights path and the fused one
    for (std::uint64_t s = 0; s < 40; ++s)
      cases.push_back({100 + s, masks[s % 5], biases[(s / 5) % 4], s % 3 != 0, s % 4 == 1, need_weights});
  return cases;
}

BOOST_DATA_TEST_CASE(gradcheck_every_input_and_parameter, bdata::make(grid()), c) {
  MhaProblem p = make_problem(c.seed, tg::float64, c.masks, c.bias, c.biases, c.non_contiguous);
  p.need_weights = c.need_weights;
  std::vector<Tensor> xs = p.inputs();
  for (auto& x : xs) x = x.detach().set_requires_grad();
  BOOST_TEST_CONTEXT("B=" << p.b << " Q=" << p.q << " K=" << p.k << " H=" << p.h << " D=" << p.d << " Dv=" << p.dv << " causal="
                          << p.causal << " offset=" << p.offset) {
    const auto r = tg::gradcheck([&](const std::vector<Tensor>& in) {
      auto [out, attn] = p.run(in);
      return attn.defined() ? std::vector<Tensor>{out, attn} : std::vector<Tensor>{out};
    }, xs);
    BOOST_TEST(r.ok, r.report());
  }
  tg::clear_tape();
}

// The two projection nodes alone (ops/multihead_attention_projections.cpp), against float64 central
// differences and against the same steps as separate ops, on contiguous and strided inputs
// (a transposed x, w and w_o, a strided bias, the head outputs in any layout).
struct ProjectionCase {
  std::int64_t b, l, c, heads, width, cout;
  bool biases, strided;
};
std::ostream& operator<<(std::ostream& os, const ProjectionCase& c) {
  return os << "B " << c.b << " L " << c.l << " C " << c.c << " H " << c.heads << " W " << c.width << " Cout " << c.cout
            << " biases " << c.biases << " strided " << c.strided;
}

std::vector<ProjectionCase> projection_cases() {
  std::vector<ProjectionCase> cases;
  for (bool strided : {false, true})
    for (bool biases : {false, true}) {
      cases.push_back({2, 3, 4, 2, 3, 5, biases, strided});
      cases.push_back({1, 1, 1, 1, 1, 1, biases, strided});
      cases.push_back({3, 2, 5, 3, 2, 2, biases, strided});
    }
  return cases;
}

// A float64 tensor of `shape` whose last two dims are stored transposed when `strided`
// (1-D: every other element of a longer tensor).
Tensor operand(const Shape& shape, std::uint64_t seed, bool strided) {
  if (!strided) return tg::randn(shape, seed, tg::float64);
  if (shape.size() == 1) return tg::select(tg::randn({shape[0], 2}, seed, tg::float64), 1, 1);
  Shape t = shape;
  std::swap(t[t.size() - 1], t[t.size() - 2]);
  return tg::transpose(tg::randn(t, seed, tg::float64), -1, -2);
}

BOOST_DATA_TEST_CASE(projection_nodes_gradcheck, bdata::make(projection_cases()), c) {
  const std::int64_t n = c.heads * c.width;
  std::vector<Tensor> xs{operand({c.b, c.l, c.c}, 1, c.strided), operand({c.c, n}, 2, c.strided),
                         operand({n, c.cout}, 3, c.strided)};
  if (c.biases) {
    xs.push_back(operand({n}, 4, c.strided));
    xs.push_back(operand({c.cout}, 5, c.strided));
  }
  if (c.l > 1 && c.c > 1) BOOST_TEST(xs[0].is_contiguous() == !c.strided);
  for (auto& x : xs) x = x.detach().set_requires_grad();
  auto run = [&](const std::vector<Tensor>& in) {
    const Tensor b = c.biases ? in[3] : Tensor(), b_o = c.biases ? in[4] : Tensor();
    const Tensor heads = tg::detail::project_heads("test", in[0], in[1], b, c.heads);
    // The output projection also gets the heads as a contiguous [B, H, L, W] tensor (the
    // attention core's layout), not only the projection's strided view.
    const Tensor o = c.strided ? tg::contiguous(heads) : heads;
    return std::vector<Tensor>{heads, tg::detail::merge_heads_project("test", o, in[2], b_o)};
  };
  const auto r = tg::gradcheck(run, xs);
  BOOST_TEST(r.ok, r.report());
  // The same steps as separate ops.
  const auto got = run(xs);
  const Tensor q = project(xs[0], xs[1], c.biases ? xs[3] : Tensor());
  const Tensor split = tg::permute(tg::reshape(q, {c.b, c.l, c.heads, c.width}), {0, 2, 1, 3});
  BOOST_TEST(got[0].shape() == (Shape{c.b, c.heads, c.l, c.width}));
  check_close(values(got[0]), values(split), 1e-12, 1e-12, "heads");
  const Tensor merged = tg::reshape(tg::permute(split, {0, 2, 1, 3}), {c.b, c.l, n});
  check_close(values(got[1]), values(project(merged, xs[2], c.biases ? xs[4] : Tensor())), 1e-12, 1e-12, "output");
  tg::clear_tape();
}

BOOST_AUTO_TEST_CASE(projection_nodes_follow_the_matmul_precision) {
  // Under bfloat16 precision both nodes' products, forward and backward, are the bfloat16
  // matmul on the [B L, C] rows (bitwise), which differs from the exact one.
  const tg::MatmulPrecision bf16 = tg::MatmulPrecision::bfloat16;
  const Tensor x = tg::randn({2, 3, 8}, 11), w = tg::randn({8, 4}, 12).set_requires_grad(), w_o = tg::randn({4, 5}, 13);
  const Tensor x2 = tg::reshape(x, {6, 8});
  const Tensor g = tg::randn({2, 2, 3, 2}, 14);
  Tensor heads, out;
  {
    const tg::MatmulPrecisionGuard guard(bf16);
    heads = tg::detail::project_heads("test", x, w, Tensor(), 2);
    out = tg::detail::merge_heads_project("test", tg::contiguous(heads.detach()), w_o, Tensor());
    tg::backward({heads}, {g});
  }
  const Tensor split = split_heads(tg::reshape(tg::matmul(x2, w.detach(), bf16), {2, 3, 4}), 2);
  BOOST_TEST(values(heads) == values(split));
  BOOST_TEST(values(heads) != values(split_heads(tg::matmul(x, w.detach()), 2)));
  const Tensor merged = tg::reshape(tg::permute(split, {0, 2, 1, 3}), {6, 4});
  BOOST_TEST(values(out) == values(tg::matmul(merged, w_o, bf16)));
  const Tensor dy = tg::reshape(tg::permute(g, {0, 2, 1, 3}), {6, 4});
  BOOST_TEST(values(w.grad()) == values(tg::matmul(tg::transpose(x2, 0, 1), dy, bf16)));
  tg::clear_tape();
}

// A plain list, not bdata::xrange: GCC 12 warns (maybe-uninitialized) inside xrange under ASan.
std::vector<int> first(int n) {
  std::vector<int> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  return v;
}

BOOST_DATA_TEST_CASE(scaled_dot_product_attention_gradcheck, bdata::make(first(24)), i) {
  tg::Generator gen(500 + static_cast<std::uint64_t>(i));
  auto pick = [&](std::int64_t lo, std::int64_t hi) { return lo + static_cast<std::int64_t>(gen.next_u64() % static_cast<std::uint64_t>(hi - lo + 1)); };
  const std::int64_t b = pick(1, 3), q = pick(1, 6), k = pick(1, 6), d = pick(1, 4), dv = pick(1, 4);
  // Leading dims broadcast: k and v share one batch entry for odd cases.
  Tensor tq = tg::randn({b, q, d}, gen, tg::float64).set_requires_grad();
  Tensor tk = tg::randn({i % 2 ? 1 : b, k, d}, gen, tg::float64).set_requires_grad();
  Tensor tv = (i % 3 == 0 ? tg::transpose(tg::randn({b, dv, k}, gen, tg::float64), 1, 2) : tg::randn({b, k, dv}, gen, tg::float64))
                  .set_requires_grad();
  std::vector<bool> m;
  for (std::int64_t n = 0; n < q * k; ++n) m.push_back(gen.uniform() < 0.7);
  const Tensor mask = i % 4 == 0 ? Tensor() : i % 4 == 1 ? tg::causal_mask(q, k, pick(-3, 4)) : tg::from_bools(m, {q, k});
  const auto r = tg::gradcheck([&](const std::vector<Tensor>& in) {
    auto [out, w] = tg::scaled_dot_product_attention(in[0], in[1], in[2], mask);
    return std::vector<Tensor>{out, w};
  }, {tq, tk, tv});
  BOOST_TEST(r.ok, r.report());
  // The fused path: attention() returns the output alone.
  const auto fused = tg::gradcheck([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{tg::attention(in[0], in[1], in[2], mask)}; },
                                   {tq, tk, tv});
  BOOST_TEST(fused.ok, fused.report());
  tg::clear_tape();
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(exactness)

BOOST_AUTO_TEST_CASE(masked_and_future_positions_do_not_matter_bitwise) {
  // For each query i: raise the context by 1000 at every key that is masked for all queries or in
  // i's future (j > i + offset); query i's output and attention must not change by one bit.
  for (auto dtype : {tg::float32, tg::float64}) {
    for (std::uint64_t seed : {1u, 2u, 3u, 4u, 5u, 6u, 11u, 12u, 13u, 14u, 15u, 16u}) {
      MhaProblem p = make_problem(seed % 10, dtype, MaskKind::random, BiasKind::none, true, false);
      p.need_weights = seed < 10;  // the second six run fused
      p.causal = true;
      p.masks.attention_mask = Tensor();
      auto [out, attn] = p.run(p.inputs());
      const auto km = p.masks.key_mask.to_vector<bool>();
      for (std::int64_t i = 0; i < p.q; ++i) {
        std::vector<double> bump(static_cast<std::size_t>(p.b * p.k), 0.0);
        bool any = false;
        for (std::int64_t b = 0; b < p.b; ++b)
          for (std::int64_t j = 0; j < p.k; ++j)
            if (!km[static_cast<std::size_t>(b * p.k + j)] || j > i + p.offset) bump[static_cast<std::size_t>(b * p.k + j)] = 1000, any = true;
        if (!any) continue;
        MhaProblem raised = p;
        raised.act.context = p.act.context + tg::from_vector(bump, {p.b, p.k, 1}).to(dtype);
        auto [out2, attn2] = raised.run(raised.inputs());
        BOOST_TEST(values(tg::select(out, 1, i)) == values(tg::select(out2, 1, i)));
        if (p.need_weights) BOOST_TEST(values(tg::select(attn, 2, i)) == values(tg::select(attn2, 2, i)));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(masked_weights_and_their_gradients_are_exactly_zero) {
  MhaProblem p = make_problem(7, tg::float64, MaskKind::empty_query, BiasKind::full, true, false);
  std::vector<Tensor> xs = p.inputs();
  for (auto& x : xs) x = x.detach().set_requires_grad();
  auto [out, attn] = p.run(xs);
  tg::backward({out, attn}, {tg::ones_like(out), tg::ones_like(attn)});
  // The bias gradient is dS: zero wherever the weight is (masked or empty).
  const auto a = values(attn), gb = values(xs[2].grad());
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] == 0) BOOST_TEST(gb[i] == 0);
  for (double g : gb) BOOST_TEST(std::isfinite(g));
  // Query 0 of batch 0 is masked: its output row is exactly zero.
  for (std::int64_t c = 0; c < p.cout; ++c) BOOST_TEST(values(out)[static_cast<std::size_t>(c)] == 0);
  tg::clear_tape();
  // The fused path: the same zeros in the bias gradient and the output.
  p.need_weights = false;
  for (auto& x : xs) x = x.detach().set_requires_grad();
  const Tensor fused = p.run(xs).output;
  tg::backward({fused}, {tg::ones_like(fused)});
  const auto gf = values(xs[2].grad());
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] == 0) BOOST_TEST(gf[i] == 0);
  for (double g : gf) BOOST_TEST(std::isfinite(g));
  for (std::int64_t c = 0; c < p.cout; ++c) BOOST_TEST(values(fused)[static_cast<std::size_t>(c)] == 0);
  tg::clear_tape();
}

BOOST_AUTO_TEST_CASE(float32_agrees_with_float64) {
  for (std::uint64_t seed = 20; seed < 30; ++seed) {
    const MhaProblem p64 = make_problem(seed, tg::float64, MaskKind::random, BiasKind::heads_keys, true, false);
    const MhaProblem p32 = make_problem(seed, tg::float32, MaskKind::random, BiasKind::heads_keys, true, false);
    auto [o64, a64] = p64.run(p64.inputs());
    auto [o32, a32] = p32.run(p32.inputs());
    BOOST_TEST(o32.dtype() == tg::float32);
    check_close(values(o32), values(o64), 1e-4, 1e-4, "output");
    check_close(values(a32), values(a64), 1e-5, 1e-4, "attention");
    MhaProblem fused = p32;  // the fused path in float32
    fused.need_weights = false;
    check_close(values(fused.run(fused.inputs()).output), values(o64), 1e-4, 1e-4, "fused output");
  }
}

// Relative error in the 2-norm: ||got - want|| / ||want||.
double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size(); ++i) num += (got[i] - want[i]) * (got[i] - want[i]), den += want[i] * want[i];
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);  // all-zero want: the absolute error
}

// Under MatmulPrecisionGuard(bfloat16) every product rounds its operands to 8 significant bits
// (2^-9 relative each); over the chain of five products the output's relative error (2-norm)
// stays within 2^-6 (measured: at most 0.6%), and masked weights stay exactly 0. (Elementwise bounds do
// not fit: an output element can be a small difference of large terms.)
BOOST_AUTO_TEST_CASE(bfloat16_products_agree_with_float64_and_keep_exact_zeros) {
  for (std::uint64_t seed = 20; seed < 30; ++seed) {
    const MhaProblem p64 = make_problem(seed, tg::float64, MaskKind::random, BiasKind::heads_keys, true, false);
    MhaProblem p32 = make_problem(seed, tg::float32, MaskKind::random, BiasKind::heads_keys, true, false);
    auto [o64, a64] = p64.run(p64.inputs());
    const tg::MatmulPrecisionGuard bf16(tg::MatmulPrecision::bfloat16);
    for (bool weights : {true, false}) {
      p32.need_weights = weights;
      auto [o, a] = p32.run(p32.inputs());
      const double err = relative_error(values(o), values(o64));
      BOOST_TEST_MESSAGE("seed " << seed << (weights ? " weights path" : " fused path") << ": relative error " << err);
      BOOST_TEST(err <= std::ldexp(1.0, -6), (weights ? "bfloat16 output" : "bfloat16 fused output") << " seed " << seed << ": " << err);
      if (!weights) continue;
      const auto got = values(a), want = values(a64);
      BOOST_TEST(relative_error(got, want) <= std::ldexp(1.0, -6), "bfloat16 attention, seed " << seed);
      for (std::size_t i = 0; i < got.size(); ++i)
        if (want[i] == 0) BOOST_TEST(got[i] == 0);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(non_finite_masked_entries)

// A query with no allowed key, a key no query may attend to and a masked bias entry take no
// part in multi-head attention: a NaN or an infinity there must change no output and no
// gradient. Each run poisons them and compares (== on every value) with the run where they are 0.
const double kPoisons[] = {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity()};

// Which pairs may attend ([B, H, Q, K]), which queries are active ([B, Q]) and which keys are
// attended by some query ([B, K]), from the problem's masks, computed here with plain loops.
struct Participation {
  std::vector<bool> allowed, active, used;
};

Participation participation(const MhaProblem& p) {
  Participation r{std::vector<bool>(static_cast<std::size_t>(p.b * p.h * p.q * p.k)), std::vector<bool>(static_cast<std::size_t>(p.b * p.q)),
                  std::vector<bool>(static_cast<std::size_t>(p.b * p.k))};
  const auto km = p.masks.key_mask.defined() ? p.masks.key_mask.to_vector<bool>() : std::vector<bool>(r.used.size(), true);
  const auto qm = p.masks.query_mask.defined() ? p.masks.query_mask.to_vector<bool>() : std::vector<bool>(r.active.size(), true);
  const auto am = p.masks.attention_mask.defined() ? p.masks.attention_mask.to_vector<bool>() : std::vector<bool>(r.allowed.size(), true);
  for (std::int64_t b = 0; b < p.b; ++b)
    for (std::int64_t h = 0; h < p.h; ++h)
      for (std::int64_t i = 0; i < p.q; ++i)
        for (std::int64_t j = 0; j < p.k; ++j) {
          const auto n = static_cast<std::size_t>(((b * p.h + h) * p.q + i) * p.k + j);
          const bool on = km[static_cast<std::size_t>(b * p.k + j)] && qm[static_cast<std::size_t>(b * p.q + i)] && am[n] &&
                          (!p.causal || j <= i + p.offset);
          r.allowed[n] = on;
          if (on) r.active[static_cast<std::size_t>(b * p.q + i)] = r.used[static_cast<std::size_t>(b * p.k + j)] = true;
        }
  return r;
}

// x with the elements whose row (the index over all but the last dim, or every element when
// per_element) is flagged set to `value`.
Tensor poison(const Tensor& x, const std::vector<bool>& flagged, bool per_element, double value) {
  std::vector<double> v = values(x);
  const std::size_t width = per_element ? 1 : static_cast<std::size_t>(x.shape().back());
  for (std::size_t n = 0; n < v.size(); ++n)
    if (flagged[n / width]) v[n] = value;
  return tg::from_vector(v, x.shape()).to(x.dtype());
}

std::vector<bool> negate(std::vector<bool> v) {
  v.flip();
  return v;
}

// Output, attention and the gradient of every input, with the given upstream gradients.
std::vector<std::vector<double>> run_with_gradients(const MhaProblem& p, std::vector<Tensor> xs, const Tensor& d_out, const Tensor& d_attn) {
  for (auto& x : xs) x = x.detach().set_requires_grad();
  auto [out, attn] = p.run(xs);
  if (attn.defined()) tg::backward({out, attn}, {d_out, d_attn});
  else tg::backward({out}, {d_out});
  std::vector<std::vector<double>> r{values(out)};
  if (attn.defined()) r.push_back(values(attn));
  for (const auto& x : xs) r.push_back(values(x.grad()));
  tg::clear_tape();
  return r;
}

void check_same(const std::vector<std::vector<double>>& poisoned, const std::vector<std::vector<double>>& zeroed, const std::string& what) {
  BOOST_REQUIRE_EQUAL(poisoned.size(), zeroed.size());
  for (std::size_t i = 0; i < poisoned.size(); ++i) {
    const std::string name = i == 0 ? "output" : fmt::format("result {} (attention if returned, then the inputs' gradients)", i);
    for (double x : poisoned[i]) BOOST_TEST_REQUIRE(std::isfinite(x), what << ": " << name << " is not finite");
    BOOST_TEST((poisoned[i] == zeroed[i]), what << ": " << name << " differs from the zeroed run");
  }
}

BOOST_AUTO_TEST_CASE(inactive_queries_unattended_keys_and_masked_bias_change_nothing) {
  // float32 runs twice: exact products, then bfloat16 ones (the precision of the layers' products).
  for (auto [dtype, precision] : {std::pair{tg::float32, tg::MatmulPrecision::exact}, std::pair{tg::float32, tg::MatmulPrecision::bfloat16},
                                  std::pair{tg::float64, tg::MatmulPrecision::exact}}) {
    const tg::MatmulPrecisionGuard products(precision);
    for (std::uint64_t seed = 60; seed < 84; ++seed) {  // 72 and on: the fused path
      MhaProblem p = make_problem(seed, dtype, seed % 2 ? MaskKind::empty_query : MaskKind::empty_batch, BiasKind::full, true, seed % 3 == 0);
      p.need_weights = seed < 72;
      // One more padding key in the last batch entry and, when causal, a future a query may not see.
      std::vector<bool> km = p.masks.key_mask.to_vector<bool>();
      km[static_cast<std::size_t>((p.b - 1) * p.k + static_cast<std::int64_t>(seed) % p.k)] = false;
      p.masks.key_mask = tg::from_bools(km, {p.b, p.k});
      const Participation part = participation(p);
      BOOST_TEST_REQUIRE((!std::all_of(part.active.begin(), part.active.end(), [](bool x) { return x; }) &&
                          !std::all_of(part.used.begin(), part.used.end(), [](bool x) { return x; })));
      const std::vector<bool> inactive = negate(part.active), unused = negate(part.used), masked = negate(part.allowed);
      const std::vector<Tensor> xs = p.inputs();  // query, context, bias, w_q, ...
      auto with = [&](double q, double c, double b) {
        std::vector<Tensor> ys = xs;
        ys[0] = poison(xs[0], inactive, false, q);
        ys[1] = poison(xs[1], unused, false, c);
        ys[2] = poison(xs[2], masked, true, b);
        return ys;
      };
      tg::Generator gen(seed);
      const Tensor d_out = tg::randn({p.b, p.q, p.cout}, gen, tg::float64).to(dtype);
      const Tensor d_attn = tg::randn({p.b, p.h, p.q, p.k}, gen, tg::float64).to(dtype);
      const auto zeroed = run_with_gradients(p, with(0, 0, 0), d_out, d_attn);
      for (double x : kPoisons) {
        const std::string what =
            fmt::format("{}{} seed {} poison {}", dtype, precision == tg::MatmulPrecision::bfloat16 ? " (bfloat16 products)" : "", seed, x);
        check_same(run_with_gradients(p, with(x, 0, 0), d_out, d_attn), zeroed, what + " in inactive queries");
        check_same(run_with_gradients(p, with(0, x, 0), d_out, d_attn), zeroed, what + " in unattended keys' context");
        check_same(run_with_gradients(p, with(0, 0, x), d_out, d_attn), zeroed, what + " in masked bias entries");
        check_same(run_with_gradients(p, with(x, -x, x), d_out, d_attn), zeroed, what + " everywhere at once");
      }
      // Step 7 stays exact: inactive queries output exactly 0 (b_o included) and b_o's gradient
      // sums the upstream gradient over active queries only.
      const auto d = values(d_out);
      std::vector<double> db_o(static_cast<std::size_t>(p.cout), 0.0);
      for (std::int64_t n = 0; n < p.b * p.q; ++n)
        for (std::int64_t c = 0; c < p.cout; ++c) {
          const auto at = static_cast<std::size_t>(n * p.cout + c);
          if (inactive[static_cast<std::size_t>(n)]) BOOST_TEST(zeroed[0][at] == 0.0);
          else db_o[static_cast<std::size_t>(c)] += d[at];
        }
      check_close(zeroed.back(), db_o, dtype == tg::float64 ? 1e-12 : 1e-5, 0, "gradient of b_o");  // a sum, no product
    }
  }
}

BOOST_AUTO_TEST_CASE(fused_path_equals_weights_path) {
  // Output and every input's gradient, need_weights false against true, over every mask and bias
  // kind (the fused path reads the masks part by part and finds the active queries and used keys
  // row by row; the weights path combines them into one tensor).
  const MaskKind masks[] = {MaskKind::none, MaskKind::random, MaskKind::empty_row, MaskKind::empty_query, MaskKind::empty_batch};
  const BiasKind biases[] = {BiasKind::none, BiasKind::full, BiasKind::heads_keys, BiasKind::queries_keys};
  for (auto dtype : {tg::float64, tg::float32}) {
    const double tol = dtype == tg::float64 ? 1e-11 : 2e-4;
    for (std::uint64_t seed = 0; seed < 60; ++seed) {
      MhaProblem p = make_problem(200 + seed, dtype, masks[seed % 5], biases[(seed / 5) % 4], seed % 2 == 0, seed % 3 == 0);
      // Rows with pairs, with a key mask only, and with neither (causal and query mask at most).
      if (seed % 3 != 0) p.masks.attention_mask = Tensor();
      if (seed % 3 == 2) p.masks.key_mask = Tensor();
      tg::Generator gen(seed);
      const Tensor d_out = tg::randn({p.b, p.q, p.cout}, gen, tg::float64).to(dtype);
      auto weights = run_with_gradients(p, p.inputs(), d_out, tg::zeros({p.b, p.h, p.q, p.k}, dtype));
      weights.erase(weights.begin() + 1);  // the attention
      p.need_weights = false;
      const auto fused = run_with_gradients(p, p.inputs(), d_out, Tensor());
      BOOST_TEST_REQUIRE(fused.size() == weights.size());
      for (std::size_t i = 0; i < fused.size(); ++i) check_close(fused[i], weights[i], tol, tol, fmt::format("{} seed {} result {}", dtype, seed, i));
    }
  }
}

// The layer: inputs, masks and upstream gradients for one forward + backward.
std::vector<std::vector<double>> run_layer(tg::MultiHeadAttention& layer, const Tensor& query0, const Tensor& context0, const tg::MhaCall& call,
                                           const Tensor& d_out) {
  Tensor query = query0.detach().set_requires_grad(), context = context0.detach().set_requires_grad();
  layer.zero_grad();
  auto r = layer.forward(query, context, call);
  tg::backward({r.output}, {d_out});
  std::vector<std::vector<double>> out{values(r.output), values(query.grad()), values(context.grad())};
  if (r.weights.defined()) out.push_back(values(r.weights));
  for (const Tensor& w : layer.parameters()) out.push_back(values(w.grad()));
  tg::clear_tape();
  return out;
}

BOOST_AUTO_TEST_CASE(layer_forward_with_padding_and_inactive_queries) {
  for (auto dtype : {tg::float32, tg::float64}) {
    tg::MultiHeadAttention layer({.query_dim = 4, .heads = 2, .context_dim = 3, .out_dim = 5, .dtype = dtype, .seed = 12});
    for (const Tensor& w : layer.parameters())  // biases too, so that b_o's suppression is visible
      tg::copy_(w, tg::randn(w.shape(), 13, tg::float64).to(dtype));
    // Batch 0: context position 4 is padding; batch 1: positions 0 and 2. Query 1 of batch 0 is padding.
    const Tensor key_mask = tg::from_bools({true, true, true, true, false, false, true, false, true, true}, {2, 5});
    const Tensor query_mask = tg::from_bools({true, false, true, true, true, true}, {2, 3});
    for (bool need_weights : {true, false}) {
      const tg::MhaCall call{.masking = {.key_mask = key_mask, .query_mask = query_mask}, .need_weights = need_weights};
      const Tensor query = tg::randn({2, 3, 4}, 14, tg::float64).to(dtype), context = tg::randn({2, 5, 3}, 15, tg::float64).to(dtype);
      const Tensor d_out = tg::randn({2, 3, 5}, 16, tg::float64).to(dtype);
      const std::vector<bool> padding_keys{false, false, false, false, true, true, false, true, false, false};
      const std::vector<bool> padding_queries{false, true, false, false, false, false};
      const auto zeroed = run_layer(layer, poison(query, padding_queries, false, 0), poison(context, padding_keys, false, 0), call, d_out);
      for (double x : kPoisons)
        check_same(run_layer(layer, poison(query, padding_queries, false, x), poison(context, padding_keys, false, -x), call, d_out), zeroed,
                   fmt::format("{} need_weights {} poison {}", dtype, need_weights, x));
    }
  }
}

BOOST_AUTO_TEST_CASE(decode_with_a_poisoned_padding_position) {
  // Self-attention decoding of 6 positions; position 2 of batch 1 is padding (a query that may
  // attend to nothing, a key no later query may attend to) and holds NaN or inf.
  for (auto dtype : {tg::float32, tg::float64}) {
    tg::MultiHeadAttention layer({.query_dim = 4, .heads = 2, .dtype = dtype, .seed = 17});
    for (const Tensor& w : layer.parameters()) tg::copy_(w, tg::randn(w.shape(), 18, tg::float64).to(dtype));
    const Tensor x = tg::randn({2, 6, 4}, 19, tg::float64).to(dtype);
    std::vector<bool> padding(12, false);
    padding[6 + 2] = true;
    for (bool need_weights : {true, false}) {
      auto decode_all = [&](const Tensor& seq) {
        tg::KVCache cache;
        std::vector<double> outs;
        for (std::int64_t t = 0; t < 6; ++t) {
          std::vector<bool> km, qm{true, t != 2};
          for (std::int64_t b = 0; b < 2; ++b)
            for (std::int64_t j = 0; j <= t; ++j) km.push_back(!padding[static_cast<std::size_t>(b * 6 + j)]);
          const tg::MhaCall call{.masking = {.key_mask = tg::from_bools(km, {2, t + 1}), .query_mask = tg::from_bools(qm, {2, 1})}, .need_weights = need_weights};
          for (double v : values(layer.decode(tg::slice(seq, 1, t, t + 1), cache, call).output)) outs.push_back(v);
        }
        return outs;
      };
      const auto zeroed = decode_all(poison(x, padding, false, 0));
      for (double p : kPoisons) {
        const auto poisoned = decode_all(poison(x, padding, false, p));
        for (double v : poisoned) BOOST_TEST_REQUIRE(std::isfinite(v));
        BOOST_TEST((poisoned == zeroed), fmt::format("{} need_weights {} poison {}", dtype, need_weights, p));
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(layer)

BOOST_AUTO_TEST_CASE(self_and_cross_attention_with_and_without_bias) {
  tg::MultiHeadAttention self({.query_dim = 8, .heads = 2, .seed = 1});
  BOOST_TEST(self.parameters().size() == 8u);
  const Tensor x = tg::randn({2, 5, 8}, 3);
  auto [y, w] = self.forward(x, {.need_weights = true});
  BOOST_TEST(y.shape() == (Shape{2, 5, 8}));
  BOOST_TEST(w.shape() == (Shape{2, 2, 5, 5}));

  tg::MultiHeadAttention cross({.query_dim = 6, .heads = 3, .context_dim = 10, .head_dim = 2, .value_head_dim = 5, .out_dim = 4,
                                .bias = false, .dtype = tg::float64, .seed = 2});
  BOOST_TEST(cross.parameters().size() == 4u);
  const Tensor q = tg::randn({2, 3, 6}, 4, tg::float64), ctx = tg::randn({2, 7, 10}, 5, tg::float64);
  auto r = cross.forward(q, ctx, {.masking = {.key_mask = tg::from_bools(std::vector<bool>(14, true), {2, 7})}});  // need_weights is off by default
  BOOST_TEST(r.output.shape() == (Shape{2, 3, 4}));
  BOOST_TEST(!r.weights.defined());
  tg::backward(tg::sum(r.output));
  for (const Tensor& p : cross.parameters()) BOOST_TEST((p.grad().defined() && tg::any(tg::ne(p.grad(), tg::zeros_like(p)))));
  tg::clear_tape();
}

BOOST_AUTO_TEST_CASE(seeded_initialisation) {
  tg::MultiHeadAttention a({.query_dim = 4, .heads = 2, .seed = 9}), b({.query_dim = 4, .heads = 2, .seed = 9}),
      c({.query_dim = 4, .heads = 2, .seed = 10});
  BOOST_TEST(values(a.weights().w_q) == values(b.weights().w_q));
  BOOST_TEST(values(a.weights().w_q) != values(c.weights().w_q));
  const double bound = std::sqrt(6.0 / 8.0);
  for (double v : values(a.weights().w_o)) BOOST_TEST(std::abs(v) <= bound);
  BOOST_TEST(values(a.weights().b_o) == std::vector<double>(4, 0.0));
  check_throws<tg::ValueError>([] { tg::MultiHeadAttention({.query_dim = 5, .heads = 2}); }, {"heads = 2", "query_dim = 5"});
  check_throws<tg::ValueError>([] { tg::MultiHeadAttention({.query_dim = 4, .heads = 0}); }, {"heads", "0"});
}

BOOST_AUTO_TEST_CASE(every_config_field_is_validated_before_use) {
  using Config = tg::MultiHeadAttentionConfig;
  constexpr std::int64_t big = std::numeric_limits<std::int64_t>::max();
  auto fails = [](const Config& c, const std::vector<std::string>& fragments) {
    check_throws<tg::ValueError>([&] { tg::MultiHeadAttention{c}; }, fragments);
  };
  // Once overflowed in the Xavier bound (then "rand: expected low <= high, got low=nan").
  fails({.query_dim = big}, {"MultiHeadAttention", "'w_q'", "[config.query_dim, config.heads * config.head_dim]",
                             fmt::format("[{}, {}]", big, big), "more than can be allocated", "head_dim = query_dim / heads"});
  // Once built a layer whose w_q was [4, 0].
  fails({.query_dim = 4, .heads = std::int64_t{1} << 33, .head_dim = std::int64_t{1} << 33},
        {"MultiHeadAttention", "config.heads * config.head_dim = 8589934592 * 8589934592 overflows"});
  fails({.query_dim = 4, .heads = std::int64_t{1} << 32, .head_dim = 1, .value_head_dim = std::int64_t{1} << 32},
        {"config.heads * config.value_head_dim = 4294967296 * 4294967296 overflows", "filled in: context_dim = query_dim"});
  // No overflow, but a weight no tensor can hold; found before anything is allocated.
  fails({.query_dim = 4, .context_dim = std::int64_t{1} << 50},
        {"'w_k'", "[config.context_dim, config.heads * config.head_dim]", "[1125899906842624, 4]", "float32"});
  fails({.query_dim = 4, .out_dim = big}, {"'w_o'", "[config.heads * config.value_head_dim, config.out_dim]"});
  fails({.query_dim = 0}, {"config.query_dim", ">= 1", "0"});
  fails({.query_dim = 4, .heads = -2}, {"config.heads", ">= 1", "-2"});
  fails({.query_dim = 4, .context_dim = -1}, {"config.context_dim", "or 0 for its default", "-1"});
  fails({.query_dim = 4, .head_dim = -2}, {"config.head_dim", "-2"});
  fails({.query_dim = 4, .value_head_dim = -3}, {"config.value_head_dim", "-3"});
  fails({.query_dim = 4, .out_dim = std::numeric_limits<std::int64_t>::min()}, {"config.out_dim", "-9223372036854775808"});
  check_throws<tg::DTypeError>([] { tg::MultiHeadAttention({.query_dim = 4, .dtype = tg::int64}); }, {"config.dtype", "int64"});
  // Every width explicit and different: each weight follows its fields.
  const tg::MultiHeadAttention ok({.query_dim = 2, .heads = 3, .head_dim = 5, .value_head_dim = 7, .out_dim = 11});
  BOOST_TEST(ok.weights().w_o.shape() == (Shape{21, 11}));
}

BOOST_AUTO_TEST_CASE(long_one_token_decoding_equals_the_full_causal_forward) {
  // One token per step runs the single-row products as plain loops (kernels/matmul_rows.cpp), on
  // cache views whose strides change as the cache grows (16, 32, 64 positions): every step's
  // output is the full forward's row within float32 rounding.
  tg::MultiHeadAttention layer({.query_dim = 32, .heads = 4, .seed = 5});
  const Tensor x = tg::randn({2, 40, 32}, 12);
  const Tensor full = layer.forward(x, {.masking = {.causal = true}}).output;
  tg::KVCache cache;
  for (std::int64_t t = 0; t < 40; ++t) {
    const Tensor out = layer.decode(tg::slice(x, 1, t, t + 1), cache).output;
    check_close(values(out), values(tg::slice(full, 1, t, t + 1)), 1e-5, 1e-5, fmt::format("step {}", t));
  }
  BOOST_TEST(cache.capacity() == 64);
}

BOOST_AUTO_TEST_CASE(kv_cache_decoding_equals_the_full_causal_forward) {
  for (auto dtype : {tg::float64, tg::float32}) {
    const double tol = dtype == tg::float64 ? 1e-12 : 1e-5;
    tg::MultiHeadAttention layer({.query_dim = 6, .heads = 2, .head_dim = 4, .value_head_dim = 3, .out_dim = 5, .dtype = dtype, .seed = 3});
    const Tensor x = tg::randn({2, 8, 6}, 11, tg::float64).to(dtype);
    auto [full, full_attn] = layer.forward(x, x, {.masking = {.causal = true}, .need_weights = true});
    for (std::int64_t chunk : {1, 3}) {
      tg::KVCache cache;
      std::vector<Tensor> outs;
      for (std::int64_t t = 0; t < 8; t += chunk) {
        const std::int64_t n = std::min<std::int64_t>(chunk, 8 - t);
        auto [o, a] = layer.decode(tg::slice(x, 1, t, t + n), cache, {.need_weights = true});
        BOOST_TEST(a.shape() == (Shape{2, 2, n, t + n}));
        // The step's weights are the full causal weights' rows, cut at the cached length.
        check_close(values(a), values(tg::slice(tg::slice(full_attn, 2, t, t + n), 3, 0, t + n)), tol, tol, "step weights");
        outs.push_back(o);
      }
      BOOST_TEST(cache.length() == 8);
      check_close(values(tg::concat(outs, 1)), values(full), tol, tol, fmt::format("chunks of {} ({})", chunk, dtype));
      // Fused decoding (need_weights off, the default) gives the same outputs.
      tg::KVCache fused_cache;
      std::vector<Tensor> fused;
      for (std::int64_t t = 0; t < 8; t += chunk) fused.push_back(layer.decode(tg::slice(x, 1, t, std::min<std::int64_t>(t + chunk, 8)), fused_cache).output);
      check_close(values(tg::concat(fused, 1)), values(full), tol, tol, fmt::format("fused, chunks of {} ({})", chunk, dtype));
    }
  }
  tg::clear_tape();
  tg::MultiHeadAttention layer({.query_dim = 4, .heads = 1, .seed = 4});
  tg::KVCache cache;
  layer.decode(tg::randn({1, 1, 4}, 1), cache);
  BOOST_TEST(tg::tape_size() == 0u);
}

BOOST_AUTO_TEST_CASE(kv_cache_is_checked_and_reusable) {
  tg::MultiHeadAttention layer({.query_dim = 4, .heads = 2, .dtype = tg::float64, .seed = 6});
  tg::KVCache cache;
  layer.decode(tg::randn({3, 2, 4}, 1, tg::float64), cache);
  // Another batch size while positions are cached: an error, not a read past the buffers.
  check_throws<tg::ShapeError>([&] { layer.decode(tg::randn({2, 1, 4}, 2, tg::float64), cache); },
                               {"MultiHeadAttention::decode", "'cache'", "[B, L, width] = [3, 2, 4]", "[2, 1, 4]", "(B = 2)"});
  tg::MultiHeadAttention wider({.query_dim = 6, .heads = 2, .dtype = tg::float64, .seed = 6});
  check_throws<tg::ShapeError>([&] { wider.decode(tg::randn({3, 1, 6}, 2, tg::float64), cache); }, {"'cache'", "another batch or layer"});
  check_throws<tg::DTypeError>([&] { layer.decode(tg::randn({3, 1, 4}, 2, tg::float32), cache); }, {"'query'", "float32", "float64"});
  // After clear() it starts over with any batch, and equals a fresh cache.
  for (std::int64_t batch : {1, 5}) {
    cache.clear();
    tg::KVCache fresh;
    const Tensor x = tg::randn({batch, 3, 4}, 3, tg::float64);
    BOOST_TEST(values(layer.decode(x, cache).output) == values(layer.decode(x, fresh).output));
  }
}

BOOST_AUTO_TEST_CASE(kv_cache_decoding_with_masks_and_bias) {
  tg::MultiHeadAttention layer({.query_dim = 4, .heads = 2, .dtype = tg::float64, .seed = 8});
  const Tensor x = tg::randn({2, 5, 4}, 4, tg::float64);
  const Tensor key_mask = tg::from_bools({true, false, true, true, true, true, true, false, true, true}, {2, 5});
  const Tensor bias = tg::randn({1, 2, 5, 5}, 5, tg::float64);
  auto [full, full_attn] = layer.forward(x, x, {.masking = {.key_mask = key_mask, .causal = true}, .bias = bias});
  tg::KVCache cache;
  std::vector<Tensor> outs;
  for (std::int64_t t = 0; t < 5; ++t) {
    tg::MhaCall call;  // (field by field: GCC 12 warns of an uninitialised slope tensor in the nested initializer)
    call.masking.key_mask = tg::slice(key_mask, 1, 0, t + 1);
    call.bias = tg::slice(tg::slice(bias, 2, t, t + 1), 3, 0, t + 1);
    outs.push_back(layer.decode(tg::slice(x, 1, t, t + 1), cache, call).output);
  }
  check_close(values(tg::concat(outs, 1)), values(full), 1e-12, 1e-12, "masked, biased decoding");
}

BOOST_AUTO_TEST_CASE(kv_cache_copies_are_deep_and_moves_leave_the_source_empty) {
  tg::MultiHeadAttention layer({.query_dim = 4, .heads = 2, .dtype = tg::float64, .seed = 9});
  const Tensor x = tg::randn({2, 8, 4}, 20, tg::float64), other = tg::randn({2, 8, 4}, 21, tg::float64);
  auto step = [&](const Tensor& seq, std::int64_t t, tg::KVCache& cache) { return values(layer.decode(tg::slice(seq, 1, t, t + 1), cache).output); };
  // What decoding x gives with a cache that is never copied.
  tg::KVCache reference;
  std::vector<std::vector<double>> expected;
  for (std::int64_t t = 0; t < 8; ++t) expected.push_back(step(x, t, reference));

  tg::KVCache original;
  for (std::int64_t t = 0; t < 3; ++t) step(x, t, original);
  tg::KVCache copy = original;  // 3 positions
  tg::KVCache assigned;
  assigned = original;
  BOOST_TEST((copy.length() == 3 && assigned.length() == 3 && copy.capacity() == original.capacity()));
  for (std::int64_t t = 3; t < 5; ++t) BOOST_TEST(step(x, t, original) == expected[static_cast<std::size_t>(t)]);
  // The copies decode other tokens at positions 3..7 (the assigned one past a growth too)...
  for (std::int64_t t = 3; t < 8; ++t) step(other, t, copy);
  for (std::int64_t t = 3; t < 20; ++t) step(other, t % 8, assigned);
  // ... and the original carries on exactly as if they did not exist.
  for (std::int64_t t = 5; t < 8; ++t) BOOST_TEST(step(x, t, original) == expected[static_cast<std::size_t>(t)]);
  // A copy continues its own sequence correctly: x[0..3) then other[3..8).
  tg::KVCache fresh, branch;
  for (std::int64_t t = 0; t < 3; ++t) step(x, t, fresh);
  branch = fresh;
  const auto branch_step = step(other, 3, branch);
  tg::KVCache mixed;
  for (std::int64_t t = 0; t < 3; ++t) step(x, t, mixed);
  BOOST_TEST(branch_step == step(other, 3, mixed));

  // Moves take the buffers and leave an empty cache that can start over.
  const std::int64_t capacity = original.capacity();
  tg::KVCache moved = std::move(original);
  BOOST_TEST((moved.length() == 8 && moved.capacity() == capacity));
  BOOST_TEST((original.length() == 0 && original.capacity() == 0));  // NOLINT(bugprone-use-after-move): specified
  BOOST_TEST(step(x, 0, original) == expected[0]);
  tg::KVCache target;
  target = std::move(moved);
  BOOST_TEST((target.length() == 8 && moved.length() == 0 && moved.capacity() == 0));  // NOLINT(bugprone-use-after-move)
  // Copying an empty cache, or one that was cleared, gives an empty cache.
  tg::KVCache empty, cleared = target;
  cleared.clear();
  BOOST_TEST((tg::KVCache(empty).capacity() == 0 && tg::KVCache(cleared).length() == 0));
}

BOOST_AUTO_TEST_CASE(kv_cache_append_is_amortised) {
  tg::MultiHeadAttention layer({.query_dim = 4, .heads = 2, .seed = 5});
  tg::KVCache cache;
  int growths = 0;
  std::int64_t capacity = 0;
  for (int t = 0; t < 200; ++t) {
    layer.decode(tg::randn({1, 1, 4}, static_cast<std::uint64_t>(t)), cache);
    if (cache.capacity() != capacity) ++growths;
    capacity = cache.capacity();
  }
  BOOST_TEST(cache.length() == 200);
  BOOST_TEST(growths <= 5);  // 16, 32, 64, 128, 256: doubling, not one copy per step
  cache.clear();
  BOOST_TEST(cache.length() == 0);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(bad_inputs)

BOOST_AUTO_TEST_CASE(every_argument_is_checked) {
  const MhaProblem p = make_problem(3, tg::float32, MaskKind::random, BiasKind::none, true, false);
  auto run = [&](auto edit) {
    MhaProblem x = p;
    edit(x);
    tg::multihead_attention(x.act, x.par, x.masks, x.h, x.causal, x.offset);
  };
  check_throws<tg::ShapeError>([&] { run([](MhaProblem& x) { x.act.query = tg::zeros({2, 3}); }); }, {"multihead_attention", "'query'", "[B, Q, Cq]", "[2, 3]"});
  check_throws<tg::ShapeError>([&] { run([](MhaProblem& x) { x.act.context = tg::zeros({x.b, x.k}); }); }, {"'context'", "[B, K, Cctx]"});
  check_throws<tg::ShapeError>([&] { run([](MhaProblem& x) { x.par.w_q = tg::zeros({x.cq + 1, x.h * x.d}); }); }, {"'w_q'", "rows (Cq, the last dim of 'query'"});
  check_throws<tg::ShapeError>([&] { run([](MhaProblem& x) { x.par.w_k = tg::zeros({x.cctx + 1, x.h * x.d}); x.par.w_v = tg::zeros({x.cctx + 1, x.h * x.dv}); }); },
                               {"'w_k'", "context"});
  check_throws<tg::ShapeError>([&] { run([](MhaProblem& x) { x.par.w_o = tg::zeros({x.h * x.dv + 1, x.cout}); }); }, {"'w_o'"});
  check_throws<tg::ShapeError>([&] { run([](MhaProblem& x) { x.par.b_o = tg::zeros({x.cout + 1}); }); }, {"'b_o'", fmt::format("[{}]", p.cout)});
  check_throws<tg::ShapeError>([&] { run([](MhaProblem& x) { x.h = x.h * x.d + 1; }); }, {"heads", "must divide", "'w_q'"});
  check_throws<tg::ValueError>([&] { run([](MhaProblem& x) { x.h = 0; }); }, {"'heads'", ">= 1", "0"});
  check_throws<tg::DTypeError>([&] { run([](MhaProblem& x) { x.masks.key_mask = tg::ones({x.b, x.k}); }); }, {"'key_mask'", "bool", "float32"});
  check_throws<tg::ShapeError>([&] { run([](MhaProblem& x) { x.masks.query_mask = tg::zeros({x.b, x.q + 1}, tg::bool_); }); }, {"'query_mask'", "have shape"});
  check_throws<tg::ShapeError>([&] { run([](MhaProblem& x) { x.masks.attention_mask = tg::zeros({x.q + 1, x.k}, tg::bool_); }); },
                               {"'attention_mask'", "broadcast"});
  check_throws<tg::ShapeError>([&] { run([](MhaProblem& x) { x.act.bias = tg::zeros({x.k + 1}); }); }, {"'bias'", "broadcast"});
  check_throws<tg::DTypeError>([&] { run([](MhaProblem& x) { x.act.bias = tg::zeros({x.k}, tg::float64); }); }, {"'bias'", "float64", "float32"});
  check_throws<tg::DTypeError>([&] { run([](MhaProblem& x) { x.par.w_v = x.par.w_v.to(tg::float64); }); }, {"'w_v'", "float64", "float32"});
  check_throws<tg::DTypeError>([&] { run([](MhaProblem& x) { x.act.context = x.act.context.to(tg::float64); }); }, {"'query'", "'context'", "dtype"});
  check_throws<tg::ShapeError>([&] { run([](MhaProblem& x) { x.act.query = tg::zeros({x.b, 0, x.cq}); }); }, {"B, Q and K must be >= 1", "Q = 0"});
  check_throws<tg::ShapeError>([&] { run([](MhaProblem& x) { x.act.context = tg::zeros({x.b + 1, x.k, x.cctx}); }); }, {"same batch size"});
}

BOOST_AUTO_TEST_CASE(the_layer_blames_what_the_caller_passed) {
  tg::MultiHeadAttention cross({.query_dim = 32, .heads = 4, .context_dim = 16, .seed = 1});
  tg::MultiHeadAttention self({.query_dim = 32, .heads = 4, .seed = 1});
  const Tensor query = tg::zeros({2, 5, 32}), context = tg::zeros({2, 3, 16});
  // Checks that `call` throws E naming every fragment and none of the weights, which the caller
  // never passed.
  auto blames = [](auto call, const std::vector<std::string>& fragments) {
    try {
      call();
      BOOST_ERROR("expected an error mentioning " << fragments[0]);
    } catch (const tg::Error& e) {
      const std::string msg = e.what();
      for (const auto& f : fragments) BOOST_CHECK_MESSAGE(msg.find(f) != std::string::npos, "message '" << msg << "' lacks '" << f << "'");
      for (const char* w : {"w_q", "w_k", "w_v", "w_o", "multihead_attention"})
        BOOST_CHECK_MESSAGE(msg.find(w) == std::string::npos, "message '" << msg << "' blames " << w);
    }
  };
  blames([&] { cross.forward(tg::zeros({2, 5, 64}), context); },
         {"MultiHeadAttention::forward", "'query'", "width 64", "[2, 5, 64]", "config.query_dim is 32"});
  blames([&] { cross.forward(query.to(tg::float64), context); }, {"MultiHeadAttention::forward", "'query'", "float64", "config.dtype is float32"});
  blames([&] { cross.forward(query, tg::zeros({2, 3, 32})); }, {"'context'", "width 32", "config.context_dim is 16"});
  blames([&] { cross.forward(query, context.to(tg::float64)); }, {"'context'", "float64", "config.dtype is float32"});
  blames([&] { self.forward(tg::zeros({5, 32})); }, {"MultiHeadAttention::forward", "argument 'x'", "[5, 32]", "[B, L, config.query_dim = 32]"});
  blames([&] { cross.forward(tg::zeros({2, 5, 32})); }, {"argument 'x'", "self-attention", "config.context_dim is 16"});
  blames([&] { self.forward(tg::zeros({0, 5, 32})); }, {"argument 'x'", "B, L >= 1", "[0, 5, 32]"});
  blames([&] { self.forward(query, query, {.masking = {.key_mask = tg::zeros({2, 4}, tg::bool_)}}); },
         {"MultiHeadAttention::forward", "'call.masking.key_mask'", "[2, 5]", "[2, 4]"});
  tg::KVCache cache;
  blames([&] { self.decode(tg::zeros({2, 1, 64}), cache); }, {"MultiHeadAttention::decode", "'query'", "width 64", "config.query_dim is 32"});
  blames([&] { self.decode(tg::zeros({2, 1, 32}, tg::float64), cache); }, {"MultiHeadAttention::decode", "'query'", "float64", "config.dtype is float32"});
  blames([&] { self.decode(tg::zeros({2, 0, 32}), cache); }, {"MultiHeadAttention::decode", "'query'", "[2, 0, 32]"});
  blames([&] { cross.decode(query, cache); }, {"MultiHeadAttention::decode", "self-attention", "config.context_dim 16"});
  blames([&] { self.decode(tg::zeros({2, 1, 32}), cache, {.masking = {.key_mask = tg::zeros({2, 4}, tg::bool_)}}); },
         {"MultiHeadAttention::decode", "'call.masking.key_mask'", "[2, 1]"});
  BOOST_TEST(cache.length() == 0);  // nothing appended by a call that failed
  // Exception types: shapes are ShapeError, dtypes DTypeError.
  check_throws<tg::ShapeError>([&] { cross.forward(tg::zeros({2, 5, 64}), context); }, {"'query'"});
  check_throws<tg::DTypeError>([&] { cross.forward(query, context.to(tg::float64)); }, {"'context'"});
  check_throws<tg::ValueError>([&] { cross.decode(query, cache); }, {"self-attention"});
}

BOOST_AUTO_TEST_SUITE_END()

// The layer with rotary position embeddings (docs/semantics.md §7.3).
BOOST_AUTO_TEST_SUITE(rotary)

namespace {
// A self-attention layer with random weights and biases (so that b_o's suppression shows).
tg::MultiHeadAttention rotary_layer(tg::DType dtype, tg::RotaryLayout layout, std::int64_t rotary_dim = 0) {
  tg::MultiHeadAttention layer({.query_dim = 8, .heads = 2, .out_dim = 5, .dtype = dtype, .seed = 21,
                                .rotary = tg::RotaryOptions{.rotary_dim = rotary_dim, .layout = layout}});
  for (const Tensor& w : layer.parameters()) tg::copy_(w, tg::randn(w.shape(), 22, tg::float64).to(dtype));
  return layer;
}

// The layer's output by its definition in public ops: project, split heads, rotate q and k by
// position, attend causally, merge heads, project.
tg::AttentionResult by_definition(const tg::MultiHeadAttention& layer, const Tensor& x) {
  const auto& w = layer.weights();
  const std::int64_t b = x.size(0), len = x.size(1), h = layer.config().heads;
  auto heads = [&](const Tensor& t) { return tg::permute(tg::reshape(t, {b, len, h, t.size(2) / h}), {0, 2, 1, 3}); };
  const Tensor positions = tg::arange(len);
  const Tensor q = tg::rotary(heads(tg::matmul(x, w.w_q) + w.b_q), positions, *layer.config().rotary);
  const Tensor k = tg::rotary(heads(tg::matmul(x, w.w_k) + w.b_k), positions, *layer.config().rotary);
  auto [o, attn] = tg::scaled_dot_product_attention(q, k, heads(tg::matmul(x, w.w_v) + w.b_v), tg::causal_mask(len, len));
  return {tg::matmul(tg::reshape(tg::permute(o, {0, 2, 1, 3}), {b, len, w.w_o.size(0)}), w.w_o) + w.b_o, attn};
}

const tg::RotaryLayout kLayouts[] = {tg::RotaryLayout::half_split, tg::RotaryLayout::interleaved};
}  // namespace

BOOST_AUTO_TEST_CASE(the_layer_rotates_q_and_k_per_head_on_both_paths) {
  const Tensor x = tg::randn({2, 6, 8}, 23, tg::float64);
  for (auto layout : kLayouts)
    for (std::int64_t r : {0, 2}) {
      const tg::MultiHeadAttention layer = rotary_layer(tg::float64, layout, r);
      const auto want = by_definition(layer, x);
      const auto got = layer.forward(x, {.masking = {.causal = true}, .need_weights = true});
      const std::string what = fmt::format("layout {} rotary_dim {}", static_cast<int>(layout), r);
      check_close(values(got.output), values(want.output), 1e-12, 1e-12, what);
      check_close(values(got.weights), values(want.weights), 1e-12, 1e-12, what + " weights");
      check_close(values(layer.forward(x, {.masking = {.causal = true}}).output), values(want.output), 1e-12, 1e-12, what + " fused");
    }
  // Rotation is not the identity: without it the output differs.
  tg::MultiHeadAttention plain({.query_dim = 8, .heads = 2, .out_dim = 5, .dtype = tg::float64, .seed = 21});
  for (const Tensor& w : plain.parameters()) tg::copy_(w, tg::randn(w.shape(), 22, tg::float64));
  BOOST_TEST(values(plain.forward(x, {.masking = {.causal = true}}).output) != values(rotary_layer(tg::float64, kLayouts[0]).forward(x, {.masking = {.causal = true}}).output));
}

BOOST_AUTO_TEST_CASE(gradcheck_on_both_paths_with_masks) {
  const Tensor key_mask = tg::from_bools({true, true, false, true, true, true, true, true, true, false}, {2, 5});
  const Tensor query_mask = tg::from_bools({true, true, true, false, true, true, true, true, true, true}, {2, 5});
  for (auto layout : kLayouts)
    for (bool need_weights : {true, false}) {
      tg::MultiHeadAttention layer = rotary_layer(tg::float64, layout, 2);
      const Tensor x = tg::randn({2, 5, 8}, 24, tg::float64).set_requires_grad();
      std::vector<Tensor> params = layer.parameters();
      params.push_back(x);
      const auto r = tg::gradcheck_parameters(
          [&] {
            return std::vector<Tensor>{
                layer.forward(x, {.masking = {.key_mask = key_mask, .query_mask = query_mask, .causal = true}, .need_weights = need_weights}).output};
          },
          params);
      BOOST_TEST(r.ok, "need_weights " << need_weights << ": " << r.report());
    }
}

BOOST_AUTO_TEST_CASE(fused_equals_weights_path_within_float32_rounding) {
  using non_finite_masked_entries::run_layer;
  const Tensor key_mask = tg::from_bools({true, true, false, true, true, true, false, true, true, true, true, true, true, true}, {2, 7});
  for (auto layout : kLayouts) {
    tg::MultiHeadAttention layer = rotary_layer(tg::float32, layout);
    const Tensor x = tg::randn({2, 7, 8}, 25), d_out = tg::randn({2, 7, 5}, 26);
    const tg::MhaCall call{.masking = {.key_mask = key_mask, .causal = true}};
    auto weights = run_layer(layer, x, x, {call.masking, {}, true}, d_out);
    weights.erase(weights.begin() + 3);  // the attention weights
    const auto fused = run_layer(layer, x, x, call, d_out);
    BOOST_TEST_REQUIRE(fused.size() == weights.size());
    for (std::size_t i = 0; i < fused.size(); ++i) check_close(fused[i], weights[i], 2e-5, 2e-5, fmt::format("result {}", i));
  }
}

BOOST_AUTO_TEST_CASE(masked_positions_change_nothing_and_suppressed_queries_are_zero) {
  using namespace non_finite_masked_entries;
  for (auto dtype : {tg::float32, tg::float64})
    for (auto layout : kLayouts) {
      tg::MultiHeadAttention layer = rotary_layer(dtype, layout);
      // Batch 0: key 4 is padding; batch 1: keys 0 and 2. Query 1 of batch 0 may attend to nothing.
      const Tensor key_mask = tg::from_bools({true, true, true, true, false, false, true, false, true, true}, {2, 5});
      const Tensor query_mask = tg::from_bools({true, false, true, true, true, true, true, true, true, true}, {2, 5});
      const Tensor query = tg::randn({2, 5, 8}, 27, tg::float64).to(dtype), context = tg::randn({2, 5, 8}, 28, tg::float64).to(dtype);
      const Tensor d_out = tg::randn({2, 5, 5}, 29, tg::float64).to(dtype);
      const std::vector<bool> padding_keys{false, false, false, false, true, true, false, true, false, false};
      const std::vector<bool> padding_queries{false, true, false, false, false, false, false, false, false, false};
      for (bool need_weights : {true, false}) {
        const tg::MhaCall call{.masking = {.key_mask = key_mask, .query_mask = query_mask}, .need_weights = need_weights};
        const auto zeroed = run_layer(layer, poison(query, padding_queries, false, 0), poison(context, padding_keys, false, 0), call, d_out);
        for (std::size_t c = 0; c < 5; ++c) BOOST_TEST(zeroed[0][5 + c] == 0.0);  // query 1's output, b_o included
        for (std::size_t c = 0; c < 8; ++c) BOOST_TEST(zeroed[1][8 + c] == 0.0);  // and its gradient
        for (double p : kPoisons)
          check_same(run_layer(layer, poison(query, padding_queries, false, p), poison(context, padding_keys, false, -p), call, d_out), zeroed,
                     fmt::format("{} need_weights {} poison {}", dtype, need_weights, p));
      }
    }
}

BOOST_AUTO_TEST_CASE(decoding_through_the_cache_equals_the_full_forward) {
  for (auto dtype : {tg::float64, tg::float32}) {
    const double tol = dtype == tg::float64 ? 1e-12 : 1e-5;
    for (auto layout : kLayouts) {
      const tg::MultiHeadAttention layer = rotary_layer(dtype, layout);
      const Tensor x = tg::randn({2, 9, 8}, 30, tg::float64).to(dtype);
      auto [full, full_attn] = layer.forward(x, {.masking = {.causal = true}, .need_weights = true});
      for (std::int64_t chunk : {1, 4})
        for (bool need_weights : {true, false}) {
          tg::KVCache cache;
          std::vector<Tensor> outs;
          for (std::int64_t t = 0; t < 9; t += chunk) {
            const std::int64_t n = std::min<std::int64_t>(chunk, 9 - t);
            auto [o, a] = layer.decode(tg::slice(x, 1, t, t + n), cache, {.need_weights = need_weights});
            if (need_weights) check_close(values(a), values(tg::slice(tg::slice(full_attn, 2, t, t + n), 3, 0, t + n)), tol, tol, "step weights");
            outs.push_back(o);
          }
          check_close(values(tg::concat(outs, 1)), values(full), tol, tol,
                      fmt::format("{} layout {} chunks of {} need_weights {}", dtype, static_cast<int>(layout), chunk, need_weights));
        }
      // The forward places query i at causal_offset + i: the last rows alone, attending to the
      // whole sequence, are the full forward's last rows.
      const Tensor tail = layer.forward(tg::slice(x, 1, 6, 9), x, {.masking = {.causal = true, .causal_offset = 6}}).output;
      check_close(values(tail), values(tg::slice(full, 1, 6, 9)), tol, tol, "forward with causal_offset");
    }
  }
}

// A rotation maps a finite row to a finite row for every base the op accepts, at the extreme
// positions; the bases whose angles overflowed (to NaN outputs) are refused.
BOOST_AUTO_TEST_CASE(every_accepted_rotary_base_turns_finite_rows_to_finite_rows) {
  const std::int64_t far = std::int64_t{1} << 53;
  const Tensor positions = tg::from_vector(std::vector<std::int64_t>{0, 1, -far, far}, {4});
  for (const tg::DType dtype : {tg::float64, tg::float32})
    for (const double base : {1.0, 1.0 + 1e-15, 2.0, 10000.0, 1e300, std::numeric_limits<double>::max()}) {
      const Tensor y = tg::rotary(tg::ones({4, 64}, dtype), positions, {.base = base});
      for (const double v : values(y)) BOOST_TEST_REQUIRE(std::isfinite(v), "base " << base << " dtype " << dtype);
    }
  for (const double base : {std::numeric_limits<double>::denorm_min(), std::numeric_limits<double>::min(), 0.999})
    check_throws<tg::ValueError>([&] { tg::rotary(tg::ones({4, 64}), positions, {.base = base}); }, {"rotary", "options.base", ">= 1"});
}

BOOST_AUTO_TEST_CASE(the_rotary_config_is_validated) {
  auto fails = [](tg::MultiHeadAttentionConfig c, std::vector<std::string> fragments) {
    fragments.insert(fragments.begin(), "MultiHeadAttention");
    check_throws<tg::ValueError>([&] { tg::MultiHeadAttention{c}; }, fragments);
  };
  fails({.query_dim = 8, .heads = 2, .rotary = tg::RotaryOptions{.rotary_dim = 3}}, {"config.rotary.rotary_dim", "even", "head_dim = 4", "got 3"});
  fails({.query_dim = 8, .heads = 2, .rotary = tg::RotaryOptions{.rotary_dim = 6}}, {"config.rotary.rotary_dim", "got 6"});
  fails({.query_dim = 6, .heads = 2, .rotary = tg::RotaryOptions{}}, {"config.rotary.rotary_dim", "head_dim = 3", "odd here", "got 0"});
  fails({.query_dim = 8, .rotary = tg::RotaryOptions{.base = -1}}, {"config.rotary.base", ">= 1", "-1"});
  check_throws<tg::ValueError>(
      [] { tg::Decoder({.vocab = 4, .max_len = 4, .dim = 8, .heads = 2, .positions = tg::PositionKind::rotary, .rotary = {.base = 0.25}}); },
      {"Decoder", "config.rotary.base", ">= 1", "0.25"});
  check_throws<tg::ValueError>([] { tg::Decoder({.vocab = 4, .max_len = 4, .dim = 6, .heads = 2, .positions = tg::PositionKind::rotary}); },
                               {"Decoder", "config.rotary.rotary_dim", "dim / heads = 3", "odd here"});
  // An odd head_dim is fine when fewer channels rotate.
  const tg::MultiHeadAttention ok({.query_dim = 6, .heads = 2, .rotary = tg::RotaryOptions{.rotary_dim = 2}});
  BOOST_TEST(ok.forward(tg::randn({1, 3, 6}, 1)).output.shape() == (Shape{1, 3, 6}));
}

BOOST_AUTO_TEST_SUITE_END()
