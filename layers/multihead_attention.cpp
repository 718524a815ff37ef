// multihead_attention: projections, head split, the attention core, head merge, output
// projection, and the suppression of queries that may attend to nothing.
#include "tapegrad/layers/multihead_attention.hpp"

#include "layers/attention_core.hpp"
#include "layers/mha_detail.hpp"
#include "ops/kernel.hpp"
#include "tapegrad/ops/cast.hpp"
#include "tapegrad/ops/compare.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/matmul.hpp"
#include "tapegrad/ops/reduction.hpp"
#include "tapegrad/ops/view.hpp"
#include "tapegrad/ops/where.hpp"

namespace tapegrad {
namespace detail {
namespace {

constexpr const char* kOp = "multihead_attention";

void check_matrix(const char* name, const Tensor& w, std::int64_t rows, DType dtype) {
  check_floating(kOp, name, w);
  if (w.dim() != 2 || (rows >= 0 && w.size(0) != rows))
    fail<ShapeError>("{}: argument '{}' must be a matrix with {} rows, got shape {}", kOp, name,
                     rows >= 0 ? fmt::format("{}", rows) : std::string("any number of"), shape_str(w.shape()));
  if (w.dtype() != dtype)
    fail<DTypeError>("{}: argument '{}' ({}) is {} but 'query' is {}; convert it with to()", kOp, name, shape_str(w.shape()),
                     w.dtype(), dtype);
}

void check_vector(const char* name, const Tensor& b, std::int64_t size, DType dtype) {
  if (!b.defined()) return;
  check_floating(kOp, name, b);
  if (b.shape() != Shape{size})
    fail<ShapeError>("{}: argument '{}' must have shape [{}], got {}", kOp, name, size, shape_str(b.shape()));
  if (b.dtype() != dtype)
    fail<DTypeError>("{}: argument '{}' ({}) is {} but 'query' is {}; convert it with to()", kOp, name, shape_str(b.shape()),
                     b.dtype(), dtype);
}

void check_mask(const char* name, const Tensor& m, const Shape& shape, bool exact) {
  if (!m.defined()) return;
  check_dtype(kOp, name, m, DType::bool_);
  const bool fits = exact ? m.shape() == shape : broadcast_args(kOp, "attention shape", shape, name, m.shape()) == shape;
  if (!fits)
    fail<ShapeError>("{}: argument '{}' must {} {}, got shape {}", kOp, name, exact ? "have shape" : "broadcast to",
                     shape_str(shape), shape_str(m.shape()));
}

// [B, L, H*W] -> [B, H, L, W]: a view.
Tensor split_heads(const Tensor& x, std::int64_t heads) {
  return permute(reshape(x, {x.size(0), x.size(1), heads, x.size(2) / heads}), {0, 2, 1, 3});
}

}  // namespace

Tensor project(const Tensor& x, const Tensor& w, const Tensor& b) {
  Tensor y = matmul(x, w);
  return b.defined() ? add(y, b) : y;
}

MhaShapes check_mha(const MhaActivations& a, const MhaParameters& p, const MhaMasks& m, std::int64_t heads,
                    std::int64_t context_length) {
  check_floating(kOp, "query", a.query);
  const DType dtype = a.query.dtype();
  if (a.query.dim() != 3) fail<ShapeError>("{}: argument 'query' must be [B, Q, Cq], got shape {}", kOp, shape_str(a.query.shape()));
  if (heads < 1) fail<ValueError>("{}: argument 'heads' must be >= 1, got {}", kOp, heads);
  MhaShapes s{a.query.size(0), a.query.size(1), context_length, heads, 0, 0, 0};
  check_matrix("w_q", p.w_q, a.query.size(2), dtype);
  check_matrix("w_k", p.w_k, -1, dtype);
  check_matrix("w_v", p.w_v, p.w_k.size(0), dtype);
  if (p.w_k.size(1) != p.w_q.size(1))
    fail<ShapeError>("{}: arguments 'w_q' {} and 'w_k' {} must project to the same width H*D", kOp, shape_str(p.w_q.shape()),
                     shape_str(p.w_k.shape()));
  for (auto [name, w] : {std::pair{"w_q", &p.w_q}, {"w_v", &p.w_v}})
    if (w->size(1) % heads != 0)
      fail<ShapeError>("{}: heads = {} must divide the projection width of '{}', shape {}", kOp, heads, name, shape_str(w->shape()));
  s.d = p.w_q.size(1) / heads;
  s.dv = p.w_v.size(1) / heads;
  if (s.d < 1)
    fail<ShapeError>("{}: the per-head query/key width D must be >= 1, got 'w_q' {} with heads = {}", kOp, shape_str(p.w_q.shape()),
                     heads);
  check_matrix("w_o", p.w_o, p.w_v.size(1), dtype);
  s.cout = p.w_o.size(1);
  check_vector("b_q", p.b_q, heads * s.d, dtype);
  check_vector("b_k", p.b_k, heads * s.d, dtype);
  check_vector("b_v", p.b_v, heads * s.dv, dtype);
  check_vector("b_o", p.b_o, s.cout, dtype);
  if (s.b < 1 || s.q < 1 || s.k < 1)
    fail<ShapeError>("{}: B, Q and K must be >= 1, got B = {}, Q = {}, K = {} (query {}, context length {})", kOp, s.b, s.q, s.k,
                     shape_str(a.query.shape()), s.k);
  const Shape scores{s.b, heads, s.q, s.k};
  check_mask("key_mask", m.key_mask, {s.b, s.k}, true);
  check_mask("query_mask", m.query_mask, {s.b, s.q}, true);
  check_mask("attention_mask", m.attention_mask, scores, false);
  if (a.bias.defined()) {
    check_floating(kOp, "bias", a.bias);
    if (a.bias.dtype() != dtype)
      fail<DTypeError>("{}: argument 'bias' is {} but 'query' is {}; convert it with to()", kOp, a.bias.dtype(), dtype);
    if (broadcast_args(kOp, "attention shape", scores, "bias", a.bias.shape()) != scores)
      fail<ShapeError>("{}: argument 'bias' must broadcast to {}, got shape {}", kOp, shape_str(scores), shape_str(a.bias.shape()));
  }
  return s;
}

AttentionResult attend_projected(const Tensor& q, const Tensor& k, const Tensor& v, const MhaActivations& a,
                                 const MhaParameters& p, const MhaMasks& m, const MhaShapes& s, bool causal,
                                 std::int64_t causal_offset) {
  // Step 4: the allowed set, as one bool tensor broadcastable to [B, H, Q, K] (or none at all).
  Tensor allowed;
  auto restrict_to = [&](const Tensor& more) { allowed = allowed.defined() ? logical_and(allowed, more) : more; };
  if (m.key_mask.defined()) restrict_to(reshape(m.key_mask, {s.b, 1, 1, s.k}));
  if (m.query_mask.defined()) restrict_to(reshape(m.query_mask, {s.b, 1, s.q, 1}));
  if (m.attention_mask.defined()) restrict_to(m.attention_mask);
  if (causal) restrict_to(causal_mask(s.q, s.k, causal_offset));

  // Steps 2-5 in the attention core (one tape node), with the bias added to the scores.
  auto [heads_out, attention] =
      attention_core({kOp, split_heads(q, s.h), split_heads(k, s.h), split_heads(v, s.h), a.bias, allowed});
  // Step 6: concatenate heads in head order, then the output projection.
  const Tensor merged = reshape(permute(heads_out, {0, 2, 1, 3}), {s.b, s.q, s.h * s.dv});
  Tensor output = project(merged, p.w_o, p.b_o);
  // Step 7: a query with no allowed key in any head is exactly zero, b_o included.
  if (allowed.defined()) {
    const Tensor allowed_keys = sum(to(expand(allowed, {s.b, s.h, s.q, s.k}), q.dtype()), {1, 3});  // [B, Q]
    const Tensor active = gt(allowed_keys, scalar(0.0, q.dtype()));
    if (!all(active)) output = where(unsqueeze(active, -1), output, scalar(0.0, output.dtype()));
  }
  return {output, attention};
}

}  // namespace detail

AttentionResult multihead_attention(const MhaActivations& a, const MhaParameters& p, const MhaMasks& m,
                                    std::int64_t heads, bool causal, std::int64_t causal_offset) {
  detail::check_floating(detail::kOp, "context", a.context);
  if (a.context.dim() != 3)
    detail::fail<ShapeError>("{}: argument 'context' must be [B, K, Cctx], got shape {}", detail::kOp, detail::shape_str(a.context.shape()));
  const detail::MhaShapes s = detail::check_mha(a, p, m, heads, a.context.size(1));
  if (a.context.size(0) != s.b)
    detail::fail<ShapeError>("{}: arguments 'query' {} and 'context' {} must have the same batch size B", detail::kOp,
                             detail::shape_str(a.query.shape()), detail::shape_str(a.context.shape()));
  if (a.context.size(2) != p.w_k.size(0))
    detail::fail<ShapeError>("{}: argument 'w_k' {} must have one row per context channel ('context' is {})", detail::kOp,
                             detail::shape_str(p.w_k.shape()), detail::shape_str(a.context.shape()));
  if (a.context.dtype() != a.query.dtype())
    detail::fail<DTypeError>("{}: arguments 'query' ({}) and 'context' ({}) must have the same dtype", detail::kOp, a.query.dtype(),
                             a.context.dtype());
  // Step 1: the projections.
  const Tensor q = detail::project(a.query, p.w_q, p.b_q);
  const Tensor k = detail::project(a.context, p.w_k, p.b_k);
  const Tensor v = detail::project(a.context, p.w_v, p.b_v);
  return detail::attend_projected(q, k, v, a, p, m, s, causal, causal_offset);
}

}  // namespace tapegrad
