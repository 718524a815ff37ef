// multihead_attention: projections, head split, the attention core, head merge, output
// projection, and the suppression of queries that may attend to nothing.
#include "tapegrad/ops/multihead_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/attention_core.hpp"
#include "ops/grouped_heads.hpp"
#include "ops/multihead_attention_detail.hpp"
#include "ops/op.hpp"
#include "kernels/weighted_matmul.hpp"
#include "tapegrad/ops/compare.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/matmul.hpp"
#include "tapegrad/ops/view.hpp"
#include "tapegrad/ops/where.hpp"

namespace tapegrad {
namespace detail {
namespace {

// `rows_from` says where the row count comes from, for the message.
void check_matrix(const char* op, const char* name, const Tensor& w, std::int64_t rows, DType dtype,
                  const std::string& rows_from = {}) {
  check_floating(op, name, w);
  if (w.dim() != 2 || (rows >= 0 && w.size(0) != rows))
    fail<ShapeError>("{}: argument '{}' must be a matrix with {} rows{}, got shape {}", op, name,
                     rows >= 0 ? fmt::format("{}", rows) : std::string("any number of"),
                     rows_from.empty() ? "" : " (" + rows_from + ")", shape_str(w.shape()));
  if (w.dtype() != dtype)
    fail<DTypeError>("{}: argument '{}' ({}) is {} but 'query' is {}; convert it with to()", op, name, shape_str(w.shape()),
                     w.dtype(), dtype);
}

void check_vector(const char* op, const char* name, const Tensor& b, std::int64_t size, DType dtype) {
  if (!b.defined()) return;
  check_floating(op, name, b);
  if (b.shape() != Shape{size})
    fail<ShapeError>("{}: argument '{}' must have shape [{}], got {}", op, name, size, shape_str(b.shape()));
  if (b.dtype() != dtype)
    fail<DTypeError>("{}: argument '{}' ({}) is {} but 'query' is {}; convert it with to()", op, name, shape_str(b.shape()),
                     b.dtype(), dtype);
}

void check_mask(const char* op, const char* name, const Tensor& m, const Shape& shape, bool exact) {
  if (!m.defined()) return;
  check_dtype(op, name, m, DType::bool_);
  const bool fits = exact ? m.shape() == shape : broadcast_args(op, "attention shape", shape, name, m.shape()) == shape;
  if (!fits)
    fail<ShapeError>("{}: argument '{}' must {} {}, got shape {}", op, name, exact ? "have shape" : "broadcast to",
                     shape_str(shape), shape_str(m.shape()));
}

}  // namespace

Tensor split_heads(const Tensor& x, std::int64_t heads) {
  return permute(reshape(x, {x.size(0), x.size(1), heads, x.size(2) / heads}), {0, 2, 1, 3});
}

Tensor rows_where(const Tensor& rows, const Tensor& x) {
  return rows.defined() ? where(unsqueeze(rows, -1), x, scalar(0.0, x.dtype())) : x;
}

namespace {

// Whether every row of x [B, L, C] that `rows` [B, L] leaves out is finite.
bool left_out_rows_finite(const Tensor& rows, const Tensor& x) {
  const bool* keep = static_cast<const bool*>(rows.raw_data());  // a fresh contiguous mask
  return visit_float(x.dtype(), "multihead_attention", [&]<class T>(Tag<T>) {
    const T* p = static_cast<const T*>(x.raw_data());
    const std::int64_t len = x.size(1), c = x.size(2), s0 = x.strides()[0], s1 = x.strides()[1], s2 = x.strides()[2];
    for (std::int64_t b = 0; b < x.size(0); ++b)
      for (std::int64_t i = 0; i < len; ++i) {
        if (keep[b * len + i]) continue;
        const T* row = p + b * s0 + i * s1;
        if (s2 == 1) {
          if (!all_finite_run(row, c)) return false;
          continue;
        }
        for (std::int64_t j = 0; j < c; ++j)
          if (!std::isfinite(row[j * s2])) return false;
      }
    return true;
  });
}

// x with the rows that `rows` leaves out set to 0 when one of them is not finite, else x.
Tensor zero_left_out_rows(const Tensor& rows, const Tensor& x) {
  return !rows.defined() || left_out_rows_finite(rows, x) ? x : rows_where(rows, x);
}

}  // namespace

Tensor project(const Tensor& x, const Tensor& w, const Tensor& b) {
  Tensor y = matmul(x, w);
  return b.defined() ? add(y, b) : y;
}

namespace {

// The options that are not shapes: heads, kv_heads, the window. Returns Hkv.
std::int64_t check_options(const char* op, const MhaOptions& o) {
  if (o.heads < 1) fail<ValueError>("{}: argument 'heads' must be >= 1, got {}", op, o.heads);
  if (o.kv_heads < 0 || (o.kv_heads > 0 && o.heads % o.kv_heads != 0))
    fail<ValueError>("{}: argument 'kv_heads' must divide heads = {} (or be 0 for heads), got {}", op, o.heads, o.kv_heads);
  if (o.window < 0) fail<ValueError>("{}: argument 'window' must be >= 0 (0: no window), got {}", op, o.window);
  if (o.window > 0 && !o.causal)
    fail<ValueError>("{}: argument 'window' = {} needs causal = true (the window reaches back from each query's causal end)", op,
                     o.window);
  return o.kv_heads == 0 ? o.heads : o.kv_heads;
}

// The key/value projections' widths: Hkv*D for w_k, a multiple of Hkv for w_v. With Hkv = H the
// messages are the plain multi-head ones.
void check_kv_widths(const char* op, const MhaParameters& p, const MhaShapes& s) {
  if (s.hkv == s.h) {
    if (p.w_k.size(1) != p.w_q.size(1))
      fail<ShapeError>("{}: arguments 'w_q' {} and 'w_k' {} must project to the same width H*D", op, shape_str(p.w_q.shape()),
                       shape_str(p.w_k.shape()));
    if (p.w_v.size(1) % s.h != 0)
      fail<ShapeError>("{}: heads = {} must divide the projection width of 'w_v', shape {}", op, s.h, shape_str(p.w_v.shape()));
    return;
  }
  if (p.w_k.size(1) != s.hkv * s.d)
    fail<ShapeError>("{}: argument 'w_k' {} must project to kv_heads * D = {} * {} = {} ('w_q' {} gives D = {} with heads = {})", op,
                     shape_str(p.w_k.shape()), s.hkv, s.d, s.hkv * s.d, shape_str(p.w_q.shape()), s.d, s.h);
  if (p.w_v.size(1) % s.hkv != 0)
    fail<ShapeError>("{}: kv_heads = {} must divide the projection width of 'w_v', shape {}", op, s.hkv, shape_str(p.w_v.shape()));
}

// ALiBi's slopes: floating [H], query's dtype.
void check_slopes(const char* op, const Tensor& slopes, std::int64_t heads, DType dtype) {
  if (!slopes.defined()) return;
  check_floating(op, "alibi_slopes", slopes);
  if (slopes.shape() != Shape{heads})
    fail<ShapeError>("{}: argument 'alibi_slopes' must have shape [heads] = [{}], one slope per query head, got {}", op, heads,
                     shape_str(slopes.shape()));
  if (slopes.dtype() != dtype)
    fail<DTypeError>("{}: argument 'alibi_slopes' is {} but 'query' is {}; convert it with to()", op, slopes.dtype(), dtype);
}

}  // namespace

MhaShapes check_mha(const char* op, const MhaActivations& a, const MhaParameters& p, const MhaMasks& m, const MhaOptions& o,
                    std::int64_t context_length) {
  check_floating(op, "query", a.query);
  const DType dtype = a.query.dtype();
  if (a.query.dim() != 3) fail<ShapeError>("{}: argument 'query' must be [B, Q, Cq], got shape {}", op, shape_str(a.query.shape()));
  const std::int64_t heads = o.heads;
  MhaShapes s{op, a.query.size(0), a.query.size(1), context_length, heads, 0, 0, 0, check_options(op, o)};
  check_matrix(op, "w_q", p.w_q, a.query.size(2), dtype, fmt::format("Cq, the last dim of 'query' {}", shape_str(a.query.shape())));
  check_matrix(op, "w_k", p.w_k, -1, dtype);
  check_matrix(op, "w_v", p.w_v, p.w_k.size(0), dtype, fmt::format("Cctx, as 'w_k' {} has", shape_str(p.w_k.shape())));
  if (p.w_q.size(1) % heads != 0)
    fail<ShapeError>("{}: heads = {} must divide the projection width of 'w_q', shape {}", op, heads, shape_str(p.w_q.shape()));
  s.d = p.w_q.size(1) / heads;
  check_kv_widths(op, p, s);
  s.dv = p.w_v.size(1) / s.hkv;
  if (s.d < 1)
    fail<ShapeError>("{}: the per-head query/key width D must be >= 1, got 'w_q' {} with heads = {}", op, shape_str(p.w_q.shape()),
                     heads);
  // H*Dv: the heads' outputs concatenated, w_o's rows (w_v's width when Hkv = H).
  std::int64_t merged = 0;
  if (__builtin_mul_overflow(heads, s.dv, &merged))
    fail<ShapeError>("{}: heads * Dv = {} * {} overflows int64 ('w_v' {}, kv_heads = {})", op, heads, s.dv, shape_str(p.w_v.shape()), s.hkv);
  check_matrix(op, "w_o", p.w_o, merged, dtype, fmt::format("heads * Dv = {} * {}", heads, s.dv));
  s.cout = p.w_o.size(1);
  check_vector(op, "b_q", p.b_q, heads * s.d, dtype);
  check_vector(op, "b_k", p.b_k, s.hkv * s.d, dtype);
  check_vector(op, "b_v", p.b_v, s.hkv * s.dv, dtype);
  check_vector(op, "b_o", p.b_o, s.cout, dtype);
  check_slopes(op, o.alibi_slopes, heads, dtype);
  if (s.b < 1 || s.q < 1 || s.k < 1)
    fail<ShapeError>("{}: B, Q and K must be >= 1, got B = {}, Q = {}, K = {} (query {}, context length {})", op, s.b, s.q, s.k,
                     shape_str(a.query.shape()), s.k);
  const Shape scores{s.b, heads, s.q, s.k};
  check_countable(op, fmt::format("heads = {} gives the attention [B, heads, Q, K] =", heads).c_str(), scores);
  check_mask(op, "key_mask", m.key_mask, {s.b, s.k}, true);
  check_mask(op, "query_mask", m.query_mask, {s.b, s.q}, true);
  check_mask(op, "attention_mask", m.attention_mask, scores, false);
  if (a.bias.defined()) {
    check_floating(op, "bias", a.bias);
    if (a.bias.dtype() != dtype)
      fail<DTypeError>("{}: argument 'bias' is {} but 'query' is {}; convert it with to()", op, a.bias.dtype(), dtype);
    if (broadcast_args(op, "attention shape", scores, "bias", a.bias.shape()) != scores)
      fail<ShapeError>("{}: argument 'bias' must broadcast to {}, got shape {}", op, shape_str(scores), shape_str(a.bias.shape()));
  }
  return s;
}

AllowedPairs allowed_pairs(const MhaMasks& m, const MhaShapes& s, const MhaOptions& o) {
  AllowedPairs out;
  out.mask = {m.attention_mask, m.key_mask, m.query_mask, o.causal, o.causal_offset, o.causal ? o.window : 0};
  if (out.mask.empty()) return out;
  // active[b, i] = any over (h, j) and used[b, j] = any over (h, i) of the allowed pairs, row by
  // row. Without an attention_mask the heads share their rows (one per query), and a row's
  // allowed keys are the key mask's in [begin, end) (the causal end, the window's begin): the
  // row is active when the first allowed key from its begin is below its end, and the keys used
  // are the allowed ones that some active row's [begin, end) covers (with a window and a query
  // mask those intervals may leave gaps). With an attention_mask, each row's keys are read.
  const std::int64_t heads = m.attention_mask.defined() ? s.h : 1;
  const RowMasks rows(s.op, out.mask, {s.b, heads, s.q, s.k});
  out.active = zeros({s.b, s.q}, DType::bool_);
  out.used = zeros({s.b, s.k}, DType::bool_);
  bool* active = static_cast<bool*>(mutable_data(out.active));
  bool* used = static_cast<bool*>(mutable_data(out.used));
  const auto k = static_cast<std::size_t>(s.k);
  std::vector<std::int64_t> next(k + 1);  // next[j]: the first key >= j the key mask allows (s.k: none)
  std::vector<std::int64_t> cover(k + 1);  // +1 where an active row's [begin, end) opens, -1 where it closes
  for (std::int64_t b = 0; b < s.b; ++b) {
    const bool* keys = rows.row(b * heads * s.q).keys;  // the batch's key mask row, or null
    next[k] = s.k;
    for (std::size_t j = k; j-- > 0;) next[j] = keys == nullptr || keys[j] ? static_cast<std::int64_t>(j) : next[j + 1];
    std::fill(cover.begin(), cover.end(), 0);
    for (std::int64_t r = b * heads * s.q; r < (b + 1) * heads * s.q; ++r) {
      const RowMask row = rows.row(r);
      bool* act = active + b * s.q + r % s.q;
      if (row.pairs == nullptr) {
        if (next[static_cast<std::size_t>(row.begin)] < row.end) {
          *act = true;
          ++cover[static_cast<std::size_t>(row.begin)];
          --cover[static_cast<std::size_t>(row.end)];
        }
        continue;
      }
      for (std::int64_t j = row.begin; j < row.end; ++j)
        if (row(j)) *act = used[b * s.k + j] = true;
    }
    std::int64_t open = 0;  // active rows covering key j
    for (std::size_t j = 0; j < k; ++j)
      if ((open += cover[j]) > 0 && next[j] == static_cast<std::int64_t>(j)) used[b * s.k + static_cast<std::int64_t>(j)] = true;
  }
  if (all(out.active)) out.active = Tensor();
  if (all(out.used)) out.used = Tensor();
  return out;
}

AttentionResult attend_projected(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias, const MhaParameters& p,
                                 const AllowedPairs& allowed, const MhaShapes& s, const MhaOptions& o) {
  // Steps 3-5 in the attention core (one tape node), with the bias and ALiBi added to the
  // scores; both paths read the masks row by row. Grouped heads are views (ops/grouped_heads.hpp):
  // q [B, Hkv, G, Q, D] against k, v [B, Hkv, 1, K, D], the attention_mask and the bias split
  // likewise, so that each still holds one entry per query head.
  AttentionArgs args{s.op, q, k, v, bias, allowed.mask, o.need_weights, o.alibi_slopes};
  const bool grouped = s.hkv != s.h;
  if (grouped) {
    args.q = group_queries(q, s.hkv);
    args.k = group_keys(k);
    args.v = group_keys(v);
    args.bias = group_pairs(s.op, "bias", bias, s.h, s.hkv);
    args.mask.allowed = group_pairs(s.op, "attention_mask", allowed.mask.allowed, s.h, s.hkv);
  }
  auto [heads_out, attention] = attention_core(args);
  if (grouped) {
    heads_out = merge_groups(heads_out);  // [B, H, Q, Dv]
    attention = merge_groups(attention);  // [B, H, Q, K]
  }
  // Step 6: concatenate heads in head order, then the output projection (one node).
  Tensor output = merge_heads_project(s.op, heads_out, p.w_o, p.b_o);
  // Step 7: a query with no allowed key in any head is exactly zero, b_o included (selected, so
  // its gradient there is exactly zero too).
  return {rows_where(allowed.active, output), attention};
}

Tensor positions_from(std::int64_t first, std::int64_t n) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    if (__builtin_add_overflow(first, i, &p[static_cast<std::size_t>(i)])) p[static_cast<std::size_t>(i)] = std::numeric_limits<std::int64_t>::max();
  return from_vector(std::span<const std::int64_t>(p), {n});
}

AttentionResult multihead_attention(const char* op, const MhaActivations& a, const MhaParameters& p, const MhaMasks& m,
                                    const MhaOptions& o, const RotaryOptions* rotary) {
  check_floating(op, "context", a.context);
  if (a.context.dim() != 3)
    fail<ShapeError>("{}: argument 'context' must be [B, K, Cctx], got shape {}", op, shape_str(a.context.shape()));
  const MhaShapes s = check_mha(op, a, p, m, o, a.context.size(1));
  if (a.context.size(0) != s.b)
    fail<ShapeError>("{}: arguments 'query' {} and 'context' {} must have the same batch size B", op, shape_str(a.query.shape()),
                     shape_str(a.context.shape()));
  if (a.context.size(2) != p.w_k.size(0))
    fail<ShapeError>("{}: argument 'w_k' {} must have one row per context channel ('context' is {})", op, shape_str(p.w_k.shape()),
                     shape_str(a.context.shape()));
  if (a.context.dtype() != a.query.dtype())
    fail<DTypeError>("{}: arguments 'query' ({}) and 'context' ({}) must have the same dtype", op, a.query.dtype(), a.context.dtype());
  const AllowedPairs allowed = allowed_pairs(m, s, o);
  // Step 1, on zero rows for the queries that attend to nothing and the keys that no query
  // attends to, when one of those rows holds a NaN or inf. Their values reach no output, but a
  // non-finite one would reach the weight gradients: dw_q = query^T dq multiplies a query's row
  // by its zero row of dq, and 0 * NaN is NaN. Selecting (not multiplying) drops the value and
  // gives those rows exactly zero gradients. Finite rows times their zero rows of dq, dk, dv add
  // nothing, so they are left as they are (no copy of the input: padding would cost one).
  const Tensor query = zero_left_out_rows(allowed.active, a.query), context = zero_left_out_rows(allowed.used, a.context);
  // Steps 1-2: each projection and its head split is one node.
  Tensor q = project_heads(op, query, p.w_q, p.b_q, s.h);
  Tensor k = project_heads(op, context, p.w_k, p.b_k, s.hkv);
  const Tensor v = project_heads(op, context, p.w_v, p.b_v, s.hkv);
  if (rotary != nullptr) {
    // A rotation keeps a zero row zero and a finite row finite, so the rows selected above stay
    // as they were: the exact zeros hold with it.
    q = tapegrad::rotary(q, positions_from(o.causal_offset, s.q), *rotary);
    k = tapegrad::rotary(k, positions_from(0, s.k), *rotary);
  }
  return attend_projected(q, k, v, a.bias, p, allowed, s, o);
}

}  // namespace detail

AttentionResult multihead_attention(const MhaActivations& a, const MhaParameters& p, const MhaMasks& m, std::int64_t heads,
                                    bool causal, std::int64_t causal_offset, bool need_weights) {
  return detail::multihead_attention("multihead_attention", a, p, m,
                                     MhaOptions{.heads = heads, .causal = causal, .causal_offset = causal_offset, .need_weights = need_weights});
}

AttentionResult multihead_attention(const MhaActivations& a, const MhaParameters& p, const MhaMasks& m, const MhaOptions& o) {
  return detail::multihead_attention("multihead_attention", a, p, m, o);
}

}  // namespace tapegrad
