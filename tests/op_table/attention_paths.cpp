// The attention path as a dimension of the op table: one entry per implementation of
// scaled_dot_product_attention (the reference and every fast path that float64 reaches) and per
// masking: the masks (a pair mask, key and query masks), the causal rule with an offset, a
// window, a bias and ALiBi slopes, each alone and together. Every entry runs the same samples
// against one float64 reference written here in plain loops, in every layout, float32 against
// float64, to first and second order. The blocks compute in float32 only: their entries run the
// reference in float64, so that their float32 results are checked against it in every layout.
// (bfloat16 products, grouped heads and rows of several key tiles: test_attention_variants.)
#include "ops/attention_core.hpp"
#include "op_table/common.hpp"

namespace tg_test::table {
namespace {

using tg::detail::AttentionPath;

struct PathCase {
  const char* name;
  AttentionPath path;
  std::int64_t block_rows;  // the blocks' rows, small so that several run
  bool weights;             // the path returns the weights
  bool float32_only;        // the blocks: float64 runs the reference (float32 is checked against it)
};
std::vector<PathCase> path_cases() {
  return {{"reference", AttentionPath::reference, 0, true, false},
          {"weights", AttentionPath::weights, 0, true, false},
          {"pipelined (blocks of 2 rows)", AttentionPath::blocks, 2, true, true},
          {"fused_blocks (blocks of 2 rows)", AttentionPath::fused_blocks, 2, false, true},
          {"tiles", AttentionPath::tiles, 0, false, false}};
}

// One masking of the scores. Windows and offsets are small against the samples' 1-6 keys, so
// that rows are cut on both sides. No offset is negative: the write-after-record check writes
// into the first output row, which must see a key (test_attention_variants has the queries that
// see none before the causal rule lets them).
struct MaskingCase {
  const char* name;
  bool causal;
  std::int64_t offset, window;  // window 0: none
  bool masks, bias, alibi;      // the pair, key and query masks; a learnable bias; ALiBi slopes
};
std::vector<MaskingCase> masking_cases() {
  return {{"window 3, offset 1, masks, bias, ALiBi", true, 1, 3, true, true, true},
          {"window 2 alone", true, 0, 2, false, false, false},
          {"window 20 (wider than the rows), offset 2", true, 2, 20, false, false, false},
          {"ALiBi alone, not causal", false, 0, 0, false, false, true},
          {"ALiBi, causal, offset 3", true, 3, 0, false, false, true},
          {"bias and ALiBi without masks, window 2, offset 1", true, 1, 2, false, true, true},
          {"masks alone, not causal", false, 0, 0, true, false, false}};
}

// The masks, a pure function of the indices: pairs[b][i][j] (shared by the heads), keys[b][j],
// queries[b][i]. Query 0 of batch 1 is masked; keys are masked where (b + 2 j) % 5 == 4.
bool pair_allowed(std::int64_t b, std::int64_t i, std::int64_t j) { return (b + 3 * i + 5 * j) % 7 != 3; }
bool key_allowed(std::int64_t b, std::int64_t j) { return (b + 2 * j) % 5 != 4; }
bool query_allowed(std::int64_t b, std::int64_t i) { return !(b == 1 && i == 0); }
bool allowed(const MaskingCase& m, std::int64_t b, std::int64_t i, std::int64_t j) {
  const std::int64_t p = i + m.offset;
  if (m.causal && j > p) return false;
  if (m.window > 0 && j <= p - m.window) return false;
  return !m.masks || (pair_allowed(b, i, j) && key_allowed(b, j) && query_allowed(b, i));
}

Tensor bools(std::int64_t rows, std::int64_t cols, const std::function<bool(std::int64_t, std::int64_t)>& f) {
  std::vector<bool> v;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) v.push_back(f(r, c));
  return arg(tg::from_bools(v, {rows, cols}));
}

// q [B, H, Q, D], k [B', H, K, D], v [B', H, K, Dv] (B' = B or 1), then bias [1, H, Q, K] and
// slopes [H] where the masking has them.
Outs run_path(const PathCase& c, const MaskingCase& mc, const Ins& in) {
  const std::int64_t b = in[0].size(0), q = in[0].size(2), k = in[1].size(2);
  tg::AttentionMasking m{.causal = mc.causal, .causal_offset = mc.offset, .window = mc.window};
  if (mc.masks) {
    std::vector<bool> pairs;
    for (std::int64_t n = 0; n < b; ++n)
      for (std::int64_t i = 0; i < q; ++i)
        for (std::int64_t j = 0; j < k; ++j) pairs.push_back(pair_allowed(n, i, j));
    m.mask = arg(tg::from_bools(pairs, {b, 1, q, k}));
    m.key_mask = bools(b, k, key_allowed);
    m.query_mask = bools(b, q, query_allowed);
  }
  const Tensor bias = mc.bias ? in[3] : Tensor();
  if (mc.alibi) m.alibi_slopes = in.back();
  const AttentionPath path = c.float32_only && in[0].dtype() != tg::float32 ? AttentionPath::reference : c.path;
  const auto r = tg::detail::attention_core({"attention", in[0], in[1], in[2], bias, c.weights}, m, path, c.block_rows);
  return c.weights ? Outs{r.output, r.weights} : Outs{r.output};
}

Refs reference(const PathCase& c, const MaskingCase& mc, const Refs& in) {
  const Ref &q = in[0], &k = in[1], &v = in[2];
  const Ref* bias = mc.bias ? &in[3] : nullptr;
  const Ref* slopes = mc.alibi ? &in.back() : nullptr;
  const std::int64_t nb = q.shape[0], nh = q.shape[1], nq = q.shape[2], d = q.shape[3], nk = k.shape[2], dv = v.shape[3];
  const bool kb = k.shape[0] != 1;  // k and v have the batch (else they broadcast over it)
  Ref out{{nb, nh, nq, dv}, std::vector<double>(static_cast<std::size_t>(nb * nh * nq * dv), 0.0)};
  Ref w{{nb, nh, nq, nk}, std::vector<double>(static_cast<std::size_t>(nb * nh * nq * nk), 0.0)};
  auto at = [](const Ref& r, std::int64_t a, std::int64_t b2, std::int64_t c2, std::int64_t e) {
    return r.v[static_cast<std::size_t>(((a * r.shape[1] + b2) * r.shape[2] + c2) * r.shape[3] + e)];
  };
  for (std::int64_t b = 0; b < nb; ++b)
    for (std::int64_t h = 0; h < nh; ++h)
      for (std::int64_t i = 0; i < nq; ++i) {
        std::vector<double> s(static_cast<std::size_t>(nk));
        double m = -INFINITY;
        for (std::int64_t j = 0; j < nk; ++j) {
          if (!allowed(mc, b, i, j)) continue;
          double x = 0;
          for (std::int64_t e = 0; e < d; ++e) x += at(q, b, h, i, e) * at(k, kb ? b : 0, h, j, e);
          x /= std::sqrt(static_cast<double>(d));
          if (bias) x += at(*bias, 0, h, i, j);
          if (slopes) x -= slopes->v[static_cast<std::size_t>(h)] * static_cast<double>(std::abs(i + mc.offset - j));
          s[static_cast<std::size_t>(j)] = x;
          m = std::max(m, x);
        }
        double z = 0;  // a row with no allowed key stays zeros
        for (std::int64_t j = 0; j < nk; ++j) z += allowed(mc, b, i, j) ? std::exp(s[static_cast<std::size_t>(j)] - m) : 0.0;
        for (std::int64_t j = 0; j < nk; ++j) {
          const double a = allowed(mc, b, i, j) ? std::exp(s[static_cast<std::size_t>(j)] - m) / z : 0.0;
          w.v[static_cast<std::size_t>(((b * nh + h) * nq + i) * nk + j)] = a;
          for (std::int64_t e = 0; e < dv; ++e) out.v[static_cast<std::size_t>(((b * nh + h) * nq + i) * dv + e)] += a * at(v, kb ? b : 0, h, j, e);
        }
      }
  return c.weights ? Refs{out, w} : Refs{out};
}

// q, k, v, then the bias's and the slopes' shapes where the masking has them.
std::vector<Shape> sample(const MaskingCase& mc, std::vector<Shape> qkv, const Shape& bias, const Shape& slopes) {
  if (mc.bias) qkv.push_back(bias);
  if (mc.alibi) qkv.push_back(slopes);
  return qkv;
}

}  // namespace

void add_attention_paths(std::vector<OpInfo>& t) {
  for (const PathCase& c : path_cases())
    for (const MaskingCase& mc : masking_cases()) {
      OpInfo info;
      info.name = fmt::format("attention path {}, {}", c.name, mc.name);
      info.covers = {"scaled_dot_product_attention"};
      // B 2, H 2; Q < K, Q > K, k and v broadcast over the batch, one key, and an empty batch.
      info.samples = {sample(mc, {{2, 2, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 3}}, {1, 2, 3, 5}, {2}),
                      sample(mc, {{2, 2, 5, 3}, {2, 2, 4, 3}, {2, 2, 4, 2}}, {1, 2, 5, 4}, {2}),
                      sample(mc, {{2, 2, 4, 2}, {1, 2, 6, 2}, {1, 2, 6, 3}}, {1, 2, 4, 6}, {2}),
                      sample(mc, {{2, 1, 2, 3}, {2, 1, 1, 3}, {2, 1, 1, 2}}, {1, 1, 2, 1}, {1}),
                      sample(mc, {{0, 2, 3, 4}, {0, 2, 5, 4}, {0, 2, 5, 3}}, {1, 2, 3, 5}, {2})};
      info.op = [c, mc](const Ins& in) { return run_path(c, mc, in); };
      info.reference = [c, mc](const Refs& in) { return reference(c, mc, in); };
      info.undefined_inputs_unreachable = "op builds the masks from q's and k's sizes (test_attention_variants names each undefined argument)";
      t.push_back(info);
    }
}

}  // namespace tg_test::table
