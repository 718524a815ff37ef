// The backward of attention in a create_graph pass: the node's inputs run again through the
// reference composite, built of recorded ops, and that composite is differentiated with
// create_graph (docs/gradients.md, "Attention to second order"). The fast paths' kernels have
// no differentiable form; the composite computes the same function, so its gradients are the
// node's (up to rounding), and their own gradients come from ops that each have a backward.
//
//   S = scores_product(q, k) * scale (+ bias)    A = masked_softmax(S, mask)    O = weighted_product(A, v)
//
// Exact zeros: every product whose operand is shaped like the weights skips that operand's zero
// entries (weighted_matmul), in both ops below and in their backwards, which are written in the
// same two ops. So a masked key's k or v, or an empty row's q, holding NaN or inf reaches no
// gradient of any order, as in the first-order paths.
#include <cmath>
#include <span>
#include <vector>

#include "kernels/weighted_matmul.hpp"
#include "ops/attention_core.hpp"
#include "ops/op.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/matmul.hpp"
#include "tapegrad/ops/softmax.hpp"
#include "tapegrad/ops/view.hpp"

namespace tapegrad::detail {
namespace {

Tensor weighted_product(const Tensor& w, const Tensor& x);

// x y^T (batch dims broadcast), a plain product: where an operand is not finite the scores are
// NaN too, and the softmax does not read a masked one. Its backward multiplies by dC, which
// is zero wherever the scores were masked, so those products skip zero weights.
//   dx = dC y,  dy = dC^T x
Tensor scores_product(const Tensor& x, const Tensor& y) {
  Tensor out;
  {
    NoGradGuard off;
    out = weighted_matmul(x, transpose(y, -1, -2));
  }
  record("scores_product", {x, y}, out, {x, y}, [x, y](std::span<const Tensor> g, const std::vector<bool>& needs) {
    std::vector<Tensor> grads(2);
    if (needs[0]) grads[0] = sum_to(weighted_product(g[0], y), x.shape());
    if (needs[1]) grads[1] = sum_to(weighted_product(transpose(g[0], -1, -2), x), y.shape());
    return grads;
  });
  return out;
}

// w x (batch dims broadcast) in which a zero weight contributes nothing (weighted_matmul).
//   dw = dC x^T (a scores product: read only where w != 0 by the softmax),  dx = w^T dC
Tensor weighted_product(const Tensor& w, const Tensor& x) {
  Tensor out;
  {
    NoGradGuard off;
    out = weighted_matmul(w, x);
  }
  record("weighted_product", {w, x}, out, {w, x}, [w, x](std::span<const Tensor> g, const std::vector<bool>& needs) {
    std::vector<Tensor> grads(2);
    if (needs[0]) grads[0] = sum_to(scores_product(g[0], x), w.shape());
    if (needs[1]) grads[1] = sum_to(weighted_product(transpose(w, -1, -2), g[0]), x.shape());
    return grads;
  });
  return out;
}

// x under a new node of its own (identity): grad() below then stops at the attention's inputs
// instead of going on into their history (q and k may be one tensor, or one made from the other).
Tensor alias(const Tensor& x) {
  if (!x.defined() || !x.requires_grad()) return x;
  Tensor out = x.detach();
  record("attention_input", {x}, out, {}, [](std::span<const Tensor> g, const std::vector<bool>&) { return std::vector<Tensor>{g[0]}; });
  return out;
}

// ALiBi's bias -slopes[h] |i + offset - j| in recorded ops (the slopes' gradients of every order
// come from mul's): the slopes [H] laid over the scores' trailing leading dims whose sizes
// multiply to H ([H] of [B, H, Q, K], [Hkv, G] of [B, Hkv, G, Q, K]), times the distances.
Tensor alibi_bias(const Tensor& slopes, const RowMasks& masks, const Shape& scores_shape) {
  const std::size_t rank = scores_shape.size();
  const std::int64_t q = scores_shape[rank - 2], k = scores_shape[rank - 1];
  std::vector<double> distance(static_cast<std::size_t>(q * k));
  for (std::int64_t i = 0; i < q; ++i) {
    const std::int64_t position = masks.row(i).position;
    for (std::int64_t j = 0; j < k; ++j) distance[static_cast<std::size_t>(i * k + j)] = static_cast<double>(position > j ? position - j : j - position);
  }
  Shape heads{q, k};
  std::int64_t count = 1;
  for (std::size_t d = rank - 2; d-- > 0 && count < slopes.numel();) {  // innermost first: each goes in front
    count *= scores_shape[d];
    heads.insert(heads.begin(), scores_shape[d]);
  }
  Shape laid = heads;
  laid[laid.size() - 2] = laid[laid.size() - 1] = 1;
  const Tensor d = from_vector(std::span<const double>(distance), {q, k}).to(slopes.dtype());
  return neg(mul(reshape(slopes, laid), d));
}

std::uint64_t version_of(const Tensor& t) { return t.impl()->storage->version.load(std::memory_order_acquire); }

}  // namespace

SecondOrderReads::SecondOrderReads(const AttentionArgs& a, const RowMasks& masks) {
  if (a.bias.defined()) read_.emplace_back(a.bias, version_of(a.bias));
  for (const Tensor& t : masks.tensors()) read_.emplace_back(t, version_of(t));
}

void SecondOrderReads::check(const char* op) const {
  for (const auto& [t, version] : read_)
    if (version_of(t) != version)
      fail<GraphError>("backward of {}: its bias, ALiBi's slopes or a mask (shape {}) was modified in place after {} was recorded (version {}, "
                       "now {}), so the second-order gradients would be wrong; run backward before updating it, or update a clone()",
                       op, shape_str(t.shape()), op, version, version_of(t));
}

std::vector<Tensor> attention_backward_with_graph(const AttentionArgs& a, const Shape& scores_shape, const RowMasks& masks,
                                                  double scale, const SecondOrderReads& reads, std::span<const Tensor> g,
                                                  const std::vector<bool>& needs) {
  reads.check(a.op);
  const MatmulPrecisionGuard exact(MatmulPrecision::exact);
  const Tensor q = alias(a.q), k = alias(a.k), v = alias(a.v), bias = alias(a.bias), slopes = alias(masks.slopes());
  Tensor s = mul(scores_product(q, k), scale);
  if (bias.defined()) s = add(s, bias);
  if (slopes.defined()) s = add(s, alibi_bias(slopes, masks, scores_shape));
  if (s.shape() != scores_shape) s = expand(s, scores_shape);
  const Tensor weights = masked_softmax(s, masks.empty() ? Tensor() : masks.materialise(scores_shape));
  // The outputs an upstream gradient reached (and that depend on something wanted), with it.
  std::vector<Tensor> outs, upstream, wanted;
  const Tensor results[2] = {g[0].defined() ? weighted_product(weights, v) : Tensor(), weights};
  for (std::size_t n = 0; n < g.size() && n < 2; ++n)
    if (g[n].defined() && results[n].requires_grad()) {
      outs.push_back(results[n]);
      upstream.push_back(g[n]);
    }
  const Tensor inputs[5] = {q, k, v, bias, slopes};
  std::vector<std::size_t> at;
  for (std::size_t i = 0; i < 5; ++i)
    if (needs[i] && inputs[i].defined() && inputs[i].requires_grad()) {
      wanted.push_back(inputs[i]);
      at.push_back(i);
    }
  std::vector<Tensor> grads(5);
  if (wanted.empty() || outs.empty()) return grads;
  const std::vector<Tensor> found = grad(outs, wanted, upstream, {.create_graph = true, .allow_unused = true});
  for (std::size_t n = 0; n < at.size(); ++n)
    grads[at[n]] = found[n].defined() ? found[n] : zeros(inputs[at[n]].shape(), inputs[at[n]].dtype());
  return grads;
}

}  // namespace tapegrad::detail
