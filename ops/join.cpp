// concat and stack: copies into one new tensor; each input's gradient is its slice of g.
#include "ops/kernel.hpp"
#include "tapegrad/ops/join.hpp"
#include "tapegrad/ops/view.hpp"

namespace tapegrad {
using namespace detail;

Tensor concat(const std::vector<Tensor>& tensors, std::int64_t dim) {
  if (tensors.empty()) fail<ValueError>("concat: argument 'tensors' is empty; give at least one tensor");
  for (std::size_t i = 0; i < tensors.size(); ++i)
    if (!tensors[i].defined()) fail<Error>("concat: argument 'tensors[{}]' is an undefined tensor", i);
  const Tensor& first = tensors[0];
  const auto d = static_cast<std::size_t>(wrap_dim("concat", "dim", dim, first.dim()));
  Shape shape = first.shape();
  shape[d] = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (t.dtype() != first.dtype())
      fail<DTypeError>("concat: argument 'tensors[{}]' is {} but 'tensors[0]' is {}", i, t.dtype(), first.dtype());
    bool fits = t.dim() == first.dim();
    for (std::size_t k = 0; fits && k < shape.size(); ++k) fits = k == d || t.shape()[k] == first.shape()[k];
    if (!fits)
      fail<ShapeError>("concat: argument 'tensors[{}]' has shape {}, expected {} with any size in dim {}", i,
                       shape_str(t.shape()), shape_str(first.shape()), d);
    shape[d] += t.shape()[d];
  }
  Tensor out = new_tensor(shape, first.dtype());
  std::vector<std::int64_t> starts;
  std::int64_t at = 0;
  for (const auto& t : tensors) {
    starts.push_back(at);
    copy_into(slice(out, static_cast<std::int64_t>(d), at, at + t.shape()[d]), t);
    at += t.shape()[d];
  }
  if (should_record(tensors)) {
    // d tensors[i] = g[..., starts[i] : starts[i] + size_i, ...] along dim
    std::vector<Tensor> outs{out};
    record_op("concat", tensors, outs, [d, starts, shape](std::span<const Tensor> g, const std::vector<bool>& needs) {
      std::vector<Tensor> grads(starts.size());
      for (std::size_t i = 0; i < starts.size(); ++i) {
        const std::int64_t end = i + 1 < starts.size() ? starts[i + 1] : shape[d];
        if (needs[i]) grads[i] = slice(g[0], static_cast<std::int64_t>(d), starts[i], end);
      }
      return grads;
    }, /*saved=*/{});
    out = outs[0];
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, std::int64_t dim) {
  if (tensors.empty()) fail<ValueError>("stack: argument 'tensors' is empty; give at least one tensor");
  std::vector<Tensor> expanded;
  expanded.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined()) fail<Error>("stack: argument 'tensors[{}]' is an undefined tensor", i);
    if (tensors[i].shape() != tensors[0].shape())
      fail<ShapeError>("stack: argument 'tensors[{}]' has shape {}, expected {} like 'tensors[0]'", i,
                       shape_str(tensors[i].shape()), shape_str(tensors[0].shape()));
    expanded.push_back(unsqueeze(tensors[i], wrap_dim("stack", "dim", dim, tensors[0].dim() + 1)));
  }
  return concat(expanded, dim < 0 ? dim + tensors[0].dim() + 1 : dim);
}

}  // namespace tapegrad
