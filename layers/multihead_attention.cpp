// multihead_attention: projections, head split, the attention core, head merge, output
// projection, and the suppression of queries that may attend to nothing.
#include "tapegrad/layers/multihead_attention.hpp"

#include "layers/attention_core.hpp"
#include "layers/mha_detail.hpp"
#include "ops/kernel.hpp"
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

// [B, L, H*W] -> [B, H, L, W]: a view.
Tensor split_heads(const Tensor& x, std::int64_t heads) {
  return permute(reshape(x, {x.size(0), x.size(1), heads, x.size(2) / heads}), {0, 2, 1, 3});
}

}  // namespace

Tensor rows_where(const Tensor& rows, const Tensor& x) {
  return rows.defined() ? where(unsqueeze(rows, -1), x, scalar(0.0, x.dtype())) : x;
}

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

namespace {

// active and used from the mask's parts, one row of [B, H, Q, K] at a time and nothing of size
// Q K built: a row without key or pair mask allows every key below its end, a row with only a
// key mask allows the keys the mask allows below its end; only rows with pairs are walked.
void participation_by_rows(const AttentionMask& parts, const MhaShapes& s, AllowedPairs& out) {
  const RowMasks rows(s.op, parts, {s.b, s.h, s.q, s.k});
  out.active = zeros({s.b, s.q}, DType::bool_);
  out.used = zeros({s.b, s.k}, DType::bool_);
  bool* active = static_cast<bool*>(mutable_data(out.active));
  bool* used = static_cast<bool*>(mutable_data(out.used));
  // Per batch entry: keys below `reach` are used; keys below `key_reach` are used where allowed;
  // `first_key` is the first key the key mask allows (K when none).
  std::vector<std::int64_t> reach(static_cast<std::size_t>(s.b), 0), key_reach(reach), first_key(reach.size(), s.k);
  const Tensor keys = parts.key_mask.defined() ? contiguous(parts.key_mask) : Tensor();
  const bool* key_rows = keys.defined() ? static_cast<const bool*>(keys.raw_data()) : nullptr;
  for (std::int64_t b = 0; key_rows != nullptr && b < s.b; ++b)
    for (std::int64_t j = s.k; j-- > 0;)
      if (key_rows[b * s.k + j]) first_key[static_cast<std::size_t>(b)] = j;
  for (std::int64_t b = 0; b < s.b; ++b)
    for (std::int64_t h = 0; h < s.h; ++h)
      for (std::int64_t i = 0; i < s.q; ++i) {
        const RowMask r = rows.row((b * s.h + h) * s.q + i);
        const auto bi = static_cast<std::size_t>(b);
        if (r.pairs != nullptr) {
          for (std::int64_t j = 0; j < r.end; ++j)
            if (r(j)) active[b * s.q + i] = used[b * s.k + j] = true;
        } else if (r.keys != nullptr) {
          active[b * s.q + i] |= r.end > first_key[bi];
          key_reach[bi] = std::max(key_reach[bi], r.end);
        } else {
          active[b * s.q + i] |= r.end > 0;
          reach[bi] = std::max(reach[bi], r.end);
        }
      }
  for (std::int64_t b = 0; b < s.b; ++b)
    for (std::int64_t j = 0; j < s.k; ++j)
      used[b * s.k + j] |= j < reach[static_cast<std::size_t>(b)] || (j < key_reach[static_cast<std::size_t>(b)] && key_rows[b * s.k + j]);
}

}  // namespace

AllowedPairs allowed_pairs(const MhaMasks& m, const MhaShapes& s, bool causal, std::int64_t causal_offset, bool combine) {
  AllowedPairs out;
  out.parts = {m.attention_mask, m.key_mask, m.query_mask, causal, causal_offset};
  if (!combine) {
    if (out.parts.empty()) return out;
    participation_by_rows(out.parts, s, out);
    if (all(out.active)) out.active = Tensor();
    if (all(out.used)) out.used = Tensor();
    return out;
  }
  auto restrict_to = [&](const Tensor& more) { out.pairs = out.pairs.defined() ? logical_and(out.pairs, more) : more; };
  if (m.key_mask.defined()) restrict_to(reshape(m.key_mask, {s.b, 1, 1, s.k}));
  if (m.query_mask.defined()) restrict_to(reshape(m.query_mask, {s.b, 1, s.q, 1}));
  if (m.attention_mask.defined()) restrict_to(m.attention_mask);
  if (causal) restrict_to(causal_mask(s.q, s.k, causal_offset));
  if (!out.pairs.defined()) return out;
  // active[b, i] = any over (h, j) and used[b, j] = any over (h, i) of pairs[b, h, i, j]: one
  // pass over the broadcast mask, which is never materialised at [B, H, Q, K].
  const Shape full{s.b, s.h, s.q, s.k};
  out.active = zeros({s.b, s.q}, DType::bool_);
  out.used = zeros({s.b, s.k}, DType::bool_);
  const Dims8 sp = broadcast_strides(out.pairs, full);
  const std::int64_t sa[] = {s.q, 0, 1, 0}, su[] = {s.k, 0, 0, 1};
  bool* active = static_cast<bool*>(mutable_data(out.active));
  bool* used = static_cast<bool*>(mutable_data(out.used));
  const bool* pairs = static_cast<const bool*>(out.pairs.raw_data());
  StridedLoop<3> loop(full.data(), full.size(), {sa, su, sp.data()});
  loop.for_each_run([&](const auto& off, std::int64_t n, const auto& inner) {
    for (std::int64_t t = 0; t < n; ++t) {
      const bool allowed = pairs[off[2] + t * inner[2]];
      active[off[0] + t * inner[0]] |= allowed;
      used[off[1] + t * inner[1]] |= allowed;
    }
  });
  if (all(out.active)) out.active = Tensor();
  if (all(out.used)) out.used = Tensor();
  return out;
}

AttentionResult attend_projected(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias, const MhaParameters& p,
                                 const AllowedPairs& allowed, const MhaShapes& s, bool need_weights) {
  // Steps 2-5 in the attention core (one tape node), with the bias added to the scores. The fused
  // path reads the masks part by part, the weights path the combined pairs.
  AttentionMask mask = allowed.parts;
  if (need_weights) {
    mask = AttentionMask();
    mask.allowed = allowed.pairs;
  }
  auto [heads_out, attention] =
      attention_core({s.op, split_heads(q, s.h), split_heads(k, s.h), split_heads(v, s.h), bias, mask, need_weights});
  // Step 6: concatenate heads in head order, then the output projection.
  const Tensor merged = reshape(permute(heads_out, {0, 2, 1, 3}), {s.b, s.q, s.h * s.dv});
  Tensor output = project(merged, p.w_o, p.b_o);
  // Step 7: a query with no allowed key in any head is exactly zero, b_o included (selected, so
  // its gradient there is exactly zero too).
  return {rows_where(allowed.active, output), attention};
}

AttentionResult multihead_attention(const char* op, const MhaActivations& a, const MhaParameters& p, const MhaMasks& m,
                                    std::int64_t heads, bool causal, std::int64_t causal_offset, bool need_weights) {
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
  const AllowedPairs allowed = allowed_pairs(m, s, causal, causal_offset, /*combine=*/need_weights);
  // Step 1, on zero rows for the queries that attend to nothing and the keys that no query
  // attends to. Their values reach no output, but a NaN or inf there would reach the weight
  // gradients: dw_q = query^T dq multiplies a query's row by its zero row of dq, and 0 * NaN is
  // NaN. Selecting (not multiplying) drops the value and gives those rows exactly zero gradients.
  const Tensor query = rows_where(allowed.active, a.query), context = rows_where(allowed.used, a.context);
  const Tensor q = project(query, p.w_q, p.b_q);
  const Tensor k = project(context, p.w_k, p.b_k);
  const Tensor v = project(context, p.w_v, p.b_v);
  return attend_projected(q, k, v, a.bias, p, allowed, s, need_weights);
}

}  // namespace detail

AttentionResult multihead_attention(const MhaActivations& a, const MhaParameters& p, const MhaMasks& m, std::int64_t heads,
                                    bool causal, std::int64_t causal_offset, bool need_weights) {
  return detail::multihead_attention("multihead_attention", a, p, m, heads, causal, causal_offset, need_weights);
}

}  // namespace tapegrad
