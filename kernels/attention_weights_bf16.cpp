// Attention's weights path on bfloat16 products: float32 operands under a bfloat16 matmul
// precision, scores too small for the pipelined blocks (attention_paths.cpp chooses).
#include <algorithm>
#include <memory>
#include <vector>

#include "kernels/attention_alibi.hpp"
#include "kernels/attention_operands.hpp"
#include "kernels/attention_paths.hpp"
#include "kernels/attention_softmax.hpp"
#include "kernels/attention_products.hpp"
#include "runtime/parallel.hpp"

namespace tapegrad::detail {
namespace {

// C[K, N] += Wᵀ ⊛ X for whole [Q, K] weights W (dv = Aᵀ ⊛ dO, dk = dSᵀ ⊛ q): computed as
// (Xᵀ W̃)ᵀ, the form oneDNN's bfloat16 gemm runs much faster than W̃ᵀ X̃ (it streams the wide
// operand by rows), then the non-finite elements of X added back as
// weighted_gemm_bf16 does.
void transposed_weighted_bf16(std::int64_t q, std::int64_t k, std::int64_t n, const float* w, const std::uint16_t* wb,
                              const tiles::RoundedRows& x, float* c) {
  if (q == 0 || k == 0 || n == 0) return;
  thread_local std::vector<float> t;
  t.resize(static_cast<std::size_t>(n * k));
  gemm_bf16(true, false, n, k, q, 1.0f, x.bits, x.ld_bits, wb, k, 0.0f, t.data(), k);
  constexpr std::int64_t kBlock = 32;  // both sides of the transpose stay in L1
  for (std::int64_t j0 = 0; j0 < k; j0 += kBlock)
    for (std::int64_t i0 = 0; i0 < n; i0 += kBlock)
      for (std::int64_t j = j0; j < std::min(k, j0 + kBlock); ++j)
        for (std::int64_t i = i0; i < std::min(n, i0 + kBlock); ++i) c[j * n + i] += t[static_cast<std::size_t>(i * k + j)];
  if (x.any_bad(q)) tiles::add_non_finite(true, k, n, q, 1.0f, w, k, x.x, x.ld, x.bad, c, n);
}

// The backward: q, k, v and the weights A, in float32 and (rounded once, in the forward) bfloat16.
class Bf16Backward final : public AttentionBackward {
 public:
  Bf16Backward(Tensor q_, Tensor k_, Tensor v_, Tensor a_, std::shared_ptr<Storage> rounded, RowMasks masks_, double scale_, Shape batch_,
               std::int64_t nq_, std::int64_t nk_, std::int64_t d_, std::int64_t dv_)
      : q(std::move(q_)), k(std::move(k_)), v(std::move(v_)), A(std::move(a_)), rounded_weights(std::move(rounded)), masks(std::move(masks_)),
        scale(scale_), batch(std::move(batch_)), nq(nq_), nk(nk_), d(d_), dv(dv_), bh(shape_numel(batch)) {}

  AttentionGrads operator()(const Tensor& d_out, const Tensor& d_weights, const std::vector<bool>& needs) const override {
    AttentionGrads grads;
    grads.scaled = !wants_raw_ds(needs);  // with dbias or the slopes' gradient asked for, 1/sqrt(D) is left to the caller
    const Matrices<float> qs(q, batch), ks(k, batch), vs(v, batch);
    const Bf16Matrices qb(q, batch), kb(k, batch), vb(v, batch);
    const float* a_f = static_cast<const float*>(A.raw_data());
    const auto* a_b = reinterpret_cast<const std::uint16_t*>(rounded_weights->data);
    const Tensor go = d_out.defined() ? matrix_ready(d_out) : Tensor();
    const Matrices<float> gs = go.defined() ? Matrices<float>(go, batch) : Matrices<float>();
    const Bf16Matrices gb = go.defined() ? Bf16Matrices(go, batch) : Bf16Matrices();
    // dv = Aᵀ ⊛ dO
    if (needs[2] && go.defined()) {
      Tensor dv_full = zeros(with_matrix(batch, nk, dv), DType::float32);
      float* out = static_cast<float*>(mutable_data(dv_full));
      parallel_for(bh, nq * nk * dv, [&](std::int64_t b0, std::int64_t b1) {
        for (std::int64_t b = b0; b < b1; ++b)
          transposed_weighted_bf16(nq, nk, dv, a_f + b * nq * nk, a_b + b * nq * nk, gb.rows(gs, b), out + b * nk * dv);
      });
      grads.dv = dv_full;
    }
    if (!(needs[0] || needs[1] || wants_raw_ds(needs))) return grads;
    // dA = dO vᵀ + upstream dA (read only where A != 0), summed inside the softmax pass
    Tensor dA;
    if (go.defined()) {
      dA = new_tensor(with_matrix(batch, nq, nk), DType::float32, "attention");
      float* out = static_cast<float*>(mutable_data(dA));
      parallel_for(bh, nq * nk * dv, [&](std::int64_t b0, std::int64_t b1) {
        for (std::int64_t b = b0; b < b1; ++b)
          tiles::scores_bf16(nq, nk, dv, 1.0f, gb.rows(gs, b), vb.rows(vs, b), out + b * nq * nk, nk);
      });
    }
    if (!dA.defined() && !d_weights.defined()) return grads;
    const double factor = wants_raw_ds(needs) ? 1.0 : scale;
    auto rounded_ds = std::make_shared<Storage>(static_cast<std::size_t>(bh * nq * nk) * sizeof(std::uint16_t));
    auto* ds_b = reinterpret_cast<std::uint16_t*>(rounded_ds->data);
    // dS in float32 too only for dbias and the slopes, or where an inf or NaN in q or k is added back
    // by its float32 weight; else only rounded (a [..., Q, K] float32 pass saved).
    const bool float_ds = wants_raw_ds(needs) || (needs[0] && kb.any_bad()) || (needs[1] && qb.any_bad());
    const Tensor dS = attention_softmax_backward(A, dA, d_weights, masks, factor, ds_b, float_ds);  // zero where masked
    const float* ds_f = float_ds ? static_cast<const float*>(dS.raw_data()) : nullptr;
    auto ds_at = [&](std::int64_t b) { return ds_f != nullptr ? ds_f + b * nq * nk : nullptr; };
    if (wants(needs, 3)) grads.dbias = dS;
    if (wants(needs, 4)) grads.dslopes = alibi_slopes_gradient(dS, masks);
    // dq = dS ⊛ k,  dk = dSᵀ ⊛ q
    if (needs[0]) {
      Tensor dq = zeros(with_matrix(batch, nq, d), DType::float32);
      float* out = static_cast<float*>(mutable_data(dq));
      parallel_for(bh, nq * nk * d, [&](std::int64_t b0, std::int64_t b1) {
        for (std::int64_t b = b0; b < b1; ++b)
          tiles::weighted_gemm_bf16(false, nq, d, nk, 1.0f, ds_at(b), ds_b + b * nq * nk, nk, kb.rows(ks, b), out + b * nq * d, d);
      });
      grads.dq = dq;
    }
    if (needs[1]) {
      Tensor dk = zeros(with_matrix(batch, nk, d), DType::float32);
      float* out = static_cast<float*>(mutable_data(dk));
      parallel_for(bh, nq * nk * d, [&](std::int64_t b0, std::int64_t b1) {
        for (std::int64_t b = b0; b < b1; ++b)
          transposed_weighted_bf16(nq, nk, d, ds_at(b), ds_b + b * nq * nk, qb.rows(qs, b), out + b * nk * d);
      });
      grads.dk = dk;
    }
    return grads;
  }

 private:
  Tensor q, k, v, A;
  std::shared_ptr<Storage> rounded_weights;
  RowMasks masks;
  double scale;
  Shape batch;
  std::int64_t nq, nk, d, dv, bh;
};

}  // namespace

// The weights path under a bfloat16 matmul precision (float32 only, scores too small for
// attention_blocks.cpp's blocks): the same forward and
// backward as attention_core's, with every product on bfloat16 operands rounded once per call
// (q, k, v, dO) or written rounded by the softmax passes themselves (A, dS) next to their
// float32 values, so no product pays a pass over the [..., Q, K] weights. The products are the
// fused path's tile products (attention_products.hpp) on whole matrices, one batch entry at a
// time: zero weights and non-finite operands are handled exactly as there.
AttentionRun attention_weights_bf16(const AttentionArgs& a, const Shape& scores_shape, const RowMasks& masks, double scale) {
  const Shape batch(scores_shape.begin(), scores_shape.end() - 2);
  const std::int64_t bh = shape_numel(batch), nq = scores_shape[scores_shape.size() - 2], nk = scores_shape.back();
  const std::int64_t d = a.q.size(-1), dv = a.v.size(-1);
  const Tensor q = matrix_ready(a.q), k = matrix_ready(a.k), v = matrix_ready(a.v);
  const Matrices<float> qs(q, batch), ks(k, batch), vs(v, batch);
  const Bf16Matrices qb(q, batch), kb(k, batch), vb(v, batch);
  const auto pairs = static_cast<std::size_t>(shape_numel(scores_shape));
  auto rounded_weights = std::make_shared<Storage>(pairs * sizeof(std::uint16_t));
  auto* ab = reinterpret_cast<std::uint16_t*>(rounded_weights->data);
  const Tensor weights = new_tensor(scores_shape, DType::float32, a.op);
  const Tensor output = zeros(with_matrix(batch, nq, dv), DType::float32);
  float* w = static_cast<float*>(mutable_data(weights));
  float* o = static_cast<float*>(mutable_data(output));
  // S = q kᵀ (scaled in the softmax pass), A = masked_softmax(S) and its rounded copy, O = A ⊛ v
  parallel_for(bh, nq * nk * d, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b)
      tiles::scores_bf16(nq, nk, d, 1.0f, qb.rows(qs, b), kb.rows(ks, b), w + b * nq * nk, nk);
  });
  attention_softmax_forward(weights, scale, a.bias, masks, weights, ab);
  parallel_for(bh, nq * nk * dv, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b)
      tiles::weighted_gemm_bf16(false, nq, dv, nk, 1.0f, w + b * nq * nk, ab + b * nq * nk, nk, vb.rows(vs, b), o + b * nq * dv, dv);
  });
  AttentionRun run{output, weights, masks.saved_with({a.q, a.k, a.v, weights}, /*ends_only=*/true), nullptr};
  run.backward = std::make_shared<Bf16Backward>(q, k, v, weights.detach(), std::move(rounded_weights), masks, scale, batch, nq, nk, d, dv);
  return run;
}

}  // namespace tapegrad::detail
