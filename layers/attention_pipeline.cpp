// The weights path (need_weights) in blocks of query rows: the same forward and backward as
// attention.cpp's (formulas there and in docs/gradients.md), but each block's scores go from the
// product that writes them through the softmax pass into the products that read them while they
// are still in cache. Done in whole-tensor steps, each of the [..., Q, K] passes streams main
// memory (32 MiB of scores at B = 4, H = 8, Q = K = 512), whose bandwidth a second core barely
// raises, while the products speed up ~1.8x.
//
//   forward, per block of rows             backward, per block of rows
//   S = q kᵀ                               dv += Aᵀ ⊛ dO
//   A = masked_softmax(s S + bias)         dA = dO vᵀ,  dS = A (dA - rowsum(A dA))  (+ upstream dA)
//   O = A ⊛ v                              dq = dS ⊛ k,  dk += dSᵀ ⊛ q
//
// The rows' softmax passes are attention_softmax.cpp's, on the rows of the block; the products
// are the tile products of the fused path (attention_tiles.hpp), so zero weights and non-finite
// operands follow the same rules. Products stop at the block's last causal key (rounded up to
// the softmax loops' padding): A and dS are 0 past it. Under a bfloat16 matmul precision the
// products are those tiles' bfloat16 ones, as attention.cpp's attention_bf16: q, k, v and dO
// rounded once per call, A and dS rounded by the softmax passes as they write a block's rows
// (the backward rounds its block of A again rather than keep a [..., Q, K] bfloat16 copy).
//
// The forward's blocks are independent. In the backward, dk and dv sum over a batch entry's
// blocks: each (batch entry, group) item runs its blocks in order into the group's own buffer
// (a batch entry's blocks are split into `groups` interleaved groups only when there are few batch
// entries), and the groups' buffers are added in order at the end. Groups and blocks follow from
// the shape alone, so the sums do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "autodiff/parallel.hpp"
#include "layers/attention_core.hpp"
#include "layers/attention_operands.hpp"
#include "layers/attention_softmax.hpp"
#include "layers/attention_tiles.hpp"
#include "ops/kernel.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/matmul.hpp"

namespace tapegrad::detail {
namespace {

using tiles::gemm;
using tiles::weighted_gemm;

// A block's float32 scores stay in L2 between the product that writes them and the passes that
// read them: at most kBlockRows rows (the backward's products by Aᵀ and dSᵀ sum over the rows of
// a block: fewer than ~64 and their accumulators' traffic shows) and at most kBlockBytes of
// scores. Measured on the long shape (K = 2048), forward + backward: 32 rows 116 ms, 64 rows
// 89 ms, 128 rows 88 ms; the large shape (K = 512): 64 or 128 rows 99 ms, 256 rows 103 ms.
constexpr std::int64_t kBlockRows = 128, kBlockBytes = 1 << 20;
// Batch entries fewer than this split their blocks into groups (fixed by the shape, not the
// threads) so that the backward has work for every thread.
constexpr std::int64_t kMinItems = 8;

Shape with_matrix(const Shape& batch, std::int64_t rows, std::int64_t cols) {
  Shape s = batch;
  s.push_back(rows);
  s.push_back(cols);
  return s;
}

struct Blocks {
  std::int64_t bh = 0, nq = 0, nk = 0, rows = 0, count = 0;  // count: blocks per batch entry
  Blocks(const Shape& scores, std::int64_t block_rows) {
    bh = shape_numel(Shape(scores.begin(), scores.end() - 2));
    nq = scores[scores.size() - 2];
    nk = scores.back();
    rows = block_rows > 0 ? block_rows : std::clamp<std::int64_t>(kBlockBytes / (4 * std::max<std::int64_t>(nk, 1)) / 16 * 16, 16, kBlockRows);
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

}  // namespace

// Measured forward + backward on one thread (CPU time, the benchmark's layer): at 4 MiB of
// scores (B = 8, H = 8, Q = K = 128) the blocks tie with the whole tensors (13.1 and 13.7 ms),
// at 0.5 MiB (B = 8, H = 4, Q = K = 64) they lose (0.90 and 0.87 ms: many small products
// where one batched product per step did the work), at 32 and 64 MiB they win by 1.26-1.40x.
bool attention_pipeline_pays(const Shape& scores_shape) { return 4 * shape_numel(scores_shape) >= (std::int64_t{8} << 20); }

AttentionResult attention_pipelined(const AttentionArgs& a, const Shape& scores_shape, const RowMasks& masks, double scale,
                                    std::int64_t block_rows) {
  const Shape batch(scores_shape.begin(), scores_shape.end() - 2);
  const Blocks blk(scores_shape, block_rows);
  const bool bf16 = matmul_precision() == MatmulPrecision::bfloat16;
  const std::int64_t nq = blk.nq, nk = blk.nk, d = a.q.size(-1), dv = a.v.size(-1);
  const Tensor q = matrix_ready(a.q), k = matrix_ready(a.k), v = matrix_ready(a.v);
  const Matrices<float> qs(q, batch), ks(k, batch), vs(v, batch);
  const Bf16Matrices qb = bf16 ? Bf16Matrices(q, batch) : Bf16Matrices(), kb = bf16 ? Bf16Matrices(k, batch) : Bf16Matrices(),
                     vb = bf16 ? Bf16Matrices(v, batch) : Bf16Matrices();
  const Tensor weights = new_tensor(scores_shape, DType::float32, a.op);
  const Tensor output = zeros(with_matrix(batch, nq, dv), DType::float32);
  float* w = static_cast<float*>(mutable_data(weights));
  float* o = static_cast<float*>(mutable_data(output));
  const RowPointers s_rows(weights, scores_shape), bias_rows(a.bias, scores_shape);
  parallel_for(blk.bh * blk.count, blk.rows * nk * (d + dv), [&](std::int64_t u0, std::int64_t u1) {
    std::vector<float> pack;
    std::vector<std::uint16_t> rounded(static_cast<std::size_t>(bf16 ? blk.rows * nk : 0));
    for (std::int64_t u = u0; u < u1; ++u) {
      const std::int64_t b = u / blk.count, i0 = u % blk.count * blk.rows, n = blk.size(u % blk.count), r0 = b * nq + i0;
      const std::int64_t end = Blocks::key_end(masks, r0, n, nk);
      float* s = w + r0 * nk;
      // S = q kᵀ (scaled in the softmax pass), A = masked_softmax(S) (and rounded), O = A ⊛ v
      if (bf16) tiles::scores_bf16(n, end, d, 1.0f, qb.rows(qs, b).from(i0), kb.rows(ks, b), s, nk);
      else gemm(false, true, n, end, d, 1.0f, qs[b] + i0 * qs.ld, qs.ld, ks[b], ks.ld, 0.0f, s, nk);
      attention_softmax_forward_rows(s_rows, bias_rows, static_cast<float>(scale), masks, w, bf16 ? rounded.data() : nullptr, r0, r0 + n);
      if (bf16) tiles::weighted_gemm_bf16(false, n, dv, end, 1.0f, s, rounded.data(), nk, vb.rows(vs, b), o + r0 * dv, dv);
      else weighted_gemm<float>(false, n, dv, end, 1.0f, s, nk, vs[b], vs.ld, o + r0 * dv, dv, pack);
    }
  });
  const std::vector<Tensor> inputs{a.q, a.k, a.v, a.bias};
  if (!should_record(inputs)) return {output, weights};
  std::vector<Tensor> outputs{output, weights};
  record_op(a.op, inputs, outputs,
            [q, k, v, q_shape = a.q.shape(), k_shape = a.k.shape(), v_shape = a.v.shape(),
             bias_shape = a.bias.defined() ? a.bias.shape() : Shape{}, A = weights.detach(), masks, scale, scores_shape, batch, blk, d,
             dv, bf16](std::span<const Tensor> g, const std::vector<bool>& needs) {
              const Tensor& d_out = g[0];
              const Tensor& d_weights = g[1];
              const std::int64_t nq = blk.nq, nk = blk.nk;
              std::vector<Tensor> grads(4);
              const bool want_dv = needs[2] && d_out.defined();
              const bool want_ds = (needs[0] || needs[1] || needs[3]) && (d_out.defined() || d_weights.defined());
              if (!want_dv && !want_ds) return grads;
              const Matrices<float> qs(q, batch), ks(k, batch), vs(v, batch);
              const Tensor go = d_out.defined() ? matrix_ready(d_out) : Tensor();
              const Matrices<float> gs = go.defined() ? Matrices<float>(go, batch) : Matrices<float>();
              // As in the forward, whatever the precision where backward() runs.
              const Bf16Matrices qb = bf16 && want_ds && needs[1] ? Bf16Matrices(q, batch) : Bf16Matrices(),
                                 kb = bf16 && want_ds && needs[0] ? Bf16Matrices(k, batch) : Bf16Matrices(),
                                 vb = bf16 && want_ds && go.defined() ? Bf16Matrices(v, batch) : Bf16Matrices(),
                                 gb = bf16 && go.defined() ? Bf16Matrices(go, batch) : Bf16Matrices();
              const float* a_f = static_cast<const float*>(A.raw_data());
              // The 1/sqrt(D) goes on dS when the bias needs no gradient, else on dq and dk.
              const float factor = static_cast<float>(needs[3] ? 1.0 : scale);
              // dbias needs dS whole; else each block's dS lives in the block's buffer only.
              const Tensor dS = want_ds && needs[3] ? new_tensor(scores_shape, DType::float32, "attention") : Tensor();
              float* ds_all = dS.defined() ? static_cast<float*>(mutable_data(dS)) : nullptr;
              const std::int64_t groups = std::clamp<std::int64_t>((kMinItems + blk.bh - 1) / std::max<std::int64_t>(blk.bh, 1), 1, std::max<std::int64_t>(blk.count, 1));
              std::vector<Tensor> dk_parts, dv_parts;
              std::vector<float*> dk_p, dv_p;
              for (std::int64_t i = 0; i < groups; ++i) {
                if (want_ds && needs[1]) dk_p.push_back(static_cast<float*>(mutable_data(dk_parts.emplace_back(zeros(with_matrix(batch, nk, d), DType::float32)))));
                if (want_dv) dv_p.push_back(static_cast<float*>(mutable_data(dv_parts.emplace_back(zeros(with_matrix(batch, nk, dv), DType::float32)))));
              }
              Tensor dq = want_ds && needs[0] ? zeros(with_matrix(batch, nq, d), DType::float32) : Tensor();
              float* dq_p = dq.defined() ? static_cast<float*>(mutable_data(dq)) : nullptr;
              const RowPointers upstream(d_weights, scores_shape);
              const std::int64_t block_cost = blk.rows * nk * (2 * d + 2 * dv);
              parallel_for(blk.bh * groups, block_cost * blk.count / groups, [&](std::int64_t i0_, std::int64_t i1_) {
                std::vector<float> pack, buffer(static_cast<std::size_t>(dS.defined() ? 0 : blk.rows * nk));
                std::vector<std::uint16_t> rounded(static_cast<std::size_t>(bf16 ? blk.rows * nk : 0));
                for (std::int64_t item = i0_; item < i1_; ++item) {
                  const std::int64_t b = item / groups, group = item % groups;
                  for (std::int64_t t = group; t < blk.count; t += groups) {
                    const std::int64_t i0 = t * blk.rows, n = blk.size(t), r0 = b * nq + i0;
                    const std::int64_t end = Blocks::key_end(masks, r0, n, nk);
                    const float* a_blk = a_f + r0 * nk;
                    const float* go_blk = go.defined() ? gs[b] + i0 * gs.ld : nullptr;
                    // dv += Aᵀ ⊛ dO
                    if (want_dv) {
                      float* out = dv_p[static_cast<std::size_t>(group)] + b * nk * dv;
                      if (bf16) {
                        for (std::int64_t r = 0; r < n; ++r) round_bf16_weights(a_blk + r * nk, rounded.data() + r * nk, end);
                        tiles::weighted_gemm_bf16(true, end, dv, n, 1.0f, a_blk, rounded.data(), nk, gb.rows(gs, b).from(i0), out, dv);
                      } else {
                        weighted_gemm<float>(true, end, dv, n, 1.0f, a_blk, nk, go_blk, gs.ld, out, dv, pack);
                      }
                    }
                    if (!want_ds) continue;
                    // dA = dO vᵀ into the dS buffer (not finite where a masked key's v is, never read
                    // there), then dS over it, the upstream dA added on the fly
                    float* ds = ds_all != nullptr ? ds_all + r0 * nk : buffer.data();
                    if (go_blk != nullptr) {
                      if (bf16) tiles::scores_bf16(n, end, dv, 1.0f, gb.rows(gs, b).from(i0), vb.rows(vs, b), ds, nk);
                      else gemm(false, true, n, end, dv, 1.0f, go_blk, gs.ld, vs[b], vs.ld, 0.0f, ds, nk);
                    }
                    const RowPointers da = go_blk != nullptr ? RowPointers::block(ds, scores_shape, r0) : RowPointers(Tensor(), scores_shape);
                    attention_softmax_backward_rows(a_f, da, upstream, factor, masks, ds, bf16 ? rounded.data() : nullptr, r0, r0 + n);
                    // dq = dS ⊛ k,  dk += dSᵀ ⊛ q
                    float* dk_out = dk_p.empty() ? nullptr : dk_p[static_cast<std::size_t>(group)] + b * nk * d;
                    if (bf16) {
                      if (dq_p != nullptr) tiles::weighted_gemm_bf16(false, n, d, end, 1.0f, ds, rounded.data(), nk, kb.rows(ks, b), dq_p + r0 * d, d);
                      if (dk_out != nullptr) tiles::weighted_gemm_bf16(true, end, d, n, 1.0f, ds, rounded.data(), nk, qb.rows(qs, b).from(i0), dk_out, d);
                    } else {
                      if (dq_p != nullptr) weighted_gemm<float>(false, n, d, end, 1.0f, ds, nk, ks[b], ks.ld, dq_p + r0 * d, d, pack);
                      if (dk_out != nullptr) weighted_gemm<float>(true, end, d, n, 1.0f, ds, nk, qs[b] + i0 * qs.ld, qs.ld, dk_out, d, pack);
                    }
                  }
                }
              });
              auto summed = [](const std::vector<Tensor>& parts) {
                Tensor t = parts[0];
                for (std::size_t i = 1; i < parts.size(); ++i) t = add_same_shape(t, parts[i]);
                return t;
              };
              auto scaled = [&](Tensor t) { return needs[3] ? mul(t, scale) : t; };
              if (want_dv) grads[2] = sum_to(summed(dv_parts), v_shape);
              if (dS.defined()) grads[3] = sum_to(dS, bias_shape);
              if (dq.defined()) grads[0] = scaled(sum_to(dq, q_shape));
              if (!dk_parts.empty()) grads[1] = scaled(sum_to(summed(dk_parts), k_shape));
              return grads;
            },
            /*saved=*/std::vector<Tensor>{a.q, a.k, a.v, weights});
  return {outputs[0], outputs[1]};
}

}  // namespace tapegrad::detail
