// weighted_matmul: c = w @ x where a zero weight contributes nothing (see the header).
//
// The plain matmul (oneDNN, or OpenBLAS for float64) stays the workhorse in both cases:
//   x all finite:   c = w @ x                       (0 * finite is 0: nothing to fix)
//   otherwise:      c = w @ x0,  x0 = x with every non-finite element replaced by 0,
//                   then c[i, n] += w[i, k] x[k, n] for each non-finite x[k, n] and each row
//                   i whose weight w[i, k] is nonzero (in attention: the rows that attend to it).
// The correction costs O(M) per non-finite element, on top of two O(size) passes over x.
#include "kernels/weighted_matmul.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "autodiff/loops.hpp"
#include "kernels/matmul_dnnl.hpp"
#include "kernels/product.hpp"

namespace tapegrad::detail {
namespace {

// 1 for an infinity or NaN (the values whose exponent bits are all ones), else 0, as an integer
// of the element's width: or-ing these keeps the scan a branch-free integer loop, which the
// compiler vectorises (a bool accumulator or std::isfinite would not be).
template <class T> auto non_finite(T v) {
  if constexpr (sizeof(T) == 4) {
    return std::uint32_t{(std::bit_cast<std::uint32_t>(v) & 0x7f800000u) == 0x7f800000u};
  } else {
    return std::uint64_t{(std::bit_cast<std::uint64_t>(v) & 0x7ff0000000000000u) == 0x7ff0000000000000u};
  }
}

// Whether n elements from p are all finite: 16 lanes of or-ed flags so that the loop vectorises at
// full width (one accumulator made a dependency chain per element), compiled per instruction set.
template <class T> [[gnu::always_inline]] inline bool span_finite(const T* p, std::int64_t n) {
  constexpr std::int64_t kLanes = 16;
  decltype(non_finite(T{})) lane[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (std::int64_t l = 0; l < kLanes; ++l) lane[l] |= non_finite(p[i + l]);
  for (std::int64_t l = 0; i + l < n; ++l) lane[0] |= non_finite(p[i + l]);
  decltype(non_finite(T{})) bad = 0;
  for (std::int64_t l = 0; l < kLanes; ++l) bad |= lane[l];
  return bad == 0;
}
TAPEGRAD_CPU_CLONES bool span_finite_f32(const float* p, std::int64_t n) { return span_finite(p, n); }
TAPEGRAD_CPU_CLONES bool span_finite_f64(const double* p, std::int64_t n) { return span_finite(p, n); }

template <class T> bool all_finite(const Tensor& x) {
  const T* p = static_cast<const T*>(x.raw_data());
  auto scan = [](const T* r, std::int64_t n) {
    if constexpr (std::is_same_v<T, float>) return span_finite_f32(r, n);
    else return span_finite_f64(r, n);
  };
  // A dense permutation (q, k, v split into heads from one projection) is one block from its
  // first element: scanned flat, not in runs of a head's width.
  if (dense_in_some_order({x.shape().data(), x.shape().size()}, {x.strides().data(), x.strides().size()})) return scan(p, x.numel());
  bool finite = true;
  StridedLoop<1> loop(x.shape().data(), x.shape().size(), {x.strides().data()});
  loop.for_each_run([&](const auto& off, std::int64_t n, const auto& inner) {
    const T* r = p + off[0];
    if (!finite) return;
    if (inner[0] == 1) {
      finite = scan(r, n);
      return;
    }
    decltype(non_finite(T{})) bad = 0;
    for (std::int64_t i = 0; i < n; ++i) bad |= non_finite(r[i * inner[0]]);
    finite = bad == 0;
  });
  return finite;
}

// x with its non-finite elements replaced by 0, in a fresh dense tensor whose dims lie in memory
// in the order of x's (a transposed v stays transposed, a key cache sliced to its length keeps
// the keys at stride 1). The product then takes the same loops on the copy as on x itself when
// x is finite: which loops run, and so the order of the sums, follows the layout (a dot product
// per output for an operand whose columns are contiguous, sums down the rows otherwise), and a
// NaN at a masked key must not change a bit of any output.
template <class T> Tensor finite_part(const Tensor& x) {
  Tensor out = make_view(new_tensor({x.numel()}, x.dtype()), x.shape(), dense_strides_like(x.shape(), x.strides()), 0, "weighted_matmul");
  map_into<T, T>(out, [](T v) { return non_finite(v) ? T(0) : v; }, x);
  return out;
}

// c[i, n] += w[i, k] x[k, n] for every non-finite x[k, n] and every i with w[i, k] != 0.
template <class T> void add_non_finite(const Tensor& w, const Tensor& x, const Tensor& c) {
  const std::size_t rc = c.shape().size(), rw = w.shape().size(), rx = x.shape().size();
  const std::int64_t m = c.shape()[rc - 2], n = c.shape()[rc - 1], k = w.shape()[rw - 1];
  const std::int64_t wi = w.strides()[rw - 2], wk = w.strides()[rw - 1], xk = x.strides()[rx - 2], xn = x.strides()[rx - 1],
                     ci = c.strides()[rc - 2], cn = c.strides()[rc - 1];
  const std::span<const std::int64_t> batch(c.shape().data(), rc - 2);
  const Dims8 sw = batch_strides(w, batch), sx = batch_strides(x, batch), sc = batch_strides(c, batch);
  const T* base_w = static_cast<const T*>(w.raw_data());
  const T* base_x = static_cast<const T*>(x.raw_data());
  T* base_c = static_cast<T*>(mutable_data(c));
  StridedLoop<3> loop(batch.data(), batch.size(), {sw.data(), sx.data(), sc.data()});
  loop.for_each_run([&](const auto& off, std::int64_t count, const auto& inner) {
    for (std::int64_t t = 0; t < count; ++t) {
      const T* pw = base_w + off[0] + t * inner[0];
      const T* px = base_x + off[1] + t * inner[1];
      T* pc = base_c + off[2] + t * inner[2];
      for (std::int64_t kk = 0; kk < k; ++kk)
        for (std::int64_t nn = 0; nn < n; ++nn) {
          const T v = px[kk * xk + nn * xn];
          if (!non_finite(v)) continue;
          for (std::int64_t i = 0; i < m; ++i)
            if (const T weight = pw[i * wi + kk * wk]; weight != T(0)) pc[i * ci + nn * cn] += weight * v;
        }
    }
  });
}

}  // namespace

bool all_finite_run(const float* p, std::int64_t n) noexcept { return span_finite_f32(p, n); }
bool all_finite_run(const double* p, std::int64_t n) noexcept { return span_finite_f64(p, n); }

bool left_out_rows_finite(const Tensor& keep_rows, const Tensor& x) {
  const bool* keep = static_cast<const bool*>(keep_rows.raw_data());
  return visit_float(x.dtype(), "multihead_attention", [&]<class T>(Tag<T>) {
    const T* p = static_cast<const T*>(x.raw_data());
    const std::int64_t len = x.size(1), c = x.size(2), s0 = x.strides()[0], s1 = x.strides()[1], s2 = x.strides()[2];
    for (std::int64_t b = 0; b < x.size(0); ++b)
      for (std::int64_t i = 0; i < len; ++i) {
        if (keep[b * len + i]) continue;
        const T* row = p + b * s0 + i * s1;
        if (s2 == 1) {
          if (!all_finite_run(row, c)) return false;
          continue;
        }
        for (std::int64_t j = 0; j < c; ++j)
          if (!std::isfinite(row[j * s2])) return false;
      }
    return true;
  });
}

bool all_finite_values(const Tensor& x) {
  return visit_float(x.dtype(), "weighted_matmul", [&]<class T>(Tag<T>) { return all_finite<T>(x); });
}

Tensor weighted_matmul(const Tensor& w, const Tensor& x) {
  return visit_float(x.dtype(), "weighted_matmul", [&]<class T>(Tag<T>) {
    if (all_finite<T>(x)) return product(w, x, false);
    Tensor c = product(w, finite_part<T>(x), false);
    if (c.numel() > 0) add_non_finite<T>(w, x, c);
    return c;
  });
}

}  // namespace tapegrad::detail
