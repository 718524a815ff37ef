// float64 matmul. oneDNN has no float64 matmul on CPU, and float64 exists here for exact
// gradient checks and references, so this favours clarity over peak speed: each batch's A and
// B are packed into contiguous row-major panels, then C += A[i, k] * B[k, :] runs over
// contiguous rows (which the compiler vectorises), in k-blocks that keep B's rows in cache.
#include <algorithm>
#include <memory>
#include <new>

#include "autodiff/loops.hpp"
#include "kernels/matmul.hpp"

namespace tapegrad::detail {
namespace {

constexpr std::int64_t kBlockK = 128;
constexpr std::align_val_t kPanelAlign{64};
struct Aligned {
  void operator()(double* p) const noexcept { ::operator delete[](p, kPanelAlign); }
};

// Panels of up to this many doubles (4 MiB) are kept per thread between calls.
constexpr std::int64_t kKeptPanel = std::int64_t{1} << 19;

// This thread's packing panel `which` (0 for A, 1 for B) of n doubles: 64-byte aligned, as C's
// rows are, so that the gemm's vector loads never straddle two cache lines (from malloc their
// alignment followed the heap's layout, and so did the speed). Kept and reused up to kKeptPanel,
// so that a panel is not mapped and faulted in afresh at every call; a larger one lives in
// `once` for this call only.
double* panel(int which, std::int64_t n, std::unique_ptr<double[], Aligned>& once) {
  if (n > kKeptPanel) {
    once.reset(new (kPanelAlign) double[static_cast<std::size_t>(n)]);
    return once.get();
  }
  thread_local std::unique_ptr<double[], Aligned> panels[2];
  thread_local std::int64_t sizes[2] = {0, 0};
  if (sizes[which] < n) {
    panels[which].reset(new (kPanelAlign) double[static_cast<std::size_t>(n)]);
    sizes[which] = n;
  }
  return panels[which].get();
}

// Copies the [rows, cols] matrix at p (strides rs, cs) into dst, row-major.
void pack(const double* p, std::int64_t rows, std::int64_t cols, std::int64_t rs, std::int64_t cs, double* dst) {
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) dst[i * cols + j] = p[i * rs + j * cs];
}

void gemm(const double* a, const double* b, double* c, std::int64_t m, std::int64_t k, std::int64_t n) {
  std::fill(c, c + m * n, 0.0);
  for (std::int64_t k0 = 0; k0 < k; k0 += kBlockK) {
    const std::int64_t k1 = std::min(k, k0 + kBlockK);
    for (std::int64_t i = 0; i < m; ++i) {
      double* __restrict row = c + i * n;
      for (std::int64_t kk = k0; kk < k1; ++kk) {
        const double aik = a[i * k + kk];
        const double* __restrict brow = b + kk * n;
        for (std::int64_t j = 0; j < n; ++j) row[j] += aik * brow[j];
      }
    }
  }
}

}  // namespace

void matmul_f64(const Tensor& a, const Tensor& b, const Tensor& c) {
  const std::size_t r = c.shape().size();
  const std::int64_t m = c.shape()[r - 2], n = c.shape()[r - 1], k = a.shape()[r - 1];
  const std::span<const std::int64_t> batch(c.shape().data(), r - 2);
  const Dims8 sa = batch_strides(a, batch), sb = batch_strides(b, batch), sc = batch_strides(c, batch);
  std::unique_ptr<double[], Aligned> once_a, once_b;
  double* pa = panel(0, m * k, once_a);
  double* pb = panel(1, k * n, once_b);
  const double* base_a = static_cast<const double*>(a.raw_data());
  const double* base_b = static_cast<const double*>(b.raw_data());
  double* base_c = static_cast<double*>(mutable_data(c));
  StridedLoop<3> loop(batch.data(), batch.size(), {sa.data(), sb.data(), sc.data()});
  loop.for_each_run([&](const auto& off, std::int64_t count, const auto& inner) {
    for (std::int64_t t = 0; t < count; ++t) {
      pack(base_a + off[0] + t * inner[0], m, k, a.strides()[r - 2], a.strides()[r - 1], pa);
      pack(base_b + off[1] + t * inner[1], k, n, b.strides()[r - 2], b.strides()[r - 1], pb);
      gemm(pa, pb, base_c + off[2] + t * inner[2], m, k, n);
    }
  });
}

}  // namespace tapegrad::detail
