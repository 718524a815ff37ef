// Internal: grouped-query attention as views. Query head h reads
// key/value head h / G, G = H / Hkv. Instead of repeating k and v G times, the queries are
// viewed as [..., Hkv, G, Q, D] and k, v as [..., Hkv, 1, K, D]: the attention core broadcasts
// the size-1 group dim and, in backward, sums the gradients of k and v over it (sum_to). Score
// row r then belongs to head (r / Q) mod H = hkv G + g, the rows' numbering of RowMasks.
#pragma once

#include <cstdint>

#include "ops/attention_core.hpp"
#include "tapegrad/ops/view.hpp"

namespace tapegrad::detail {

// q [..., H, Q, D] -> [..., Hkv, G, Q, D], a view (splitting a dim). H = q.size(-3).
inline Tensor group_queries(const Tensor& q, std::int64_t kv_heads) {
  Shape s = q.shape();
  s[s.size() - 3] /= kv_heads;
  s.insert(s.end() - 3, kv_heads);
  return reshape(q, s);
}
// k or v [..., Hkv, K, W] -> [..., Hkv, 1, K, W], a view.
inline Tensor group_keys(const Tensor& k) { return unsqueeze(k, -3); }
// A bias broadcasting to [..., H, Q, K] (validated so) -> one broadcasting to [..., Hkv, G, Q, K]:
// its dim -3 split when it is H, a size-1 group dim inserted when it is 1, unchanged below rank 3.
inline Tensor group_pairs(const Tensor& t, std::int64_t kv_heads) {
  if (!t.defined() || t.dim() < 3) return t;  // broadcasts over every head as it is
  return t.size(-3) == 1 ? unsqueeze(t, -3) : group_queries(t, kv_heads);
}
// The grouped scores' shape [..., Hkv, G, Q, K] -> [..., Hkv G, Q, K], which masks are checked against.
inline Shape ungrouped(const Shape& scores) {
  Shape s = scores;
  s[s.size() - 4] *= s[s.size() - 3];
  s.erase(s.end() - 3);
  return s;
}
// [..., Hkv, G, L, W] -> [..., Hkv G, L, W]: the heads back in order h = hkv G + g (a view of a
// contiguous result; undefined stays undefined).
inline Tensor merge_groups(const Tensor& x) { return x.defined() ? reshape(x, ungrouped(x.shape())) : x; }

// Attention of H query heads (dim -3 of a.q) over kv_heads key/value heads as these views
// (kv_heads 0 or H: plain attention, no views); rows_for(shape) gives the call's rows for the
// ungrouped scores' shape [..., H, Q, K], once a's tensors are checked.
template <class RowsFor> AttentionResult grouped_attention(AttentionArgs a, std::int64_t kv_heads, RowsFor&& rows_for) {
  const bool grouped = kv_heads != 0 && kv_heads != a.q.size(-3);
  if (grouped) {
    a.q = group_queries(a.q, kv_heads);
    a.k = group_keys(a.k);
    a.v = group_keys(a.v);
    a.bias = group_pairs(a.bias, kv_heads);
  }
  const Shape scores = check_attention(a);
  AttentionResult r = attention_core(a, scores, rows_for(grouped ? ungrouped(scores) : scores));
  if (grouped) r = {merge_groups(r.output), merge_groups(r.weights)};
  return r;
}

}  // namespace tapegrad::detail
