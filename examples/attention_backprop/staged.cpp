#include "attention_backprop/staged.hpp"

#include <cmath>

namespace tg = tapegrad;

namespace attention_backprop {

Tensor split_heads(const Tensor& x, std::int64_t heads) {
  return tg::permute(tg::reshape(x, {x.size(0), x.size(1), heads, x.size(2) / heads}), {0, 2, 1, 3});
}

Tensor merge_heads(const Tensor& x) {
  return tg::reshape(tg::permute(x, {0, 2, 1, 3}), {x.size(0), x.size(2), x.size(1) * x.size(3)});
}

void derive_masks(Problem& p) {
  const Sizes& n = p.n;
  const Shape full{n.b, n.h, n.q, n.k};
  auto host = [&](const Tensor& m, const Shape& shape) {
    return m.defined() ? tg::contiguous(tg::expand(m, shape)).to_vector<bool>() : std::vector<bool>();
  };
  const std::vector<bool> keys = host(p.key_mask, {n.b, n.k}), queries = host(p.query_mask, {n.b, n.q}),
                          pairs = host(p.attention_mask, full);
  p.allowed_host.assign(static_cast<std::size_t>(n.b * n.h * n.q * n.k), false);
  p.active_host.assign(static_cast<std::size_t>(n.b * n.q), false);
  p.used_host.assign(static_cast<std::size_t>(n.b * n.k), false);
  for (std::int64_t b = 0; b < n.b; ++b)
    for (std::int64_t h = 0; h < n.h; ++h)
      for (std::int64_t i = 0; i < n.q; ++i)
        for (std::int64_t j = 0; j < n.k; ++j) {
          const auto e = static_cast<std::size_t>(((b * n.h + h) * n.q + i) * n.k + j);
          const bool ok = (keys.empty() || keys[static_cast<std::size_t>(b * n.k + j)]) &&
                          (queries.empty() || queries[static_cast<std::size_t>(b * n.q + i)]) && (pairs.empty() || pairs[e]) &&
                          (!p.causal || j - i <= p.causal_offset);
          p.allowed_host[e] = ok;
          if (ok) {
            p.active_host[static_cast<std::size_t>(b * n.q + i)] = true;
            p.used_host[static_cast<std::size_t>(b * n.k + j)] = true;
          }
        }
  p.allowed = tg::from_bools(p.allowed_host, full);
  p.active = tg::from_bools(p.active_host, {n.b, n.q, 1});
  p.used = tg::from_bools(p.used_host, {n.b, n.k, 1});
}

Vars forward(const Problem& p, Var replaced, const Tensor& value) {
  Vars v;
  auto set = [&](Var x, auto&& compute) { at(v, x) = x == replaced ? value : compute(); };
  for (std::size_t x = 0; x <= static_cast<std::size_t>(Var::b_o); ++x)
    set(static_cast<Var>(x), [&] { return p.given[x]; });
  const Tensor zero = tg::scalar(0.0, tg::float64);
  auto project = [&](Var x, Var w, Var b) { return tg::add(tg::matmul(at(v, x), at(v, w)), at(v, b)); };
  // Step 0: selection (not multiplication), as ops/multihead_attention.cpp does.
  set(Var::query_sel, [&] { return tg::where(p.active, at(v, Var::query), zero); });
  set(Var::context_sel, [&] { return tg::where(p.used, at(v, Var::context), zero); });
  // Steps 1-2: projections, then head h takes channels [h*D, (h+1)*D).
  set(Var::q_h, [&] { return split_heads(project(Var::query_sel, Var::w_q, Var::b_q), p.n.h); });
  set(Var::k_h, [&] { return split_heads(project(Var::context_sel, Var::w_k, Var::b_k), p.n.h); });
  set(Var::v_h, [&] { return split_heads(project(Var::context_sel, Var::w_v, Var::b_v), p.n.h); });
  // Step 3, with the scale as its own stage so that its gradient can be seen.
  set(Var::raw, [&] { return tg::matmul(at(v, Var::q_h), tg::transpose(at(v, Var::k_h), -1, -2)); });
  set(Var::S, [&] {
    const Tensor scaled = tg::mul(at(v, Var::raw), 1.0 / std::sqrt(static_cast<double>(p.n.d)));
    return at(v, Var::bias).defined() ? tg::add(scaled, at(v, Var::bias)) : scaled;
  });
  // Steps 4-5.
  set(Var::A, [&] { return tg::masked_softmax(at(v, Var::S), p.allowed); });
  // Step 6.
  set(Var::O_h, [&] { return tg::matmul(at(v, Var::A), at(v, Var::v_h)); });
  set(Var::merged, [&] { return merge_heads(at(v, Var::O_h)); });
  set(Var::y, [&] { return project(Var::merged, Var::w_o, Var::b_o); });
  // Step 7.
  set(Var::out, [&] { return tg::where(p.active, at(v, Var::y), zero); });
  return v;
}

Tensor loss(const Problem& p, const Vars& v) { return tg::sum(tg::mul(at(v, Var::out), p.R)); }

namespace {

Tensor fresh_copy(const Tensor& t) { return tg::from_vector(t.to_vector<double>(), t.shape()); }

}  // namespace

Tensor tape_gradient(const Problem& p, const Vars& base, Var x) {
  Tensor leaf = fresh_copy(at(base, x));
  leaf.set_requires_grad();
  tg::backward(loss(p, forward(p, x, leaf)));
  return leaf.grad().defined() ? leaf.grad() : tg::zeros(leaf.shape(), tg::float64);
}

Tensor numeric_gradient(const Problem& p, const Vars& base, Var x, double h) {
  tg::NoGradGuard no_grad;
  const Shape shape = at(base, x).shape();
  std::vector<double> values = at(base, x).to_vector<double>(), grad(values.size());
  auto loss_at = [&] { return loss(p, forward(p, x, tg::from_vector(values, shape))).item(); };
  for (std::size_t e = 0; e < values.size(); ++e) {
    const double x0 = values[e];
    values[e] = x0 + h;
    const double up = loss_at();
    values[e] = x0 - h;
    const double down = loss_at();
    values[e] = x0;
    grad[e] = (up - down) / (2 * h);
  }
  return tg::from_vector(grad, shape);
}

}  // namespace attention_backprop
