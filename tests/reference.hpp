// Independent reference computations for the op tests: plain row-major arrays and
// multi-index loops, sharing no code with tapegrad's kernels.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <tapegrad/tapegrad.hpp>

namespace tg_test {

struct Ref {
  tapegrad::Shape shape;
  std::vector<double> v;  // row-major

  static Ref of(const tapegrad::Tensor& t) { return {t.shape(), t.to_vector<double>()}; }
  std::int64_t numel() const;
  std::vector<std::int64_t> unravel(std::int64_t flat) const;
  std::int64_t ravel(const std::vector<std::int64_t>& index) const;
  // Element at a multi-index of a (possibly larger-rank) broadcast shape.
  double at_broadcast(const std::vector<std::int64_t>& index) const;
};

tapegrad::Shape ref_broadcast(const tapegrad::Shape& a, const tapegrad::Shape& b);
// out[i] = f(inputs at i), all inputs broadcast together.
Ref ref_map(const std::vector<Ref>& in, const std::function<double(const std::vector<double>&)>& f);
// out[j] = f(all in[i] with i mapping to j) over `dims` (empty = all).
Ref ref_reduce(const Ref& in, std::vector<std::int64_t> dims, bool keepdim,
               const std::function<double(const std::vector<double>&)>& f);
// out[index] = in[source(index)] for each index of `shape`.
Ref ref_gather(const Ref& in, const tapegrad::Shape& shape,
               const std::function<std::vector<std::int64_t>(const std::vector<std::int64_t>&)>& source);
// Batched matmul with broadcasting batch dims, plain triple loop.
Ref ref_matmul(const Ref& a, const Ref& b);

// numpy.take along dim d: shape x.shape[:d] + index_shape + x.shape[d+1:]; `ids` row-major over
// index_shape.
Ref ref_take(const Ref& x, std::size_t d, const tapegrad::Shape& index_shape, const std::vector<std::int64_t>& ids);
// torch.gather along dim d: shape index_shape, out[p] = x[p with p[d] replaced by ids[p]].
// The index of the first maximum along dim d (no NaN in x), as doubles.
Ref ref_argmax(const Ref& x, std::size_t d, bool keepdim);
Ref ref_take_along(const Ref& x, std::size_t d, const tapegrad::Shape& index_shape, const std::vector<std::int64_t>& ids);

}  // namespace tg_test
