// Tensor handle, storage (a few bytes inline, anything larger a block of the runtime's cache) and
// the argument checks every op shares.
#include <numeric>

#include "autodiff/check.hpp"
#include "autodiff/loops.hpp"
#include "autodiff/node.hpp"
#include "autodiff/tensor_impl.hpp"
#include "runtime/block_cache.hpp"
#include "tapegrad/autodiff/tape.hpp"

namespace tapegrad {
namespace detail {

Storage::Storage(std::size_t n) : bytes(n) {
  data = n <= kInlineBytes ? inline_bytes : static_cast<std::byte*>(take_block(n));
}

Storage::~Storage() {
  delete derived.load(std::memory_order_acquire);
  if (data != inline_bytes) give_block(data, bytes);
}

std::int64_t shape_numel(const Shape& shape) noexcept {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  std::int64_t s = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<std::int64_t>(shape[i], 1);
  }
  return strides;
}

Shape dense_strides_like(const Shape& shape, const Shape& like) {
  const std::size_t rank = shape.size();
  std::vector<std::size_t> order(rank);  // dims from the outermost in memory to the innermost
  std::iota(order.begin(), order.end(), 0);
  const auto reach = [&](std::size_t d) { return like[d] == 0 ? std::numeric_limits<std::int64_t>::max() : like[d]; };
  std::stable_sort(order.begin(), order.end(), [&](std::size_t p, std::size_t q) { return reach(p) > reach(q); });
  Shape strides(rank);
  std::int64_t step = 1;
  for (std::size_t i = rank; i-- > 0;) {
    strides[order[i]] = step;
    step *= std::max<std::int64_t>(shape[order[i]], 1);
  }
  return strides;
}

std::int64_t check_shape(const char* op, const char* what, const Shape& shape, DType dtype) {
  for (auto s : shape)
    if (s < 0) fail<ShapeError>("{}: {} {} has a negative size", op, what, shape_str(shape));
  auto bytes = static_cast<std::int64_t>(itemsize(dtype));
  bool overflow = false;
  for (auto s : shape) overflow = overflow || __builtin_mul_overflow(bytes, std::max<std::int64_t>(s, 1), &bytes);
  if (overflow || bytes > kMaxBytes)
    fail<ShapeError>("{}: {} {} of {} has more elements than can be addressed (its sizes, with 0 counted as 1, "
                     "times the item size exceed 2^48 bytes)",
                     op, what, shape_str(shape), dtype);
  return shape_numel(shape);
}

void check_countable(const char* op, const char* what, const Shape& shape) {
  std::int64_t n = 1;
  for (auto s : shape)
    if (__builtin_mul_overflow(n, std::max<std::int64_t>(s, 1), &n))
      fail<ShapeError>("{}: {} {}: more elements than int64 can count (the sizes, with 0 counted as 1)", op, what, shape_str(shape));
}

namespace {

// Whether every element of a view lies inside its storage. Zero-size views hold no element.
bool within_storage(const Storage& storage, const Shape& shape, const Shape& strides, std::int64_t offset, DType dtype) {
  if (shape_numel(shape) == 0) return true;
  std::int64_t lo = offset, hi = offset;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    std::int64_t reach = 0;
    if (__builtin_mul_overflow(strides[d], shape[d] - 1, &reach)) return false;
    std::int64_t& end = reach < 0 ? lo : hi;
    if (__builtin_add_overflow(end, reach, &end)) return false;
  }
  return lo >= 0 && hi < static_cast<std::int64_t>(storage.bytes / itemsize(dtype));
}

}  // namespace

Tensor make_view(const Tensor& base, Shape shape, Shape strides, std::int64_t offset, const char* op) {
  check_shape(op, "result shape", shape, base.dtype());
  const auto& storage = base.impl()->storage;
  if (strides.size() != shape.size() || !within_storage(*storage, shape, strides, offset, base.dtype()))
    throw std::logic_error(fmt::format("{}: tapegrad internal error: a view with shape {}, strides {} and offset {} "
                                       "reaches outside its storage of {} bytes",
                                       op, shape_str(shape), shape_str(strides), offset, storage->bytes));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = storage;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

Tensor new_tensor(const Shape& shape, DType dtype, const char* op, const char* what) {
  const std::int64_t n = check_shape(op, what, shape, dtype);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<std::size_t>(n) * itemsize(dtype));
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

void* mutable_data(const Tensor& t) {
  const auto& impl = *t.impl();
  return impl.storage->data + impl.offset * static_cast<std::int64_t>(itemsize(impl.dtype));
}

// Release: a kernel that reads the new version (a weight's bfloat16 copy) also sees the write.
void bump_version(const Tensor& t) noexcept { t.impl()->storage->version.fetch_add(1, std::memory_order_release); }

void check_defined(const char* op, const char* name, const Tensor& t) {
  if (!t.defined()) fail<Error>("{}: argument '{}' is an undefined tensor", op, name);
}

void fail_undefined_self(const char* member) {
  fail<Error>("{}: called on an undefined (default-constructed) tensor", member);
}

void check_floating(const char* op, const char* name, const Tensor& t) {
  check_defined(op, name, t);
  if (!is_floating(t.dtype()))
    fail<DTypeError>("{}: argument '{}' must be float32 or float64, got {} with shape {}", op, name,
                     t.dtype(), shape_str(t.shape()));
}

DType check_same_float(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                       const Tensor& b) {
  check_floating(op, a_name, a);
  check_floating(op, b_name, b);
  if (a.dtype() != b.dtype())
    fail<DTypeError>(
        "{}: arguments '{}' ({} {}) and '{}' ({} {}) must have the same dtype; tapegrad never "
        "mixes float32 and float64 silently, convert one with to()",
        op, a_name, a.dtype(), shape_str(a.shape()), b_name, b.dtype(), shape_str(b.shape()));
  return a.dtype();
}

void check_dtype(const char* op, const char* name, const Tensor& t, DType expected) {
  check_defined(op, name, t);
  if (t.dtype() != expected)
    fail<DTypeError>("{}: argument '{}' must be {}, got {} with shape {}", op, name, expected,
                     t.dtype(), shape_str(t.shape()));
}

void check_like(const char* op, const char* name, const Tensor& t, const char* like_name, const Tensor& like) {
  check_defined(op, name, t);
  if (t.dtype() == like.dtype() && t.shape() == like.shape()) return;
  const auto message = fmt::format("{}: argument '{}' must be {} {} as '{}' is, got {} {}", op, name, like.dtype(),
                                   shape_str(like.shape()), like_name, t.dtype(), shape_str(t.shape()));
  if (t.dtype() != like.dtype()) throw DTypeError(message);
  throw ShapeError(message);
}

std::int64_t wrap_dim(const char* op, const char* name, std::int64_t dim, std::int64_t rank) {
  if (dim < -rank || dim >= rank || rank == 0)
    fail<ShapeError>("{}: argument '{}' = {} is out of range for rank {} (expected {} <= {} < {})",
                     op, name, dim, rank, -rank, name, rank);
  return dim < 0 ? dim + rank : dim;
}

}  // namespace detail

using detail::fail;
using detail::shape_str;

Tensor::Tensor(std::shared_ptr<detail::TensorImpl> impl) noexcept : impl_(std::move(impl)) {}

// Every member that reads the tensor starts here, so an undefined tensor names the member.
static const detail::TensorImpl& checked(const Tensor& t, const char* member) {
  detail::check_self(member, t);
  return *t.impl();
}

DType Tensor::dtype() const { return checked(*this, "Tensor::dtype").dtype; }
const Shape& Tensor::shape() const { return checked(*this, "Tensor::shape").shape; }
const Shape& Tensor::strides() const { return checked(*this, "Tensor::strides").strides; }
std::int64_t Tensor::offset() const { return checked(*this, "Tensor::offset").offset; }
std::int64_t Tensor::dim() const { return static_cast<std::int64_t>(checked(*this, "Tensor::dim").shape.size()); }
std::int64_t Tensor::size(std::int64_t d) const {
  const Shape& shape = checked(*this, "Tensor::size").shape;
  return shape[static_cast<std::size_t>(detail::wrap_dim("Tensor::size", "d", d, static_cast<std::int64_t>(shape.size())))];
}
std::int64_t Tensor::numel() const { return detail::shape_numel(checked(*this, "Tensor::numel").shape); }

bool Tensor::is_contiguous() const {
  const auto& impl = checked(*this, "Tensor::is_contiguous");
  std::int64_t expected = 1;
  for (std::size_t i = impl.shape.size(); i-- > 0;) {
    if (impl.shape[i] == 1) continue;
    if (impl.strides[i] != expected) return false;
    expected *= impl.shape[i];
  }
  return true;
}

bool Tensor::shares_storage_with(const Tensor& other) const {
  return defined() && other.defined() && impl_->storage == other.impl_->storage;
}

const void* Tensor::raw_data() const {
  detail::check_self("Tensor::raw_data", *this);
  return detail::mutable_data(*this);
}
std::uint64_t Tensor::version() const {
  return checked(*this, "Tensor::version").storage->version.load(std::memory_order_relaxed);
}
void Tensor::note_write() const { detail::bump_version(*this); }

void Tensor::check_element_type(DType requested) const {
  const auto& impl = checked(*this, "Tensor::data");
  if (impl.dtype != requested)
    fail<DTypeError>("Tensor::data: requested {} elements from a {} tensor of shape {}", requested,
                     impl.dtype, shape_str(impl.shape));
}

template <class T>
  requires ElementType<T>
std::vector<T> Tensor::to_vector() const {
  detail::check_self("Tensor::to_vector", *this);
  std::vector<T> out;
  out.reserve(static_cast<std::size_t>(numel()));
  const Tensor c = is_contiguous() ? *this : detail::copy_of(*this);
  detail::visit_any(dtype(), [&]<class S>(detail::Tag<S>) {
    const S* p = static_cast<const S*>(c.raw_data());
    for (std::int64_t i = 0; i < c.numel(); ++i) out.push_back(detail::convert<T>(p[i]));
  });
  return out;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<bool> Tensor::to_vector<bool>() const;
template std::vector<std::int64_t> Tensor::to_vector<std::int64_t>() const;

double Tensor::item() const {
  detail::check_self("Tensor::item", *this);
  if (numel() != 1)
    fail<ShapeError>("Tensor::item: expected a tensor with exactly one element, got shape {}",
                     shape_str(shape()));
  return to_vector<double>()[0];
}

bool Tensor::requires_grad() const {
  const auto& impl = checked(*this, "Tensor::requires_grad");
  return impl.leaf_requires_grad || detail::live_node(impl) != nullptr;
}

Tensor& Tensor::set_requires_grad(bool on) {
  auto& impl = const_cast<detail::TensorImpl&>(checked(*this, "Tensor::set_requires_grad"));
  if (const detail::Node* n = detail::live_node(impl))
    fail<GraphError>(
        "Tensor::set_requires_grad: this tensor (shape {}) is the output of recorded op {}; only "
        "leaves can change requires_grad (use detach() to make a new leaf)",
        shape_str(impl.shape), n->name);
  if (on && !is_floating(impl.dtype))
    fail<DTypeError>("Tensor::set_requires_grad: only float32/float64 tensors can require grad, "
                     "this one is {} with shape {}",
                     impl.dtype, shape_str(impl.shape));
  impl.grad_fn.reset();  // a released node's output is a leaf now
  impl.leaf_requires_grad = on;
  return *this;
}

bool Tensor::is_leaf() const { return detail::live_node(checked(*this, "Tensor::is_leaf")) == nullptr; }
Tensor Tensor::grad() const { return checked(*this, "Tensor::grad").grad; }
void Tensor::set_grad(const Tensor& gradient) {
  auto& impl = const_cast<detail::TensorImpl&>(checked(*this, "Tensor::set_grad"));
  if (gradient.defined()) {
    if (!impl.leaf_requires_grad)
      detail::fail<GraphError>("Tensor::set_grad: this tensor is not a leaf that requires grad; only such a leaf has a gradient");
    detail::check_like("Tensor::set_grad", "gradient", gradient, "the leaf", *this);
    if (gradient.requires_grad()) detail::fail<GraphError>("Tensor::set_grad: argument 'gradient' must have no history (detach() it)");
  }
  impl.grad = gradient;
}
void Tensor::zero_grad() { const_cast<detail::TensorImpl&>(checked(*this, "Tensor::zero_grad")).grad = Tensor(); }

Tensor Tensor::detach() const {
  const auto& impl = checked(*this, "Tensor::detach");
  return detail::make_view(*this, impl.shape, impl.strides, impl.offset, "Tensor::detach");
}

}  // namespace tapegrad
