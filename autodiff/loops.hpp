// Internal: the loop engine every elementwise op and reduction runs on, dtype dispatch, and the
// allocation and copy helpers. It sits at the bottom with the tensor and the tape (which
// accumulates gradients with it), so nothing here may call an op.
//
// StridedLoop walks N operands over one shape, each with its own element strides (0 on a
// broadcast dim). It drops size-1 dims and merges dims that are contiguous for every operand,
// so a contiguous op becomes one flat run and a transposed one two nested runs.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <cstdint>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "autodiff/check.hpp"
#include "runtime/cpu.hpp"
#include "runtime/parallel.hpp"
#include "autodiff/small_vec.hpp"
#include "autodiff/tensor_impl.hpp"

namespace tapegrad::detail {

template <class T> struct Tag {};

template <class F> decltype(auto) visit_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::float32: return f(Tag<float>{});
    case DType::float64: return f(Tag<double>{});
    default: fail<DTypeError>("{}: expected a floating tensor (float32 or float64), got {}", op, dtype);
  }
}

template <class F> decltype(auto) visit_any(DType dtype, F&& f) {
  switch (dtype) {
    case DType::float32: return f(Tag<float>{});
    case DType::float64: return f(Tag<double>{});
    case DType::bool_: return f(Tag<bool>{});
    case DType::int64: return f(Tag<std::int64_t>{});
  }
  __builtin_unreachable();
}

// Element conversion with every case defined (C++ leaves out-of-range float conversions
// undefined): float to int64 truncates toward zero and saturates, NaN becomes 0; float64 to
// float32 beyond float32's range becomes +-inf; to bool is "!= 0".
template <class D, class S> D convert(S v) {
  if constexpr (std::is_same_v<D, S>) {
    return v;
  } else if constexpr (std::is_floating_point_v<S> && std::is_same_v<D, std::int64_t>) {
    constexpr double kLimit = 9223372036854775808.0;  // 2^63
    if (std::isnan(v)) return 0;
    if (v >= kLimit) return std::numeric_limits<std::int64_t>::max();
    if (v <= -kLimit) return std::numeric_limits<std::int64_t>::min();
    return static_cast<std::int64_t>(v);
  } else if constexpr (std::is_same_v<S, double> && std::is_same_v<D, float>) {
    if (std::isfinite(v) && std::abs(v) > static_cast<double>(std::numeric_limits<float>::max()))
      return v > 0 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
    return static_cast<float>(v);
  } else {
    return static_cast<D>(v);
  }
}

// The broadcast shape of two arguments, or a ShapeError naming both arguments and shapes.
Shape broadcast_args(const char* op, const char* a_name, const Shape& a, const char* b_name,
                     const Shape& b);

// Strides of `t` read as if it had been broadcast to `shape` (0 on new and stretched dims).
// The caller has checked that t broadcasts to shape.
Dims8 broadcast_strides(const Tensor& t, const Shape& shape);
// The strides of t's batch dims (all but its last two) read as broadcast to `batch` (0 on the
// dims t lacks and on its size-1 dims), without making a view: products ask for them per call.
Dims8 batch_strides(const Tensor& t, std::span<const std::int64_t> batch);

template <std::size_t N>
class StridedLoop {
 public:
  // `shape` has `rank` dims; strides[k] points at operand k's `rank` strides.
  StridedLoop(const std::int64_t* shape, std::size_t rank, const std::array<const std::int64_t*, N>& strides) {
    // Walk from the innermost dim outwards, merging into the current group while every
    // operand's stride continues it.
    for (std::size_t d = rank; d-- > 0;) {
      const std::int64_t n = shape[d];
      if (n == 0) {
        empty_ = true;
        return;
      }
      if (n == 1) continue;
      // A group's size is a product of one tensor's sizes, which fits (tensor_impl.hpp). Stride
      // times size is checked rather than argued (operands' strides are bounded only by how
      // they were derived): a product that overflows is no stride, so it means no merge.
      bool merge = !sizes_.empty();
      for (std::size_t k = 0; merge && k < N; ++k) {
        std::int64_t next = 0;
        merge = !__builtin_mul_overflow(strides_[k].back(), sizes_.back(), &next) && strides[k][d] == next;
      }
      if (merge) {
        sizes_.back() *= n;
        continue;
      }
      sizes_.push_back(n);
      for (std::size_t k = 0; k < N; ++k) strides_[k].push_back(strides[k][d]);
    }
  }

  // Calls run(offsets, n, inner) for each innermost run of n elements; operand k's elements are
  // at offsets[k] + i * inner[k].
  template <class F> void for_each_run(F&& run) const { for_each_run_in(0, numel(), run); }

  // The same for the elements at row-major positions [begin, end) of the shape (in runs that
  // may start or end part-way through an innermost run): how parallel loops split the work.
  template <class F> void for_each_run_in(std::int64_t begin, std::int64_t end, F&& run) const {
    std::array<std::int64_t, N> offsets{};
    if (empty_ || begin >= end) return;
    if (sizes_.empty()) {
      run(offsets, std::int64_t{1}, std::array<std::int64_t, N>{});
      return;
    }
    std::array<std::int64_t, N> inner;
    for (std::size_t k = 0; k < N; ++k) inner[k] = strides_[k][0];
    const std::size_t outer = sizes_.size() - 1;
    Dims8 counter(outer, 0);
    std::int64_t i = begin % sizes_[0];
    std::size_t dim = 1;
    for (std::int64_t r = begin / sizes_[0]; r > 0; ++dim) {
      const std::int64_t c = r % sizes_[dim];
      r /= sizes_[dim];
      counter[dim - 1] = c;
      for (std::size_t k = 0; k < N; ++k) offsets[k] += c * strides_[k][dim];
    }
    for (std::int64_t pos = begin;;) {
      const std::int64_t n = std::min(sizes_[0] - i, end - pos);
      std::array<std::int64_t, N> start = offsets;
      for (std::size_t k = 0; k < N; ++k) start[k] += i * inner[k];
      run(start, n, inner);
      pos += n;
      if (pos >= end) return;
      i = 0;
      std::size_t d = 1;
      for (; d <= outer; ++d) {
        for (std::size_t k = 0; k < N; ++k) offsets[k] += strides_[k][d];
        if (++counter[d - 1] < sizes_[d]) break;
        for (std::size_t k = 0; k < N; ++k) offsets[k] -= strides_[k][d] * sizes_[d];
        counter[d - 1] = 0;
      }
      if (d > outer) return;
    }
  }

  // Elements visited (the product of the merged sizes: it fits, as the shape's product does).
  std::int64_t numel() const {
    if (empty_) return 0;
    std::int64_t n = 1;
    for (auto s : sizes_) n *= s;
    return n;
  }

 private:
  bool empty_ = false;
  Dims8 sizes_;  // innermost first
  std::array<Dims8, N> strides_;
};

// One innermost run with unit output stride: out[i] = f(in_0[i or 0], ...), where bit k of
// Mask says input k advances with i (stride 1) rather than staying put (stride 0, a broadcast
// operand: a bias row, a scalar per row). Both index forms are compile-time, so the loop is a
// plain contiguous loop the compiler vectorises, once per instruction set (TAPEGRAD_CPU_CLONES).
template <unsigned Mask, std::size_t... K, class Out, class F, class... In>
TAPEGRAD_CPU_CLONES void unit_run(std::index_sequence<K...>, Out* __restrict o, std::int64_t n, const F& f,
                                   const In*... p) {
  for (std::int64_t i = 0; i < n; ++i) o[i] = f(p[(Mask >> K & 1u) ? i : 0]...);
}

template <class Out, class F, class... In>
void dispatch_unit_run(unsigned mask, Out* o, std::int64_t n, const F& f, const In*... p) {
  [&]<unsigned... M>(std::integer_sequence<unsigned, M...>) {
    (void)((mask == M && (unit_run<M>(std::index_sequence_for<In...>{}, o, n, f, p...), true)) || ...);
  }(std::make_integer_sequence<unsigned, 1u << sizeof...(In)>{});
}

// How the loops address a tensor's elements: bools as their bytes (0 or 1), which the
// vectoriser handles where it gives up on `bool` itself; f still sees bool through conversion.
template <class T> using Stored = std::conditional_t<std::is_same_v<T, bool>, std::uint8_t, T>;

// out[i] = f(in_0[i], in_1[i], ...) over out's shape; each input broadcasts to it. `cost` (>= 1) is
// f's price per element relative to a copy (1): it decides when the loop is worth splitting
// over threads (parallel_for), so tiny tensors stay serial. Each element is computed by the
// same code whatever the split, so results do not depend on the thread count.
template <class Out, class... In, class F, class... Ts>
void map_into_cost(std::int64_t cost, const Tensor& out, F&& f, const Ts&... in) {
  static_assert(sizeof...(Ts) == sizeof...(In) && (std::is_same_v<Ts, Tensor> && ...));
  constexpr std::size_t N = 1 + sizeof...(In);
  const std::array<Dims8, sizeof...(In)> in_strides{broadcast_strides(in, out.shape())...};
  std::array<const std::int64_t*, N> all{};
  all[0] = out.strides().data();
  for (std::size_t k = 1; k < N; ++k) all[k] = in_strides[k - 1].data();
  const StridedLoop<N> loop(out.shape().data(), out.shape().size(), all);
  Stored<Out>* po = static_cast<Stored<Out>*>(mutable_data(out));
  const std::tuple<const Stored<In>*...> pi{static_cast<const Stored<In>*>(in.raw_data())...};
  const auto g = [&f](const Stored<In>... v) { return static_cast<Stored<Out>>(f(static_cast<In>(v)...)); };
  const auto run = [&](const std::array<std::int64_t, N>& off, std::int64_t n, const std::array<std::int64_t, N>& inner) {
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      Stored<Out>* o = po + off[0];
      const std::tuple<const Stored<In>*...> p{(std::get<K>(pi) + off[K + 1])...};
      const bool unit = inner[0] == 1 && (((inner[K + 1] == 1) || (inner[K + 1] == 0)) && ...);
      if (unit) {
        const unsigned mask = ((inner[K + 1] == 1 ? 1u << K : 0u) | ... | 0u);
        dispatch_unit_run(mask, o, n, g, std::get<K>(p)...);
      } else {
        for (std::int64_t i = 0; i < n; ++i) o[i * inner[0]] = g(std::get<K>(p)[i * inner[K + 1]]...);
      }
    }(std::index_sequence_for<In...>{});
  };
  const std::int64_t total = loop.numel();
  // (the first test keeps small tensors clear of the OpenMP runtime's queries)
  if (total < kParallelGrain / cost || parallel_chunks(total, cost) == 1) loop.for_each_run_in(0, total, run);
  else parallel_for(total, cost, [&](std::int64_t b, std::int64_t e) { loop.for_each_run_in(b, e, run); });
}

template <class Out, class... In, class F, class... Ts>
void map_into(const Tensor& out, F&& f, const Ts&... in) {
  map_into_cost<Out, In...>(1, out, std::forward<F>(f), in...);
}

// A fresh contiguous tensor. A shape that breaks the invariant of tensor_impl.hpp is a
// ShapeError "{op}: {what} ...": a caller whose shape comes from user integers or from several
// tensors must name itself (a shape copied from one existing tensor cannot fail).
Tensor new_tensor(const Shape& shape, DType dtype, const char* op = "tensor", const char* what = "result shape");

// Copies src (broadcast to dst's shape) into dst's elements. Internal only: used on tensors a
// kernel just created, never on a caller's tensor.
void copy_into(const Tensor& dst, const Tensor& src);
// A contiguous copy with its own storage (never a view of t), not recorded. Named apart from the
// public, recorded tapegrad::clone so that op sources with `using namespace detail` stay unambiguous.
Tensor copy_of(const Tensor& t);
// a + b for two tensors of one shape and floating dtype (the tape's gradient accumulation).
Tensor add_same_shape(const Tensor& a, const Tensor& b);

}  // namespace tapegrad::detail
