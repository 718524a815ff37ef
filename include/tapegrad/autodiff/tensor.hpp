// Tensor: a strided, reference-counted view of shared storage, plus its autograd state.
//
// Copying a Tensor copies the handle, not the data: both handles see the same values, the same
// requires_grad flag and the same accumulated gradient (as in PyTorch). Views (reshape, permute,
// slice, expand...) are new tensors over the same storage. No public op writes into its inputs.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

// fmt::print("{}", t.shape()) prints [3, 4]: a Shape is a std::vector, which fmt/ranges.h formats.
#include <fmt/ranges.h>

#include "tapegrad/autodiff/dtype.hpp"

namespace tapegrad {

using Shape = std::vector<std::int64_t>;

namespace detail {
struct TensorImpl;
}

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor: defined() is false
  explicit Tensor(std::shared_ptr<detail::TensorImpl> impl) noexcept;

  bool defined() const noexcept { return impl_ != nullptr; }

  // Layout. Strides and offset count elements, not bytes.
  DType dtype() const;
  const Shape& shape() const;
  const Shape& strides() const;
  std::int64_t offset() const;
  std::int64_t dim() const;
  std::int64_t size(std::int64_t d) const;  // negative d counts from the end
  std::int64_t numel() const;
  bool is_contiguous() const;
  bool shares_storage_with(const Tensor& other) const;

  // Pointer to element [0, ..., 0]; T (float, double, bool, std::int64_t, optionally const) must
  // match dtype() (checked). data<const T>() is for reading. data<T>() hands out a writable
  // pointer, so it counts as an in-place write: it bumps the version of the storage, and a
  // recorded op that saved this tensor (or a view of it) will refuse to run its backward. Update
  // parameters with the functions of ops/inplace.hpp instead.
  template <class T> T* data() const {
    check_element_type(dtype_of<std::remove_const_t<T>>());
    if constexpr (!std::is_const_v<T>) note_write();
    return static_cast<T*>(const_cast<void*>(raw_data()));
  }
  const void* raw_data() const;  // element [0, ..., 0], read-only, any dtype
  // Increases with every in-place write to this tensor's storage (shared by all its views).
  std::uint64_t version() const;

  // Values in row-major order, converted to T (bool/int64/float conversions as in C++). T is one
  // of the element types (float, double, bool, std::int64_t): another does not compile.
  template <class T>
    requires ElementType<T>
  std::vector<T> to_vector() const;
  // The single value of a one-element tensor, as double.
  double item() const;

  // Autograd state.
  bool requires_grad() const;
  // Marks a leaf as wanting a gradient. Only floating leaves can; a recorded op's output cannot
  // be changed (detach() it first).
  Tensor& set_requires_grad(bool on = true);
  bool is_leaf() const;
  Tensor grad() const;  // undefined until a backward reached this leaf
  // Replaces this leaf's gradient (data-parallel training sets the averaged one): a tensor of
  // the leaf's shape and dtype with no history, or an undefined one to drop it.
  void set_grad(const Tensor& gradient);
  void zero_grad();     // drops the accumulated gradient
  // The same storage and layout with no autograd history.
  Tensor detach() const;

  // Convenience members for the free functions of the same name (ops/view.hpp, ops/cast.hpp;
  // they are defined with those functions, above this layer).
  Tensor contiguous() const;
  Tensor reshape(Shape shape) const;
  Tensor permute(std::vector<std::int64_t> dims) const;
  Tensor transpose(std::int64_t dim0, std::int64_t dim1) const;
  Tensor to(DType dtype) const;

  detail::TensorImpl* impl() const noexcept { return impl_.get(); }
  const std::shared_ptr<detail::TensorImpl>& impl_ptr() const noexcept { return impl_; }

 private:
  void check_element_type(DType requested) const;
  void note_write() const;
  std::shared_ptr<detail::TensorImpl> impl_;
};

extern template std::vector<float> Tensor::to_vector<float>() const;
extern template std::vector<double> Tensor::to_vector<double>() const;
extern template std::vector<bool> Tensor::to_vector<bool>() const;
extern template std::vector<std::int64_t> Tensor::to_vector<std::int64_t>() const;

// ---- Factories -------------------------------------------------------------------------------

Tensor empty(const Shape& shape, DType dtype = float32);  // uninitialised values
Tensor zeros(const Shape& shape, DType dtype = float32);
Tensor ones(const Shape& shape, DType dtype = float32);
Tensor full(const Shape& shape, double value, DType dtype = float32);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor scalar(double value, DType dtype = float32);  // rank 0
// [start, start + step, ...) up to but excluding end, like numpy.arange. int64 (the default)
// needs a whole start and step (a ValueError otherwise: pass a floating dtype for fractions).
Tensor arange(double start, double end, double step = 1.0, DType dtype = int64);
Tensor arange(std::int64_t end, DType dtype = int64);

// A tensor holding a copy of `values` (row-major) with the given shape; values.size() must
// equal the product of shape.
Tensor from_vector(std::span<const float> values, const Shape& shape);
Tensor from_vector(std::span<const double> values, const Shape& shape);
Tensor from_vector(std::span<const std::int64_t> values, const Shape& shape);
Tensor from_bools(const std::vector<bool>& values, const Shape& shape);

// Small nested literals for tests and examples. Every pair of braces is one dimension, so
// tensor({{10}, {20}}) is [2, 1] and tensor({1, 2}) is [2]; a bare number is rank 0.
class Literal {
 public:
  Literal(double value) : value_(value) {}  // NOLINT: implicit on purpose, for literals
  Literal(std::initializer_list<Literal> items) : items_(items), is_list_(true) {}
  double value() const noexcept { return value_; }
  const std::vector<Literal>& items() const noexcept { return items_; }
  bool is_list() const noexcept { return is_list_; }

 private:
  double value_ = 0;
  std::vector<Literal> items_;
  bool is_list_ = false;
};
Tensor tensor(const Literal& values, DType dtype = float32);  // tensor({{1, 2}, {3, 4}}): float32 [2, 2]
Tensor mask(const Literal& values);                          // mask({{true, false}}): bool [1, 2]

// Seeded random numbers. The stream is std::mt19937_64 (its output is fixed by the C++
// standard) turned into values by tapegrad's own transforms, so a seed gives the same tensor
// on every platform and standard library.
// A seeded stream of random numbers. A copy is independent (as a std::mt19937_64 copy): it
// continues from the same point, and drawing from one never advances the other.
class Generator {
 public:
  explicit Generator(std::uint64_t seed);
  Generator(const Generator& other);
  Generator& operator=(const Generator& other);
  Generator(Generator&&) noexcept = default;
  Generator& operator=(Generator&&) noexcept = default;
  ~Generator();
  double uniform();  // [0, 1)
  double normal();   // mean 0, standard deviation 1
  std::uint64_t next_u64();
  // The stream's position, for a checkpoint: int64 [2 + W], whether a spare normal is cached, its
  // bits, then the engine's W words in the standard library's own textual form (W = 313 with
  // libstdc++), so a state is read back by a build on the same standard library. After
  // set_state(s) the draws are exactly those that followed get_state(); a state of another
  // dtype, shape or an impossible spare is refused (DTypeError, ShapeError, ValueError) and the
  // generator is left as it was.
  Tensor get_state() const;
  void set_state(const Tensor& state);

 private:
  struct State;
  std::shared_ptr<State> state_;
};
Tensor randn(const Shape& shape, Generator& gen, DType dtype = float32);
// Uniform in [low, high): every value v has low <= v < high, for any finite low < high (also
// -DBL_MAX and DBL_MAX); float32 needs bounds within float32's range and some float32 value in
// [low, high). low == high gives low everywhere (as PyTorch's uniform_). Otherwise a ValueError.
Tensor rand(const Shape& shape, Generator& gen, DType dtype = float32, double low = 0.0,
            double high = 1.0);
Tensor randn(const Shape& shape, std::uint64_t seed, DType dtype = float32);
Tensor rand(const Shape& shape, std::uint64_t seed, DType dtype = float32, double low = 0.0,
            double high = 1.0);

// A readable, summarised rendering: shape, dtype and values (numpy-style "..." past 1000
// elements). fmt::print("{}", t) uses it too.
std::string to_string(const Tensor& t);

}  // namespace tapegrad

template <>
struct fmt::formatter<tapegrad::Tensor> : fmt::formatter<std::string_view> {
  auto format(const tapegrad::Tensor& t, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(tapegrad::to_string(t), ctx);
  }
};
