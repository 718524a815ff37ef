// index_select, embedding and gather: one "take along a dim" kernel and its backward.
//
// Every output element p reads x at p's coordinates mapped into x, with the coordinate along
// `dim` replaced by the id index[q(p)]. A Take plan says, for each output dim, which dim of x
// and which dim of index it walks (or none). Forward and backward walk the output's shape:
//
//   forward    out[p] = x[x_at(p) + id(p) * x.stride(dim)]
//   backward   dx[x_at(p) + id(p) * dx.stride(dim)] += g[p],   dx = zeros of x's shape
//
// The forward multiplies x by a 0/1 selection matrix; the backward is its transpose, so the
// gradient of every copy of a repeated id lands on (and adds into) the same element of x. Each
// is recorded with the other as its backward, so gradients of every order follow.
#include "tapegrad/ops/indexing.hpp"

#include "ops/op.hpp"

namespace tapegrad {
namespace {
using namespace detail;

struct Take {
  const char* op;          // names in errors
  const char* backward_op;  // names the recorded scatter-add, the backward's own node
  const char* x_name;
  const char* index_name;
  std::int64_t dim;        // in x, normalised
  Shape out_shape;
  std::vector<std::int64_t> x_dim;      // per output dim: the dim of x it walks, or -1
  std::vector<std::int64_t> index_dim;  // per output dim: the dim of index it walks, or -1

  void add_dim(std::int64_t size, std::int64_t in_x, std::int64_t in_index) {
    out_shape.push_back(size);
    x_dim.push_back(in_x);
    index_dim.push_back(in_index);
  }
};

// The strides of a tensor seen along the output's dims (0 where the output dim does not walk it).
Dims8 along(const Shape& strides, const std::vector<std::int64_t>& which) {
  Dims8 out(which.size(), 0);
  for (std::size_t i = 0; i < which.size(); ++i)
    if (which[i] >= 0) out[i] = strides[static_cast<std::size_t>(which[i])];
  return out;
}

// Every id in [0, x.size(dim)), checked over index itself (not over the output, which may be
// empty while index is not).
void check_ids(const Take& t, const Tensor& x, const Tensor& index) {
  const std::int64_t n = x.shape()[static_cast<std::size_t>(t.dim)];
  const Shape position = contiguous_strides(index.shape());
  StridedLoop<2> loop(index.shape().data(), index.shape().size(), {position.data(), index.strides().data()});
  const auto* ids = static_cast<const std::int64_t*>(index.raw_data());
  loop.for_each_run([&](const auto& off, std::int64_t len, const auto& inner) {
    for (std::int64_t i = 0; i < len; ++i) {
      const std::int64_t id = ids[off[1] + i * inner[1]];
      if (id < 0 || id >= n)
        fail<ValueError>("{}: argument '{}' holds {} at position {}, out of range for dim {} of '{}' (shape {}); "
                         "ids must lie in [0, {})",
                         t.op, t.index_name, id, shape_str(unravel_index(off[0] + i * inner[0], index.shape())), t.dim,
                         t.x_name, shape_str(x.shape()), n);
    }
  });
}

// Calls f(at, x_at(p) + id(p) * step) for each output position p: `at` p's offset in `out`
// (the output or its gradient), the second in `x` (x or its gradient), which has x's shape.
template <class F> void for_each_take(const Take& t, const Tensor& out, const Tensor& x, const Tensor& index, F f) {
  const Dims8 xs = along(x.strides(), t.x_dim), is = along(index.strides(), t.index_dim);
  StridedLoop<3> loop(t.out_shape.data(), t.out_shape.size(), {out.strides().data(), xs.data(), is.data()});
  const std::int64_t step = x.strides()[static_cast<std::size_t>(t.dim)];
  const auto* ids = static_cast<const std::int64_t*>(index.raw_data());
  loop.for_each_run([&](const auto& off, std::int64_t len, const auto& inner) {
    for (std::int64_t i = 0; i < len; ++i)
      f(off[0] + i * inner[0], off[1] + i * inner[1] + ids[off[2] + i * inner[2]] * step);
  });
}

Tensor put(const Take& t, const Shape& x_shape, const Tensor& index, const Tensor& g);

// The forward, recorded: out[p] = x[x_at(p) + id(p) * x.stride(dim)], ids already checked.
Tensor take(const Take& t, const Tensor& x, const Tensor& index) {
  Tensor out = new_tensor(t.out_shape, x.dtype(), t.op);
  visit_any(x.dtype(), [&]<class T>(Tag<T>) {
    const T* px = static_cast<const T*>(x.raw_data());
    T* po = static_cast<T*>(mutable_data(out));
    for_each_take(t, out, x, index, [&](std::int64_t at, std::int64_t from) { po[at] = px[from]; });
  });
  // dx = scatter-add of g into zeros of x's shape at the positions the forward read
  record_one(t.op, x, out, {index}, [t, index, x_shape = x.shape()](const Tensor& g) {
    return put(t, x_shape, index, g);
  });
  return out;
}

// The backward, dx = zeros of x's shape with dx[x_at(p) + id(p) * dx.stride(dim)] += g[p],
// recorded as an op of its own so that a create_graph pass differentiates it: the scatter-add is
// linear in g and is the transpose of the take, so its backward is the take of its upstream
// gradient (recorded in turn, so every order follows). dg = take(g')
Tensor put(const Take& t, const Shape& x_shape, const Tensor& index, const Tensor& g) {
  Tensor dx = zeros(x_shape, g.dtype());
  visit_float(g.dtype(), t.op, [&]<class T>(Tag<T>) {
    const T* pg = static_cast<const T*>(g.raw_data());
    T* pd = static_cast<T*>(mutable_data(dx));
    for_each_take(t, g, dx, index, [&](std::int64_t at, std::int64_t to) { pd[to] += pg[at]; });
  });
  record_one(t.backward_op, g, dx, {index}, [t, index](const Tensor& gg) { return take(t, gg, index); });
  return dx;
}

// x.shape[:dim] + index.shape + x.shape[dim+1:]
Tensor select_rows(const char* op, const char* backward_op, const char* x_name, const Tensor& x, std::int64_t dim,
                   const char* index_name, const Tensor& index) {
  check_defined(op, x_name, x);
  check_dtype(op, index_name, index, DType::int64);
  Take t{op, backward_op, x_name, index_name, wrap_dim(op, "dim", dim, x.dim()), {}, {}, {}};
  for (std::int64_t d = 0; d < x.dim(); ++d) {
    if (d != t.dim) t.add_dim(x.size(d), d, -1);
    else
      for (std::int64_t k = 0; k < index.dim(); ++k) t.add_dim(index.size(k), -1, k);
  }
  check_ids(t, x, index);
  return take(t, x, index);
}

}  // namespace

Tensor index_select(const Tensor& x, std::int64_t dim, const Tensor& index) {
  return select_rows("index_select", "index_select_backward", "x", x, dim, "index", index);
}

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  check_defined("embedding", "weight", weight);
  if (weight.dim() != 2)
    fail<ShapeError>("embedding: argument 'weight' must have rank 2, [vocabulary, width], got shape {}",
                     shape_str(weight.shape()));
  return select_rows("embedding", "embedding_backward", "weight", weight, 0, "ids", ids);
}

Tensor gather(const Tensor& x, std::int64_t dim, const Tensor& index) {
  check_defined("gather", "x", x);
  check_dtype("gather", "index", index, DType::int64);
  Take t{"gather", "gather_backward", "x", "index", wrap_dim("gather", "dim", dim, x.dim()), {}, {}, {}};
  if (index.dim() != x.dim())
    fail<ShapeError>("gather: argument 'index' with shape {} must have the rank of 'x', shape {}",
                     shape_str(index.shape()), shape_str(x.shape()));
  for (std::int64_t d = 0; d < x.dim(); ++d) {
    if (d != t.dim && index.size(d) > x.size(d))
      fail<ShapeError>("gather: argument 'index' with shape {} is larger than 'x', shape {}, in dim {} ({} > {}); "
                       "only dim {} may be larger",
                       shape_str(index.shape()), shape_str(x.shape()), d, index.size(d), x.size(d), t.dim);
    t.add_dim(index.size(d), d == t.dim ? -1 : d, d);
  }
  check_ids(t, x, index);
  return take(t, x, index);
}

}  // namespace tapegrad
