#include "mha_support.hpp"

namespace tg_test {
namespace tg = tapegrad;
using tg::Tensor;

std::vector<Tensor> MhaProblem::inputs() const {
  std::vector<Tensor> xs{act.query, act.context};
  if (act.bias.defined()) xs.push_back(act.bias);
  for (const Tensor* t : {&par.w_q, &par.w_k, &par.w_v, &par.w_o, &par.b_q, &par.b_k, &par.b_v, &par.b_o})
    if (t->defined()) xs.push_back(*t);
  return xs;
}

tg::AttentionResult MhaProblem::run(const std::vector<Tensor>& xs) const {
  std::size_t i = 0;
  tg::MhaActivations a{xs[i], xs[i + 1], Tensor()};
  i += 2;
  if (act.bias.defined()) a.bias = xs[i++];
  tg::MhaParameters p;
  for (auto [from, to] : {std::pair{&par.w_q, &p.w_q}, {&par.w_k, &p.w_k}, {&par.w_v, &p.w_v}, {&par.w_o, &p.w_o},
                          {&par.b_q, &p.b_q}, {&par.b_k, &p.b_k}, {&par.b_v, &p.b_v}, {&par.b_o, &p.b_o}})
    if (from->defined()) *to = xs[i++];
  return tg::multihead_attention(a, p, masks, h, causal, offset, need_weights);
}

MhaProblem make_problem(std::uint64_t seed, tg::DType dtype, MaskKind masks, BiasKind bias, bool all_biases,
                        bool non_contiguous) {
  tg::Generator gen(seed);
  auto pick = [&](std::int64_t lo, std::int64_t hi) { return lo + static_cast<std::int64_t>(gen.next_u64() % static_cast<std::uint64_t>(hi - lo + 1)); };
  MhaProblem p{};
  p.b = pick(1, 3);
  p.q = pick(1, 6);
  p.k = pick(1, 6);
  p.h = pick(1, 4);
  p.d = pick(1, 3);
  p.dv = pick(1, 3);
  p.cq = pick(1, 4);
  p.cctx = pick(1, 4);
  p.cout = pick(1, 4);
  p.causal = gen.uniform() < 0.5;
  p.offset = pick(-3, 4);
  auto randn = [&](const tg::Shape& s) {
    Tensor t = tg::randn(s, gen, tg::float64).to(dtype);
    if (!non_contiguous || s.size() < 2) return t;
    // Same values, transposed storage.
    std::vector<std::int64_t> rev;
    for (auto d = static_cast<std::int64_t>(s.size()) - 1; d >= 0; --d) rev.push_back(d);
    return tg::permute(tg::contiguous(tg::permute(t, rev)), rev);
  };
  p.act.query = randn({p.b, p.q, p.cq});
  p.act.context = randn({p.b, p.k, p.cctx});
  p.par.w_q = randn({p.cq, p.h * p.d});
  p.par.w_k = randn({p.cctx, p.h * p.d});
  p.par.w_v = randn({p.cctx, p.h * p.dv});
  p.par.w_o = randn({p.h * p.dv, p.cout});
  if (all_biases) {
    p.par.b_q = randn({p.h * p.d});
    p.par.b_k = randn({p.h * p.d});
    p.par.b_v = randn({p.h * p.dv});
    p.par.b_o = randn({p.cout});
  }
  switch (bias) {
    case BiasKind::none: break;
    case BiasKind::full: p.act.bias = randn({p.b, p.h, p.q, p.k}); break;
    case BiasKind::heads_keys: p.act.bias = randn({1, p.h, 1, p.k}); break;
    case BiasKind::queries_keys: p.act.bias = randn({p.q, p.k}); break;
  }
  auto bools = [&](const tg::Shape& s, double p_true) {
    std::vector<bool> v;
    for (std::int64_t i = 0, n = s.empty() ? 1 : [&] { std::int64_t m = 1; for (auto x : s) m *= x; return m; }(); i < n; ++i)
      v.push_back(gen.uniform() < p_true);
    return v;
  };
  if (masks != MaskKind::none) {
    auto km = bools({p.b, p.k}, 0.8), qm = bools({p.b, p.q}, 0.85), am = bools({p.b, p.h, p.q, p.k}, 0.8);
    if (masks == MaskKind::empty_row) for (std::int64_t j = 0; j < p.k; ++j) am[static_cast<std::size_t>(j)] = false;  // b0 h0 q0
    if (masks == MaskKind::empty_query) qm[0] = false;
    if (masks == MaskKind::empty_batch) for (std::int64_t j = 0; j < p.k; ++j) km[static_cast<std::size_t>(j)] = false;  // batch 0
    p.masks.key_mask = tg::from_bools(km, {p.b, p.k});
    p.masks.query_mask = tg::from_bools(qm, {p.b, p.q});
    p.masks.attention_mask = tg::from_bools(am, {p.b, p.h, p.q, p.k});
  }
  return p;
}

}  // namespace tg_test
