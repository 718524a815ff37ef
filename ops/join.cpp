// concat and stack: copies into one new tensor; each input's gradient is its slice of g.
#include "ops/op.hpp"
#include "tapegrad/ops/join.hpp"
#include "tapegrad/ops/view.hpp"

namespace tapegrad {
using namespace detail;

namespace {

void check_tensors(const char* op, const std::vector<Tensor>& tensors) {
  if (tensors.empty()) fail<ValueError>("{}: argument 'tensors' is empty; give at least one tensor", op);
  for (std::size_t i = 0; i < tensors.size(); ++i)
    if (!tensors[i].defined()) fail<Error>("{}: argument 'tensors[{}]' is an undefined tensor", op, i);
}

// The concatenation along dim d; `op` is the public function, for errors and the tape.
Tensor join(const char* op, const std::vector<Tensor>& tensors, std::size_t d) {
  const Tensor& first = tensors[0];
  Shape shape = first.shape();
  shape[d] = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (t.dtype() != first.dtype())
      fail<DTypeError>("{}: argument 'tensors[{}]' is {} but 'tensors[0]' is {}", op, i, t.dtype(), first.dtype());
    bool fits = t.dim() == first.dim();
    for (std::size_t k = 0; fits && k < shape.size(); ++k) fits = k == d || t.shape()[k] == first.shape()[k];
    if (!fits)
      fail<ShapeError>("{}: argument 'tensors[{}]' has shape {}, expected {} with any size in dim {}", op, i,
                       shape_str(t.shape()), shape_str(first.shape()), d);
    // Each size fits; their sum need not ([0, 2^62] twice along dim 1).
    if (__builtin_add_overflow(shape[d], t.shape()[d], &shape[d]))
      fail<ShapeError>("{}: the sizes of 'tensors' along dim {} add up to more than can be addressed ('tensors[{}]' is {})",
                       op, d, i, shape_str(t.shape()));
  }
  Tensor out = new_tensor(shape, first.dtype(), op);
  std::vector<std::int64_t> starts;
  std::int64_t at = 0;
  for (const auto& t : tensors) {
    starts.push_back(at);
    copy_into(slice(out, static_cast<std::int64_t>(d), at, at + t.shape()[d]), t);
    at += t.shape()[d];
  }
  // d tensors[i] = g[..., starts[i] : starts[i] + size_i, ...] along dim
  record(op, tensors, std::span<Tensor>(&out, 1), {},
         [d, starts = std::move(starts), total = shape[d]](std::span<const Tensor> g, const std::vector<bool>& needs) {
           std::vector<Tensor> grads(starts.size());
           for (std::size_t i = 0; i < starts.size(); ++i) {
             const std::int64_t end = i + 1 < starts.size() ? starts[i + 1] : total;
             if (needs[i]) grads[i] = slice(g[0], static_cast<std::int64_t>(d), starts[i], end);
           }
           return grads;
         });
  return out;
}

}  // namespace

Tensor concat(const std::vector<Tensor>& tensors, std::int64_t dim) {
  check_tensors("concat", tensors);
  return join("concat", tensors, static_cast<std::size_t>(wrap_dim("concat", "dim", dim, tensors[0].dim())));
}

Tensor stack(const std::vector<Tensor>& tensors, std::int64_t dim) {
  check_tensors("stack", tensors);
  const std::int64_t d = wrap_dim("stack", "dim", dim, tensors[0].dim() + 1);
  std::vector<Tensor> expanded;
  expanded.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].shape() != tensors[0].shape())
      fail<ShapeError>("stack: argument 'tensors[{}]' has shape {}, expected {} like 'tensors[0]'", i,
                       shape_str(tensors[i].shape()), shape_str(tensors[0].shape()));
    expanded.push_back(unsqueeze(tensors[i], d));
  }
  return join("stack", expanded, static_cast<std::size_t>(d));
}

}  // namespace tapegrad
