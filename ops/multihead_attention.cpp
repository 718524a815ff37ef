// multihead_attention: projections, head split, the attention core, head merge, output
// projection, and the suppression of queries that may attend to nothing.
#include "tapegrad/ops/multihead_attention.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "ops/attention_core.hpp"
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

void check_matrix(const char* op, const char* name, const Tensor& w, std::int64_t rows, DType dtype) {
  check_floating(op, name, w);
  if (w.dim() != 2 || (rows >= 0 && w.size(0) != rows))
    fail<ShapeError>("{}: argument '{}' must be a matrix with {} rows, got shape {}", op, name,
                     rows >= 0 ? fmt::format("{}", rows) : std::string("any number of"), shape_str(w.shape()));
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

MhaShapes check_mha(const char* op, const MhaActivations& a, const MhaParameters& p, const MhaMasks& m, std::int64_t heads,
                    std::int64_t context_length) {
  check_floating(op, "query", a.query);
  const DType dtype = a.query.dtype();
  if (a.query.dim() != 3) fail<ShapeError>("{}: argument 'query' must be [B, Q, Cq], got shape {}", op, shape_str(a.query.shape()));
  if (heads < 1) fail<ValueError>("{}: argument 'heads' must be >= 1, got {}", op, heads);
  MhaShapes s{op, a.query.size(0), a.query.size(1), context_length, heads, 0, 0, 0};
  check_matrix(op, "w_q", p.w_q, a.query.size(2), dtype);
  check_matrix(op, "w_k", p.w_k, -1, dtype);
  check_matrix(op, "w_v", p.w_v, p.w_k.size(0), dtype);
  if (p.w_k.size(1) != p.w_q.size(1))
    fail<ShapeError>("{}: arguments 'w_q' {} and 'w_k' {} must project to the same width H*D", op, shape_str(p.w_q.shape()),
                     shape_str(p.w_k.shape()));
  for (auto [name, w] : {std::pair{"w_q", &p.w_q}, {"w_v", &p.w_v}})
    if (w->size(1) % heads != 0)
      fail<ShapeError>("{}: heads = {} must divide the projection width of '{}', shape {}", op, heads, name, shape_str(w->shape()));
  s.d = p.w_q.size(1) / heads;
  s.dv = p.w_v.size(1) / heads;
  if (s.d < 1)
    fail<ShapeError>("{}: the per-head query/key width D must be >= 1, got 'w_q' {} with heads = {}", op, shape_str(p.w_q.shape()),
                     heads);
  check_matrix(op, "w_o", p.w_o, p.w_v.size(1), dtype);
  s.cout = p.w_o.size(1);
  check_vector(op, "b_q", p.b_q, heads * s.d, dtype);
  check_vector(op, "b_k", p.b_k, heads * s.d, dtype);
  check_vector(op, "b_v", p.b_v, heads * s.dv, dtype);
  check_vector(op, "b_o", p.b_o, s.cout, dtype);
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

AllowedPairs allowed_pairs(const MhaMasks& m, const MhaShapes& s, bool causal, std::int64_t causal_offset) {
  AllowedPairs out;
  out.mask = {m.attention_mask, m.key_mask, m.query_mask, causal, causal_offset};
  if (out.mask.empty()) return out;
  // active[b, i] = any over (h, j) and used[b, j] = any over (h, i) of the allowed pairs, row by
  // row. Without an attention_mask the heads share their rows (one per query), and a row's
  // allowed keys are the key mask's below the causal end: the row is active when its first
  // allowed key is below the end, and the keys used are the allowed ones below the largest
  // end of an active row. With an attention_mask, each row's keys are read.
  const std::int64_t heads = m.attention_mask.defined() ? s.h : 1;
  const RowMasks rows(s.op, out.mask, {s.b, heads, s.q, s.k});
  out.active = zeros({s.b, s.q}, DType::bool_);
  out.used = zeros({s.b, s.k}, DType::bool_);
  bool* active = static_cast<bool*>(mutable_data(out.active));
  bool* used = static_cast<bool*>(mutable_data(out.used));
  for (std::int64_t b = 0; b < s.b; ++b) {
    std::int64_t first_key = 0;  // the first key the key mask allows (s.k: none)
    if (m.key_mask.defined()) {
      const RowMask any_row = rows.row(b * heads * s.q);
      while (first_key < s.k && !any_row.keys[first_key]) ++first_key;
    }
    std::int64_t widest = 0;  // the largest causal end of an active row
    for (std::int64_t r = b * heads * s.q; r < (b + 1) * heads * s.q; ++r) {
      const RowMask row = rows.row(r);
      bool* act = active + b * s.q + r % s.q;
      if (row.pairs == nullptr) {
        if (first_key < row.end) {
          *act = true;
          widest = std::max(widest, row.end);
        }
        continue;
      }
      for (std::int64_t j = 0; j < row.end; ++j)
        if (row(j)) *act = used[b * s.k + j] = true;
    }
    for (std::int64_t j = 0; j < widest; ++j) used[b * s.k + j] |= !m.key_mask.defined() || rows.row(b * heads * s.q).keys[j];
  }
  if (all(out.active)) out.active = Tensor();
  if (all(out.used)) out.used = Tensor();
  return out;
}

AttentionResult attend_projected(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias, const MhaParameters& p,
                                 const AllowedPairs& allowed, const MhaShapes& s, bool need_weights) {
  // Steps 3-5 in the attention core (one tape node), with the bias added to the scores; both
  // paths read the masks row by row.
  auto [heads_out, attention] = attention_core({s.op, q, k, v, bias, allowed.mask, need_weights});
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
                                    std::int64_t heads, bool causal, std::int64_t causal_offset, bool need_weights,
                                    const RotaryOptions* rotary) {
  check_floating(op, "context", a.context);
  if (a.context.dim() != 3)
    fail<ShapeError>("{}: argument 'context' must be [B, K, Cctx], got shape {}", op, shape_str(a.context.shape()));
  const MhaShapes s = check_mha(op, a, p, m, heads, a.context.size(1));
  if (a.context.size(0) != s.b)
    fail<ShapeError>("{}: arguments 'query' {} and 'context' {} must have the same batch size B", op, shape_str(a.query.shape()),
                     shape_str(a.context.shape()));
  if (a.context.size(2) != p.w_k.size(0))
    fail<ShapeError>("{}: argument 'w_k' {} must have one row per context channel ('context' is {})", op, shape_str(p.w_k.shape()),
                     shape_str(a.context.shape()));
  if (a.context.dtype() != a.query.dtype())
    fail<DTypeError>("{}: arguments 'query' ({}) and 'context' ({}) must have the same dtype", op, a.query.dtype(), a.context.dtype());
  const AllowedPairs allowed = allowed_pairs(m, s, causal, causal_offset);
  // Step 1, on zero rows for the queries that attend to nothing and the keys that no query
  // attends to, when one of those rows holds a NaN or inf. Their values reach no output, but a
  // non-finite one would reach the weight gradients: dw_q = query^T dq multiplies a query's row
  // by its zero row of dq, and 0 * NaN is NaN. Selecting (not multiplying) drops the value and
  // gives those rows exactly zero gradients. Finite rows times their zero rows of dq, dk, dv add
  // nothing, so they are left as they are (no copy of the input: padding would cost one).
  const Tensor query = zero_left_out_rows(allowed.active, a.query), context = zero_left_out_rows(allowed.used, a.context);
  // Steps 1-2: each projection and its head split is one node.
  Tensor q = project_heads(op, query, p.w_q, p.b_q, heads);
  Tensor k = project_heads(op, context, p.w_k, p.b_k, heads);
  const Tensor v = project_heads(op, context, p.w_v, p.b_v, heads);
  if (rotary != nullptr) {
    // A rotation keeps a zero row zero and a finite row finite, so the rows selected above stay
    // as they were: the exact zeros hold with it.
    q = tapegrad::rotary(q, positions_from(causal_offset, s.q), *rotary);
    k = tapegrad::rotary(k, positions_from(0, s.k), *rotary);
  }
  return attend_projected(q, k, v, a.bias, p, allowed, s, need_weights);
}

}  // namespace detail

AttentionResult multihead_attention(const MhaActivations& a, const MhaParameters& p, const MhaMasks& m, std::int64_t heads,
                                    bool causal, std::int64_t causal_offset, bool need_weights) {
  return detail::multihead_attention("multihead_attention", a, p, m, heads, causal, causal_offset, need_weights);
}

}  // namespace tapegrad
