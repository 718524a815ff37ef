// sum, mean, max over dims. Forward and backward side by side (the loops: kernels/reduction.cpp).
#include "kernels/optimizer_loops.hpp"
#include "kernels/reduction.hpp"
#include "ops/op.hpp"
#include "tapegrad/ops/cast.hpp"
#include "tapegrad/ops/compare.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/reduction.hpp"
#include "tapegrad/ops/view.hpp"
#include "tapegrad/ops/where.hpp"

namespace tapegrad {
namespace {
using namespace detail;

ReductionPlan plan_reduction(const char* op, const Tensor& x, const Dims& dims, bool keepdim) {
  check_floating(op, "x", x);
  const std::int64_t rank = x.dim();
  ReductionPlan p{std::vector<bool>(static_cast<std::size_t>(rank), dims.empty()), x.shape(), {}, 1};
  for (auto d : dims) {
    const auto k = static_cast<std::size_t>(wrap_dim(op, "dims", d, rank));
    if (p.reduced[k]) fail<ShapeError>("{}: argument 'dims' names dim {} twice (input shape {})", op, d, shape_str(x.shape()));
    p.reduced[k] = true;
  }
  for (std::size_t k = 0; k < p.kept.size(); ++k) {
    if (p.reduced[k]) {
      p.count *= p.kept[k];  // a product of x's sizes: fits (tensor_impl.hpp)
      p.kept[k] = 1;
    }
    if (keepdim || !p.reduced[k]) p.result.push_back(p.kept[k]);
  }
  return p;
}

// max's backward as an op of g: dx = where(x == M, g / ties, 0), g laid out as p.kept (the
// kernel). The winners and their counts are constants (max is piecewise linear in x, its second
// derivative 0), so g is its one input and its own gradient, written beside it, is the adjoint
// of that linear map: dg = sum over the reduced dims of where(x == M, U, 0), divided by the ties.
// It reads U only at the winners; a slice without winners (its maximum NaN) counts 1, not 0:
// its dg is 0 either way, and U / 0 would be 0 / 0.
Tensor max_backward(const Tensor& x, const Tensor& kept, const Tensor& g, const ReductionPlan& p) {
  Tensor dx = max_kept_backward(x, kept, g, p);
  if (!is_grad_enabled()) return dx;  // a first-order pass: record() would return at once
  record_one("max_backward", g, dx, {x, kept}, [x, kept, p](const Tensor& u) {
    const Tensor wins = eq(x, kept), zero = scalar(0.0, x.dtype()), one = scalar(1.0, x.dtype());
    Dims reduced;
    for (std::size_t k = 0; k < p.reduced.size(); ++k)
      if (p.reduced[k]) reduced.push_back(static_cast<std::int64_t>(k));
    Tensor ties = sum(to(wins, x.dtype()), reduced, /*keepdim=*/true);
    ties = where(lt(ties, one), one, ties);
    return div(sum(where(wins, u, zero), reduced, /*keepdim=*/true), ties);
  });
  return dx;
}

}  // namespace

Tensor sum(const Tensor& x, const Dims& dims, bool keepdim) {
  const ReductionPlan p = plan_reduction("sum", x, dims, keepdim);
  Tensor kept = sum_kept(x, p);
  Tensor out = make_view(kept, p.result, contiguous_strides(p.result), 0, "sum");
  // dx = g broadcast back over the reduced dims
  record_one("sum", x, out, {}, [kept_shape = p.kept, x_shape = x.shape()](const Tensor& g) {
    return expand(reshape(g, kept_shape), x_shape);
  });
  return out;
}

Tensor mean(const Tensor& x, const Dims& dims, bool keepdim) {
  const ReductionPlan p = plan_reduction("mean", x, dims, keepdim);
  return div(sum(x, dims, keepdim), static_cast<double>(p.count));
}

Tensor max(const Tensor& x, const Dims& dims, bool keepdim) {
  const ReductionPlan p = plan_reduction("max", x, dims, keepdim);
  if (p.count == 0 && shape_numel(p.kept) > 0)
    fail<ShapeError>("max: cannot reduce over a zero-size dim (input shape {}); the maximum of nothing is undefined",
                     shape_str(x.shape()));
  Tensor kept = max_kept(x, p);
  Tensor out = make_view(kept, p.result, contiguous_strides(p.result), 0, "max");
  // dx = [x == max] g / (number of tied maxima), the gradient shared among ties: the op
  // max_backward, one formula to every order.
  record_one("max", x, out, {x, out}, [x, kept = kept, p](const Tensor& g) {
    return max_backward(x, kept, contiguous(reshape(g, p.kept)), p);
  });
  return out;
}

Tensor sum(const Tensor& x) { return sum(x, {}, false); }

double sum_of_squares(const Tensor& x) {
  check_floating("sum_of_squares", "x", x);
  const Tensor c = x.is_contiguous() ? x : copy_of(x);
  return visit_float(c.dtype(), "sum_of_squares", [&]<class T>(Tag<T>) { return detail::sum_of_squares(static_cast<const T*>(c.raw_data()), c.numel()); });
}
Tensor mean(const Tensor& x) { return mean(x, {}, false); }
Tensor max(const Tensor& x) { return max(x, {}, false); }

}  // namespace tapegrad
