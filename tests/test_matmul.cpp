// matmul: float32 (oneDNN) against float64 (OpenBLAS) against a plain triple loop, on
// awkward shapes and layouts; bfloat16 within its documented bound; gradients in float32.
#define BOOST_TEST_MODULE matmul
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>

#include <bit>
#include <thread>

#include "autodiff/tensor_impl.hpp"
#include "kernels/matmul_dnnl.hpp"
#include "kernels/matmul_f64.hpp"
#include "kernels/matmul_rows.hpp"
#include "kernels/product.hpp"
#include "kernels/rounded_copy.hpp"
#include "reference.hpp"
#include "support.hpp"

namespace tg = tapegrad;
namespace bdata = boost::unit_test::data;
using namespace tg_test;
using tg::Shape;
using tg::Tensor;

namespace {

struct Case {
  std::string name;
  Shape a, b;
  bool transpose_a = false, transpose_b = false;  // operand given as a transposed view
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

std::vector<Case> cases() {
  return {
      {"1x1", {1, 1}, {1, 1}},
      {"1xN", {1, 17}, {17, 5}},
      {"Nx1", {9, 3}, {3, 1}},
      {"primes", {7, 13}, {13, 11}},
      {"primes, both transposed", {31, 17}, {17, 29}, true, true},
      {"a transposed", {16, 8}, {8, 12}, true, false},
      {"b transposed", {5, 64}, {64, 33}, false, true},
      {"batched", {3, 5, 7}, {3, 7, 4}},
      {"broadcast batch", {2, 1, 5, 7}, {3, 7, 4}},
      {"rank 2 times rank 4", {5, 6}, {2, 3, 6, 2}, false, true},
      {"attention-like", {2, 4, 16, 8}, {2, 4, 8, 16}, false, true},
      {"rank 13 (past oneDNN's limit)", {2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 4}, {2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 5, 4, 2}, false, true},
      {"256 square", {256, 256}, {256, 256}},
      // One row per matrix: the plain loops of kernels/matmul_rows.cpp, both of their forms.
      {"one row, batched, b transposed", {3, 1, 20}, {3, 20, 7}, false, true},
      {"one row, broadcast batch", {2, 1, 1, 9}, {4, 9, 33}},
      // Several rows in the plain loops: 16 columns, then 8, then 3 one by one; b transposed is
      // first copied into rows, a transposed is read with its stride.
      {"rows, plain loops", {6, 9}, {9, 27}},
      {"rows, plain loops, b transposed", {6, 9}, {9, 27}, false, true},
      {"rows, plain loops, a transposed", {6, 9}, {9, 27}, true, false},
  };
}

// The operand with the case's layout: a transposed view of a contiguous tensor, same values.
Tensor operand(const Shape& shape, bool transposed, std::uint64_t seed, tg::DType dtype) {
  Tensor x = tg::randn(shape, seed, tg::float64).to(dtype);
  if (!transposed) return x;
  return tg::transpose(tg::contiguous(tg::transpose(x, -1, -2)), -1, -2);
}

}  // namespace

BOOST_DATA_TEST_CASE(float32_and_float64_agree_with_a_triple_loop, bdata::make(cases()), c) {
  const Tensor a64 = operand(c.a, c.transpose_a, 1, tg::float64), b64 = operand(c.b, c.transpose_b, 2, tg::float64);
  const Tensor a32 = operand(c.a, c.transpose_a, 1, tg::float32), b32 = operand(c.b, c.transpose_b, 2, tg::float32);
  if (c.transpose_a) BOOST_TEST(!a32.is_contiguous());
  const Ref expected = ref_matmul(Ref::of(a64), Ref::of(b64));
  const Tensor c64 = tg::matmul(a64, b64);
  BOOST_TEST(c64.shape() == expected.shape);
  check_close(c64.to_vector<double>(), expected.v, 1e-12, 1e-12, "float64");
  const Tensor c32 = tg::matmul(a32, b32);
  BOOST_TEST(c32.dtype() == tg::float32);
  const double k = static_cast<double>(c.a.back());
  check_close(c32.to_vector<double>(), expected.v, 1e-6 * std::sqrt(k) * 4, 1e-5, "float32");
}

BOOST_AUTO_TEST_CASE(strided_and_expanded_operands) {
  const Tensor base = tg::randn({6, 10}, 3, tg::float64);
  const Tensor a = tg::slice(base, 1, 0, 10, 2);  // [6, 5], inner stride 2: copied for oneDNN
  const Tensor b = tg::expand(tg::randn({1, 5, 3}, 4, tg::float64), {4, 5, 3});  // stride-0 batch
  const Ref expected = ref_matmul(Ref::of(a), Ref::of(b));
  check_close(tg::matmul(a, b).to_vector<double>(), expected.v, 1e-12, 1e-12, "float64");
  check_close(tg::matmul(a.to(tg::float32), tg::expand(tg::randn({1, 5, 3}, 4, tg::float64).to(tg::float32), {4, 5, 3})).to_vector<double>(),
              expected.v, 1e-5, 1e-5, "float32");
  // Both operands expanded along the same batch dim.
  const Tensor ea = tg::expand(tg::unsqueeze(a, 0), {3, 6, 5});
  const Tensor eb = tg::expand(tg::randn({1, 5, 2}, 5, tg::float64), {3, 5, 2});
  check_close(tg::matmul(ea, eb).to_vector<double>(), ref_matmul(Ref::of(ea), Ref::of(eb)).v, 1e-12, 1e-12, "both expanded");
  const Tensor ea32 = tg::expand(tg::unsqueeze(a.to(tg::float32), 0), {3, 6, 5});
  const Tensor eb32 = tg::expand(tg::randn({1, 5, 2}, 5, tg::float64).to(tg::float32), {3, 5, 2});
  BOOST_TEST((ea32.strides()[0] == 0 && eb32.strides()[0] == 0));
  check_close(tg::matmul(ea32, eb32).to_vector<double>(), ref_matmul(Ref::of(ea), Ref::of(eb)).v, 1e-5, 1e-5,
              "both expanded, float32");
}

BOOST_AUTO_TEST_CASE(a_contiguous_operand_after_an_expanded_one_of_the_same_layout) {
  // Found by fuzz/fuzz_layer.cpp. oneDNN sees the expanded a [2, 2, 2] (batch stride 0) as
  // [1, 2, 2] and, with b [2, 2, 1], runs it on its reference loop, so tapegrad notes the layout
  // as slow and copies a. The contiguous a [1, 2, 2] that follows is described the same way; its
  // "copy" changed nothing and the call recursed until the stack overflowed.
  const Tensor small = tg::randn({1, 2, 2}, 6, tg::float64), b = tg::randn({2, 2, 1}, 7, tg::float64);
  const Tensor expanded = tg::expand(small, {2, 2, 2});
  check_close(tg::matmul(tg::expand(small.to(tg::float32), {2, 2, 2}), b.to(tg::float32)).to_vector<double>(),
              ref_matmul(Ref::of(expanded), Ref::of(b)).v, 1e-5, 1e-5, "expanded a");
  check_close(tg::matmul(small.to(tg::float32), b.to(tg::float32)).to_vector<double>(), ref_matmul(Ref::of(small), Ref::of(b)).v, 1e-5,
              1e-5, "contiguous a, the same layout");
}

BOOST_AUTO_TEST_CASE(interleaved_batches) {
  // Found by fuzz/fuzz_shapes.cpp: rows 0 and 3 of every [4, 1] matrix of a [4, 4, 4, 1] tensor
  // have strides [16, 4, 3, 1]. Each matrix spans 6 elements but a new one starts every 4:
  // oneDNN refuses such strides, and its dnnl::error escaped from matmul. They are copied now.
  const Tensor base = tg::randn({4, 4, 4, 1}, 8, tg::float64), b = tg::randn({1, 3}, 9, tg::float64);
  const Tensor a = tg::slice(base, 2, 0, 4, 3);
  BOOST_TEST(a.strides() == (Shape{16, 4, 3, 1}));
  const Ref expected = ref_matmul(Ref::of(a), Ref::of(b));
  check_close(tg::matmul(tg::slice(base.to(tg::float32), 2, 0, 4, 3), b.to(tg::float32)).to_vector<double>(), expected.v, 1e-5, 1e-5,
              "float32");
  check_close(tg::matmul(tg::transpose(b, 0, 1).to(tg::float32), tg::transpose(tg::slice(base.to(tg::float32), 2, 0, 4, 3), -1, -2))
                  .to_vector<double>(),
              ref_matmul(Ref::of(tg::transpose(b, 0, 1)), Ref::of(tg::transpose(a, -1, -2))).v, 1e-5, 1e-5, "as b, transposed");
}

BOOST_AUTO_TEST_CASE(one_row_with_any_strides) {
  // A row read with a stride (a column of a taller matrix), and a b with neither unit stride.
  const Tensor base_a = tg::randn({13, 3}, 10, tg::float64), base_b = tg::randn({2, 13, 6, 2}, 11, tg::float64);
  auto a_of = [](const Tensor& base) { return tg::expand(tg::slice(tg::transpose(base, 0, 1), 0, 1, 2), {2, 1, 13}); };
  auto b_of = [](const Tensor& base) { return tg::select(base, 3, 1); };  // strides [156, 12, 2]
  const Ref expected = ref_matmul(Ref::of(a_of(base_a)), Ref::of(b_of(base_b)));
  const Tensor got = tg::matmul(a_of(base_a.to(tg::float32)), b_of(base_b.to(tg::float32)));
  BOOST_TEST(got.shape() == (Shape{2, 1, 6}));
  check_close(got.to_vector<double>(), expected.v, 1e-5, 1e-5, "strided row and matrix");
  // With b's columns contiguous and a's row strided, the row is gathered first.
  const Tensor bt = tg::transpose(tg::randn({2, 6, 13}, 12, tg::float64), -1, -2);
  check_close(tg::matmul(a_of(base_a.to(tg::float32)), bt.to(tg::float32)).to_vector<double>(),
              ref_matmul(Ref::of(a_of(base_a)), Ref::of(bt)).v, 1e-5, 1e-5, "strided row, transposed b");
}

BOOST_AUTO_TEST_CASE(a_hot_primitive_survives_churn) {
  // The primitive cache keeps what is used: a layout used every 16 calls stays while more than
  // the cache's capacity of one-off layouts (a new N each, as decoding makes) passes through.
  // The cache this replaced dropped everything when full and re-created the hot layout.
  using tg::detail::dnnl_primitives_created;
  using tg::detail::kDnnlCacheCapacity;
  // Every product here is large enough for oneDNN (tiny ones run as plain loops).
  const Tensor hot_a = tg::randn({16, 32}, 13), hot_b = tg::randn({32, 16}, 14);
  const Tensor hot = tg::matmul(hot_a, hot_b);
  const std::int64_t before = dnnl_primitives_created();
  const auto churn = static_cast<std::int64_t>(kDnnlCacheCapacity) + 100;
  // Four rows: oneDNN, not the loops; too few multiply-adds to be cut into panels of columns.
  const Tensor a = tg::randn({4, 768}, 15);
  for (std::int64_t i = 0; i < churn; ++i) {
    tg::matmul(a, tg::zeros({768, 2 + i}));
    if (i % 16 == 0) BOOST_TEST(tg::matmul(hot_a, hot_b).to_vector<float>() == hot.to_vector<float>());
  }
  BOOST_TEST(dnnl_primitives_created() - before == churn);  // each one-off once, the hot one never
  // Bounded all the same: the first one-offs were dropped, and come back as new primitives.
  tg::matmul(a, tg::zeros({768, 2}));
  BOOST_TEST(dnnl_primitives_created() - before == churn + 1);
  tg::matmul(hot_a, hot_b);
  BOOST_TEST(dnnl_primitives_created() - before == churn + 1);
}

BOOST_AUTO_TEST_CASE(empty_dims) {
  BOOST_TEST(tg::matmul(tg::zeros({0, 3}), tg::zeros({3, 4})).shape() == (Shape{0, 4}));
  const Tensor k0 = tg::matmul(tg::zeros({2, 0}), tg::zeros({0, 3}));
  BOOST_TEST(k0.to_vector<double>() == std::vector<double>(6, 0.0));
}

// bfloat16 keeps 8 significant bits: rounding a and b each costs at most 2^-9 relative, so
// |c_bf16 - c| <= (2^-8 + 2^-16) (|a| |b|) elementwise, plus float32 accumulation.
BOOST_AUTO_TEST_CASE(bfloat16_within_its_rounding_bound) {
  BOOST_TEST_MESSAGE("bfloat16 native on this CPU: " << tg::bfloat16_native());
  for (const Shape& sa : {Shape{64, 96}, Shape{3, 17, 40}}) {
    const Shape sb = sa.size() == 2 ? Shape{96, 48} : Shape{3, 40, 9};
    const Tensor a = tg::randn(sa, 7, tg::float32), b = tg::randn(sb, 8, tg::float32);
    const auto got = tg::matmul(a, b, tg::MatmulPrecision::bfloat16).to_vector<double>();
    const auto exact = ref_matmul(Ref::of(a), Ref::of(b)).v;
    const auto bound = ref_matmul(Ref::of(tg::sqrt(a * a)), Ref::of(tg::sqrt(b * b))).v;
    double worst_ratio = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double allowed = (std::ldexp(1.0, -8) + std::ldexp(1.0, -16)) * bound[i] + 1e-5;
      BOOST_TEST(std::abs(got[i] - exact[i]) <= allowed);
      worst_ratio = std::max(worst_ratio, std::abs(got[i] - exact[i]) / allowed);
    }
    BOOST_TEST(worst_ratio > 0.0);  // it really rounded
  }
}

// Without a bfloat16 dot product (AVX2, or AVX-512 without BF16: ctest also runs this under
// ONEDNN_MAX_CPU_ISA=AVX512_CORE) a bfloat16 product is the float32 product of the rounded
// operands, bit for bit. oneDNN's own bfloat16 gemm there was 3-5x slower than float32, and its
// batch pieces changed bits with the thread count.
BOOST_AUTO_TEST_CASE(bfloat16_emulated_is_float32_on_rounded_operands) {
  BOOST_TEST_MESSAGE("bfloat16 native on this CPU: " << tg::bfloat16_native());
  if (tg::bfloat16_native()) return;
  const auto rounded = [](const Tensor& x) {
    const auto v = x.contiguous().to_vector<float>();
    std::vector<std::uint16_t> bits(v.size());
    tg::detail::round_bf16(v.data(), bits.data(), static_cast<std::int64_t>(v.size()));
    std::vector<float> r(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) r[i] = std::bit_cast<float>(static_cast<std::uint32_t>(bits[i]) << 16);
    return tg::from_vector(r, x.shape());
  };
  // Operands transposed as stored (kept so: the float32 kernel depends on the layout), a batch
  // large enough to be cut into pieces, a strided operand (rounded into a contiguous copy), a
  // weight broadcast over the batch, and products small enough for the plain loops.
  const Tensor a = tg::randn({3, 129, 1001}, 1), b = tg::randn({3, 129, 257}, 2);
  const Tensor w = tg::randn({300, 129}, 3), x = tg::randn({2, 70, 258}, 4);
  const Tensor s = tg::randn({64, 8}, 5), r = tg::randn({1, 512}, 6), v = tg::randn({512, 1024}, 7);
  const auto t = [](const Tensor& m) { return m.transpose(-2, -1); };
  const auto half = [](const Tensor& m) { return tg::narrow(m, 2, 0, 129); };
  const std::pair<Tensor, Tensor> products[][2] = {{{t(a), b}, {t(rounded(a)), rounded(b)}},
                                                   {{half(x), t(w)}, {rounded(half(x)), t(rounded(w))}},
                                                   {{t(s), s}, {t(rounded(s)), rounded(s)}},
                                                   {{r, v}, {rounded(r), rounded(v)}}};
  for (const auto& [operands, reference] : products) {
    const auto got = tg::matmul(operands.first, operands.second, tg::MatmulPrecision::bfloat16).to_vector<float>();
    const auto want = tg::matmul(reference.first, reference.second).to_vector<float>();
    BOOST_TEST(got == want, boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(gradients_in_float32_match_float64) {
  auto grads = [](tg::DType dtype, tg::MatmulPrecision p) {
    Tensor a = tg::randn({2, 5, 7}, 11, tg::float64).to(dtype).detach().set_requires_grad();
    Tensor b = tg::randn({7, 3}, 12, tg::float64).to(dtype).detach().set_requires_grad();
    tg::backward(tg::sum(tg::tanh(tg::matmul(a, b, p))));
    auto out = std::make_pair(a.grad().to_vector<double>(), b.grad().to_vector<double>());
    tg::clear_tape();
    return out;
  };
  const auto g64 = grads(tg::float64, tg::MatmulPrecision::exact);
  const auto g32 = grads(tg::float32, tg::MatmulPrecision::exact);
  check_close(g32.first, g64.first, 1e-5, 1e-4, "da");
  check_close(g32.second, g64.second, 1e-5, 1e-4, "db");
  const auto g16 = grads(tg::float32, tg::MatmulPrecision::bfloat16);
  check_close(g16.first, g64.first, 0.05, 0.02, "da bf16");
  check_close(g16.second, g64.second, 0.05, 0.02, "db bf16");
}

// Large contiguous operands take the threaded conversion; a NaN stays a NaN through rounding.
BOOST_AUTO_TEST_CASE(bfloat16_large_operands_on_two_threads) {
  const int saved = tg::num_threads();
  tg::set_num_threads(2);
  Tensor a = tg::randn({300, 260}, 21, tg::float32);
  const Tensor b = tg::randn({260, 200}, 22, tg::float32);
  const auto got = tg::matmul(a, b, tg::MatmulPrecision::bfloat16).to_vector<double>();
  const auto exact = ref_matmul(Ref::of(a), Ref::of(b)).v;
  const auto bound = ref_matmul(Ref::of(tg::sqrt(a * a)), Ref::of(tg::sqrt(b * b))).v;
  for (std::size_t i = 0; i < got.size(); ++i)
    BOOST_REQUIRE(std::abs(got[i] - exact[i]) <= (std::ldexp(1.0, -8) + std::ldexp(1.0, -16)) * bound[i] + 1e-4);
  a.data<float>()[5 * 260 + 3] = std::numeric_limits<float>::quiet_NaN();
  const Tensor c = tg::matmul(a, b, tg::MatmulPrecision::bfloat16);
  BOOST_TEST(std::isnan(c.to_vector<double>()[5 * 200 + 7]));
  BOOST_TEST(std::isfinite(c.to_vector<double>()[4 * 200 + 7]));
  tg::set_num_threads(saved);
}

bool same(const Tensor& x, const Tensor& y) { return x.shape() == y.shape() && x.to_vector<double>() == y.to_vector<double>(); }

// The thread's matmul precision reaches products that name none (the layers'), is restored by
// the guard, leaves float64 exact, and a recorded product's backward keeps its forward's.
BOOST_AUTO_TEST_CASE(matmul_precision_guard) {
  const Tensor a = tg::randn({2, 5, 7}, 11), b = tg::randn({7, 3}, 12);
  BOOST_TEST((tg::matmul_precision() == tg::MatmulPrecision::exact));
  auto grads = [&](auto&& product) {
    Tensor ga = a.detach().set_requires_grad(), gb = b.detach().set_requires_grad();
    const Tensor y = tg::sum(tg::tanh(product(ga, gb)));
    return std::make_pair(y, std::vector<Tensor>{ga, gb});
  };
  auto [y_explicit, leaves_explicit] = grads([](const Tensor& x, const Tensor& w) { return tg::matmul(x, w, tg::MatmulPrecision::bfloat16); });
  tg::backward(y_explicit);
  std::pair<Tensor, std::vector<Tensor>> guarded;
  {
    tg::MatmulPrecisionGuard bf16(tg::MatmulPrecision::bfloat16);
    BOOST_TEST((tg::matmul_precision() == tg::MatmulPrecision::bfloat16));
    guarded = grads([](const Tensor& x, const Tensor& w) { return tg::matmul(x, w); });
    const Tensor a64 = a.to(tg::float64), b64 = b.to(tg::float64);
    BOOST_TEST(same(tg::matmul(a64, b64), tg::matmul(a64, b64, tg::MatmulPrecision::exact)));
    const tg::Linear layer({.in = 7, .out = 3, .seed = 4});
    BOOST_TEST(same(layer.forward(a), tg::matmul(a, layer.weight, tg::MatmulPrecision::bfloat16) + layer.bias));
  }
  BOOST_TEST((tg::matmul_precision() == tg::MatmulPrecision::exact));
  tg::backward(guarded.first);  // outside the guard: still the bfloat16 backward
  BOOST_TEST(same(guarded.first, y_explicit));
  for (int i = 0; i < 2; ++i) BOOST_TEST(same(guarded.second[i].grad(), leaves_explicit[i].grad()));
  BOOST_TEST(!same(tg::matmul(a, b), tg::matmul(a, b, tg::MatmulPrecision::bfloat16)));
  // set_matmul_precision itself, which the guard wraps: per thread.
  tg::set_matmul_precision(tg::MatmulPrecision::bfloat16);
  BOOST_TEST(same(tg::matmul(a, b), tg::matmul(a, b, tg::MatmulPrecision::bfloat16)));
  tg::MatmulPrecision other_thread = tg::MatmulPrecision::bfloat16;
  std::thread([&] { other_thread = tg::matmul_precision(); }).join();
  BOOST_TEST((other_thread == tg::MatmulPrecision::exact));
  tg::set_matmul_precision(tg::MatmulPrecision::exact);
  BOOST_TEST((tg::matmul_precision() == tg::MatmulPrecision::exact));
}

// A weight's bfloat16 copy (kept beside a leaf that requires grad, for every bfloat16 product
// that reads it) gives the bits of rounding afresh, as it is read plain or transposed, and after
// each kind of write: in-place ops, data<T>(), Adam's update (which rewrites the copy in its
// pass while products read it, and leaves it to the next reader otherwise); it lives as long as
// the weight. `plain` is the same values in a tensor that is no
// leaf requiring grad, so its products round every time.
BOOST_AUTO_TEST_CASE(a_weights_bfloat16_copy_gives_fresh_rounding_bits_after_every_write) {
  const auto bf16 = tg::MatmulPrecision::bfloat16;
  const std::int64_t copies_before = tg::detail::rounded_copies();
  {
    Tensor w = tg::randn({96, 80}, 31, tg::float32).detach().set_requires_grad();
    const Tensor x = tg::randn({40, 96}, 32, tg::float32), g = tg::randn({40, 80}, 33, tg::float32);
    auto check = [&](const char* when) {
      BOOST_TEST_CONTEXT(when) {
        const Tensor plain = tg::clone(w.detach());
        BOOST_TEST(same(tg::matmul(x, w, bf16), tg::matmul(x, plain, bf16)));
        BOOST_TEST(same(tg::matmul(g, w.detach().transpose(0, 1), bf16), tg::matmul(g, plain.transpose(0, 1), bf16)));
        BOOST_TEST(same(tg::matmul(tg::narrow(w.detach(), 0, 16, 40).transpose(0, 1), tg::narrow(x, 1, 0, 40), bf16),
                        tg::matmul(tg::narrow(plain, 0, 16, 40).transpose(0, 1), tg::narrow(x, 1, 0, 40), bf16)));
      }
    };
    check("new");
    BOOST_TEST(tg::detail::rounded_copies() == copies_before + (tg::bfloat16_native() ? 1 : 0));
    {
      const tg::NoGradGuard no_grad;
      tg::mul_(w, 1.001);
      check("after mul_");
      tg::copy_(tg::narrow(w, 1, 3, 2), tg::full({96, 2}, 7.0));
      check("after copy_ into a view");
    }
    w.data<float>()[17] = 2.5f;
    check("after data<float>()");
    tg::AdamW opt({{"w", w}}, {.lr = 0.01});
    for (int step = 0; step < 3; ++step) {
      tg::backward(tg::sum(tg::tanh(tg::matmul(x, w, bf16))));
      opt.step();
      opt.zero_grad();
      check("after an AdamW step");
    }
    // Steps with float32 products only: the update leaves the unread copy stale; the next
    // bfloat16 product rounds afresh.
    for (int step = 0; step < 2; ++step) {
      tg::backward(tg::sum(tg::tanh(tg::matmul(x, w))));
      opt.step();
      opt.zero_grad();
    }
    check("after float32 steps");
  }
  BOOST_TEST(tg::detail::rounded_copies() == copies_before);  // freed with the weight
}

// Two threads whose first bfloat16 product reads the same new weight: one copy, both results
// the fresh rounding's bits.
BOOST_AUTO_TEST_CASE(a_weights_bfloat16_copy_made_by_two_threads_at_once) {
  const auto bf16 = tg::MatmulPrecision::bfloat16;
  for (int round = 0; round < 20; ++round) {
    const Tensor w = tg::randn({128, 64}, 40 + round, tg::float32).detach().set_requires_grad();
    const Tensor x = tg::randn({32, 128}, 60 + round, tg::float32);
    const Tensor expected = tg::matmul(x, tg::clone(w.detach()), bf16);
    Tensor got[2];
    std::thread other([&] { got[1] = tg::matmul(x, w, bf16); });
    got[0] = tg::matmul(x, w, bf16);
    other.join();
    BOOST_TEST(same(got[0], expected));
    BOOST_TEST(same(got[1], expected));
  }
}

// A storage that already holds another kind of derived data gets no copy: its bfloat16 products
// round afresh, with the same bits, and the other data is left in place.
BOOST_AUTO_TEST_CASE(another_kind_of_derived_data_leaves_products_rounding_afresh) {
  struct Other final : tg::detail::Storage::Derived {};
  const auto bf16 = tg::MatmulPrecision::bfloat16;
  const Tensor w = tg::randn({64, 48}, 70, tg::float32).detach().set_requires_grad();
  const Tensor x = tg::randn({16, 64}, 71, tg::float32);
  auto* other = new Other;
  w.impl()->storage->derived.store(other);  // freed with the storage
  const std::int64_t copies_before = tg::detail::rounded_copies();
  BOOST_TEST(same(tg::matmul(x, w, bf16), tg::matmul(x, tg::clone(w.detach()), bf16)));
  BOOST_TEST(tg::detail::rounded_copies() == copies_before);
  BOOST_TEST(w.impl()->storage->derived.load() == other);
}

// An update rewrites a copy only while products read it: once per read, so a bfloat16
// evaluation followed by float32 training stops paying for the copy after one update.
BOOST_AUTO_TEST_CASE(an_update_rewrites_a_copy_only_after_a_product_read_it) {
  const Tensor w = tg::randn({32, 16}, 80, tg::float32).detach().set_requires_grad();
  BOOST_TEST(tg::detail::rounded_copy_to_write(w) == nullptr);  // no copy yet
  BOOST_TEST_REQUIRE(tg::detail::rounded_copy(w) != nullptr);   // a product reads it
  BOOST_TEST(tg::detail::rounded_copy_to_write(w) != nullptr);
  tg::detail::rounded_copy_written(w);
  BOOST_TEST(tg::detail::rounded_copy_to_write(w) == nullptr);  // not read since
  tg::detail::rounded_copy(w);
  BOOST_TEST(tg::detail::rounded_copy_to_write(w) != nullptr);
}

// float64 products past dgemm's int sizes go through blocks packed from any strides; the same
// code on small blocks (3) and odd shapes, transposed and broadcast operands, against the plain
// product.
BOOST_AUTO_TEST_CASE(float64_blocks_for_sizes_past_int) {
  const Tensor a = tg::randn({2, 11, 7}, 1, tg::float64).transpose(1, 2);                       // [2, 7, 11], strided
  const Tensor b = tg::expand(tg::randn({1, 11, 5}, 2, tg::float64), {2, 11, 5});                 // batch broadcast
  const Tensor c = tg::zeros({2, 7, 5}, tg::float64);
  tg::detail::matmul_f64_blocked(a, b, c, 3);
  const auto want = tg::matmul(a, b).to_vector<double>(), got = c.to_vector<double>();
  for (std::size_t i = 0; i < want.size(); ++i) BOOST_TEST(got[i] == want[i], boost::test_tools::tolerance(1e-12));
}

// A float64 operand that dgemm cannot read in place (here a column broadcast along K) is copied
// once per distinct matrix: its broadcast batch dim stays broadcast (a copy per batch entry
// took 128 MiB for this product).
BOOST_AUTO_TEST_CASE(float64_copies_keep_broadcast_batch_dims) {
  const Tensor a = tg::expand(tg::randn({1, 256, 1}, 1, tg::float64), {256, 256, 256});
  const Tensor b = tg::randn({256, 256, 8}, 2, tg::float64);
  tg::reset_peak_memory();
  const std::int64_t before = tg::memory_stats().current_bytes;
  const Tensor c = tg::matmul(a, b);
  const std::int64_t extra = tg::memory_stats().peak_bytes - before, result = c.numel() * 8;
  BOOST_TEST(extra <= result + (1 << 20), "held " << extra << " bytes for a result of " << result);
  const auto want = tg::matmul(tg::clone(a), b).to_vector<double>(), got = c.to_vector<double>();
  BOOST_TEST(got == want, boost::test_tools::per_element());
}
