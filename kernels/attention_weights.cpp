// Attention's weights path: the reference's steps (ops/attention_reference.cpp) as whole-tensor
// products and one fused pass over the scores each way, for the scale, the bias, ALiBi, the mask
// (asked for row by row, never materialised) and the softmax, and back. For scores that fit the
// cache; attention_paths.cpp sends larger ones to the blocks.
#include <memory>
#include <utility>

#include "autodiff/tensor_impl.hpp"
#include "kernels/attention_alibi.hpp"
#include "kernels/attention_paths.hpp"
#include "kernels/attention_softmax.hpp"
#include "kernels/product.hpp"
#include "kernels/weighted_matmul.hpp"

namespace tapegrad::detail {
namespace {

// x with its last two dims swapped, a view.
Tensor transposed(const Tensor& x) {
  Shape shape = x.shape(), strides = x.strides();
  std::swap(shape[shape.size() - 1], shape[shape.size() - 2]);
  std::swap(strides[strides.size() - 1], strides[strides.size() - 2]);
  return make_view(x, shape, strides, x.offset(), "attention");
}

// x broadcast to `shape`, a view.
Tensor broadcast(const Tensor& x, const Shape& shape) {
  const Dims8 strides = broadcast_strides(x, shape);
  return make_view(x, shape, Shape(strides.begin(), strides.end()), x.offset(), "attention");
}

// The backward: q, k, v and the weights A, and the masks (how far each row goes).
class WeightsBackward final : public AttentionBackward {
 public:
  WeightsBackward(Tensor q, Tensor k, Tensor v, Tensor a, RowMasks masks, double scale)
      : q_(std::move(q)), k_(std::move(k)), v_(std::move(v)), a_(std::move(a)), masks_(std::move(masks)), scale_(scale) {}

  AttentionGrads operator()(const Tensor& d_out, const Tensor& d_weights, const std::vector<bool>& needs) const override {
    AttentionGrads grads;
    // The 1/sqrt(D) goes on dS when neither the bias nor the slopes need a gradient (they read
    // dS itself), else on the [..., Q, D] and [..., K, D] results.
    grads.scaled = !wants_raw_ds(needs);
    // dv = Aᵀ dO
    if (needs[2] && d_out.defined()) grads.dv = weighted_matmul(transposed(a_), d_out);
    if (!(needs[0] || needs[1] || wants_raw_ds(needs))) return grads;
    // dA = dO vᵀ + upstream dA (read only where A != 0), summed inside the softmax pass
    const Tensor dA = d_out.defined() ? product(d_out, transposed(v_), false) : Tensor();
    if (!dA.defined() && !d_weights.defined()) return grads;
    const Tensor dS = attention_softmax_backward(a_, dA, d_weights, masks_, grads.scaled ? scale_ : 1.0);  // zero where masked
    if (needs[3]) grads.dbias = dS;
    if (needs[4]) grads.dslopes = alibi_slopes_gradient(dS, masks_);
    if (needs[0]) grads.dq = weighted_matmul(dS, k_);
    if (needs[1]) grads.dk = weighted_matmul(transposed(dS), q_);
    return grads;
  }

 private:
  Tensor q_, k_, v_, a_;
  RowMasks masks_;
  double scale_;
};

}  // namespace

AttentionRun attention_weights(const AttentionArgs& a, const Shape& scores_shape, const RowMasks& masks, double scale) {
  // Exact products: a bfloat16 precision takes attention_weights_bf16.cpp (float32), or does not apply (float64).
  const Tensor scores = product(a.q, transposed(a.k), false);
  // The weights carry every leading dim of q, k and v (v may have more than q and k); when they
  // are the scores' own shape, the softmax overwrites the scores in place.
  const bool own = scores.shape() == scores_shape;
  const Tensor weights = own ? scores : new_tensor(scores_shape, scores.dtype(), a.op);
  attention_softmax_forward(own ? scores : broadcast(scores, scores_shape), scale, a.bias, masks, weights);
  AttentionRun run{weighted_matmul(weights, a.v), weights, masks.saved_with({a.q, a.k, a.v, weights}, /*ends_only=*/true), nullptr};
  run.backward = std::make_shared<WeightsBackward>(a.q.detach(), a.k.detach(), a.v.detach(), weights.detach(), masks, scale);
  return run;
}

}  // namespace tapegrad::detail
