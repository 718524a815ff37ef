// The weights path (need_weights) in blocks of query rows: the same forward and backward as
// attention.cpp's (formulas there and in docs/gradients.md), but each block's scores go from the
// product that writes them through the softmax pass into the products that read them while they
// are still in cache. Done in whole-tensor steps, each of the [..., Q, K] passes streams main
// memory, whose bandwidth a second core barely raises, while the products speed up nearly 2x.
//
//   forward, per block of rows             backward, per block of rows
//   S = q kᵀ                               dv += Aᵀ ⊛ dO
//   A = masked_softmax(s S + bias)         dA = dO vᵀ,  dS = A (dA - rowsum(A dA))  (+ upstream dA)
//   O = A ⊛ v                              dq = dS ⊛ k,  dk += dSᵀ ⊛ q
//
// The rows' softmax passes are attention_softmax.cpp's, on the rows of the block; the products
// are the tile products of the fused path (attention_products.hpp), so zero weights and non-finite
// operands follow the same rules. Products stop at the block's last causal key (rounded up to
// the softmax loops' padding): A and dS are 0 past it. Under a bfloat16 matmul precision the
// products are those tiles' bfloat16 ones, as attention_weights_bf16.cpp's: q, k, v and dO
// rounded once per call, A and dS rounded by the softmax passes as they write a block's rows
// (the backward rounds its block of A again rather than keep a [..., Q, K] bfloat16 copy).
//
// The fused path (need_weights false) for large float32 scores runs on the same blocks, without
// the [..., Q, K] weights: a block's A goes to a per-thread buffer (rows as wide as the block's
// last causal key), and the forward saves per row the maximum m and log l (l the sum of
// exp(x - m), x the scaled, biased, masked scores). Its backward makes A again:
//
//   forward, per block of rows             backward, per block of rows
//   S = q kᵀ                               S = q kᵀ,  dA = dO vᵀ
//   A = masked_softmax(s S + bias),        P = exp((x - m) - log l)  (A up to rounding),
//     keep m, log l                          dS = P (dA - Δ),  Δ = rowsum(dO O)  (one pass)
//   O = A ⊛ v                              dv += Pᵀ ⊛ dO,  dq = dS ⊛ k,  dk += dSᵀ ⊛ q
//
// (docs/gradients.md §8.1 derives Δ = rowsum(A dA)). The forward does less than the weights
// path's (no [..., Q, K] write); the backward does one product more (S) and one pass over the
// block in cache, and reads no A from memory (docs/performance-notes.md compares the two). With
// a bias that needs a gradient dS would be held whole, [..., Q, K] (dbias sums it): that case, as
// float64 and scores too small for the blocks, takes the tiles of attention_tiles.cpp instead
// (the tests still reach it here: Δ is then rowsum(P dA), as the weights path's).
//
// The forward's blocks are independent. In the backward, dk and dv sum over a batch entry's
// blocks: each (batch entry, group) item runs its blocks in order into the group's own buffer
// (a batch entry's blocks are split into `groups` interleaved groups only when there are few batch
// entries), and the groups' buffers are added in order at the end. Groups and blocks follow from
// the shape alone, so the sums do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention_alibi.hpp"
#include "kernels/attention_operands.hpp"
#include "kernels/attention_paths.hpp"
#include "kernels/attention_softmax.hpp"
#include "kernels/attention_products.hpp"
#include "kernels/weighted_matmul.hpp"
#include "runtime/parallel.hpp"

namespace tapegrad::detail {
namespace {

using tiles::gemm;
using tiles::weighted_gemm;

// A block's float32 scores stay in L2 between the product that writes them and the passes that
// read them: at most kBlockRows rows (the backward's products by Aᵀ and dSᵀ sum over the rows of
// a block: fewer than ~64 and their accumulators' traffic shows) and at most kBlockBytes of
// scores (docs/performance-notes.md has the sizes tried).
constexpr std::int64_t kBlockRows = 128, kBlockBytes = 1 << 20;
// The fused path's buffers hold a block's rows up to its last causal key only (half the row on
// average under a causal mask), and its backward runs more steps on each block: its blocks are
// larger.
constexpr std::int64_t kFusedBlockBytes = 2 << 20;
// Batch entries fewer than this split their blocks into groups (fixed by the shape, not the
// threads) so that the backward has work for every thread. Each group holds its own dk and dv
// ([..., K, D] each): the fused path, there for its memory, asks for fewer.
constexpr std::int64_t kMinItems = 8, kFusedMinItems = 4;

// A zeroed [batch..., rows, cols] output whose leading dims (and rows) are laid out in the order
// of q's, when q's leading dims are the batch's and positive and q is dense along its last dim:
// q split into heads from one projection is [B, L, H, D] in memory, and an output laid out
// [B, L, H, Dv] merges back into [B L, H Dv] as a view (no copy, and no second copy kept for the
// backward). Otherwise row-major.
Tensor output_in_order_of(const Tensor& q, const Shape& batch, std::int64_t rows, std::int64_t cols) {
  const Shape shape = with_matrix(batch, rows, cols);
  const std::size_t r = shape.size();
  bool follow = q.dim() == static_cast<std::int64_t>(r) && q.strides()[r - 1] == 1;
  for (std::size_t d = 0; follow && d + 1 < r; ++d) follow = q.shape()[d] == shape[d] && q.strides()[d] > 0;
  if (!follow) return zeros(shape, DType::float32);
  // q's last dim has stride 1 and the others positive strides: it stays innermost.
  return make_view(zeros({shape_numel(shape)}, DType::float32), shape, dense_strides_like(shape, q.strides()), 0, "attention");
}

struct Blocks {
  std::int64_t bh = 0, nq = 0, nk = 0, rows = 0, count = 0;  // count: blocks per batch entry
  Blocks(const Shape& scores, std::int64_t block_rows, bool fused) {
    bh = shape_numel(Shape(scores.begin(), scores.end() - 2));
    nq = scores[scores.size() - 2];
    nk = scores.back();
    const std::int64_t bytes = fused ? kFusedBlockBytes : kBlockBytes;
    rows = block_rows > 0 ? block_rows : std::clamp<std::int64_t>(bytes / (4 * std::max<std::int64_t>(nk, 1)) / 16 * 16, 16, kBlockRows);
    rows = std::clamp<std::int64_t>(rows, 1, std::max<std::int64_t>(nq, 1));
    count = (nq + rows - 1) / rows;
  }
  std::int64_t size(std::int64_t t) const { return std::min(rows, nq - t * rows); }
  // Keys that rows [r0, r0 + n) of the scores may attend, rounded up as the softmax loops read.
  static std::int64_t key_end(const RowMasks& masks, std::int64_t r0, std::int64_t n, std::int64_t nk) {
    std::int64_t end = 0;
    for (std::int64_t r = r0; r < r0 + n; ++r) end = std::max(end, masks.row(r).end);
    return padded_end(end, nk);
  }
};

// What a block's scores product and softmax pass read: q, k (and their bfloat16 copies under
// that precision), the bias and the masks.
struct Operands {
  Matrices<float> qs, ks, vs;
  Bf16Matrices qb, kb, vb;
  RowPointers bias;
  const RowMasks* masks;
  Shape scores;
  float scale;
  bool bf16;
  // k and v hold no inf or NaN (float32 products): the products by A and dS read them in place
  // instead of a sanitised copy of the keys below each block's end, which costs a pass per block.
  bool k_finite = false, v_finite = false;
  std::int64_t nq, nk, d;
  // round: which of q, k, v the bfloat16 products read (float32 only); scan: which of k and v a
  // product by A or dS reads in place under float32 (a pass over the tensor each).
  Operands(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias_, const RowMasks& m, const Shape& scores_, double scale_,
           bool bfloat16, bool round_q, bool round_k, bool round_v, bool scan_k, bool scan_v)
      : bias(bias_, scores_), masks(&m), scores(scores_), scale(static_cast<float>(scale_)), bf16(bfloat16) {
    const Shape batch(scores.begin(), scores.end() - 2);
    qs = Matrices<float>(q, batch);
    ks = Matrices<float>(k, batch);
    vs = Matrices<float>(v, batch);
    if (bf16 && round_q) qb = Bf16Matrices(q, batch);
    if (bf16 && round_k) kb = Bf16Matrices(k, batch);
    if (bf16 && round_v) vb = Bf16Matrices(v, batch);
    if (!bf16) {
      k_finite = scan_k && all_finite_values(k);
      v_finite = scan_v && all_finite_values(v);
    }
    nq = scores[scores.size() - 2];
    nk = scores.back();
    d = q.size(-1);
  }
  // S = q kᵀ for the n rows of batch entry b from query i0 and the keys below `end`, to s (row
  // stride ld).
  void scores_product(std::int64_t b, std::int64_t i0, std::int64_t n, std::int64_t end, float* s, std::int64_t ld) const {
    if (bf16) tiles::scores_bf16(n, end, d, 1.0f, qb.rows(qs, b).from(i0), kb.rows(ks, b), s, ld);
    else gemm(false, true, n, end, d, 1.0f, qs[b] + i0 * qs.ld, qs.ld, ks[b], ks.ld, 0.0f, s, ld);
  }
  // Then A = masked_softmax(s S + bias) over it, in place, rounded to bfloat16 to `rounded` under
  // that precision (same stride), and each row's m and log l to `stats` if not null.
  void weights(std::int64_t b, std::int64_t i0, std::int64_t n, std::int64_t end, float* a, std::int64_t ld, std::uint16_t* rounded,
               float* stats) const {
    const std::int64_t r0 = b * nq + i0;
    scores_product(b, i0, n, end, a, ld);
    attention_softmax_forward_rows(RowPointers::block(a, Shape{ld}, r0), bias, scale, *masks, a, rounded, r0, r0 + n, stats);
  }
};

// The backward of either use of the blocks: it keeps q, k, v (as the products read them), the
// masks, and A (weights path) or O, the bias and the rows' m and log l (fused path).
class PipelineBackward final : public AttentionBackward {
 public:
  PipelineBackward(Tensor q_, Tensor k_, Tensor v_, Tensor bias_, Tensor a_, Tensor o_, Tensor stats_, RowMasks masks_, double scale_,
                   Shape scores_, Blocks blk_, std::int64_t dv_, bool bf16_)
      : q(std::move(q_)), k(std::move(k_)), v(std::move(v_)), bias(std::move(bias_)), A(std::move(a_)), O(std::move(o_)),
        stats(std::move(stats_)), masks(std::move(masks_)), scale(scale_), scores_shape(std::move(scores_)),
        batch(scores_shape.begin(), scores_shape.end() - 2), blk(blk_), dv(dv_), bf16(bf16_) {}

  AttentionGrads operator()(const Tensor& d_out, const Tensor& d_weights, const std::vector<bool>& needs) const override {
    const std::int64_t nq = blk.nq, nk = blk.nk;
    const bool want_dv = needs[2] && d_out.defined();
    const bool want_ds = (needs[0] || needs[1] || wants_raw_ds(needs)) && (d_out.defined() || d_weights.defined());
    if (!want_dv && !want_ds) return {};
    const bool recompute = !A.defined();  // the fused path (dO is then defined)
    // As in the forward, whatever the precision where backward() runs; making A again
    // reads q and k whatever the gradients asked for.
    // dq = dS ⊛ k reads k; v only enters dO vᵀ, a plain product
    const Operands op(q, k, v, bias, masks, scores_shape, scale, bf16, recompute || (want_ds && needs[1]),
                      recompute || (want_ds && needs[0]), want_ds && d_out.defined(), want_ds && needs[0], false);
    const std::int64_t d = op.d;
    const Tensor go = d_out.defined() ? matrix_ready(d_out) : Tensor();
    const Matrices<float> gs = go.defined() ? Matrices<float>(go, batch) : Matrices<float>();
    const Bf16Matrices gb = bf16 && go.defined() ? Bf16Matrices(go, batch) : Bf16Matrices();
    const float* a_f = recompute ? nullptr : static_cast<const float*>(A.raw_data());
    const Matrices<float> os = recompute ? Matrices<float>(O, batch) : Matrices<float>();
    const float* st = recompute ? static_cast<const float*>(stats.raw_data()) : nullptr;
    // The 1/sqrt(D) goes on dS when neither the bias nor ALiBi's slopes need a gradient, else on dq and dk.
    const float factor = static_cast<float>(wants_raw_ds(needs) ? 1.0 : scale);
    // dbias and the slopes' gradient need dS whole; else each block's dS lives in the block's buffer only.
    const Tensor dS = want_ds && wants_raw_ds(needs) ? new_tensor(scores_shape, DType::float32, "attention") : Tensor();
    float* ds_all = dS.defined() ? static_cast<float*>(mutable_data(dS)) : nullptr;
    const std::int64_t min_items = recompute ? kFusedMinItems : kMinItems;
    const std::int64_t groups = std::clamp<std::int64_t>((min_items + blk.bh - 1) / std::max<std::int64_t>(blk.bh, 1), 1, std::max<std::int64_t>(blk.count, 1));
    std::vector<Tensor> dk_parts, dv_parts;
    std::vector<float*> dk_p, dv_p;
    for (std::int64_t i = 0; i < groups; ++i) {
      if (want_ds && needs[1]) dk_p.push_back(static_cast<float*>(mutable_data(dk_parts.emplace_back(zeros(with_matrix(batch, nk, d), DType::float32)))));
      if (want_dv) dv_p.push_back(static_cast<float*>(mutable_data(dv_parts.emplace_back(zeros(with_matrix(batch, nk, dv), DType::float32)))));
    }
    Tensor dq = want_ds && needs[0] ? zeros(with_matrix(batch, nq, d), DType::float32) : Tensor();
    float* dq_p = dq.defined() ? static_cast<float*>(mutable_data(dq)) : nullptr;
    const RowPointers upstream(d_weights, scores_shape);
    const std::int64_t cost = cost_of({double(blk.rows), double(nk), double((recompute ? 3 : 2) * d + 2 * dv), double(blk.count) / double(groups)});
    parallel_for(blk.bh * groups, cost, [&](std::int64_t i0_, std::int64_t i1_) {
      const auto size = static_cast<std::size_t>(blk.rows * nk);
      std::vector<float> pack, buffer(dS.defined() ? 0 : size), a_buffer(recompute ? size : 0), delta;
      std::vector<std::uint16_t> rounded_a(bf16 ? size : 0), rounded_ds(bf16 ? size : 0);
      for (std::int64_t item = i0_; item < i1_; ++item) {
        const std::int64_t b = item / groups, group = item % groups;
        for (std::int64_t t = group; t < blk.count; t += groups) {
          const std::int64_t i0 = t * blk.rows, n = blk.size(t), r0 = b * nq + i0;
          const std::int64_t end = Blocks::key_end(masks, r0, n, nk);
          // Rows of A and dS: the weights' or the whole dS's (stride K), else buffers of
          // the keys below the block's end
          const std::int64_t ld = recompute && !dS.defined() ? end : nk;
          float* ds = ds_all != nullptr ? ds_all + r0 * nk : buffer.data();
          const float* go_blk = go.defined() ? gs[b] + i0 * gs.ld : nullptr;
          const float* a_blk = recompute ? a_buffer.data() : a_f + r0 * nk;
          if (recompute) {
            // S again, dA = dO vᵀ (not finite where a masked key's v is, never read there),
            // then one pass: P = exp((x - m) - log l), dS = P (dA - Δ) with Δ = rowsum(dO O)
            op.scores_product(b, i0, n, end, a_buffer.data(), ld);
            if (want_ds) {
              if (bf16) tiles::scores_bf16(n, end, dv, 1.0f, gb.rows(gs, b).from(i0), op.vb.rows(op.vs, b), ds, ld);
              else gemm(false, true, n, end, dv, 1.0f, go_blk, gs.ld, op.vs[b], op.vs.ld, 0.0f, ds, ld);
            }
            // Δ from P dA in the pass instead when dbias is asked for: the gradient of a
            // bias constant along rows is 0, a cancellation that O's rounding would spoil
            // under bfloat16 (as for the tiles, docs/gradients.md)
            delta.resize(static_cast<std::size_t>(dS.defined() ? 0 : n));
            for (std::int64_t r = 0; r < n && !dS.defined(); ++r) {
              const float* o_r = os[b] + (i0 + r) * os.ld;
              const float* g_r = go_blk + r * gs.ld;
              double sum = 0;  // in double, as the weights path's rowsum(A dA) is not
              for (std::int64_t c = 0; c < dv; ++c) sum += static_cast<double>(o_r[c]) * static_cast<double>(g_r[c]);
              delta[static_cast<std::size_t>(r)] = static_cast<float>(sum);
            }
            attention_softmax_recompute_rows(a_buffer.data(), op.bias, op.scale, masks, st + 2 * r0, dS.defined() ? nullptr : delta.data(), want_ds ? ds : nullptr,
                                             factor, bf16 ? rounded_a.data() : nullptr, bf16 && want_ds ? rounded_ds.data() : nullptr, ld, r0,
                                             r0 + n);
          } else if (bf16 && want_dv) {
            for (std::int64_t r = 0; r < n; ++r) round_bf16_weights(a_blk + r * nk, rounded_a.data() + r * nk, end);
          }
          // dv += Aᵀ ⊛ dO
          if (want_dv) {
            float* out = dv_p[static_cast<std::size_t>(group)] + b * nk * dv;
            if (bf16) tiles::weighted_gemm_bf16(true, end, dv, n, 1.0f, a_blk, rounded_a.data(), ld, gb.rows(gs, b).from(i0), out, dv);
            else weighted_gemm<float>(true, end, dv, n, 1.0f, a_blk, ld, go_blk, gs.ld, out, dv, pack);
          }
          if (!want_ds) continue;
          if (!recompute) {
            // dA = dO vᵀ into the dS buffer (not finite where a masked key's v is, never
            // read there), then dS over it, the upstream dA added on the fly
            if (go_blk != nullptr) {
              if (bf16) tiles::scores_bf16(n, end, dv, 1.0f, gb.rows(gs, b).from(i0), op.vb.rows(op.vs, b), ds, nk);
              else gemm(false, true, n, end, dv, 1.0f, go_blk, gs.ld, op.vs[b], op.vs.ld, 0.0f, ds, nk);
            }
            const RowPointers da = go_blk != nullptr ? RowPointers::block(ds, scores_shape, r0) : RowPointers(Tensor(), scores_shape);
            attention_softmax_backward_rows(a_blk, da, upstream, factor, masks, ds, bf16 ? rounded_ds.data() : nullptr, r0, r0 + n);
          }
          // dq = dS ⊛ k,  dk += dSᵀ ⊛ q
          float* dk_out = dk_p.empty() ? nullptr : dk_p[static_cast<std::size_t>(group)] + b * nk * d;
          if (bf16) {
            if (dq_p != nullptr) tiles::weighted_gemm_bf16(false, n, d, end, 1.0f, ds, rounded_ds.data(), ld, op.kb.rows(op.ks, b), dq_p + r0 * d, d);
            if (dk_out != nullptr) tiles::weighted_gemm_bf16(true, end, d, n, 1.0f, ds, rounded_ds.data(), ld, op.qb.rows(op.qs, b).from(i0), dk_out, d);
          } else {
            if (dq_p != nullptr) weighted_gemm<float>(false, n, d, end, 1.0f, ds, ld, op.ks[b], op.ks.ld, dq_p + r0 * d, d, pack, op.k_finite);
            if (dk_out != nullptr) weighted_gemm<float>(true, end, d, n, 1.0f, ds, ld, op.qs[b] + i0 * op.qs.ld, op.qs.ld, dk_out, d, pack);
          }
        }
      }
    });
    // The groups' parts added in order into the first (each element the same sum, in the
    // same order, as adding whole parts), holding no more buffer.
    auto summed = [](const std::vector<Tensor>& parts) {
      float* t = static_cast<float*>(mutable_data(parts[0]));
      const auto count = static_cast<std::int64_t>(parts.size());
      parallel_for(parts[0].numel(), count, [&](std::int64_t e0, std::int64_t e1) {
        for (std::int64_t i = 1; i < count; ++i) {
          const float* p = static_cast<const float*>(parts[static_cast<std::size_t>(i)].raw_data());
          for (std::int64_t e = e0; e < e1; ++e) t[e] += p[e];
        }
      });
      return parts[0];
    };
    // With dbias or the slopes' gradient asked for, the factor 1/sqrt(D) is left to the caller (after the sums).
    AttentionGrads grads;
    grads.scaled = !wants_raw_ds(needs);
    if (want_dv) grads.dv = summed(dv_parts);
    if (wants(needs, 3)) grads.dbias = dS;
    if (wants(needs, 4) && dS.defined()) grads.dslopes = alibi_slopes_gradient(dS, masks);
    grads.dq = dq;
    if (!dk_parts.empty()) grads.dk = summed(dk_parts);
    return grads;
  }

 private:
  Tensor q, k, v, bias, A, O, stats;
  RowMasks masks;
  double scale;
  Shape scores_shape, batch;
  Blocks blk;
  std::int64_t dv;
  bool bf16;
};

}  // namespace

AttentionRun attention_blocks(const AttentionArgs& a, const Shape& scores_shape, const RowMasks& masks, double scale, bool bf16,
                                 bool keep, std::int64_t block_rows) {
  const Shape batch(scores_shape.begin(), scores_shape.end() - 2);
  const Blocks blk(scores_shape, block_rows, !keep);
  const std::int64_t nq = blk.nq, nk = blk.nk, dv = a.v.size(-1);
  const Tensor q = matrix_ready(a.q), k = matrix_ready(a.k), v = matrix_ready(a.v);
  // O = A ⊛ v reads v; k only enters q kᵀ, which is a plain product
  const Operands op(q, k, v, a.bias, masks, scores_shape, scale, bf16, true, true, true, false, true);
  // The weights, or (fused) per row the m and log l that the backward makes them again from
  const Tensor weights = keep ? new_tensor(scores_shape, DType::float32, a.op) : Tensor();
  Shape stats_shape = batch;
  stats_shape.push_back(2 * nq);
  const Tensor stats = keep ? Tensor() : new_tensor(stats_shape, DType::float32, a.op);
  const Tensor output = output_in_order_of(a.q, batch, nq, dv);
  const Matrices<float> os(output, batch);
  float* w = keep ? static_cast<float*>(mutable_data(weights)) : nullptr;
  float* st = keep ? nullptr : static_cast<float*>(mutable_data(stats));
  float* o = static_cast<float*>(mutable_data(output));
  parallel_for(blk.bh * blk.count, blk.rows * nk * (op.d + dv), [&](std::int64_t u0, std::int64_t u1) {
    std::vector<float> pack, buffer(static_cast<std::size_t>(keep ? 0 : blk.rows * nk));
    std::vector<std::uint16_t> rounded(static_cast<std::size_t>(bf16 ? blk.rows * nk : 0));
    for (std::int64_t u = u0; u < u1; ++u) {
      const std::int64_t b = u / blk.count, i0 = u % blk.count * blk.rows, n = blk.size(u % blk.count), r0 = b * nq + i0;
      const std::int64_t end = Blocks::key_end(masks, r0, n, nk);
      // S = q kᵀ, A = masked_softmax(s S + bias) (and rounded), O = A ⊛ v; a buffer's rows
      // hold the keys below the block's end only
      float* s = keep ? w + r0 * nk : buffer.data();
      const std::int64_t ld = keep ? nk : end;
      op.weights(b, i0, n, end, s, ld, bf16 ? rounded.data() : nullptr, keep ? nullptr : st + 2 * r0);
      float* o_blk = o + os.offsets[static_cast<std::size_t>(b)] + i0 * os.ld;
      if (bf16) tiles::weighted_gemm_bf16(false, n, dv, end, 1.0f, s, rounded.data(), ld, op.vb.rows(op.vs, b), o_blk, os.ld);
      else weighted_gemm<float>(false, n, dv, end, 1.0f, s, ld, op.vs[b], op.vs.ld, o_blk, os.ld, pack, op.v_finite);
    }
  });
  // The weights path reads A, the fused one makes it again from the masks and the bias; O is
  // read for Δ = rowsum(dO O) unless dbias is asked for (Δ then comes from P dA).
  AttentionRun run{output, weights, masks.saved_with({a.q, a.k, a.v}, /*ends_only=*/keep), nullptr};
  const bool bias_grad = (a.bias.defined() && a.bias.requires_grad()) || (masks.slopes().defined() && masks.slopes().requires_grad());
  if (keep) run.saved.push_back(weights);
  if (!keep && !bias_grad) run.saved.push_back(output);
  if (!keep && a.bias.defined()) run.saved.push_back(a.bias);
  run.backward = std::make_shared<PipelineBackward>(q, k, v, keep ? Tensor() : a.bias, keep ? weights.detach() : Tensor(),
                                                    keep ? Tensor() : output.detach(), stats, masks, scale, scores_shape, blk, dv, bf16);
  return run;
}

}  // namespace tapegrad::detail
