// The op table's entries for attention: scaled_dot_product_attention, causal_mask, alibi_slopes, multihead_attention, the layer and its
// KV cache.
#include "op_table/common.hpp"

namespace tg_test::table {

void add_attention(std::vector<OpInfo>& t) {
  // Attention. The reference is plain loops (ref_matmul and a masked softmax written here);
  // the PyTorch cross-check (test_torch_reference) is a second, fully independent reference.
  {
    OpInfo info;
    info.name = "scaled_dot_product_attention";
    info.covers = {"scaled_dot_product_attention", "attention"};
    info.samples = {{{3, 4}, {5, 4}, {5, 2}}, {{2, 3, 4}, {1, 5, 4}, {5, 3}}, {{1, 1}, {1, 1}, {1, 1}}, {{2, 2, 3, 2}, {2, 1, 4, 2}, {4, 1}},
                    {{3, 2}, {0, 2}, {0, 4}}, {{0, 2}, {3, 2}, {3, 1}}};
    // Outputs 3 and 4 run again with NaN in the masked keys' k and the empty rows' q and inf in
    // the masked keys' v: they must equal outputs 0 and 1, gradients included. Outputs 2 and 5 are
    // attention(), the fused path (need_weights = false), clean and poisoned.
    info.op = [](const Ins& in) {
      const std::int64_t q = in[0].size(-2), k = in[1].size(-2);
      const Tensor mask = arg(tg::logical_and(tg::causal_mask(q, k, 1), pattern_mask({k})));
      auto [out, w] = tg::scaled_dot_product_attention(in[0], in[1], in[2], mask);
      const auto masked_key = [](std::int64_t j) { return !pattern_value(j); };
      const auto empty_row = [k](std::int64_t i) {
        for (std::int64_t j = 0; j < k && j <= i + 1; ++j)
          if (pattern_value(j)) return false;
        return true;
      };
      const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
      const Tensor q_p = with_rows(in[0], empty_row, nan), k_p = with_rows(in[1], masked_key, nan), v_p = with_rows(in[2], masked_key, inf);
      auto [out_p, w_p] = tg::scaled_dot_product_attention(q_p, k_p, v_p, mask);
      return Outs{out, w, tg::attention(in[0], in[1], in[2], mask), out_p, w_p, tg::attention(q_p, k_p, v_p, mask)};
    };
    info.reference = [](const Refs& in) {
      const Ref& q = in[0];
      const Ref& k = in[1];
      const std::int64_t nq = q.shape[q.shape.size() - 2], nk = k.shape[k.shape.size() - 2], d = q.shape.back();
      Ref kt = ref_gather(k, [&] { Shape s = k.shape; std::swap(s[s.size() - 1], s[s.size() - 2]); return s; }(),
                          [](auto idx) { std::swap(idx[idx.size() - 1], idx[idx.size() - 2]); return idx; });
      Ref w = ref_matmul(q, kt);
      for (std::int64_t r = 0; nk > 0 && r < w.numel() / nk; ++r) {
        const std::int64_t i = r % nq;
        double m = -1e300, z = 0;
        auto on = [&](std::int64_t j) { return j <= i + 1 && pattern_value(j); };
        bool any = false;
        for (std::int64_t j = 0; j < nk; ++j)
          if (on(j)) m = std::max(m, w.v[static_cast<std::size_t>(r * nk + j)] / std::sqrt(double(d))), any = true;
        for (std::int64_t j = 0; j < nk; ++j) {
          double& x = w.v[static_cast<std::size_t>(r * nk + j)];
          x = on(j) ? std::exp(x / std::sqrt(double(d)) - m) : 0.0;
          z += x;
        }
        for (std::int64_t j = 0; j < nk; ++j) w.v[static_cast<std::size_t>(r * nk + j)] = any ? w.v[static_cast<std::size_t>(r * nk + j)] / z : 0.0;
      }
      const Ref out = ref_matmul(w, in[2]);
      return Refs{out, w, out, out, w, out};
    };
    info.errors = {{"q of rank 1", [] { tg::scaled_dot_product_attention(f32({3}), f32({2, 3}), f32({2, 1})); }, Raises::shape,
                    {"scaled_dot_product_attention", "'q'", "rank >= 2"}},
                   {"mixed dtypes", [] { tg::scaled_dot_product_attention(f32({1, 3}), f64({2, 3}), f32({2, 1})); }, Raises::dtype,
                    {"scaled_dot_product_attention", "'q'", "'k'"}},
                   {"zero width D", [] { tg::attention(f32({2, 0}), f32({3, 0}), f32({3, 2})); }, Raises::shape, {"attention", "D must be >= 1", "[2, 0]"}}};
    for (const std::string fn : {"scaled_dot_product_attention", "attention"})
      for (std::size_t missing = 0; missing < 3; ++missing)
        info.errors.push_back(undefined_arg(fn, std::string(1, "qkv"[missing]), [fn, missing] {
          std::vector<Tensor> qkv{f32({2, 3}), f32({4, 3}), f32({4, 1})};
          qkv[missing] = Tensor();
          if (fn == "attention") tg::attention(qkv[0], qkv[1], qkv[2]);
          else tg::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2]);
        }));
    info.undefined_inputs_unreachable = "op builds the mask from q's and k's sizes";
    t.push_back(info);
  }
  {
    OpInfo info;
    info.name = "causal_mask";
    info.covers = {"causal_mask"};
    info.differentiable = false;
    info.samples = {{{3, 4}}, {{4, 2}}, {{1, 1}}};
    info.op = [](const Ins& in) {
      return Outs{tg::to(tg::causal_mask(in[0].size(0), in[0].size(1), -1), in[0].dtype()),
                  tg::to(tg::causal_mask(in[0].size(0), in[0].size(1), 2), in[0].dtype())};
    };
    info.reference = [](const Refs& in) {
      Ref a{in[0].shape, {}}, b{in[0].shape, {}};
      for (std::int64_t n = 0; n < a.numel(); ++n) {
        const auto idx = a.unravel(n);
        a.v.push_back(idx[1] <= idx[0] - 1 ? 1.0 : 0.0);
        b.v.push_back(idx[1] <= idx[0] + 2 ? 1.0 : 0.0);
      }
      return Refs{a, b};
    };
    info.errors = {{"negative size", [] { tg::causal_mask(2, -1); }, Raises::value, {"causal_mask", "'keys'", "-1"}},
                   {"too large", [] { tg::causal_mask(std::int64_t{1} << 40, std::int64_t{1} << 40); }, Raises::shape,
                    {"causal_mask", "result shape", "addressed"}}};
    info.undefined_inputs_unreachable = "causal_mask takes no tensor (op reads its sizes from the input)";
    t.push_back(info);
  }
  {
    // ALiBi's default slopes, against their closed form: with n the largest power of two <= H,
    // head h < n gets 2^(-8 (h + 1) / n) and head n + i gets 2^(-8 (2 i + 1) / (2 n)).
    OpInfo info;
    info.name = "alibi_slopes";
    info.covers = {"alibi_slopes"};
    info.differentiable = false;
    info.samples = {{{8}}, {{6}}, {{1}}, {{3}}, {{12}}};
    info.op = [](const Ins& in) { return Outs{tg::alibi_slopes(in[0].size(0), in[0].dtype())}; };
    info.reference = [](const Refs& in) {
      const std::int64_t heads = in[0].shape[0];
      std::int64_t n = 1;
      while (2 * n <= heads) n *= 2;
      Ref r{in[0].shape, {}};
      for (std::int64_t h = 0; h < heads; ++h)
        r.v.push_back(h < n ? std::exp2(-8.0 * double(h + 1) / double(n)) : std::exp2(-8.0 * double(2 * (h - n) + 1) / double(2 * n)));
      return Refs{r};
    };
    info.errors = {{"no heads", [] { tg::alibi_slopes(0); }, Raises::value, {"alibi_slopes", "'heads'", ">= 1"}},
                   {"integer dtype", [] { tg::alibi_slopes(4, tg::int64); }, Raises::dtype, {"alibi_slopes", "'dtype'", "int64"}}};
    info.undefined_inputs_unreachable = "alibi_slopes takes no tensor (op reads the heads from the input's size)";
    t.push_back(info);
  }
  {
    // Against plain loops: the heads one by one, concatenated and projected, plus b_o, with
    // queries that have no allowed key in any head zeroed (b_o too). Head 1 has an attention
    // mask of its own, so some queries are active through one head only.
    OpInfo info;
    info.name = "multihead_attention";
    info.covers = {"multihead_attention"};
    info.samples = {{{2, 3, 4}, {2, 5, 3}, {4, 4}, {3, 4}, {3, 6}, {6, 2}, {2}}, {{1, 1, 2}, {1, 2, 2}, {2, 2}, {2, 2}, {2, 2}, {2, 3}, {3}}};
    auto masks = [](const Ins& in) {
      const std::int64_t b = in[0].size(0), q = in[0].size(1), k = in[1].size(1);
      std::vector<bool> pairs;  // [B, 2, Q, K]: all of head 0, a pattern in head 1
      for (std::int64_t n = 0; n < b * 2 * q * k; ++n) pairs.push_back(n / (q * k) % 2 == 0 || pattern_value(n + 1));
      return tg::MhaMasks{.key_mask = pattern_mask({b, k}), .query_mask = arg(tg::logical_not(pattern_mask({b, q}))),
                          .attention_mask = arg(tg::from_bools(pairs, {b, 2, q, k}))};
    };
    // Outputs 2 and 3 run again with NaN in the masked queries' rows and -inf in the padding
    // keys' context rows: they must equal outputs 0 and 1, gradients included. Outputs 4 and 5 are
    // the fused path (need_weights = false), clean and poisoned.
    info.op = [masks](const Ins& in) {
      const tg::MhaMasks m = masks(in);
      auto [out, attn] = tg::multihead_attention({in[0], in[1]}, {in[2], in[3], in[4], in[5], {}, {}, {}, in[6]}, m, 2, true, 2);
      const Tensor query = tg::where(tg::unsqueeze(tg::logical_not(m.query_mask), -1), tg::scalar(std::nan(""), in[0].dtype()), in[0]);
      const Tensor context = tg::where(tg::unsqueeze(tg::logical_not(m.key_mask), -1),
                                       tg::scalar(-std::numeric_limits<double>::infinity(), in[1].dtype()), in[1]);
      auto [out_p, attn_p] = tg::multihead_attention({query, context}, {in[2], in[3], in[4], in[5], {}, {}, {}, in[6]}, m, 2, true, 2);
      const Tensor fused = tg::multihead_attention({in[0], in[1]}, {in[2], in[3], in[4], in[5], {}, {}, {}, in[6]}, m, 2, true, 2, false).output;
      const Tensor fused_p = tg::multihead_attention({query, context}, {in[2], in[3], in[4], in[5], {}, {}, {}, in[6]}, m, 2, true, 2, false).output;
      return Outs{out, attn, out_p, attn_p, fused, fused_p};
    };
    info.reference = [](const Refs& in) {
      // Written out with plain loops: b, h, i, j indices, D = cols(w_q) / 2, Dv = cols(w_v) / 2.
      const Ref &x = in[0], &c = in[1], &wq = in[2], &wk = in[3], &wv = in[4], &wo = in[5], &bo = in[6];
      const std::int64_t B = x.shape[0], Q = x.shape[1], K = c.shape[1], H = 2, D = wq.shape[1] / 2, Dv = wv.shape[1] / 2,
                         Cout = wo.shape[1];
      const Ref q = ref_matmul(x, wq), k = ref_matmul(c, wk), v = ref_matmul(c, wv);
      Ref attn{{B, H, Q, K}, std::vector<double>(static_cast<std::size_t>(B * H * Q * K), 0.0)};
      Ref merged{{B, Q, H * Dv}, std::vector<double>(static_cast<std::size_t>(B * Q * H * Dv), 0.0)};
      Ref out{{B, Q, Cout}, std::vector<double>(static_cast<std::size_t>(B * Q * Cout), 0.0)};
      auto at = [](const Ref& r, std::int64_t a, std::int64_t b2, std::int64_t c2) { return r.v[static_cast<std::size_t>((a * r.shape[1] + b2) * r.shape[2] + c2)]; };
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t i = 0; i < Q; ++i) {
          bool active = false;
          for (std::int64_t h = 0; h < H; ++h) {
            auto allowed = [&](std::int64_t j) {
              return pattern_value(b * K + j) && !pattern_value(b * Q + i) && j <= i + 2 &&
                     (h == 0 || pattern_value(((b * H + h) * Q + i) * K + j + 1));
            };
            std::vector<double> s(static_cast<std::size_t>(K), 0.0);
            double m = -1e300, z = 0;
            for (std::int64_t j = 0; j < K; ++j) {
              for (std::int64_t e = 0; e < D; ++e) s[static_cast<std::size_t>(j)] += at(q, b, i, h * D + e) * at(k, b, j, h * D + e);
              s[static_cast<std::size_t>(j)] /= std::sqrt(double(D));
              if (allowed(j)) m = std::max(m, s[static_cast<std::size_t>(j)]), active = true;
            }
            for (std::int64_t j = 0; j < K; ++j) z += allowed(j) ? std::exp(s[static_cast<std::size_t>(j)] - m) : 0.0;
            for (std::int64_t j = 0; j < K; ++j) {
              const double a = allowed(j) ? std::exp(s[static_cast<std::size_t>(j)] - m) / z : 0.0;
              attn.v[static_cast<std::size_t>(((b * H + h) * Q + i) * K + j)] = a;
              for (std::int64_t e = 0; e < Dv; ++e)
                merged.v[static_cast<std::size_t>((b * Q + i) * H * Dv + h * Dv + e)] += a * at(v, b, j, h * Dv + e);
            }
          }
          for (std::int64_t o = 0; o < Cout && active; ++o) {
            out.v[static_cast<std::size_t>((b * Q + i) * Cout + o)] = bo.v[static_cast<std::size_t>(o)];
            for (std::int64_t e = 0; e < H * Dv; ++e)
              out.v[static_cast<std::size_t>((b * Q + i) * Cout + o)] += merged.v[static_cast<std::size_t>((b * Q + i) * H * Dv + e)] * wo.v[static_cast<std::size_t>(e * Cout + o)];
          }
        }
      return Refs{out, attn, out, attn, out, out};
    };
    info.errors = {{"zero heads", [] { tg::multihead_attention({f32({1, 1, 2}), f32({1, 1, 2})}, {f32({2, 2}), f32({2, 2}), f32({2, 2}), f32({2, 2})}, {}, 0); },
                    Raises::value, {"multihead_attention", "'heads'", "0"}},
                   {"zero width D", [] { tg::multihead_attention({f32({1, 1, 2}), f32({1, 1, 2})}, {f32({2, 0}), f32({2, 0}), f32({2, 2}), f32({2, 2})}); },
                    Raises::shape, {"multihead_attention", "D must be >= 1", "'w_q'", "[2, 0]"}}};
    const std::vector<std::string> fields{"query", "context", "w_q", "w_k", "w_v", "w_o"};
    for (std::size_t missing = 0; missing < fields.size(); ++missing)
      info.errors.push_back(undefined_arg("multihead_attention", fields[missing], [missing] {
        std::vector<Tensor> t{f32({1, 1, 2}), f32({1, 1, 2}), f32({2, 2}), f32({2, 2}), f32({2, 2}), f32({2, 2})};
        t[missing] = Tensor();
        tg::multihead_attention({t[0], t[1]}, {t[2], t[3], t[4], t[5]});
      }));
    info.undefined_inputs_unreachable = "op builds the masks from the inputs' sizes";
    t.push_back(info);
  }
  {
    // The layer: forward on its own seeded weights equals multihead_attention with them.
    OpInfo info;
    info.name = "MultiHeadAttention";
    info.covers = {"MultiHeadAttention"};
    info.samples = {{{2, 4, 6}}, {{1, 1, 6}}};
    auto layer = [](tg::DType dtype) { return tg::MultiHeadAttention({.query_dim = 6, .heads = 3, .head_dim = 2, .value_head_dim = 1, .out_dim = 5, .dtype = dtype, .seed = 7}); };
    info.op = [layer](const Ins& in) {
      tg::MultiHeadAttention l = layer(in[0].dtype());
      for (const Tensor& p : l.parameters()) arg(p);
      auto [out, attn] = l.forward(in[0], {.masking = {.causal = true}, .need_weights = true});
      return Outs{out, attn};
    };
    info.reference = [layer](const Refs& in) {
      const auto w = layer(tg::float64).weights();
      tg::NoGradGuard no_grad;
      const Tensor x = tg::from_vector(in[0].v, in[0].shape);
      auto [out, attn] = tg::multihead_attention({x, x}, w, {}, 3, true);
      return Refs{Ref::of(out), Ref::of(attn)};
    };
    info.errors = {{"heads not dividing", [] { tg::MultiHeadAttention({.query_dim = 5, .heads = 2}); }, Raises::value, {"MultiHeadAttention", "heads"}},
                   {"query_dim too large to allocate", [] { tg::MultiHeadAttention({.query_dim = std::numeric_limits<std::int64_t>::max()}); },
                    Raises::value, {"MultiHeadAttention", "'w_q'", "config.query_dim", "more than can be allocated"}},
                   {"heads * head_dim overflowing", [] { tg::MultiHeadAttention({.query_dim = 4, .heads = std::int64_t{1} << 33, .head_dim = std::int64_t{1} << 33}); },
                    Raises::value, {"MultiHeadAttention", "config.heads * config.head_dim", "overflows"}},
                   undefined_arg("MultiHeadAttention::forward", "x", [] { tg::MultiHeadAttention({.query_dim = 2}).forward(Tensor()); }),
                   undefined_arg("MultiHeadAttention::forward", "query", [] { tg::MultiHeadAttention({.query_dim = 2}).forward(Tensor(), f32({1, 1, 2})); }),
                   undefined_arg("MultiHeadAttention::forward", "context", [] { tg::MultiHeadAttention({.query_dim = 2}).forward(f32({1, 1, 2}), Tensor()); })};
    info.undefined_inputs_unreachable = "op makes the layer in the input's dtype";
    t.push_back(info);
  }

  {
    // Property: decoding one position at a time through a KVCache equals the full causal forward.
    OpInfo info;
    info.name = "KVCache decode";
    info.covers = {"KVCache"};
    info.differentiable = false;  // decode records nothing
    info.samples = {{{2, 5, 4}}, {{1, 1, 4}}};
    info.op = [](const Ins& in) {
      tg::MultiHeadAttention layer({.query_dim = 4, .heads = 2, .value_head_dim = 3, .dtype = in[0].dtype(), .seed = 3});
      tg::KVCache cache;
      std::vector<Tensor> steps;
      for (std::int64_t t = 0; t < in[0].size(1); ++t) steps.push_back(layer.decode(tg::slice(in[0], 1, t, t + 1), cache).output);
      return Outs{tg::concat(steps, 1)};
    };
    info.reference = [](const Refs& in) {
      tg::MultiHeadAttention layer({.query_dim = 4, .heads = 2, .value_head_dim = 3, .dtype = tg::float64, .seed = 3});
      const Tensor x = tg::from_vector(in[0].v, in[0].shape);
      return Refs{Ref::of(layer.forward(x, x, {.masking = {.causal = true}}).output)};
    };
    info.errors = {{"query of the wrong width", [] {
                      tg::KVCache cache;
                      tg::MultiHeadAttention({.query_dim = 4}).decode(f32({1, 1, 3}), cache);
                    }, Raises::shape, {"MultiHeadAttention::decode", "'query'", "[1, 1, 3]"}},
                   undefined_arg("MultiHeadAttention::decode", "query", [] {
                     tg::KVCache cache;
                     tg::MultiHeadAttention({.query_dim = 4}).decode(Tensor(), cache);
                   })};
    info.undefined_inputs_unreachable = "op makes the layer in the input's dtype";
    t.push_back(info);
  }
}

}  // namespace tg_test::table
