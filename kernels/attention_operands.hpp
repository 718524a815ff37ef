// Internal: the attention core's operands read as one matrix per batch entry of the scores
// (q, k, v, dO broadcast over the batch), in float32 or, under a bfloat16 matmul precision, as
// bfloat16 copies made once per call. Used by both paths (attention.cpp, attention_tiles.cpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "runtime/parallel.hpp"
#include "autodiff/tensor_impl.hpp"
#include "kernels/attention_products.hpp"
#include "autodiff/loops.hpp"
#include "kernels/matmul_dnnl.hpp"

namespace tapegrad::detail {

// t itself when its matrices have unit column stride and a row stride a gemm accepts, else a
// contiguous copy. Leading dims keep any strides (stride 0 from broadcasting included).
inline Tensor matrix_ready(const Tensor& t) {
  const std::size_t r = t.shape().size();
  const std::int64_t rows = t.shape()[r - 2], cols = t.shape()[r - 1];
  const bool unit = cols <= 1 || t.strides()[r - 1] == 1;
  const bool rows_ok = rows <= 1 || t.strides()[r - 2] >= std::max<std::int64_t>(cols, 1);
  return unit && rows_ok ? t : copy_of(t);
}

inline std::int64_t row_stride(const Tensor& t) {
  const std::size_t r = t.shape().size();
  return t.shape()[r - 2] <= 1 ? std::max<std::int64_t>(t.shape()[r - 1], 1) : t.strides()[r - 2];
}

// Element offsets of each batch entry (row-major over `batch`) for strides already broadcast.
inline std::vector<std::int64_t> batch_offsets(const std::int64_t* strides, const Shape& batch) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(shape_numel(batch)));
  for (std::size_t f = 0; f < out.size(); ++f) {
    std::int64_t rest = static_cast<std::int64_t>(f), off = 0;
    for (std::size_t d = batch.size(); d-- > 0;) {
      off += (rest % batch[d]) * strides[d];
      rest /= batch[d];
    }
    out[f] = off;
  }
  return out;
}

// A [..., R, C] operand read as one matrix per batch entry of the scores.
template <class T> struct Matrices {
  const T* base = nullptr;
  std::vector<std::int64_t> offsets;
  std::int64_t ld = 0;
  Matrices() = default;
  Matrices(const Tensor& t, const Shape& batch) : Matrices(static_cast<const T*>(t.raw_data()), t.shape(), t.strides(), row_stride(t), batch) {}
  // The same for elements at base laid out by shape and strides (of any element type).
  Matrices(const T* data, const Shape& shape, const Shape& tstrides, std::int64_t row_ld, const Shape& batch) : base(data), ld(row_ld) {
    // The leading dims' strides broadcast to `batch` (right-aligned, 0 where t has size 1 or no dim).
    std::vector<std::int64_t> strides(batch.size(), 0);
    const std::size_t lead = shape.size() - 2;
    for (std::size_t d = 0; d < lead; ++d)
      if (shape[d] != 1) strides[batch.size() - lead + d] = tstrides[d];
    offsets = batch_offsets(strides.data(), batch);
  }
  const T* operator[](std::int64_t bh) const { return base + offsets[static_cast<std::size_t>(bh)]; }
};

// Whether t's elements fill one dense block of memory in some order of its dims (q, k and v
// split from a projection into heads are such permutations): that block can then be converted
// in memory order.
inline bool dense_permutation(const Tensor& t) {
  return dense_in_some_order({t.shape().data(), t.shape().size()}, {t.strides().data(), t.strides().size()});
}

// Under a bfloat16 matmul precision, a float32 operand (q, k, v or dO) rounded to bfloat16 once
// per call (each matrix once, however many batch entries share it), with its inf and NaN held
// as 0 and flagged per row (round_bf16_operand): the tile products read these, and put back in
// float32 what a flagged row gives. A dense permutation keeps its strides and is converted in
// memory order (per matrix and row, the runs of a split projection would be short and far
// apart); anything else, or an operand with an inf or NaN, is converted matrix by matrix
// into a contiguous copy.
struct Bf16Matrices {
  std::shared_ptr<Storage> storage;  // the bits, from the cache of freed blocks like a tensor's
  std::vector<unsigned char> bad;    // per row, matrices in order: holds an inf or NaN
  Matrices<std::uint16_t> bits;
  Matrices<unsigned char> flags;
  Bf16Matrices() = default;
  Bf16Matrices(const Tensor& t, const Shape& batch) {
    const Shape& shape = t.shape();
    const std::size_t r = shape.size();
    const std::int64_t rows = shape[r - 2], cols = shape[r - 1], numel = t.numel();
    const std::int64_t count = rows * cols == 0 ? 0 : numel / (rows * cols);  // matrices held
    storage = std::make_shared<Storage>(static_cast<std::size_t>(numel) * sizeof(std::uint16_t));
    bad.assign(static_cast<std::size_t>(count * rows), 0);
    auto* out = reinterpret_cast<std::uint16_t*>(storage->data);
    const float* base = static_cast<const float*>(t.raw_data());
    Shape flag_shape(shape.begin(), shape.end() - 1);
    flag_shape.push_back(1);
    flags = Matrices<unsigned char>(bad.data(), flag_shape, contiguous_strides(flag_shape), 1, batch);
    if (dense_permutation(t)) {
      std::atomic<bool> any{false};
      parallel_for(numel, 2, [&](std::int64_t i0, std::int64_t i1) {
        if (round_bf16_operand(base + i0, 0, 1, i1 - i0, out + i0, nullptr)) any = true;
      });
      if (!any) {
        bits = Matrices<std::uint16_t>(out, shape, t.strides(), row_stride(t), batch);
        return;
      }
    }
    const Shape lead(shape.begin(), shape.end() - 2);
    const std::vector<std::int64_t> src = batch_offsets(t.strides().data(), lead);
    const std::int64_t ld = row_stride(t);
    parallel_for(count, rows * cols, [&](std::int64_t f0, std::int64_t f1) {
      for (std::int64_t f = f0; f < f1; ++f)
        round_bf16_operand(base + src[static_cast<std::size_t>(f)], ld, rows, cols, out + f * rows * cols, bad.data() + f * rows);
    });
    bits = Matrices<std::uint16_t>(out, shape, contiguous_strides(shape), cols, batch);
  }
  const std::uint16_t* operator[](std::int64_t bh) const { return bits[bh]; }
  std::int64_t ld() const { return bits.ld; }
  // Batch entry bh's rows, with f its float32 matrices.
  tiles::RoundedRows rows(const Matrices<float>& f, std::int64_t bh) const { return {bits[bh], bits.ld, f[bh], f.ld, bad_rows(bh)}; }
  bool any_bad() const { return std::any_of(bad.begin(), bad.end(), [](unsigned char b) { return b != 0; }); }
  const unsigned char* bad_rows(std::int64_t bh) const { return flags[bh]; }
};

}  // namespace tapegrad::detail
