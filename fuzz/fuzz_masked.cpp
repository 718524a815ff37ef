// libFuzzer target for the guarantee that masked entries have no effect (docs/semantics.md
// §13, "Masked keys really have no effect"): NaN, +-inf and huge values placed where attention may not look must
// leave every output and every gradient exactly as they are with zeros there.
//
// Each input builds one problem, runs it twice (poisoned, and with the same entries replaced by
// 0) with the same finite upstream gradients, and compares all results value for value:
//  - scaled_dot_product_attention with broadcast leading dims and a random, broadcast or causal
//    mask: q rows that attend to nothing, k and v rows no query attends to (in any broadcast
//    position), and the upstream gradients of empty rows and of disallowed weights;
//  - multihead_attention and the MultiHeadAttention layer (cross or self, key/query/attention
//    masks, causal offsets, bias of several shapes): query rows of inactive queries, context rows
//    no query uses, bias entries whose every broadcast position is masked. Their own gradients
//    must be exactly 0 too.
// The zeroed run has finite, moderate inputs, so its results must be finite as well.
#include <algorithm>
#include <array>
#include <optional>

#include "fuzz_support.hpp"

namespace {
using namespace fuzz;

double poison(Input& in) {
  static constexpr double kPoisons[] = {NAN, HUGE_VAL, -HUGE_VAL, 1e300, -1e300, 3e38};
  return in.pick(kPoisons);
}

// The element of a tensor of shape `s` that position `at` of a larger broadcast shape reads.
std::int64_t broadcast_index(const Shape& s, const Shape& full, const Shape& at) {
  std::int64_t i = 0;
  for (std::size_t d = 0; d < s.size(); ++d) i = i * s[d] + (s[d] == 1 ? 0 : at[d + full.size() - s.size()]);
  return i;
}

Shape unravel(std::int64_t i, const Shape& s) {
  Shape at(s.size());
  for (std::size_t d = s.size(); d-- > 0; i /= s[d]) at[d] = i % s[d];
  return at;
}

// A float64 input of one problem: its values, which elements are masked out ("free": they may
// hold anything) and which of those are poisoned, with what.
struct Operand {
  Shape shape;
  std::vector<double> v;
  std::vector<bool> free, chosen;
  std::vector<double> bad;
  bool grad = true;  // a leaf that requires grad (not an upstream gradient)

  Operand(Input& in, Shape s, double lo = -2.0, double hi = 2.0) : shape(std::move(s)) {
    v.resize(static_cast<std::size_t>(numel_of(shape)));
    for (auto& x : v) x = in.finite(lo, hi);
    free.assign(v.size(), false);
    chosen.assign(v.size(), false);
    bad.assign(v.size(), 0.0);
  }
  std::size_t poisoned() const { return static_cast<std::size_t>(std::count(chosen.begin(), chosen.end(), true)); }
  // The poisoned run puts the poisons in, the zeroed run zeros in the same places.
  Tensor make(bool poisoned_run, tg::DType dtype) const {
    std::vector<double> x = v;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (chosen[i]) x[i] = poisoned_run ? bad[i] : 0.0;
    Tensor t = tg::from_vector(x, shape).to(dtype);
    if (grad) t.set_requires_grad();
    return t;
  }
};

struct Run {
  std::vector<std::vector<double>> results;
  std::vector<std::string> names;
  void add(const char* name, const Tensor& t) {
    names.emplace_back(name);
    results.push_back(values(t));
  }
};

void compare(const Run& poisoned, const Run& zeroed, const char* op) {
  for (std::size_t i = 0; i < zeroed.results.size(); ++i) {
    for (double x : zeroed.results[i]) require(std::isfinite(x), "{}: {} is not finite in the zeroed run", op, zeroed.names[i]);
    require(same_values(poisoned.results[i], zeroed.results[i]), "{}: {} differs when masked entries hold NaN/inf:\npoisoned {}\nzeroed   {}",
            op, zeroed.names[i], poisoned.results[i], zeroed.results[i]);
  }
}

struct Fuzzer {
  Input& in;
  tg::DType dtype = tg::float64;

  // Chooses which free elements of `op` to poison (whole rows of `row` elements or single ones).
  // Once the input's bytes run out every free element is poisoned (with NaN).
  void choose(Operand& op, std::int64_t row) {
    const bool whole_rows = !in.flag();
    for (std::size_t r = 0; r < op.v.size(); r += static_cast<std::size_t>(row)) {
      const bool pick_row = !in.flag();
      for (std::size_t i = r; i < r + static_cast<std::size_t>(row); ++i)
        if (op.free[i] && (whole_rows ? pick_row : !in.flag())) {
          op.chosen[i] = true;
          op.bad[i] = poison(in);
        }
    }
  }

  // Mostly false, so that rows and columns attend to nothing often.
  Tensor mask(const Shape& s) {
    std::vector<bool> v(static_cast<std::size_t>(numel_of(s)));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = in.in(0, 2) == 0;
    return tg::from_bools(v, s);
  }

  // A leading shape for one operand of a broadcast over `lead`: some dims 1, some dropped.
  Shape sub_lead(const Shape& lead) {
    Shape s(lead.begin() + in.in<std::ptrdiff_t>(0, static_cast<std::ptrdiff_t>(lead.size())), lead.end());
    for (auto& d : s)
      if (in.in(0, 3) == 0) d = 1;
    return s;
  }

  // ---- scaled_dot_product_attention -------------------------------------------------------

  void sdpa() {
    Shape lead(in.in<std::size_t>(0, 2));
    for (auto& d : lead) d = in.in<std::int64_t>(1, 3);
    const std::int64_t q = in.in(1, 4), k = in.in(1, 4), d = in.in(1, 3), dv = in.in(1, 3);
    dtype = in.float_dtype();
    const bool both = in.flag();  // backward from the output and the weights, or the output only
    auto with = [](Shape s, std::int64_t a, std::int64_t b) {
      s.push_back(a);
      s.push_back(b);
      return s;
    };
    const Shape lq = sub_lead(lead), lk = sub_lead(lead), lv = sub_lead(lead);
    Operand oq(in, with(lq, q, d)), ok(in, with(lk, k, d)), ov(in, with(lv, k, dv));
    // The mask: random bools of a broadcast shape, whole rows or columns, causal, or the causal
    // rule with a sliding window given as options (never materialised by the op).
    Tensor mask;
    Shape mshape;
    const int kind = in.in(0, 5);
    std::int64_t offset = 0, window = 0;
    if (kind == 4) {
      mask = tg::causal_mask(q, k, in.in<std::int64_t>(-4, 4));
    } else if (kind == 5) {
      offset = in.in<std::int64_t>(-4, 4);
      window = in.in<std::int64_t>(1, 4);
    } else if (kind > 0) {
      mshape = kind == 1 ? with(sub_lead(lead), q, k) : kind == 2 ? Shape{q, 1} : Shape{k};
      mask = this->mask(mshape);
    }
    // The leading dims of the results: the broadcast of the operands' (and the mask's).
    lead = tg::broadcast_shapes(tg::broadcast_shapes(lq, lk), lv);
    if (kind == 1) lead = tg::broadcast_shapes(lead, Shape(mshape.begin(), mshape.end() - 2));
    const Shape full = with(lead, q, k);
    std::vector<bool> allowed(static_cast<std::size_t>(numel_of(full)), true);
    const std::vector<bool> m = mask.defined() ? mask.to_vector<bool>() : std::vector<bool>{};
    std::vector<bool> row_used(static_cast<std::size_t>(numel_of(full) / k)), q_used(oq.v.size() / d), k_used(ok.v.size() / d),
        v_used(ov.v.size() / dv);
    for (std::int64_t p = 0; p < numel_of(full); ++p) {
      const Shape at = unravel(p, full);
      const std::int64_t i = at[at.size() - 2], j = at.back();
      const bool a = kind == 5 ? j <= i + offset && j > i + offset - window
                               : !mask.defined() || m[static_cast<std::size_t>(broadcast_index(mask.shape(), full, at))];
      allowed[static_cast<std::size_t>(p)] = a;
      if (!a) continue;
      Shape row = at, key = at;
      row.back() = 0;  // column 0 stands for the row (its last dim is D, not K)
      key[key.size() - 2] = at.back();
      key.back() = 0;
      row_used[static_cast<std::size_t>(p / k)] = true;
      q_used[static_cast<std::size_t>(broadcast_index(oq.shape, full, row) / d)] = true;
      k_used[static_cast<std::size_t>(broadcast_index(ok.shape, full, key) / d)] = true;
      v_used[static_cast<std::size_t>(broadcast_index(ov.shape, full, key) / dv)] = true;
    }
    for (std::size_t i = 0; i < oq.v.size(); ++i) oq.free[i] = !q_used[i / static_cast<std::size_t>(d)];
    for (std::size_t i = 0; i < ok.v.size(); ++i) ok.free[i] = !k_used[i / static_cast<std::size_t>(d)];
    for (std::size_t i = 0; i < ov.v.size(); ++i) ov.free[i] = !v_used[i / static_cast<std::size_t>(dv)];
    // Upstream gradients: finite, except at empty rows (d_out) and disallowed weights (d_w).
    Operand d_out(in, with(lead, q, dv)), d_w(in, full);
    d_out.grad = d_w.grad = false;
    for (std::size_t i = 0; i < d_out.v.size(); ++i) d_out.free[i] = !row_used[i / static_cast<std::size_t>(dv)];
    for (std::size_t i = 0; i < d_w.v.size(); ++i) d_w.free[i] = !allowed[i];
    for (auto [op, row] : std::array<std::pair<Operand*, std::int64_t>, 5>{{{&oq, d}, {&ok, d}, {&ov, dv}, {&d_out, dv}, {&d_w, k}}})
      choose(*op, row);
    // ALiBi's slopes, finite and learnable, when q carries the scores' head dim (dim -3).
    std::vector<double> slopes;
    if (lq.size() >= 1 && lq.size() == lead.size() && lq.back() == lead.back() && in.flag())
      for (std::int64_t h = 0; h < lead.back(); ++h) slopes.push_back(in.in(0, 8) / 8.0);
    auto run = [&](bool poisoned) {
      const Tensor tq = oq.make(poisoned, dtype), tk = ok.make(poisoned, dtype), tv = ov.make(poisoned, dtype);
      Tensor ts;
      if (!slopes.empty()) {
        ts = tg::from_vector(std::span<const double>(slopes), {static_cast<std::int64_t>(slopes.size())}).to(dtype);
        ts.set_requires_grad();
      }
      auto [out, w] = kind == 5 || ts.defined()
                          ? tg::scaled_dot_product_attention(
                                tq, tk, tv, {.masking = {.mask = mask, .causal = kind == 5, .causal_offset = offset, .window = window, .alibi_slopes = ts},
                                                 .need_weights = true})
                          : tg::scaled_dot_product_attention(tq, tk, tv, mask);
      if (both) tg::backward({out, w}, {d_out.make(poisoned, dtype), d_w.make(poisoned, dtype)});
      else tg::backward({out}, {d_out.make(poisoned, dtype)});
      Run r;
      r.add("output", out);
      r.add("weights", w);
      r.add("dq", tq.grad());
      r.add("dk", tk.grad());
      r.add("dv", tv.grad());
      if (ts.defined()) r.add("dslopes", ts.grad());
      tg::clear_tape();
      return r;
    };
    narrate("sdpa lead {} q {} k {} d {} dv {} mask {} ({}, offset {} window {}, {} slopes) {}: poisoned q {} k {} v {} d_out {} d_w {}", lead, q, k, d, dv, kind, mshape,
            offset, window, slopes.size(), dtype, oq.poisoned(), ok.poisoned(), ov.poisoned(), d_out.poisoned(), d_w.poisoned());
    compare(run(true), run(false), "scaled_dot_product_attention");
  }

  // ---- multihead_attention and the layer ----------------------------------------------------

  void mha() {
    const std::int64_t b = in.in(1, 2), q = in.in(1, 3), k = in.in(1, 3), h = in.in(1, 2), d = in.in(1, 2), dv = in.in(1, 2);
    const std::int64_t cq = in.in(1, 3), cout = in.in(1, 3);
    const bool layer = in.flag(), self = layer && in.flag();
    const std::int64_t cc = self ? cq : in.in(1, 3), kk = self ? q : k;
    dtype = in.float_dtype();
    tg::MhaMasks masks;
    if (in.in(0, 3) != 0) masks.key_mask = mask({b, kk});
    if (in.in(0, 3) != 0) masks.query_mask = mask({b, q});
    if (in.flag()) {
      const int s = in.in(0, 2);
      masks.attention_mask = mask(s == 0 ? Shape{b, h, q, kk} : s == 1 ? Shape{q, kk} : Shape{1, h, 1, kk});
    }
    const bool causal = in.flag();
    const std::int64_t offset = in.in<std::int64_t>(-3, 3);
    Shape bias_shape;
    if (in.flag()) bias_shape = in.flag() ? Shape{b, h, q, kk} : in.flag() ? Shape{1, h, 1, kk} : Shape{q, kk};
    // allowed[b, h, i, j] as documented (step 4), and what it leaves unused.
    const Shape full{b, h, q, kk};
    std::vector<bool> active(static_cast<std::size_t>(b * q)), used(static_cast<std::size_t>(b * kk)),
        bias_used(static_cast<std::size_t>(numel_of(bias_shape)));
    auto bits = [](const Tensor& t) { return t.defined() ? t.to_vector<bool>() : std::vector<bool>{}; };
    const auto km = bits(masks.key_mask), qm = bits(masks.query_mask), am = bits(masks.attention_mask);
    for (std::int64_t p = 0; p < numel_of(full); ++p) {
      const Shape at = unravel(p, full);
      const std::int64_t bi = at[0], i = at[2], j = at[3];
      bool a = (km.empty() || km[static_cast<std::size_t>(bi * kk + j)]) && (qm.empty() || qm[static_cast<std::size_t>(bi * q + i)]);
      a = a && (am.empty() || am[static_cast<std::size_t>(broadcast_index(masks.attention_mask.shape(), full, at))]);
      a = a && (!causal || j - i <= offset);
      if (!a) continue;
      active[static_cast<std::size_t>(bi * q + i)] = true;
      used[static_cast<std::size_t>(bi * kk + j)] = true;
      if (!bias_shape.empty()) bias_used[static_cast<std::size_t>(broadcast_index(bias_shape, full, at))] = true;
    }
    Operand x(in, {b, q, cq}), ctx(in, {b, kk, cc});
    std::optional<Operand> bias;
    if (!bias_shape.empty()) bias.emplace(in, bias_shape);
    for (std::size_t i = 0; i < x.v.size(); ++i) {
      x.free[i] = !active[i / static_cast<std::size_t>(cq)];
      if (self) x.free[i] = x.free[i] && !used[i / static_cast<std::size_t>(cq)];  // x is the context too
    }
    for (std::size_t i = 0; i < ctx.v.size(); ++i) ctx.free[i] = !used[i / static_cast<std::size_t>(cc)];
    if (bias)
      for (std::size_t i = 0; i < bias->v.size(); ++i) bias->free[i] = !bias_used[i];
    choose(x, cq);
    choose(ctx, cc);
    if (bias) choose(*bias, 1);
    Operand d_out(in, {b, q, cout}), d_attn(in, full);
    d_out.grad = d_attn.grad = false;
    // The function's parameters; the layer makes its own from a seed (one layer per run, so that
    // gradients do not accumulate across the runs).
    std::vector<Operand> params;
    const bool biases = in.flag();
    for (const Shape& s : {Shape{cq, h * d}, Shape{cc, h * d}, Shape{cc, h * dv}, Shape{h * dv, cout}, Shape{h * d}, Shape{h * d}, Shape{h * dv}, Shape{cout}})
      if (params.size() < 4 || biases)
        params.emplace_back(in, s, -1.0, 1.0);
    const std::uint64_t seed = in.in<std::uint64_t>(0, 99);
    narrate("mha b {} q {} k {} h {} d {} dv {} cq {} cc {} cout {} layer {} self {} causal {} offset {} bias {} {}: poisoned query {} "
            "context {} bias {}",
            b, q, kk, h, d, dv, cq, cc, cout, layer, self, causal, offset, bias_shape, dtype, x.poisoned(), self ? 0 : ctx.poisoned(),
            bias ? bias->poisoned() : 0);
    auto run = [&](bool poisoned) {
      const Tensor tx = x.make(poisoned, dtype), tc = self ? tx : ctx.make(poisoned, dtype);
      const Tensor tb = bias ? bias->make(poisoned, dtype) : Tensor();
      std::vector<Tensor> ps;
      tg::AttentionResult r;
      std::optional<tg::MultiHeadAttention> mod;
      if (layer) {
        mod.emplace(tg::MultiHeadAttentionConfig{.query_dim = cq, .heads = h, .context_dim = cc, .head_dim = d, .value_head_dim = dv,
                                                 .out_dim = cout, .bias = biases, .dtype = dtype, .seed = seed});
        ps = mod->parameters();
        const tg::MhaCall call{{.mask = masks.attention_mask, .key_mask = masks.key_mask, .query_mask = masks.query_mask, .causal = causal,
                                .causal_offset = offset},
                               tb,
                               /*need_weights=*/true};
        r = self ? mod->forward(tx, call) : mod->forward(tx, tc, call);
      } else {
        for (const auto& p : params) ps.push_back(p.make(poisoned, dtype));
        tg::MhaParameters mp{ps[0], ps[1], ps[2], ps[3]};
        if (biases) mp.b_q = ps[4], mp.b_k = ps[5], mp.b_v = ps[6], mp.b_o = ps[7];
        r = tg::multihead_attention({tx, tc, tb}, mp, masks, h, causal, offset);
      }
      tg::backward({r.output, r.weights}, {d_out.make(false, dtype), d_attn.make(false, dtype)});
      Run out;
      out.add("output", r.output);
      out.add("attention", r.weights);
      out.add("d query", tx.grad());
      if (!self) out.add("d context", tc.grad());
      if (tb.defined()) out.add("d bias", tb.grad());
      for (const auto& p : ps) out.add("d parameter", p.grad());
      // A poisoned entry's own gradient is exactly 0.
      for (auto [op, t] : {std::pair{&x, tx}, std::pair{&ctx, tc}}) {
        if (self && op == &ctx) continue;
        const auto g = values(t.grad());
        for (std::size_t i = 0; i < g.size(); ++i)
          require(!op->chosen[i] || g[i] == 0.0, "the gradient of a masked-out input entry is {}, not 0", g[i]);
      }
      tg::clear_tape();
      return out;
    };
    compare(run(true), run(false), layer ? "MultiHeadAttention" : "multihead_attention");
  }

  void run() {
    if (in.flag()) sdpa();
    else mha();
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return run_one(data, size, [](Input& in) { Fuzzer{in}.run(); });
}
