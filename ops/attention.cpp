// scaled_dot_product_attention, attention and causal_mask. One attention call is one tape node;
// its backward, derived in docs/gradients.md, walks the forward in reverse:
//   forward                          backward
//   S = q k^T / sqrt(D) (+ bias)     dq = dS k / sqrt(D),  dk = dS^T q / sqrt(D),  dbias = dS
//   A = masked_softmax(S, mask)      dS = A * (dA - rowsum(A * dA))
//   O = A v                          dA = dO v^T + (upstream gradient of A),  dv = A^T dO
// This file computes it plainly (weights_path below): whole-tensor products, and one pass over
// the scores for the scaling, the bias, the mask (asked for row by row, never materialised) and
// the softmax. That is the reference. Larger shapes, bfloat16 products and calls that need no
// weights take a fast path of kernels/ (attention_paths.hpp says which pays when), tested
// against this one; every path records its node here.
// Masked keys and empty rows have weights exactly 0, and so have their dS. The four products by
// A or dS (O, dv, dq, dk) are weighted_matmul, where a zero weight contributes nothing: a NaN or
// inf in a masked key's k or v, or in an empty row's q, cannot reach any output or gradient
// (a plain matmul would add 0 * NaN = NaN). dA = dO v^T needs no such care: it is NaN at a masked
// key whose v is, but the softmax backward never reads dA where A = 0.
#include <array>
#include <cmath>

#include "kernels/attention_alibi.hpp"
#include "kernels/attention_softmax.hpp"
#include "kernels/weighted_matmul.hpp"
#include "ops/attention_core.hpp"
#include "ops/attention_masking.hpp"
#include "ops/op.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/matmul.hpp"
#include "tapegrad/ops/view.hpp"

namespace tapegrad {
namespace detail {
namespace {
Shape leading(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); }
}  // namespace

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
  return scores;  // the masking is checked against it (masking_rows)
}

namespace {

// The plain path, as the table above says it.
AttentionResult weights_path(const AttentionArgs& a, const Shape& scores_shape, const RowMasks& masks, double scale) {
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
  const std::vector<Tensor> inputs{a.q, a.k, a.v, a.bias, masks.slopes()};
  if (!should_record(inputs)) return {output, weights};
  std::vector<Tensor> outputs{output, weights};
  record_op(a.op, inputs, outputs,
            [q = a.q, k = a.k, v = a.v, bias_shape = a.bias.defined() ? a.bias.shape() : Shape{}, A = weights.detach(), masks,
             scale, a, scores_shape, reads = SecondOrderReads(a, masks)](std::span<const Tensor> g, const std::vector<bool>& needs) {
              if (creating_graph()) return attention_backward_with_graph(a, scores_shape, masks, scale, reads, g, needs);
              const Tensor& d_out = g[0];
              const Tensor& d_weights = g[1];
              // As in the forward, whatever the precision where backward() runs.
              const MatmulPrecisionGuard float32_products(MatmulPrecision::exact);
              std::vector<Tensor> grads(5);
              // dv = A^T dO
              if (needs[2] && d_out.defined()) grads[2] = sum_to(weighted_matmul(transpose(A, -1, -2), d_out), v.shape());
              if (!(needs[0] || needs[1] || wants_raw_ds(needs))) return grads;
              // dA = dO v^T + upstream dA (read only where A != 0), summed inside the softmax pass
              const Tensor dA = d_out.defined() ? matmul(d_out, transpose(v, -1, -2)) : Tensor();
              if (!dA.defined() && !d_weights.defined()) return grads;
              // The 1/sqrt(D) goes on dS when neither the bias nor the slopes need a gradient (they
              // read dS itself), else on the [..., Q, D] and [..., K, D] results.
              const bool raw = wants_raw_ds(needs);
              const double factor = raw ? 1.0 : scale;
              const Tensor dS = attention_softmax_backward(A, dA, d_weights, masks, factor);  // zero where masked
              if (needs[3]) grads[3] = sum_to(dS, bias_shape);
              if (needs[4]) grads[4] = alibi_slopes_gradient(dS, masks);
              auto scaled = [&](Tensor t) { return raw ? mul(t, scale) : t; };
              if (needs[0]) grads[0] = scaled(sum_to(weighted_matmul(dS, k), q.shape()));
              if (needs[1]) grads[1] = scaled(sum_to(weighted_matmul(transpose(dS, -1, -2), q), k.shape()));
              return grads;
            },
            masks.saved_with({a.q, a.k, a.v, weights}, /*ends_only=*/true));
  return {outputs[0], outputs[1]};
}

// A fast path's node: its forward has run; the backward hands the upstream gradients to the
// path and finishes what it returns (the sums over broadcast dims, the factor 1/sqrt(D) where
// the path left it).
AttentionResult record_fast(const AttentionArgs& a, const Shape& scores_shape, const RowMasks& masks, AttentionRun run, double scale) {
  const std::vector<Tensor> inputs{a.q, a.k, a.v, a.bias, masks.slopes()};
  if (!should_record(inputs)) return {run.output, run.weights};
  std::vector<Tensor> outputs{run.output};
  if (run.weights.defined()) outputs.push_back(run.weights);
  record_op(a.op, inputs, outputs,
            [backward = run.backward, shapes = std::array<Shape, 4>{a.q.shape(), a.k.shape(), a.v.shape(), a.bias.defined() ? a.bias.shape() : Shape{}},
             scale, a, scores_shape = scores_shape, masks, reads = SecondOrderReads(a, masks)](std::span<const Tensor> g,
                                                                                        const std::vector<bool>& needs) {
              if (creating_graph()) return attention_backward_with_graph(a, scores_shape, masks, scale, reads, g, needs);
              const AttentionGrads r = (*backward)(g[0], g.size() > 1 ? g[1] : Tensor(), needs);
              auto finish = [&](const Tensor& t, std::size_t i, bool times_scale) {
                if (!t.defined() || !needs[i]) return Tensor();
                const Tensor summed = sum_to(t, shapes[i]);
                return times_scale ? mul(summed, scale) : summed;
              };
              return std::vector<Tensor>{finish(r.dq, 0, !r.scaled), finish(r.dk, 1, !r.scaled), finish(r.dv, 2, false),
                                         finish(r.dbias, 3, false), needs[4] ? r.dslopes : Tensor()};
            },
            std::move(run.saved));
  return {outputs[0], run.weights.defined() ? outputs[1] : Tensor()};
}

// No scores (a zero-size batch, Q or K): the output is zeros (a query without keys gets 0) and
// so is every gradient. Nothing of [..., Q, K] is formed: counted with 0 as 1, its shape may be
// one that no tensor can have (K = 2^46 with an empty batch), and the weights exist only when
// asked for, when check_attention has found them addressable.
AttentionResult no_scores(const AttentionArgs& a, const Shape& scores_shape, const Tensor& slopes) {
  const Shape batch(scores_shape.begin(), scores_shape.end() - 2);
  const DType dtype = a.q.dtype();
  Tensor output = zeros(with_matrix(batch, a.q.size(-2), a.v.size(-1)), dtype);
  Tensor weights = a.need_weights ? zeros(scores_shape, dtype) : Tensor();
  const std::vector<Tensor> inputs{a.q, a.k, a.v, a.bias, slopes};
  if (!should_record(inputs)) return {output, weights};
  std::vector<Tensor> outputs{output};
  if (weights.defined()) outputs.push_back(weights);
  // dq = dk = dv = dbias = dslopes = 0
  record_op(a.op, inputs, outputs,
            [shapes = std::array<Shape, 5>{a.q.shape(), a.k.shape(), a.v.shape(), a.bias.defined() ? a.bias.shape() : Shape{},
                                           slopes.defined() ? slopes.shape() : Shape{}},
             dtype](std::span<const Tensor>, const std::vector<bool>& needs) {
              std::vector<Tensor> grads(5);
              for (std::size_t i = 0; i < 5; ++i)
                if (needs[i]) grads[i] = zeros(shapes[i], dtype);
              return grads;
            },
            std::span<const Tensor>());
  return {outputs[0], weights.defined() ? outputs[1] : Tensor()};
}

}  // namespace

AttentionResult attention_core(const AttentionArgs& a, const Shape& scores_shape, const RowMasks& masks, std::optional<AttentionPath> path,
                               std::int64_t block_rows) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(a.q.size(-1)));
  if (shape_numel(scores_shape) == 0) return no_scores(a, scores_shape, masks.slopes());
  const bool bf16 = a.q.dtype() == DType::float32 && matmul_precision() == MatmulPrecision::bfloat16;
  const AttentionPath taken = path ? *path : attention_path(a, scores_shape, masks, bf16);
  AttentionResult r = taken == AttentionPath::weights
                          ? weights_path(a, scores_shape, masks, scale)
                          : record_fast(a, scores_shape, masks, run_attention(taken, a, scores_shape, masks, scale, bf16, block_rows), scale);
  if (!a.need_weights) r.weights = Tensor();  // a short row's weights path made them: dropped, as the fused paths never make them
  return r;
}

AttentionResult attention_core(const AttentionArgs& a, const AttentionMasking& masking, std::optional<AttentionPath> path,
                               std::int64_t block_rows, const MaskNames& names) {
  const Shape scores_shape = check_attention(a);
  return attention_core(a, scores_shape, masking_rows(a.op, masking, scores_shape, a.q.dtype(), names), path, block_rows);
}

}  // namespace detail

AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  return detail::attention_core({"scaled_dot_product_attention", q, k, v, Tensor()}, AttentionMasking{.mask = mask}, std::nullopt, 0,
                                {.prefix = "", .mask = "mask"});
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  // Only the output is wanted: the fused path, which never holds the [..., Q, K] weights.
  return detail::attention_core({"attention", q, k, v, Tensor(), /*need_weights=*/false}, AttentionMasking{.mask = mask}, std::nullopt,
                                0, {.prefix = "", .mask = "mask"})
      .output;
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
