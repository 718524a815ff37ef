// float32 products as plain loops, row by row: [..., M, K] @ [..., K, N].
//
// Two kinds of product come here. Decoding with a KV cache multiplies one query row by a key
// matrix that is one position longer at every step: each step is a layout oneDNN has not seen,
// and creating its primitive costs a hundred times the arithmetic of a short cache. And tiny products (a few thousand multiply-adds, as in a small
// attention layer) cost more in oneDNN's per-call bookkeeping than in arithmetic. These loops
// need no preparation, so their cost is the arithmetic.
#include <array>
#include <cstring>

#include "autodiff/loops.hpp"
#include "kernels/matmul_rows.hpp"

namespace tapegrad::detail {
namespace {

// sum_k a[k] b[k] over contiguous a and b. Eight independent partial sums let the compiler
// keep them in vector registers (a single accumulator is a serial chain it may not reorder).
float dot(const float* __restrict a, const float* __restrict b, std::int64_t k) {
  std::array<float, 8> acc{};
  std::int64_t i = 0;
  for (; i + 8 <= k; i += 8)
    for (std::size_t l = 0; l < 8; ++l) acc[l] += a[i + static_cast<std::int64_t>(l)] * b[i + static_cast<std::int64_t>(l)];
  float tail = 0;
  for (; i < k; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

// b is copied into contiguous rows for at least this many rows of a, up to this many elements.
constexpr std::int64_t kPackRows = 4, kPackMax = 1 << 14;

// c[0, W) = sum over i of a[i] b[i, 0, W), the W sums held in one vector (registers) throughout.
// Written with GCC's vector type: left to itself the vectoriser turned this loop into W scalar
// multiply-adds, several times slower.
typedef float Floats16 __attribute__((vector_size(64)));
typedef float Floats8 __attribute__((vector_size(32)));
template <std::size_t W> struct FloatsOf;
template <> struct FloatsOf<16> { using type = Floats16; };
template <> struct FloatsOf<8> { using type = Floats8; };

template <std::size_t W>
void columns(const float* a, std::int64_t ak, const float* b, std::int64_t bk, std::int64_t bn, float* c, std::int64_t k) {
  using Vec = typename FloatsOf<W>::type;
  Vec acc = {};
  for (std::int64_t i = 0; i < k; ++i) {
    const float* brow = b + i * bk;
    Vec row;
    if (bn == 1) {
      std::memcpy(&row, brow, sizeof row);
    } else {
      for (std::size_t j = 0; j < W; ++j) row[j] = brow[static_cast<std::int64_t>(j) * bn];
    }
    acc += a[i * ak] * row;
  }
  std::memcpy(c, &acc, sizeof acc);
}

// c = a @ b for one batch entry: a [K] (stride ak), b [K, N] (strides bk, bn), c [N] contiguous.
void row_times_matrix(const float* a, std::int64_t ak, const float* b, std::int64_t bk, std::int64_t bn, float* __restrict c,
                      std::int64_t k, std::int64_t n, std::vector<float>& scratch) {
  if (bk == 1) {
    // b's columns are contiguous (keys read as k^T): one dot product per output.
    const float* row = a;
    if (ak != 1) {
      scratch.resize(static_cast<std::size_t>(k));
      for (std::int64_t i = 0; i < k; ++i) scratch[static_cast<std::size_t>(i)] = a[i * ak];
      row = scratch.data();
    }
    for (std::int64_t j = 0; j < n; ++j) c[j] = dot(row, b + j * bn, k);
    return;
  }
  // b's rows are contiguous (values, weights): c accumulates a[i] times row i, 16 or 8 columns
  // at a time in locals, so that the running sums stay in registers for the whole loop over i.
  // (Accumulated in c itself, each step waited for the store of the step before: a quarter of
  // the toy attention step was spent here.) Each sum still runs over i in order, as before.
  std::int64_t j0 = 0;
  for (; j0 + 16 <= n; j0 += 16) columns<16>(a, ak, b + j0 * bn, bk, bn, c + j0, k);
  for (; j0 + 8 <= n; j0 += 8) columns<8>(a, ak, b + j0 * bn, bk, bn, c + j0, k);
  if (j0 == n) return;
  std::fill(c + j0, c + n, 0.0f);
  for (std::int64_t i = 0; i < k; ++i) {
    const float w = a[i * ak];
    const float* __restrict brow = b + i * bk;
    for (std::int64_t j = j0; j < n; ++j) c[j] += w * brow[j * bn];
  }
}

}  // namespace

// Compiled for AVX-512 (x86-64-v4), AVX2 (v3) and plain x86-64 and chosen when the program
// starts, with every loop inlined into each version (the build machine's CPU is never assumed).
// No multiply is fused into an add (CMakeLists.txt): every version and every loop gives a sum
// the same bits.
TAPEGRAD_CPU_CLONES_FLATTENED void matmul_rows(const Tensor& a, const Tensor& b, const Tensor& c) {
  const std::size_t r = c.shape().size();
  const std::int64_t n = c.shape()[r - 1], k = a.shape()[r - 1];
  // The batch dims and their strides on the stack: this serves tiny products, where the
  // bookkeeping is most of the cost.
  const std::span<const std::int64_t> batch(c.shape().data(), r - 2);
  const Dims8 sa = batch_strides(a, batch), sb = batch_strides(b, batch), sc = batch_strides(c, batch);
  const std::int64_t m = c.shape()[r - 2], am = a.strides()[r - 2], cm = c.strides()[r - 2];
  const std::int64_t ak = a.strides()[r - 1], bk = b.strides()[r - 2], bn = b.strides()[r - 1];
  const float* base_a = static_cast<const float*>(a.raw_data());
  const float* base_b = static_cast<const float*>(b.raw_data());
  float* base_c = static_cast<float*>(mutable_data(c));
  // This thread's buffers, kept between calls (tiny products come by the thousand).
  thread_local std::vector<float> scratch, packed;
  // With b's columns contiguous (k^T) and several rows to multiply, b is first copied into
  // contiguous rows: the rows then take the vector loop above rather than one dot product (and
  // its horizontal sum) per output. One row (decoding) keeps the dot products: copying b would
  // cost as much as the product. (So with such a b a row's last bits can differ between a
  // product of one to three rows and one of four or more: the two sum in different orders.)
  const bool pack = bk == 1 && m >= kPackRows && k * n <= kPackMax;
  if (pack) packed.resize(static_cast<std::size_t>(k * n));
  StridedLoop<3> loop(batch.data(), batch.size(), {sa.data(), sb.data(), sc.data()});
  loop.for_each_run([&](const auto& off, std::int64_t count, const auto& inner) {
    for (std::int64_t t = 0; t < count; ++t) {
      const float* bt = base_b + off[1] + t * inner[1];
      std::int64_t tk = bk, tn = bn;
      if (pack) {
        for (std::int64_t i = 0; i < k; ++i)
          for (std::int64_t j = 0; j < n; ++j) packed[static_cast<std::size_t>(i * n + j)] = bt[i * bk + j * bn];
        bt = packed.data();
        tk = n;
        tn = 1;
      }
      for (std::int64_t i = 0; i < m; ++i)
        row_times_matrix(base_a + off[0] + t * inner[0] + i * am, ak, bt, tk, tn, base_c + off[2] + t * inner[2] + i * cm, k, n,
                         scratch);
    }
  });
}

}  // namespace tapegrad::detail
