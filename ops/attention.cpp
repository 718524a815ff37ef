// scaled_dot_product_attention and causal_mask. The attention is one tape node; its backward,
// derived in docs/gradients.md, walks the forward in reverse:
//   forward                          backward
//   S = q k^T / sqrt(D) (+ bias)     dq = dS k / sqrt(D),  dk = dS^T q / sqrt(D),  dbias = dS
//   A = masked_softmax(S, mask)      dS = A * (dA - rowsum(A * dA))
//   O = A v                          dA = dO v^T + (upstream gradient of A),  dv = A^T dO
// The scaling, the bias, the mask and the softmax are one pass over the scores
// (attention_softmax.cpp), and the mask is asked for row by row, never materialised. Scores too
// large for the cache go through these steps a block of rows at a time instead
// (attention_pipeline.cpp), so that no step streams them through main memory.
// Masked keys and empty rows have weights exactly 0, and so have their dS. The four products by
// A or dS (O, dv, dq, dk) are weighted_matmul, where a zero weight contributes nothing: a NaN or
// inf in a masked key's k or v, or in an empty row's q, cannot reach any output or gradient
// (a plain matmul would add 0 * NaN = NaN). dA = dO v^T needs no such care: it is NaN at a masked
// key whose v is, but masked_softmax_backward never reads dA where A = 0.
// Under a bfloat16 matmul precision (float32) the same steps run on bfloat16 products with the
// same rules (attention_bf16 below), and so does the fused path.
#include <cmath>

#include "ops/attention_core.hpp"
#include "kernels/attention_operands.hpp"
#include "kernels/attention_tiles.hpp"
#include "ops/op.hpp"
#include "kernels/attention_softmax.hpp"
#include "kernels/weighted_matmul.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/matmul.hpp"
#include "tapegrad/ops/view.hpp"

namespace tapegrad {
namespace detail {
namespace {

Shape leading(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); }

Shape with_matrix(const Shape& batch, std::int64_t rows, std::int64_t cols) {
  Shape s = batch;
  s.push_back(rows);
  s.push_back(cols);
  return s;
}

// Validates q, k, v and bias; returns the scores' shape [..., Q, K].
Shape check_attention(const AttentionArgs& a) {
  const DType dtype = check_same_float(a.op, "q", a.q, "k", a.k);
  check_same_float(a.op, "q", a.q, "v", a.v);
  for (auto [name, t] : {std::pair{"q", &a.q}, {"k", &a.k}, {"v", &a.v}})
    if (t->dim() < 2)
      fail<ShapeError>("{}: argument '{}' must have rank >= 2 ([..., length, width]), got shape {}", a.op, name,
                       shape_str(t->shape()));
  if (a.q.shape().back() != a.k.shape().back())
    fail<ShapeError>("{}: arguments 'q' {} and 'k' {} must have the same last dim D", a.op, shape_str(a.q.shape()),
                     shape_str(a.k.shape()));
  if (a.q.shape().back() < 1)
    fail<ShapeError>("{}: the query/key width D must be >= 1 (scores are scaled by 1/sqrt(D)), got 'q' {} and 'k' {}", a.op,
                     shape_str(a.q.shape()), shape_str(a.k.shape()));
  if (a.k.size(-2) != a.v.size(-2))
    fail<ShapeError>("{}: arguments 'k' {} and 'v' {} must have the same number of keys (dim -2)", a.op,
                     shape_str(a.k.shape()), shape_str(a.v.shape()));
  Shape batch = broadcast_args(a.op, "q (leading dims)", leading(a.q), "k (leading dims)", leading(a.k));
  batch = broadcast_args(a.op, "q and k (leading dims)", batch, "v (leading dims)", leading(a.v));
  Shape scores = batch;
  scores.push_back(a.q.size(-2));
  scores.push_back(a.k.size(-2));
  if (a.bias.defined()) {
    check_floating(a.op, "bias", a.bias);
    if (a.bias.dtype() != dtype)
      fail<DTypeError>("{}: argument 'bias' is {} but the activations are {}; convert it with to()", a.op,
                       a.bias.dtype(), dtype);
    if (broadcast_args(a.op, "scores", scores, "bias", a.bias.shape()) != scores)
      fail<ShapeError>("{}: argument 'bias' with shape {} must broadcast to the scores' shape {}", a.op,
                       shape_str(a.bias.shape()), shape_str(scores));
  }
  check_countable(a.op, fmt::format("q {}, k {} and v {} give the scores", shape_str(a.q.shape()), shape_str(a.k.shape()),
                                    shape_str(a.v.shape())).c_str(), scores);
  // What will be allocated is checked before anything is computed.
  check_shape(a.op, "the output [..., Q, Dv]", with_matrix(batch, a.q.size(-2), a.v.size(-1)), dtype);
  if (a.need_weights) check_shape(a.op, "the weights [..., Q, K]", scores, dtype);
  return scores;  // the mask is checked by RowMasks
}


// C[K, N] += Wᵀ ⊛ X for whole [Q, K] weights W (dv = Aᵀ ⊛ dO, dk = dSᵀ ⊛ q): computed as
// (Xᵀ W̃)ᵀ, the form oneDNN's bfloat16 gemm runs 1.7x faster than W̃ᵀ X̃ at Q = K = 2048 (it
// streams the wide operand by rows), then the non-finite elements of X added back as
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

// The weights path under a bfloat16 matmul precision (float32 only, scores too small for
// attention_pipeline.cpp's blocks): the same forward and
// backward as attention_core's, with every product on bfloat16 operands rounded once per call
// (q, k, v, dO) or written rounded by the softmax passes themselves (A, dS) next to their
// float32 values, so no product pays a pass over the [..., Q, K] weights. The products are the
// fused path's tile products (attention_tiles.hpp) on whole matrices, one batch entry at a
// time: zero weights and non-finite operands are handled exactly as there.
AttentionResult attention_bf16(const AttentionArgs& a, const Shape& scores_shape, const RowMasks& masks, double scale) {
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
  const std::vector<Tensor> inputs{a.q, a.k, a.v, a.bias};
  if (!should_record(inputs)) return {output, weights};
  std::vector<Tensor> outputs{output, weights};
  record_op(a.op, inputs, outputs,
            [q, k, v, qs_shape = a.q.shape(), ks_shape = a.k.shape(), vs_shape = a.v.shape(),
             bias_shape = a.bias.defined() ? a.bias.shape() : Shape{}, A = weights.detach(), rounded_weights, masks, scale, batch, nq, nk, d,
             dv, bh](std::span<const Tensor> g, const std::vector<bool>& needs) {
              const Tensor& d_out = g[0];
              const Tensor& d_weights = g[1];
              std::vector<Tensor> grads(4);
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
                grads[2] = sum_to(dv_full, vs_shape);
              }
              if (!(needs[0] || needs[1] || needs[3])) return grads;
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
              const double factor = needs[3] ? 1.0 : scale;
              auto rounded_ds = std::make_shared<Storage>(static_cast<std::size_t>(bh * nq * nk) * sizeof(std::uint16_t));
              auto* ds_b = reinterpret_cast<std::uint16_t*>(rounded_ds->data);
              // dS in float32 too only for dbias, or where an inf or NaN in q or k is added back
              // by its float32 weight; else only rounded (a [..., Q, K] float32 pass saved).
              const bool float_ds = needs[3] || (needs[0] && kb.any_bad()) || (needs[1] && qb.any_bad());
              const Tensor dS = attention_softmax_backward(A, dA, d_weights, masks, factor, ds_b, float_ds);  // zero where masked
              const float* ds_f = float_ds ? static_cast<const float*>(dS.raw_data()) : nullptr;
              auto ds_at = [&](std::int64_t b) { return ds_f != nullptr ? ds_f + b * nq * nk : nullptr; };
              if (needs[3]) grads[3] = sum_to(dS, bias_shape);
              auto scaled = [&](Tensor t) { return needs[3] ? mul(t, scale) : t; };
              // dq = dS ⊛ k,  dk = dSᵀ ⊛ q
              if (needs[0]) {
                Tensor dq = zeros(with_matrix(batch, nq, d), DType::float32);
                float* out = static_cast<float*>(mutable_data(dq));
                parallel_for(bh, nq * nk * d, [&](std::int64_t b0, std::int64_t b1) {
                  for (std::int64_t b = b0; b < b1; ++b)
                    tiles::weighted_gemm_bf16(false, nq, d, nk, 1.0f, ds_at(b), ds_b + b * nq * nk, nk, kb.rows(ks, b), out + b * nq * d, d);
                });
                grads[0] = scaled(sum_to(dq, qs_shape));
              }
              if (needs[1]) {
                Tensor dk = zeros(with_matrix(batch, nk, d), DType::float32);
                float* out = static_cast<float*>(mutable_data(dk));
                parallel_for(bh, nq * nk * d, [&](std::int64_t b0, std::int64_t b1) {
                  for (std::int64_t b = b0; b < b1; ++b)
                    transposed_weighted_bf16(nq, nk, d, ds_at(b), ds_b + b * nq * nk, qb.rows(qs, b), out + b * nk * d);
                });
                grads[1] = scaled(sum_to(dk, ks_shape));
              }
              return grads;
            },
            masks.saved_with({a.q, a.k, a.v, weights}, /*ends_only=*/true));
  return {outputs[0], outputs[1]};
}

}  // namespace

AttentionResult attention_core(const AttentionArgs& a) {
  const Shape scores_shape = check_attention(a);
  const double scale = 1.0 / std::sqrt(static_cast<double>(a.q.size(-1)));
  if (!a.need_weights) {
    if (!attention_fused_blocks_pay(a, scores_shape)) return {flash_attention(a, scores_shape), Tensor()};
    return attention_pipelined(a, scores_shape, RowMasks(a.op, a.mask, scores_shape), scale);
  }
  const RowMasks masks(a.op, a.mask, scores_shape);
  if (a.q.dtype() == DType::float32 && attention_pipeline_pays(scores_shape)) return attention_pipelined(a, scores_shape, masks, scale);
  if (a.q.dtype() == DType::float32 && matmul_precision() == MatmulPrecision::bfloat16)
    return attention_bf16(a, scores_shape, masks, scale);
  Tensor weights, output;
  {
    NoGradGuard no_grad;  // the pieces are not recorded: the node below is the whole attention
    // Exact products: a bfloat16 precision took the branch above (float32), or does not apply (float64).
    const MatmulPrecisionGuard float32_products(MatmulPrecision::exact);
    const Tensor scores = matmul(a.q, transpose(a.k, -1, -2));
    // The weights carry every leading dim of q, k and v (v may have more than q and k); when
    // they are the scores' own shape, the softmax overwrites the scores in place.
    weights = scores.shape() == scores_shape ? scores : new_tensor(scores_shape, scores.dtype(), a.op);
    attention_softmax_forward(scores.shape() == scores_shape ? scores : expand(scores, scores_shape), scale, a.bias, masks,
                              weights);
    output = weighted_matmul(weights, a.v);
  }
  const std::vector<Tensor> inputs{a.q, a.k, a.v, a.bias};
  if (!should_record(inputs)) return {output, weights};
  std::vector<Tensor> outputs{output, weights};
  record_op(a.op, inputs, outputs,
            [q = a.q, k = a.k, v = a.v, bias_shape = a.bias.defined() ? a.bias.shape() : Shape{}, A = weights.detach(), masks,
             scale](std::span<const Tensor> g, const std::vector<bool>& needs) {
              const Tensor& d_out = g[0];
              const Tensor& d_weights = g[1];
              // As in the forward, whatever the precision where backward() runs.
              const MatmulPrecisionGuard float32_products(MatmulPrecision::exact);
              std::vector<Tensor> grads(4);
              // dv = A^T dO
              if (needs[2] && d_out.defined()) grads[2] = sum_to(weighted_matmul(transpose(A, -1, -2), d_out), v.shape());
              if (!(needs[0] || needs[1] || needs[3])) return grads;
              // dA = dO v^T + upstream dA (read only where A != 0), summed inside the softmax pass
              const Tensor dA = d_out.defined() ? matmul(d_out, transpose(v, -1, -2)) : Tensor();
              if (!dA.defined() && !d_weights.defined()) return grads;
              // The 1/sqrt(D) goes on dS when the bias needs no gradient (dS itself), else on the
              // [..., Q, D] and [..., K, D] results.
              const double factor = needs[3] ? 1.0 : scale;
              const Tensor dS = attention_softmax_backward(A, dA, d_weights, masks, factor);  // zero where masked
              if (needs[3]) grads[3] = sum_to(dS, bias_shape);
              auto scaled = [&](Tensor t) { return needs[3] ? mul(t, scale) : t; };
              if (needs[0]) grads[0] = scaled(sum_to(weighted_matmul(dS, k), q.shape()));
              if (needs[1]) grads[1] = scaled(sum_to(weighted_matmul(transpose(dS, -1, -2), q), k.shape()));
              return grads;
            },
            masks.saved_with({a.q, a.k, a.v, weights}, /*ends_only=*/true));
  return {outputs[0], outputs[1]};
}

}  // namespace detail

namespace {
detail::AttentionMask allowed_only(const Tensor& allowed) {
  detail::AttentionMask m;
  m.allowed = allowed;
  return m;
}
}  // namespace

AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  return detail::attention_core({"scaled_dot_product_attention", q, k, v, Tensor(), allowed_only(mask)});
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  // Only the output is wanted: the fused path, which never holds the [..., Q, K] weights.
  return detail::attention_core({"attention", q, k, v, Tensor(), allowed_only(mask), /*need_weights=*/false}).output;
}

Tensor causal_mask(std::int64_t queries, std::int64_t keys, std::int64_t offset) {
  if (queries < 0 || keys < 0)
    detail::fail<ValueError>("causal_mask: arguments 'queries' and 'keys' must be >= 0, got {} and {}", queries, keys);
  Tensor m = detail::new_tensor({queries, keys}, DType::bool_, "causal_mask");
  bool* p = static_cast<bool*>(detail::mutable_data(m));
  for (std::int64_t i = 0; keys > 0 && i < queries; ++i)  // [2^40, 0] is no work
    for (std::int64_t j = 0; j < keys; ++j) p[i * keys + j] = j - i <= offset;  // j <= i + offset, without overflow
  return m;
}

}  // namespace tapegrad
