// scaled_dot_product_attention computed the way it is written down: the reference every fast path
// of kernels/ is tested against, and the backward that every path's node runs in a create_graph
// pass. One tape node; its backward walks the forward in reverse, a line for each step:
//
//   forward                                   backward
//   S = q kᵀ s + bias + alibi                 dq = dS k s,  dk = dSᵀ q s,  dbias = dS,  dm_h = −Σ dS |p_i − j|
//   A = masked_softmax(S, allowed)            dS = A ⊙ (dA − rowsum(A ⊙ dA))    (0 where A is 0)
//   O = A v                                   dA = dO vᵀ + upstream dA,  dv = Aᵀ dO
//
// s = 1/sqrt(D); alibi puts −m_h |p_i − j| on head h's scores, p_i = i + causal_offset; allowed
// is the call's RowMasks (kernels/attention_mask.hpp): the causal rule, the window, the key, query
// and pair masks, read row by row. Masked keys and empty rows have A exactly 0, and so their dS;
// the products by A or dS skip zero weights (weighted), so a masked key's k or v, or an empty
// row's q, reaches no output or gradient even holding NaN (0 · NaN would be NaN).
//
// Every line of the backward is an op that records in a create_graph pass, with A joined to this
// node: the gradients of the gradients come from the same lines, of every order.
#include <span>
#include <vector>

#include "kernels/weighted_matmul.hpp"
#include "ops/attention_core.hpp"
#include "ops/op.hpp"
#include "ops/softmax.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/softmax.hpp"
#include "tapegrad/ops/view.hpp"

namespace tapegrad::detail {
namespace {

Tensor weighted(const Tensor& w, const Tensor& x);

// x yᵀ (batch dims broadcast). Read only where allowed, so it needs no care with NaN; its
// gradient dC is 0 wherever the scores were masked, so its backward's products skip it.
//   dx = dC y,  dy = dCᵀ x
Tensor scores(const Tensor& x, const Tensor& y) {
  Tensor out = weighted_matmul(x, transpose(y.detach(), -1, -2));  // detached: the view is not recorded either
  record("attention_scores", {x, y}, out, {x, y}, [x, y](std::span<const Tensor> g, const std::vector<bool>& needs) {
    std::vector<Tensor> grads(2);
    if (needs[0]) grads[0] = sum_to(weighted(g[0], y), x.shape());
    if (needs[1]) grads[1] = sum_to(weighted(transpose(g[0], -1, -2), x), y.shape());
    return grads;
  });
  return out;
}

// w x (batch dims broadcast), a zero weight contributing nothing (kernels/weighted_matmul.hpp).
//   dw = dC xᵀ (read only where w != 0),  dx = wᵀ dC
Tensor weighted(const Tensor& w, const Tensor& x) {
  Tensor out = weighted_matmul(w, x);
  record("attention_weighted", {w, x}, out, {w, x}, [w, x](std::span<const Tensor> g, const std::vector<bool>& needs) {
    std::vector<Tensor> grads(2);
    if (needs[0]) grads[0] = sum_to(scores(g[0], x), w.shape());
    if (needs[1]) grads[1] = sum_to(weighted(transpose(w, -1, -2), g[0]), x.shape());
    return grads;
  });
  return out;
}

// −|p_i − j| over [Q, K], exact integers (|causal_offset| <= 2^52), in `dtype`.
Tensor minus_distances(const RowMasks& masks, std::int64_t q, std::int64_t k, DType dtype) {
  std::vector<double> d(static_cast<std::size_t>(q * k));
  for (std::int64_t i = 0; i < q; ++i) {
    const std::int64_t p = masks.row(i).position;
    for (std::int64_t j = 0; j < k; ++j) d[static_cast<std::size_t>(i * k + j)] = -static_cast<double>(p > j ? p - j : j - p);
  }
  return from_vector(std::span<const double>(d), {q, k}).to(dtype);
}

// The scores' heads: the shape [..., 1, 1] that the slopes [H] are laid over, its trailing
// leading dims multiplying to H ([H] of [B, H, Q, K], [Hkv, G] of the grouped [B, Hkv, G, Q, K]).
Shape laid_heads(const Shape& scores, std::int64_t heads) {
  Shape laid{1, 1};
  for (std::size_t d = scores.size() - 2, n = 1; d-- > 0 && n < static_cast<std::size_t>(heads);) {
    n *= static_cast<std::size_t>(scores[d]);
    laid.insert(laid.begin(), scores[d]);
  }
  return laid;
}

// A = masked_softmax(q kᵀ s + bias + alibi, allowed): the forward's first two lines, in ops that
// record when grad mode is on.
Tensor weights_of(const Tensor& q, const Tensor& k, const Tensor& bias, const RowMasks& masks, const Shape& shape, double scale) {
  Tensor s = mul(scores(q, k), scale);
  if (bias.defined()) s = add(s, bias);
  if (const Tensor& m = masks.slopes(); m.defined()) {
    const std::int64_t q = shape[shape.size() - 2], k = shape.back();
    s = add(s, mul(reshape(m, laid_heads(shape, m.numel())), minus_distances(masks, q, k, m.dtype())));
  }
  if (s.shape() != shape) s = expand(s, shape);
  return masked_softmax(s, masks.empty() ? Tensor() : masks.materialise(shape));
}

}  // namespace

// q [..., Q, D], k [..., K, D], v [..., K, Dv], bias (optional) broadcasting to the scores
// [..., Q, K] = `shape`, the call's rows (masks and ALiBi's slopes), s = 1/sqrt(D).
AttentionResult reference_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                                    const RowMasks& masks, const Shape& shape, double scale) {
  Tensor A, O;
  {
    NoGradGuard off;  // the lines are not recorded one by one: the node below is the whole attention
    A = weights_of(q, k, bias, masks, shape, scale);
    O = weighted(A, v);
  }
  const std::vector<Tensor> inputs{q, k, v, bias, masks.slopes()};
  if (!should_record(inputs)) return {O, A};
  std::vector<Tensor> outputs{O, A};
  // The backward reads q, k, v and A (the masks only through A's zeros).
  record_op(op, inputs, outputs,
            [q, k, v, bias, masks, shape, scale, A = A.detach()](std::span<const Tensor> g, const std::vector<bool>& needs) {
              return reference_backward(q, k, v, bias, masks, shape, scale, A, g, needs);
            },
            std::vector<Tensor>{q, k, v, A});
  return {outputs[0], outputs[1]};
}

// The node's gradients of q, k, v, bias and slopes where `needs`, from the upstream gradients of
// the output and (if any) of the weights. `weights`: the forward's A, or undefined on a path that
// kept none (they are made again).
std::vector<Tensor> reference_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias, const RowMasks& masks,
                                       const Shape& shape, double scale, const Tensor& weights, std::span<const Tensor> g,
                                       const std::vector<bool>& needs) {
  // The forward's weights, joined to this node in a create_graph pass; a path that kept none
  // makes them again from its inputs (recorded then, as every line below).
  const Tensor A = weights.defined() ? output_with_history(weights, 1) : weights_of(q, k, bias, masks, shape, scale);
  const Tensor& dO = g[0];
  const Tensor dA_up = g.size() > 1 ? g[1] : Tensor();
  std::vector<Tensor> grads(5);
  // dv = Aᵀ dO
  if (needs[2] && dO.defined()) grads[2] = sum_to(weighted(transpose(A, -1, -2), dO), v.shape());
  // dA = dO vᵀ + upstream dA
  Tensor dA = dO.defined() ? scores(dO, v) : Tensor();
  if (dA_up.defined()) dA = dA.defined() ? add(dA, dA_up) : dA_up;
  if (!dA.defined() || !(needs[0] || needs[1] || needs[3] || needs[4])) return grads;
  // dS = A ⊙ (dA − rowsum(A ⊙ dA))
  const Tensor dS = softmax_backward(A, dA);
  // dbias = dS;  dm_h = Σ over head h's rows and keys of dS ⊙ (−|p_i − j|)
  if (needs[3]) grads[3] = sum_to(dS, bias.shape());
  if (needs[4]) {
    const Tensor& m = masks.slopes();
    const std::int64_t nq = shape[shape.size() - 2], nk = shape.back();
    grads[4] = reshape(sum_to(mul(dS, minus_distances(masks, nq, nk, m.dtype())), laid_heads(shape, m.numel())), m.shape());
  }
  // dq = dS k s,  dk = dSᵀ q s
  if (needs[0]) grads[0] = mul(sum_to(weighted(dS, k), q.shape()), scale);
  if (needs[1]) grads[1] = mul(sum_to(weighted(transpose(dS, -1, -2), q), k.shape()), scale);
  return grads;
}

}  // namespace tapegrad::detail
