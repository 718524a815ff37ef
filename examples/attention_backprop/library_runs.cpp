#include "attention_backprop/library_runs.hpp"

#include <algorithm>
#include <cmath>

namespace tg = tapegrad;

namespace attention_backprop {
namespace {

// A new leaf of `dtype` holding t's values (undefined stays undefined).
Tensor leaf(const Tensor& t, tg::DType dtype, bool grad = true) {
  if (!t.defined()) return t;
  Tensor out = tg::to(tg::from_vector(t.to_vector<double>(), t.shape()), dtype);
  if (grad) out.set_requires_grad();
  return out;
}

Tensor as_f64(const Tensor& t) { return t.defined() ? tg::to(t.detach(), tg::float64) : t; }

// [rows, cols] with ones from (row0, 0) down the diagonal.
Tensor eye(std::int64_t rows, std::int64_t cols, std::int64_t row0, tg::DType dtype) {
  std::vector<double> v(static_cast<std::size_t>(rows * cols), 0.0);
  for (std::int64_t c = 0; c < cols; ++c) v[static_cast<std::size_t>((row0 + c) * cols + c)] = 1.0;
  return tg::to(tg::from_vector(v, {rows, cols}), dtype);
}

tg::MhaMasks masks_of(const Problem& p) { return {p.key_mask, p.query_mask, p.attention_mask}; }

}  // namespace

LibraryRun run_multihead_attention(const Problem& p, tg::DType dtype) {
  Vars in;
  for (std::size_t x = 0; x <= static_cast<std::size_t>(Var::b_o); ++x) in[x] = leaf(p.given[x], dtype);
  auto [out, attention] = tg::multihead_attention({at(in, Var::query), at(in, Var::context), at(in, Var::bias)},
                                                  {at(in, Var::w_q), at(in, Var::w_k), at(in, Var::w_v), at(in, Var::w_o),
                                                   at(in, Var::b_q), at(in, Var::b_k), at(in, Var::b_v), at(in, Var::b_o)},
                                                  masks_of(p), p.n.h, p.causal, p.causal_offset);
  tg::backward(tg::sum(tg::mul(out, leaf(p.R, dtype, false))));
  LibraryRun run;
  at(run.values, Var::out) = as_f64(out);
  at(run.values, Var::A) = as_f64(attention);
  for (std::size_t x = 0; x <= static_cast<std::size_t>(Var::b_o); ++x)
    if (in[x].defined()) run.grads[static_cast<Var>(x)] = as_f64(in[x].grad());
  return run;
}

LibraryRun run_attention_node(const Problem& p, const Vars& base, const Tensor& d_merged, tg::DType dtype) {
  const Sizes& n = p.n;
  const std::int64_t hd = n.h * n.d, hdv = n.h * n.dv;
  Tensor q = leaf(merge_heads(at(base, Var::q_h)), dtype);
  // k and v side by side as one context; w_k and w_v each pick their half back out.
  Tensor context = leaf(tg::concat({merge_heads(at(base, Var::k_h)), merge_heads(at(base, Var::v_h))}, -1), dtype);
  const Tensor& bias = at(base, Var::bias);
  Tensor full_bias = leaf(bias.defined() ? tg::contiguous(tg::expand(bias, {n.b, n.h, n.q, n.k})) : tg::zeros({n.b, n.h, n.q, n.k}, tg::float64), dtype);
  auto [out, attention] = tg::multihead_attention(
      {q, context, full_bias}, {eye(hd, hd, 0, dtype), eye(hd + hdv, hd, 0, dtype), eye(hd + hdv, hdv, hd, dtype), eye(hdv, hdv, 0, dtype)},
      masks_of(p), n.h, p.causal, p.causal_offset);
  tg::backward({out}, {leaf(d_merged, dtype, false)});
  LibraryRun run;
  at(run.values, Var::A) = as_f64(attention);
  at(run.values, Var::O_h) = split_heads(as_f64(out), n.h);
  const Tensor d_context = as_f64(context.grad());
  run.grads[Var::q_h] = split_heads(as_f64(q.grad()), n.h);
  run.grads[Var::k_h] = split_heads(tg::slice(d_context, -1, 0, hd), n.h);
  run.grads[Var::v_h] = split_heads(tg::slice(d_context, -1, hd, hd + hdv), n.h);
  run.grads[Var::S] = as_f64(full_bias.grad());
  return run;
}

double kv_cache_gap(const Problem& p, tg::DType dtype) {
  tg::NoGradGuard no_grad;
  Vars in;
  for (std::size_t x = 0; x <= static_cast<std::size_t>(Var::b_o); ++x) in[x] = leaf(p.given[x], dtype, false);
  const tg::MhaParameters params{at(in, Var::w_q), at(in, Var::w_k), at(in, Var::w_v), at(in, Var::w_o),
                                 at(in, Var::b_q), at(in, Var::b_k), at(in, Var::b_v), at(in, Var::b_o)};
  const Tensor& bias = at(in, Var::bias);
  const Tensor full = tg::multihead_attention({at(in, Var::query), at(in, Var::context), bias}, params, masks_of(p), p.n.h, true,
                                              p.causal_offset)
                          .output;
  // Query t alone: its row of every mask and bias that has one row per query.
  auto row = [&](const Tensor& t, std::int64_t dim, std::int64_t i) {
    return t.defined() && t.dim() >= 2 && t.size(dim) == p.n.q && p.n.q > 1 ? tg::slice(t, dim, i, i + 1) : t;
  };
  double gap = 0;
  for (std::int64_t t = 0; t < p.n.q; ++t) {
    const Tensor one = tg::multihead_attention({row(at(in, Var::query), 1, t), at(in, Var::context), row(bias, -2, t)}, params,
                                               {p.key_mask, row(p.query_mask, 1, t), row(p.attention_mask, -2, t)}, p.n.h, true,
                                               t + p.causal_offset)
                           .output;
    const auto a = as_f64(one).to_vector<double>(), b = as_f64(tg::slice(full, 1, t, t + 1)).to_vector<double>();
    for (std::size_t e = 0; e < a.size(); ++e) gap = std::max(gap, std::abs(a[e] - b[e]));
  }
  return gap;
}

}  // namespace attention_backprop
