// The reductions' loops (formulas in ops/reduction.cpp): rows folded over sixteen lanes or
// explicit vectors, runs along kept dims, leading-dim blocks, and max's backward in one pass.
#include "kernels/reduction.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#include "runtime/cpu.hpp"
#include "runtime/parallel.hpp"
#include "autodiff/loops.hpp"

namespace tapegrad::detail {
namespace {

// One reduced row: a folded with v[0..n). Sixteen independent partial results let the loop
// vectorise (the compiler may not reorder a single chain of float additions itself); they
// meet at the end, so the order of a row's additions depends on n alone.
template <class Acc, class T, class Combine>
TAPEGRAD_CPU_CLONES Acc fold_row(Acc a, const T* v, std::int64_t n, const Combine& combine) {
  constexpr std::int64_t kLanes = 16;
  std::int64_t i = 0;
  if (n >= kLanes) {
    Acc lane[kLanes];
    for (std::int64_t j = 0; j < kLanes; ++j) lane[j] = static_cast<Acc>(v[j]);
    for (i = kLanes; i + kLanes <= n; i += kLanes)
      for (std::int64_t j = 0; j < kLanes; ++j) lane[j] = combine(lane[j], static_cast<Acc>(v[i + j]));
    for (std::int64_t j = 0; j < kLanes; ++j) a = combine(a, lane[j]);
  }
  for (; i < n; ++i) a = combine(a, static_cast<Acc>(v[i]));
  return a;
}

// The maximum of a row, NaN winning. The compiler does not vectorise the select with a NaN
// test in fold_row's lanes, so here the lanes are explicit vectors (GCC/Clang vector
// extensions of 32 bytes; the baseline build splits each into two SSE halves). Four of them
// run side by side: each select waits for the last one on its chain (compare, mask, blend),
// and with two chains that latency, not the loads, set the pace.
template <class T> struct Vec32;
template <> struct Vec32<float> { typedef float type __attribute__((vector_size(32))); };
template <> struct Vec32<double> { typedef double type __attribute__((vector_size(32))); };

// (`|`, not `||`: no branch, so that loops over it if-convert and vectorise)
template <class T> T max_combine(T a, T v) { return ((a != a) | (a >= v)) ? a : v; }

template <class T>
TAPEGRAD_CPU_CLONES T max_row(T a, const T* v, std::int64_t n) {
  using V = typename Vec32<T>::type;
  constexpr std::int64_t kWidth = sizeof(V) / sizeof(T), kChains = 4, kStep = kChains * kWidth;
  std::int64_t i = 0;
  if (n >= kStep) {
    V m[kChains], x[kChains];
    for (std::int64_t c = 0; c < kChains; ++c) std::memcpy(&m[c], v + c * kWidth, sizeof(V));
    for (i = kStep; i + kStep <= n; i += kStep)
      for (std::int64_t c = 0; c < kChains; ++c) {
        std::memcpy(&x[c], v + i + c * kWidth, sizeof(V));
        m[c] = ((m[c] >= x[c]) | (m[c] != m[c])) ? m[c] : x[c];
      }
    for (std::int64_t c = 0; c < kChains; ++c)
      for (std::int64_t j = 0; j < kWidth; ++j) a = max_combine(a, m[c][j]);
  }
  for (; i < n; ++i) a = max_combine(a, v[i]);
  return a;
}

// A run along a kept dim: each accumulator takes one element (reducing a leading dim).
template <class Acc, class T, class Combine>
TAPEGRAD_CPU_CLONES void fold_columns(Acc* __restrict a, const T* v, std::int64_t n, const Combine& combine) {
  for (std::int64_t i = 0; i < n; ++i) a[i] = combine(a[i], static_cast<Acc>(v[i]));
}

// kColumnRows consecutive rows (row r at v + r * stride) folded into the accumulators in row
// order, as fold_columns would one row at a time (so the same bits), but loading and storing
// each accumulator once per block instead of once per row: one row at a time, that traffic
// (8-byte accumulators for a 4-byte float) made a leading-dim sum half as fast as a copy.
inline constexpr std::int64_t kColumnRows = 8;
template <class Acc, class T, class Combine>
TAPEGRAD_CPU_CLONES void fold_column_block(Acc* __restrict a, const T* v, std::int64_t stride, std::int64_t n,
                                            const Combine& combine) {
  for (std::int64_t i = 0; i < n; ++i) {
    Acc s = a[i];
    for (std::int64_t r = 0; r < kColumnRows; ++r) s = combine(s, static_cast<Acc>(v[r * stride + i]));
    a[i] = s;
  }
}

// Whether x reads as a contiguous [rows, cols] whose rows are the reduced dims and whose
// columns are the kept ones (a reduction over leading dims), and those sizes.
bool leading_reduction(const Tensor& x, const ReductionPlan& p, std::int64_t& rows, std::int64_t& cols) {
  rows = cols = 1;
  if (!x.is_contiguous()) return false;
  for (std::size_t k = 0; k < p.reduced.size(); ++k) {
    const std::int64_t size = x.shape()[k];
    if (size == 1) continue;
    if (!p.reduced[k]) cols *= size;
    else if (cols > 1) return false;  // a reduced dim inside the kept ones
    else rows *= size;
  }
  return rows > 1 && cols > 1;
}

// Walks x in runs, calling run(k, v, n, acc_step, x_step, o, o_step) for the n elements
// v[i * x_step] that fold into accumulators k + i * acc_step (accumulators laid out as p.kept,
// contiguous) and whose positions in a contiguous tensor of x's shape are o + i * o_step. Large
// inputs are split over threads along the outermost kept dim (size > 1), so each thread owns
// its accumulators and results do not depend on the thread count.
template <class T, class Run>
void walk(const Tensor& x, const ReductionPlan& p, const Run& run) {
  Shape acc_strides = contiguous_strides(p.kept);
  for (std::size_t k = 0; k < acc_strides.size(); ++k)
    if (p.reduced[k]) acc_strides[k] = 0;
  const Shape out_strides = contiguous_strides(x.shape());
  const T* px = static_cast<const T*>(x.raw_data());
  const std::size_t rank = x.shape().size();
  std::size_t split = 0;
  while (split < rank && (p.reduced[split] || x.shape()[split] == 1)) ++split;
  const auto part = [&](std::int64_t begin, std::int64_t end) {
    Shape shape = x.shape();
    std::int64_t acc_base = 0, x_base = 0, out_base = 0;
    if (split < rank) {
      shape[split] = end - begin;
      acc_base = begin * acc_strides[split];
      x_base = begin * x.strides()[split];
      out_base = begin * out_strides[split];
    }
    const StridedLoop<3> loop(shape.data(), shape.size(), {acc_strides.data(), x.strides().data(), out_strides.data()});
    loop.for_each_run([&](const auto& off, std::int64_t n, const auto& inner) {
      run(acc_base + off[0], px + x_base + off[1], n, inner[0], inner[1], out_base + off[2], inner[2]);
    });
  };
  if (x.numel() == 0) return;
  const std::int64_t parts = split < rank ? x.shape()[split] : 1;
  const std::int64_t per_part = std::max<std::int64_t>(1, x.numel() / parts);
  if (parallel_chunks(parts, per_part) == 1) part(0, parts);
  else parallel_for(parts, per_part, part);
}

// Folds x into a tensor of shape p.kept with acc = combine(acc, v), accumulating in Acc;
// `row(acc, v, n)` folds one contiguous reduced row. kBlockRows: whether fold_column_block
// vectorises with this combine (GCC leaves a chain of max selects scalar, so max's leading-dim
// reduction takes one row at a time).
template <class T, bool kBlockRows, class Acc, class Combine, class Row>
Tensor fold(const Tensor& x, const ReductionPlan& p, Acc init, Combine combine, Row row) {
  std::vector<Acc> acc(static_cast<std::size_t>(shape_numel(p.kept)), init);
  std::int64_t rows = 0, cols = 0;
  if (leading_reduction(x, p, rows, cols)) {
    // Threads take column ranges; each column folds its rows in order whatever the split.
    const T* px = static_cast<const T*>(x.raw_data());
    const auto part = [&](std::int64_t begin, std::int64_t end) {
      std::int64_t r = 0;
      if constexpr (kBlockRows)
        for (; r + kColumnRows <= rows; r += kColumnRows)
          fold_column_block(acc.data() + begin, px + r * cols + begin, cols, end - begin, combine);
      for (; r < rows; ++r) fold_columns(acc.data() + begin, px + r * cols + begin, end - begin, combine);
    };
    const int blocks = parallel_chunks(rows, cols);
    if (blocks == 1) {
      part(0, cols);
    } else if constexpr (!kBlockRows) {
      // max: threads take blocks of whole rows, each one contiguous stream. Split by columns,
      // each thread read pieces of every row, a stream broken at each row, and 2 threads ran
      // slower than one. The blocks' maxima are combined in row order, which gives the bits of
      // the one-row-at-a-time fold (the first of equal values stays, the first NaN wins).
      std::vector<Acc> partial(static_cast<std::size_t>((blocks - 1) * cols), init);
      parallel_for(blocks, rows / blocks * cols, [&](std::int64_t b0, std::int64_t b1) {
        for (std::int64_t b = b0; b < b1; ++b) {
          Acc* a = b == 0 ? acc.data() : partial.data() + (b - 1) * cols;
          for (std::int64_t r = rows * b / blocks; r < rows * (b + 1) / blocks; ++r) fold_columns(a, px + r * cols, cols, combine);
        }
      });
      for (std::int64_t b = 1; b < blocks; ++b) fold_columns(acc.data(), partial.data() + (b - 1) * cols, cols, combine);
    } else {
      parallel_for(cols, rows, part);
    }
  } else {
    walk<T>(x, p, [&](std::int64_t k, const T* v, std::int64_t n, std::int64_t acc_step, std::int64_t x_step, std::int64_t,
                      std::int64_t) {
      Acc* a = acc.data() + k;
      if (acc_step == 0 && x_step == 1) *a = row(*a, v, n);
      else if (acc_step == 1 && x_step == 1) fold_columns(a, v, n, combine);
      else
        for (std::int64_t i = 0; i < n; ++i) a[i * acc_step] = combine(a[i * acc_step], static_cast<Acc>(v[i * x_step]));
    });
  }
  Tensor out = new_tensor(p.kept, x.dtype());
  T* po = static_cast<T*>(mutable_data(out));
  for (std::size_t i = 0; i < acc.size(); ++i) po[i] = convert<T>(acc[i]);
  return out;
}

// One reduced row (max over the last dim): d[i] = g where v[i] == m, else 0; returns how many.
template <class T>
TAPEGRAD_CPU_CLONES std::int64_t place_row(T* __restrict d, const T* v, std::int64_t n, T m, T g) {
  std::int64_t count = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const bool hit = v[i] == m;
    d[i] = hit ? g : T(0);
    count += hit;
  }
  return count;
}

// A run along a kept dim (max over a leading dim): one element per slice.
template <class T>
TAPEGRAD_CPU_CLONES void place_columns(T* __restrict d, std::int64_t* __restrict ties, const T* v, const T* m, const T* g,
                                        std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const bool hit = v[i] == m[i];
    d[i] = hit ? g[i] : T(0);
    ties[i] += hit;
  }
}

// The backward of max: dx = [x == M] g / ties. One pass over x writes g where x == M and counts
// each slice's ties at once; only when some slice has more than one (g / 1 is g itself) does a
// second pass place the shares, g / ties. No bool or float intermediates of x's size.
template <class T>
Tensor max_backward_direct(const Tensor& x, const Tensor& kept, const Tensor& gk, const ReductionPlan& p) {
  const T* pm = static_cast<const T*>(kept.raw_data());  // contiguous, laid out as p.kept
  const T* pg = static_cast<const T*>(gk.raw_data());
  std::vector<std::int64_t> ties(static_cast<std::size_t>(shape_numel(p.kept)), 0);
  Tensor dx = new_tensor(x.shape(), x.dtype());
  T* pd = static_cast<T*>(mutable_data(dx));
  std::int64_t rows = 0, cols = 0;
  const int blocks = leading_reduction(x, p, rows, cols) ? parallel_chunks(rows, cols) : 1;
  if (blocks > 1) {
    // Blocks of whole rows, as max's forward takes them (one stream per thread); each block
    // counts its own ties, summed after (integers: any order gives the same counts).
    const T* px = static_cast<const T*>(x.raw_data());
    std::vector<std::int64_t> block_ties(static_cast<std::size_t>((blocks - 1) * cols), 0);
    parallel_for(blocks, rows / blocks * cols, [&](std::int64_t b0, std::int64_t b1) {
      for (std::int64_t b = b0; b < b1; ++b) {
        std::int64_t* t = b == 0 ? ties.data() : block_ties.data() + (b - 1) * cols;
        for (std::int64_t r = rows * b / blocks; r < rows * (b + 1) / blocks; ++r)
          place_columns(pd + r * cols, t, px + r * cols, pm, pg, cols);
      }
    });
    for (std::int64_t b = 1; b < blocks; ++b)
      for (std::int64_t c = 0; c < cols; ++c) ties[static_cast<std::size_t>(c)] += block_ties[static_cast<std::size_t>((b - 1) * cols + c)];
  } else {
    walk<T>(x, p, [&](std::int64_t k, const T* v, std::int64_t n, std::int64_t acc_step, std::int64_t x_step, std::int64_t o,
                      std::int64_t o_step) {
      T* d = pd + o;
      if (acc_step == 0 && x_step == 1 && o_step == 1) ties[static_cast<std::size_t>(k)] += place_row(d, v, n, pm[k], pg[k]);
      else if (acc_step == 1 && x_step == 1 && o_step == 1) place_columns(d, ties.data() + k, v, pm + k, pg + k, n);
      else
        for (std::int64_t i = 0; i < n; ++i) {
          const std::int64_t a = k + i * acc_step;
          const bool hit = v[i * x_step] == pm[a];
          d[i * o_step] = hit ? pg[a] : T(0);
          ties[static_cast<std::size_t>(a)] += hit;
        }
    });
  }
  if (std::none_of(ties.begin(), ties.end(), [](std::int64_t t) { return t > 1; })) return dx;
  Tensor ties_t = new_tensor(p.kept, x.dtype());
  T* pt = static_cast<T*>(mutable_data(ties_t));
  for (std::size_t i = 0; i < ties.size(); ++i) pt[i] = static_cast<T>(ties[i]);
  Tensor share = new_tensor(p.kept, x.dtype());
  map_into<T, T, T>(share, [](T gv, T c) { return gv / c; }, gk, ties_t);
  map_into<T, T, T, T>(dx, [](T v, T m, T s) { return v == m ? s : T(0); }, x, kept, share);
  return dx;
}

}  // namespace

Tensor sum_kept(const Tensor& x, const ReductionPlan& p) {
  // Accumulate in double so float32 sums of many elements keep their precision.
  return visit_float(x.dtype(), "sum", [&]<class T>(Tag<T>) {
    const auto add = [](double a, double v) { return a + v; };
    return fold<T, true>(x, p, 0.0, add, [&](double a, const T* v, std::int64_t n) { return fold_row(a, v, n, add); });
  });
}

Tensor max_kept(const Tensor& x, const ReductionPlan& p) {
  return visit_float(x.dtype(), "max", [&]<class T>(Tag<T>) {
    // NaN wins: once the accumulator is NaN it stays NaN.
    // (a lambda rather than &max_combine<T>: the loops inline what they are given by type)
    return fold<T, false>(x, p, -std::numeric_limits<T>::infinity(), [](T a, T v) { return max_combine(a, v); },
                      [](T a, const T* v, std::int64_t n) { return max_row(a, v, n); });
  });
}

Tensor max_kept_backward(const Tensor& x, const Tensor& kept, const Tensor& g, const ReductionPlan& p) {
  return visit_float(x.dtype(), "max", [&]<class T>(Tag<T>) { return max_backward_direct<T>(x, kept, g, p); });
}

}  // namespace tapegrad::detail
