// scaled_dot_product_attention, attention and causal_mask: validation, the path (attention_path
// says which pays when) and each call's tape node. The reference, the computation as written with
// its backward beside it, is attention_reference.cpp; the fast paths (kernels/attention_*.cpp) are
// tested against it, and every node's backward in a create_graph pass is the reference's.
#include <array>
#include <cmath>

#include "ops/attention_core.hpp"
#include "ops/attention_masking.hpp"
#include "ops/op.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/matmul.hpp"

namespace tapegrad {
namespace detail {

void check_bias(const char* op, const Tensor& bias, const Shape& scores, DType dtype, const char* activations) {
  if (!bias.defined()) return;
  check_floating(op, "bias", bias);
  if (bias.dtype() != dtype)
    fail<DTypeError>("{}: argument 'bias' is {} but {} is {}; convert it with to()", op, bias.dtype(), activations, dtype);
  check_on_scores(op, "bias", bias, scores);
}

Shape check_attention(const AttentionArgs& a) {
  auto leading = [](const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); };
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
  const Shape scores = with_matrix(batch, a.q.size(-2), a.k.size(-2));
  check_bias(a.op, a.bias, scores, dtype, "the activations");
  check_countable(a.op, fmt::format("q {}, k {} and v {} give the scores", shape_str(a.q.shape()), shape_str(a.k.shape()),
                                    shape_str(a.v.shape())).c_str(), scores);
  // What will be allocated is checked before anything is computed.
  check_shape(a.op, "the output [..., Q, Dv]", with_matrix(batch, a.q.size(-2), a.v.size(-1)), dtype);
  if (a.need_weights) check_shape(a.op, "the weights [..., Q, K]", scores, dtype);
  return scores;  // the masking is checked against it (masking_rows)
}

namespace {

// What the reference backward reads beyond the saved tensors when it makes the weights again (the
// bias, the slopes and the masks whole, which first-order backwards do not read), with their
// versions: an in-place write since is refused, as the tape refuses one to a saved tensor.
class SecondOrderReads {
 public:
  SecondOrderReads(const AttentionArgs& a, const RowMasks& masks) {
    if (a.bias.defined()) read_.emplace_back(a.bias, version_of(a.bias));
    for (const Tensor& t : masks.tensors()) read_.emplace_back(t, version_of(t));
  }
  void check(const char* op) const {
    for (const auto& [t, version] : read_)
      if (version_of(t) != version)
        fail<GraphError>("backward of {}: its bias, ALiBi's slopes or a mask (shape {}) was modified in place after {} was recorded (version "
                         "{}, now {}), so the second-order gradients would be wrong; run backward before updating it, or update a clone()",
                         op, shape_str(t.shape()), op, version, version_of(t));
  }

 private:
  static std::uint64_t version_of(const Tensor& t) { return t.impl()->storage->version.load(std::memory_order_acquire); }
  std::vector<std::pair<Tensor, std::uint64_t>> read_;
};

// A fast path's node: its forward has run. The backward is the one attention_backward_path
// chooses: the path's own, whose gradients it finishes (the sums over broadcast dims, the factor
// 1/sqrt(D) where the path left it), or the reference's.
AttentionResult record_fast(const AttentionArgs& a, const Shape& scores_shape, const RowMasks& masks, AttentionRun run, double scale,
                            AttentionPath path) {
  const std::vector<Tensor> inputs{a.q, a.k, a.v, a.bias, masks.slopes()};
  if (!should_record(inputs)) return {run.output, run.weights};
  std::array<Tensor, 2> outs{run.output, run.weights};  // the weights are an output when there are any
  record_op(a.op, inputs, std::span<Tensor>(outs.data(), outs[1].defined() ? 2 : 1),
            [backward = run.backward, a, scores_shape, masks, scale, weights = run.weights.defined() ? run.weights.detach() : Tensor(), path,
             reads = SecondOrderReads(a, masks)](std::span<const Tensor> g, const std::vector<bool>& needs) {
              if (attention_backward_path(path) == AttentionPath::reference) {
                if (!weights.defined()) reads.check(a.op);  // they are read to make the weights again
                return reference_backward(a.q, a.k, a.v, a.bias, masks, scores_shape, scale, weights, g, needs);
              }
              const AttentionGrads r = (*backward)(g[0], g.size() > 1 ? g[1] : Tensor(), needs);
              auto finish = [&](const Tensor& t, std::size_t i, bool times_scale) {
                if (!t.defined() || !needs[i]) return Tensor();
                const Tensor summed = sum_to(t, (i == 0 ? a.q : i == 1 ? a.k : i == 2 ? a.v : a.bias).shape());
                return times_scale ? mul(summed, scale) : summed;
              };
              return std::vector<Tensor>{finish(r.dq, 0, !r.scaled), finish(r.dk, 1, !r.scaled), finish(r.dv, 2, false),
                                         finish(r.dbias, 3, false), needs[4] ? r.dslopes : Tensor()};
            },
            std::move(run.saved));
  return {outs[0], outs[1]};
}

// No scores (a zero-size batch, Q or K): the output is zeros (a query without keys gets 0), and
// so is every gradient. Nothing of [..., Q, K] is formed unless asked for (check_attention found
// it addressable then): counted with 0 as 1, its shape may be one no tensor can have (K = 2^46
// with an empty batch).
AttentionResult no_scores(const AttentionArgs& a, const Shape& scores_shape, const Tensor& slopes) {
  const Shape batch(scores_shape.begin(), scores_shape.end() - 2);
  const DType dtype = a.q.dtype();
  std::array<Tensor, 2> outs{zeros(with_matrix(batch, a.q.size(-2), a.v.size(-1)), dtype),
                             a.need_weights ? zeros(scores_shape, dtype) : Tensor()};
  // dq = dk = dv = dbias = dslopes = 0
  const std::array<Tensor, 5> inputs{a.q, a.k, a.v, a.bias, slopes};
  record(a.op, inputs, std::span<Tensor>(outs.data(), outs[1].defined() ? 2 : 1), {},
         [shapes = std::array<Shape, 5>{a.q.shape(), a.k.shape(), a.v.shape(),
                                        a.bias.defined() ? a.bias.shape() : Shape{},
                                        slopes.defined() ? slopes.shape() : Shape{}},
          dtype](std::span<const Tensor>, const std::vector<bool>& needs) {
           std::vector<Tensor> grads(5);
           for (std::size_t i = 0; i < 5; ++i)
             if (needs[i]) grads[i] = zeros(shapes[i], dtype);
           return grads;
         });
  return {outs[0], outs[1]};
}

}  // namespace

AttentionResult attention_core(const AttentionArgs& a, const Shape& scores_shape, const RowMasks& masks, std::optional<AttentionPath> path,
                               std::int64_t block_rows) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(a.q.size(-1)));
  if (shape_numel(scores_shape) == 0) return no_scores(a, scores_shape, masks.slopes());
  const bool bf16 = a.q.dtype() == DType::float32 && matmul_precision() == MatmulPrecision::bfloat16;
  const AttentionPath taken = path ? *path : attention_path(a, scores_shape, masks, bf16);
  AttentionResult r = taken == AttentionPath::reference
                          ? reference_attention(a.op, a.q, a.k, a.v, a.bias, masks, scores_shape, scale)
                          : record_fast(a, scores_shape, masks, run_attention(taken, a, scores_shape, masks, scale, bf16, block_rows), scale,
                                        taken);
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
