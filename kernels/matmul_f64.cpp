// float64 products on OpenBLAS's dgemm: oneDNN has no float64 matmul on the CPU, and float64 is
// what gradient checks and reference runs compute in. Each matrix of the batch is one
// cblas_dgemm on the operands in place: a matrix with unit stride along its rows or its columns
// is a plain or a transposed one, which dgemm reads as it is; any other layout is copied first.
// OpenBLAS runs on the calling thread only. A matrix of more than 256 rows is always computed in
// bands of 256 rows, each one dgemm call, whatever the thread count: dgemm's kernels take rows
// in tiles whose size depends on the CPU (2 to 24 rows), so a row's last bits can depend on
// where its band starts, and only bands fixed by the shape keep them the same on any count. A
// product that its size repays on more threads hands batch entries, or bands, to tapegrad's
// workers.
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <vector>

#include "autodiff/loops.hpp"
#include "autodiff/tape_observer.hpp"
#include "kernels/matmul_dnnl.hpp"
#include "kernels/matmul_f64.hpp"
#include "runtime/parallel.hpp"

namespace tapegrad::detail {
namespace {

constexpr std::int64_t kBandRows = 256;

// OpenBLAS's own threads stay idle: tapegrad's workers split the work, and a second team would
// fight them for the cores. (This is process-wide, as OpenBLAS's setting is.)
void one_blas_thread() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}

// A [rows, cols] matrix as dgemm reads it: transposed or not, with its leading dimension.
struct Operand {
  CBLAS_TRANSPOSE trans = CblasNoTrans;
  std::int64_t ld = 0;
};

// dgemm's form of a matrix with these sizes and strides, when it has one (ld >= 1, unit stride
// along one dim, and the other stride past that dim's extent).
bool as_blas(std::int64_t rows, std::int64_t cols, std::int64_t rs, std::int64_t cs, Operand& out) {
  if ((cols == 1 || cs == 1) && (rows == 1 || rs >= std::max<std::int64_t>(cols, 1))) {
    out = {CblasNoTrans, rows == 1 ? std::max<std::int64_t>(cols, 1) : rs};
    return true;
  }
  if ((rows == 1 || rs == 1) && (cols == 1 || cs >= std::max<std::int64_t>(rows, 1))) {
    out = {CblasTrans, cols == 1 ? std::max<std::int64_t>(rows, 1) : cs};
    return true;
  }
  return false;
}

Operand operand_of(const Tensor& t) {
  const std::size_t r = t.shape().size();
  Operand o;
  as_blas(t.shape()[r - 2], t.shape()[r - 1], t.strides()[r - 2], t.strides()[r - 1], o);
  return o;
}

bool fits_blas(const Tensor& t) {
  const std::size_t r = t.shape().size();
  Operand o;
  return as_blas(t.shape()[r - 2], t.shape()[r - 1], t.strides()[r - 2], t.strides()[r - 1], o) && o.ld <= INT_MAX;
}

// t's matrices copied densely, its broadcast batch dims (stride 0) kept broadcast: one copy of
// each distinct matrix, not one per batch entry.
Tensor dense_matrices(const Tensor& t) {
  Shape shape = t.shape(), strides = t.strides();
  for (std::size_t d = 0; d + 2 < shape.size(); ++d)
    if (strides[d] == 0) shape[d] = 1;
  const Tensor dense = copy_of(make_view(t, shape, strides, t.offset(), "matmul"));
  Shape out = dense.strides();
  for (std::size_t d = 0; d + 2 < shape.size(); ++d)
    if (t.strides()[d] == 0) out[d] = 0;
  return make_view(dense, t.shape(), std::move(out), dense.offset(), "matmul");
}

// Element offset of batch entry `f` (row-major over `batch`) for strides broadcast to it.
std::int64_t batch_offset(std::int64_t f, std::span<const std::int64_t> batch, const Dims8& strides) {
  std::int64_t off = 0;
  for (std::size_t d = batch.size(); d-- > 0;) {
    off += (f % batch[d]) * strides[d];
    f /= batch[d];
  }
  return off;
}

struct Product {
  const double *a, *b;
  double* c;
  Operand oa, ob;
  std::int64_t m, n, k;
  std::span<const std::int64_t> batch;
  Dims8 sa, sb, sc;
  std::int64_t count;      // batch entries
  std::int64_t a_row = 0;  // a's stride from one row to the next (for bands)

  // Rows [i0, i1) of batch entry f.
  void rows(std::int64_t f, std::int64_t i0, std::int64_t i1) const {
    const double* pa = a + batch_offset(f, batch, sa) + i0 * a_row;
    double* pc = c + batch_offset(f, batch, sc) + i0 * n;
    cblas_dgemm(CblasRowMajor, oa.trans, ob.trans, static_cast<int>(i1 - i0), static_cast<int>(n), static_cast<int>(k), 1.0, pa,
                static_cast<int>(oa.ld), b + batch_offset(f, batch, sb), static_cast<int>(ob.ld), 0.0, pc, static_cast<int>(n));
  }
  std::int64_t bands() const { return (m + kBandRows - 1) / kBandRows; }
  // Piece i of `pieces`: a range of the (batch entry, band) pairs, each one dgemm call.
  void piece(int i, int pieces) const {
    const std::int64_t units = count * bands();
    for (std::int64_t u = units * i / pieces; u < units * (i + 1) / pieces; ++u) {
      const std::int64_t f = u / bands(), i0 = u % bands() * kBandRows;
      rows(f, i0, std::min(m, i0 + kBandRows));
    }
  }
};

}  // namespace

void matmul_f64_blocked(const Tensor& a, const Tensor& b, const Tensor& c, std::int64_t block) {
  const std::size_t r = c.shape().size();
  const std::span<const std::int64_t> batch(c.shape().data(), r - 2);
  const std::int64_t m = c.shape()[r - 2], n = c.shape()[r - 1], k = a.shape()[r - 1];
  const std::int64_t ar = a.strides()[r - 2], ac = a.strides()[r - 1], br = b.strides()[r - 2], bc = b.strides()[r - 1];
  const Dims8 sa = batch_strides(a, batch), sb = batch_strides(b, batch), sc = batch_strides(c, batch);
  const auto area = static_cast<std::size_t>(block * block);
  std::vector<double> pa(area), pb(area), pc(area);
  const auto* base_a = static_cast<const double*>(a.raw_data());
  const auto* base_b = static_cast<const double*>(b.raw_data());
  auto* base_c = static_cast<double*>(mutable_data(c));
  const std::int64_t count = shape_numel(Shape(batch.begin(), batch.end()));
  for (std::int64_t f = 0; f < count; ++f) {
    const double *fa = base_a + batch_offset(f, batch, sa), *fb = base_b + batch_offset(f, batch, sb);
    double* fc = base_c + batch_offset(f, batch, sc);
    for (std::int64_t i0 = 0; i0 < m; i0 += block)
      for (std::int64_t j0 = 0; j0 < n; j0 += block) {
        const std::int64_t mb = std::min(block, m - i0), nb = std::min(block, n - j0);
        for (std::int64_t k0 = 0; k0 < k; k0 += block) {
          const std::int64_t kb = std::min(block, k - k0);
          for (std::int64_t i = 0; i < mb; ++i)
            for (std::int64_t q = 0; q < kb; ++q) pa[i * kb + q] = fa[(i0 + i) * ar + (k0 + q) * ac];
          for (std::int64_t q = 0; q < kb; ++q)
            for (std::int64_t j = 0; j < nb; ++j) pb[q * nb + j] = fb[(k0 + q) * br + (j0 + j) * bc];
          cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(mb), static_cast<int>(nb), static_cast<int>(kb), 1.0, pa.data(),
                      static_cast<int>(kb), pb.data(), static_cast<int>(nb), k0 == 0 ? 0.0 : 1.0, pc.data(), static_cast<int>(nb));
        }
        for (std::int64_t i = 0; i < mb; ++i) std::copy_n(pc.data() + i * nb, nb, fc + (i0 + i) * n + j0);
      }
  }
}

void matmul_f64(const Tensor& a_in, const Tensor& b_in, const Tensor& c) {
  const ObservedProduct observed;
  one_blas_thread();
  const std::size_t r = c.shape().size();
  const std::int64_t m = c.shape()[r - 2], n = c.shape()[r - 1], k = a_in.shape()[r - 1];
  const std::span<const std::int64_t> batch(c.shape().data(), r - 2);
  if (std::max({m, n, k}) > INT_MAX) return matmul_f64_blocked(a_in, b_in, c, 1024);
  // Copies are dense: their ld is K or N, which fit.
  const Tensor a = fits_blas(a_in) ? a_in : dense_matrices(a_in);
  const Tensor b = fits_blas(b_in) ? b_in : dense_matrices(b_in);
  Product p{static_cast<const double*>(a.raw_data()),
            static_cast<const double*>(b.raw_data()),
            static_cast<double*>(mutable_data(c)),
            operand_of(a),
            operand_of(b),
            m,
            n,
            k,
            batch,
            batch_strides(a, batch),
            batch_strides(b, batch),
            batch_strides(c, batch),
            shape_numel(Shape(batch.begin(), batch.end()))};
  p.a_row = p.oa.trans == CblasNoTrans ? p.oa.ld : 1;
  // As float32 products: by batch entries, else bands of rows; ThreadChoice may keep it on one.
  const double macs = static_cast<double>(c.numel()) * static_cast<double>(k);
  const std::int64_t units = p.count * p.bands();
  const int wanted = static_cast<int>(std::min<std::int64_t>(dnnl_threads_for(macs), units));
  if (wanted <= 1) {
    p.piece(0, 1);
    return;
  }
  std::uint64_t key = mix_key(kKeySeed, 5);  // kinds 1-4 are the float32 and bfloat16 products and gemms
  for (const Tensor* t : {&a, &b, &c}) {
    for (const std::int64_t d : t->shape()) key = mix_key(key, static_cast<std::uint64_t>(d));
    for (const std::int64_t s : t->strides()) key = mix_key(key, static_cast<std::uint64_t>(s));
  }
  const double start = now_seconds();
  struct Job {
    const Product* p;
    int pieces;
  } job{&p, choose_threads(key, wanted, start)};
  const bool pooled = pool_run(job.pieces, job.pieces, [](void* data, int i) noexcept {
    const auto& j = *static_cast<const Job*>(data);
    j.p->piece(i, j.pieces);
  }, &job);
  record_threads(key, pooled ? job.pieces : 1, start);
}

}  // namespace tapegrad::detail
