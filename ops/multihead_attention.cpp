// multihead_attention: projections, head split, the attention core, head merge, output
// projection, and the suppression of queries that may attend to nothing; and its decoding form,
// the same steps over the keys and values a KVCache (defined first) holds and appends to.
#include "tapegrad/ops/multihead_attention.hpp"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "kernels/weighted_matmul.hpp"
#include "ops/attention_masking.hpp"
#include "ops/grouped_heads.hpp"
#include "ops/multihead_projections.hpp"
#include "ops/op.hpp"
#include "tapegrad/autodiff/tape.hpp"
#include "tapegrad/ops/inplace.hpp"
#include "tapegrad/ops/view.hpp"
#include "tapegrad/ops/where.hpp"

namespace tapegrad {
namespace {

// A fresh [B, capacity, width] buffer holding positions [from, from + length) of `buffer` at its
// front (the positions past them are not read: they were never written).
Tensor reallocated(const Tensor& buffer, std::int64_t from, std::int64_t length, std::int64_t capacity) {
  const NoGradGuard no_grad;
  Tensor out = empty({buffer.size(0), capacity, buffer.size(2)}, buffer.dtype());
  if (length > 0) copy_(slice(out, 1, 0, length), slice(buffer, 1, from, from + length));
  return out;
}

}  // namespace

KVCache::KVCache(const KVCache& other)
    : k_(other.k_.defined() ? reallocated(other.k_, 0, other.held_, other.capacity()) : Tensor()),
      v_(other.v_.defined() ? reallocated(other.v_, 0, other.held_, other.capacity()) : Tensor()),
      start_(other.start_),
      held_(other.held_) {}

KVCache& KVCache::operator=(const KVCache& other) {
  if (this != &other) *this = KVCache(other);
  return *this;
}

KVCache::KVCache(KVCache&& other) noexcept
    : k_(std::move(other.k_)), v_(std::move(other.v_)), start_(std::exchange(other.start_, 0)),
      held_(std::exchange(other.held_, 0)) {}

KVCache& KVCache::operator=(KVCache&& other) noexcept {
  if (this == &other) return *this;
  k_ = std::move(other.k_);  // a moved-from Tensor is undefined
  v_ = std::move(other.v_);
  start_ = std::exchange(other.start_, 0);
  held_ = std::exchange(other.held_, 0);
  return *this;
}

std::int64_t KVCache::start_after(std::int64_t n, std::int64_t keep_from) const noexcept {
  return held_ + n > capacity() ? start_ + std::clamp<std::int64_t>(keep_from - start_, 0, held_) : start_;
}

void KVCache::append(const Tensor& k, const Tensor& v, std::int64_t keep_from) {
  const std::int64_t n = k.size(1);
  const NoGradGuard no_grad;
  if (held_ + n > capacity()) {
    // Full. Positions before keep_from are dropped rather than kept: the kept ones move to the
    // front, in place when at most half the buffer is then in use (they cannot overlap their
    // destination: more than kept + n rows are dropped), else into a buffer twice that size, so
    // each move of `kept` rows is paid for by at least as many appends.
    const std::int64_t drop = start_after(n, keep_from) - start_, kept = held_ - drop;
    if (drop > 0 && 2 * (kept + n) <= capacity()) {
      copy_(slice(k_, 1, 0, kept), slice(k_, 1, drop, held_));
      copy_(slice(v_, 1, 0, kept), slice(v_, 1, drop, held_));
    } else {
      // Grow by doubling: each position is copied O(1) times on average. Not past what can be
      // allocated, while what is needed still can be.
      std::int64_t grown = drop > 0 ? std::max<std::int64_t>(2 * (kept + n), 16)
                                    : std::max<std::int64_t>({2 * capacity(), kept + n, 16});
      try {
        detail::check_shape("KVCache", "buffer", {k.size(0), grown, std::max(k.size(2), v.size(2))}, k.dtype());
      } catch (const ShapeError&) {
        grown = kept + n;
      }
      k_ = reallocated(k_.defined() ? k_ : k, drop, kept, grown);
      v_ = reallocated(v_.defined() ? v_ : v, drop, kept, grown);
    }
    start_ += drop;
    held_ = kept;
  }
  copy_(slice(k_, 1, held_, held_ + n), k);
  copy_(slice(v_, 1, held_, held_ + n), v);
  held_ += n;
}

Tensor KVCache::keys() const { return slice(k_, 1, 0, held_); }
Tensor KVCache::values() const { return slice(v_, 1, 0, held_); }

namespace detail {

// The cache's private parts, for the decoding form only.
struct KVCacheAccess {
  static std::int64_t start_after(const KVCache& c, std::int64_t n, std::int64_t keep_from) { return c.start_after(n, keep_from); }
  static void append(KVCache& c, const Tensor& k, const Tensor& v, std::int64_t keep_from) { c.append(k, v, keep_from); }
  static Tensor keys(const KVCache& c) { return c.keys(); }
  static Tensor values(const KVCache& c) { return c.values(); }
  static const Tensor& buffer(const KVCache& c) { return c.k_; }
  static void reset(KVCache& c) { c.k_ = c.v_ = Tensor(); }
};

namespace {

struct MhaShapes {
  std::int64_t b, q, k, h, d, dv;
  std::int64_t hkv = 0;  // key/value heads, dividing h
};

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

// The key/value projections' widths: Hkv*D for w_k, a multiple of Hkv for w_v. With Hkv = H the
// messages are the plain multi-head ones.
void check_kv_widths(const char* op, const MhaParameters& p, const MhaShapes& s) {
  const bool plain = s.hkv == s.h;
  if (plain && p.w_k.size(1) != p.w_q.size(1))
    fail<ShapeError>("{}: arguments 'w_q' {} and 'w_k' {} must project to the same width H*D", op,
                     shape_str(p.w_q.shape()), shape_str(p.w_k.shape()));
  if (p.w_k.size(1) != s.hkv * s.d)
    fail<ShapeError>("{}: argument 'w_k' {} must project to kv_heads * D = {} * {} = {} ('w_q' {} gives D = {} with heads = {})", op,
                     shape_str(p.w_k.shape()), s.hkv, s.d, s.hkv * s.d, shape_str(p.w_q.shape()), s.d, s.h);
  if (p.w_v.size(1) % s.hkv != 0)
    fail<ShapeError>("{}: {} = {} must divide the projection width of 'w_v', shape {}", op,
                     plain ? "heads" : "kv_heads", s.hkv, shape_str(p.w_v.shape()));
}

// The query, the context (its width, batch and dtype; run() checked its rank), the parameters,
// the heads and the bias, for keys 0 .. context_length - 1. The masking is checked by masking_rows.
MhaShapes check_mha(const char* op, const MhaActivations& a, const Tensor& context, const MhaParameters& p, const MhaOptions& o,
                    std::int64_t context_length, const char* heads_name) {
  check_floating(op, "query", a.query);
  const DType dtype = a.query.dtype();
  if (a.query.dim() != 3) fail<ShapeError>("{}: argument 'query' must be [B, Q, Cq], got shape {}", op, shape_str(a.query.shape()));
  if (o.heads < 1) fail<ValueError>("{}: argument '{}heads' must be >= 1, got {}", op, heads_name, o.heads);
  check_kv_heads(op, heads_name, o.heads, o.kv_heads);
  const std::int64_t heads = o.heads;
  MhaShapes s{a.query.size(0), a.query.size(1), context_length, heads, 0, 0, o.kv_heads == 0 ? heads : o.kv_heads};
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
  check_vector(op, "b_q", p.b_q, heads * s.d, dtype);
  check_vector(op, "b_k", p.b_k, s.hkv * s.d, dtype);
  check_vector(op, "b_v", p.b_v, s.hkv * s.dv, dtype);
  check_vector(op, "b_o", p.b_o, p.w_o.size(1), dtype);
  if (context.size(0) != s.b)
    fail<ShapeError>("{}: arguments 'query' {} and 'context' {} must have the same batch size B", op, shape_str(a.query.shape()),
                     shape_str(context.shape()));
  if (context.size(2) != p.w_k.size(0))
    fail<ShapeError>("{}: argument 'w_k' {} must have one row per context channel ('context' is {})", op, shape_str(p.w_k.shape()),
                     shape_str(context.shape()));
  if (context.dtype() != dtype)
    fail<DTypeError>("{}: arguments 'query' ({}) and 'context' ({}) must have the same dtype", op, dtype, context.dtype());
  if (s.b < 1 || s.q < 1 || s.k < 1)
    fail<ShapeError>("{}: B, Q and K must be >= 1, got B = {}, Q = {}, K = {} (query {}, context length {})", op, s.b, s.q, s.k,
                     shape_str(a.query.shape()), s.k);
  const Shape scores{s.b, heads, s.q, s.k};
  check_countable(op, fmt::format("heads = {} gives the attention [B, heads, Q, K] =", heads).c_str(), scores);
  check_bias(op, a.bias, scores, dtype, "'query'");
  return s;
}

// x [B, L, C] with the rows where `rows` [B, L] is false set to 0 (selected: NaN is dropped too);
// x itself when `rows` is undefined.
Tensor rows_where(const Tensor& rows, const Tensor& x) {
  return rows.defined() ? where(unsqueeze(rows, -1), x, scalar(0.0, x.dtype())) : x;
}

// x with the rows that `rows` leaves out set to 0 when one of them is not finite, else x.
Tensor zero_left_out_rows(const Tensor& rows, const Tensor& x) {
  return !rows.defined() || left_out_rows_finite(rows, x) ? x : rows_where(rows, x);
}

// int64 [n]: first, first + 1, ... (saturating at INT64_MAX, which rotary then refuses by name).
Tensor positions_from(std::int64_t first, std::int64_t n) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    if (__builtin_add_overflow(first, i, &p[static_cast<std::size_t>(i)])) p[static_cast<std::size_t>(i)] = std::numeric_limits<std::int64_t>::max();
  return from_vector(std::span<const std::int64_t>(p), {n});
}

// [B, H, L, W] heads, a view of a [B, L, H W] tensor, back to that tensor's layout [B, L, H W].
Tensor merged(const Tensor& heads) {
  return reshape(permute(heads, {0, 2, 1, 3}), {heads.size(0), heads.size(2), heads.size(1) * heads.size(3)});
}

// Both forms. Without a cache: keys from `a.context`. With one: query's n new positions are
// also the context, appended to the cache, and the keys are every held position.
AttentionResult run(const char* op, const MhaActivations& a, const MhaParameters& p, const MhaOptions& o, KVCache* cache,
                    const MaskNames& names, const char* heads_name) {
  const bool decoding = cache != nullptr;
  std::optional<NoGradGuard> inference;
  if (decoding) {
    inference.emplace();
    if (a.context.defined())
      fail<ValueError>("{}: decoding is self-attention: the keys come from 'query', so 'context' must be left undefined, got shape {}",
                       op, shape_str(a.context.shape()));
  }
  const Tensor& context = decoding ? a.query : a.context;
  check_floating(op, "context", context);
  if (context.dim() != 3) fail<ShapeError>("{}: argument 'context' must be [B, K, Cctx], got shape {}", op, shape_str(context.shape()));
  const std::int64_t before = decoding ? cache->length() : 0, n = context.size(1);
  std::int64_t keys_total = 0;
  if (__builtin_add_overflow(before, n, &keys_total))
    fail<ValueError>("{}: the cache's {} positions plus {} new ones overflow int64", op, before, n);
  const MhaShapes all = check_mha(op, a, context, p, o, keys_total, heads_name);
  AttentionMasking masking = o.masking;
  std::int64_t start = 0, keep_from = 0;
  if (decoding) {
    if (masking.causal_offset != 0)
      fail<ValueError>("{}: decoding puts query i at position L + i (L = {} positions cached) itself: {}causal_offset must be 0, got {}",
                       op, before, names.prefix, masking.causal_offset);
    masking.causal = true;
    masking.causal_offset = before;
    // A cache holds one batch of one layer's keys and values. An empty (cleared) cache with
    // other buffers is made again; a non-empty one must match.
    const Tensor& held = KVCacheAccess::buffer(*cache);
    if (held.defined()) {
      const bool fits = held.size(0) == all.b && held.size(2) == p.w_k.size(1) &&
                        cache->value_width() == p.w_v.size(1) && held.dtype() == a.query.dtype();
      if (!fits && cache->held() > 0)
        fail<ShapeError>("{}: argument 'cache' holds {} {} keys [B, L, width] = [{}, {}, {}] from another batch or layer; 'query' is {} {} "
                         "(B = {}) and these keys are {} wide (clear() the cache to start over)",
                         op, cache->held(), held.dtype(), held.size(0), cache->held(), held.size(2), shape_str(a.query.shape()),
                         a.query.dtype(), all.b, p.w_k.size(1));
      if (!fits) KVCacheAccess::reset(*cache);
    }
    // The first new query (position L) sees keys after L - window: older ones may go.
    keep_from = masking.window > 0 ? std::max<std::int64_t>(0, before - masking.window + 1) : 0;
    start = KVCacheAccess::start_after(*cache, n, keep_from);
  }
  // Everything is checked against every key (0 .. L + n - 1) before anything changes; the rows
  // cover the held ones, from `start`.
  const RowMasks rows = masking_rows(op, masking, {all.b, all.h, all.q, all.k}, a.query.dtype(), names, start);
  MhaShapes s = all;
  s.k = all.k - start;
  const auto [active, used] = rows.taking(s.h, masking.mask.defined());
  // Step 1, on zero rows for the queries that attend to nothing and the keys no query attends to,
  // when one of those rows holds a NaN or inf: unused, it would still reach dw_q = query^T dq
  // through its zero row of dq (0 * NaN is NaN). Selecting drops it and gives those rows exactly
  // zero gradients; finite rows are left as they are (no copy of the input). Decoding keeps the
  // rows: the new keys may serve later queries, and nothing has a gradient.
  const Tensor query = decoding ? a.query : zero_left_out_rows(active, a.query);
  const Tensor keyed = decoding ? context : zero_left_out_rows(used, context);
  // Steps 1-2: each projection and its head split is one node.
  Tensor q = project_heads(op, query, p.w_q, p.b_q, s.h);
  Tensor k = project_heads(op, keyed, p.w_k, p.b_k, s.hkv);
  Tensor v = project_heads(op, keyed, p.w_v, p.b_v, s.hkv);
  if (o.rotary) {
    // Query i at causal_offset + i, key j at its absolute position. A rotation keeps a zero row
    // zero and a finite row finite, so the rows selected above stay as they were.
    q = rotary(q, positions_from(masking.causal_offset, s.q), *o.rotary);
    k = rotary(k, positions_from(before, n), *o.rotary);
  }
  if (decoding) {
    KVCacheAccess::append(*cache, merged(k), merged(v), keep_from);
    k = permute(reshape(KVCacheAccess::keys(*cache), {s.b, s.k, s.hkv, s.d}), {0, 2, 1, 3});
    v = permute(reshape(KVCacheAccess::values(*cache), {s.b, s.k, s.hkv, s.dv}), {0, 2, 1, 3});
  }
  // Steps 3-5: the attention core (one tape node) with the bias and the rows, grouped heads as
  // views (ops/grouped_heads.hpp).
  const auto [heads_out, attention] = grouped_attention({op, q, k, v, keys_from(a.bias, start), o.need_weights}, s.hkv,
                                                        [&](const Shape&) -> const RowMasks& { return rows; });
  // Step 6: concatenate heads in head order, then the output projection (one node).
  const Tensor output = merge_heads_project(op, heads_out, p.w_o, p.b_o);
  // Step 7: a query with no allowed key in any head is exactly zero, b_o included (selected, so
  // its gradient there is exactly zero too).
  return {rows_where(active, output), attention};
}

}  // namespace
}  // namespace detail

AttentionResult multihead_attention(const MhaActivations& a, const MhaParameters& p, const MhaMasks& m, std::int64_t heads,
                                    bool causal, std::int64_t causal_offset, bool need_weights) {
  const MhaOptions o{.heads = heads,
                     .masking = {.mask = m.attention_mask, .key_mask = m.key_mask, .query_mask = m.query_mask, .causal = causal,
                                 .causal_offset = causal_offset},
                     .need_weights = need_weights};
  return detail::run("multihead_attention", a, p, o, nullptr, {.prefix = "", .mask = "attention_mask"}, "");
}

AttentionResult multihead_attention(const MhaActivations& a, const MhaParameters& p, const MhaOptions& o) {
  return detail::run("multihead_attention", a, p, o, nullptr, {.prefix = "options.masking."}, "options.");
}

AttentionResult multihead_attention(const MhaActivations& a, const MhaParameters& p, const MhaOptions& o, KVCache& cache) {
  return detail::run("multihead_attention", a, p, o, &cache, {.prefix = "options.masking."}, "options.");
}

}  // namespace tapegrad
