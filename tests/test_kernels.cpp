// The elementwise and reduction kernels' fast paths: results on two threads equal the serial
// results bit for bit (large tensors take the parallel split, which the op table's small
// tensors never reach; ctest runs with OMP_NUM_THREADS=1, so the suite sets the threads
// itself), and float32 exp, tanh and GELU stay within their documented error of a float64
// reference, and the finiteness scan that guards attention's weighted products finds every
// non-finite element whatever the layout.
#define BOOST_TEST_MODULE kernels
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>
#include <vector>

#include <tapegrad/tapegrad.hpp>

#include "kernels/gelu_f32.hpp"
#include "kernels/weighted_matmul.hpp"

namespace tg = tapegrad;
using tg::Tensor;

namespace {

struct Threads {
  int saved = tg::num_threads();
  explicit Threads(int n) { tg::set_num_threads(n); }
  ~Threads() { tg::set_num_threads(saved); }
};

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor ca = tg::clone(a), cb = tg::clone(b);
  if (ca.shape() != cb.shape() || ca.dtype() != cb.dtype()) return false;
  const std::size_t bytes = static_cast<std::size_t>(ca.numel()) * (ca.dtype() == tg::float64 ? 8 : ca.dtype() == tg::float32 ? 4 : 1);
  return std::memcmp(ca.raw_data(), cb.raw_data(), bytes) == 0;
}

// The op's output and its inputs' gradients (upstream gradient: a fixed pattern of its shape).
std::vector<Tensor> run(const std::function<Tensor(const std::vector<Tensor>&)>& op, std::vector<Tensor> inputs) {
  for (auto& t : inputs) t = tg::clone(t).detach().set_requires_grad();
  const Tensor y = op(inputs);
  tg::Generator gen(3);
  const Tensor g = tg::randn(y.shape(), gen, y.dtype());
  tg::backward({y}, {g});
  std::vector<Tensor> out{y.detach()};
  for (auto& t : inputs) out.push_back(t.grad());
  tg::clear_tape();
  return out;
}

void check_parallel_equals_serial(const char* what, const std::function<Tensor(const std::vector<Tensor>&)>& op,
                                  const std::vector<Tensor>& inputs) {
  std::vector<Tensor> serial, parallel;
  {
    Threads t(1);
    serial = run(op, inputs);
  }
  {
    Threads t(2);
    parallel = run(op, inputs);
  }
  BOOST_TEST_CONTEXT(what) {
    BOOST_REQUIRE_EQUAL(serial.size(), parallel.size());
    for (std::size_t i = 0; i < serial.size(); ++i) BOOST_TEST(same_bits(serial[i], parallel[i]), "result " << i);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(parallel_results_equal_serial_results) {
  for (tg::DType dtype : {tg::float32, tg::float64}) {
    tg::Generator gen(11);
    // 301 x 517 (155,617 elements): above the parallel grain, odd sizes so that chunks end
    // part-way through rows and vector loops have remainders.
    const Tensor a = tg::randn({301, 517}, gen, dtype), b = tg::randn({301, 517}, gen, dtype);
    const Tensor row = tg::randn({517}, gen, dtype), col = tg::randn({301, 1}, gen, dtype);
    const Tensor at = tg::transpose(tg::randn({517, 301}, gen, dtype), 0, 1);  // strided
    const Tensor cond = tg::gt(tg::randn({301, 517}, gen), tg::zeros({}));
    using V = std::vector<Tensor>;
    check_parallel_equals_serial("add", [](const V& v) { return tg::add(v[0], v[1]); }, {a, b});
    check_parallel_equals_serial("add row", [](const V& v) { return tg::add(v[0], v[1]); }, {a, row});
    check_parallel_equals_serial("sub column", [](const V& v) { return tg::sub(v[0], v[1]); }, {a, col});
    check_parallel_equals_serial("mul strided", [](const V& v) { return tg::mul(v[0], v[1]); }, {at, b});
    check_parallel_equals_serial("div", [](const V& v) { return tg::div(v[0], v[1]); }, {a, tg::exp(b)});
    for (const auto& [name, f] : std::vector<std::pair<const char*, Tensor (*)(const Tensor&)>>{
             {"relu", tg::relu}, {"gelu", tg::gelu}, {"exp", tg::exp}, {"tanh", tg::tanh}, {"neg", tg::neg},
             {"sigmoid", tg::sigmoid}, {"silu", tg::silu}, {"rms_norm", [](const Tensor& x) { return tg::rms_norm(x); }}}) {
      check_parallel_equals_serial(name, [f = f](const V& v) { return f(v[0]); }, {a});
      check_parallel_equals_serial(name, [f = f](const V& v) { return f(v[0]); }, {at});
    }
    check_parallel_equals_serial("where", [cond](const V& v) { return tg::where(cond, v[0], v[1]); }, {a, row});
    for (const tg::Dims& dims : std::vector<tg::Dims>{{-1}, {0}, {}}) {
      check_parallel_equals_serial("sum", [dims](const V& v) { return tg::sum(v[0], dims); }, {a});
      check_parallel_equals_serial("sum strided", [dims](const V& v) { return tg::sum(v[0], dims); }, {at});
      check_parallel_equals_serial("mean", [dims](const V& v) { return tg::mean(v[0], dims); }, {a});
      check_parallel_equals_serial("max", [dims](const V& v) { return tg::max(v[0], dims); }, {a});
    }
    // Threads take max over a leading dim in blocks of rows: ties (shared gradients), signed
    // zeros and NaN must come out as the one-thread fold gives them (the first of equal values,
    // the first NaN).
    std::vector<double> pattern(301 * 517);
    for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<double>((i * 7919) % 13) - 6.0;
    for (std::size_t r = 0; r < 301; ++r) pattern[r * 517 + 11] = r % 2 == 1 ? 0.0 : -0.0;
    pattern[200 * 517 + 7] = std::numeric_limits<double>::quiet_NaN();
    const Tensor tied = tg::to(tg::from_vector(std::span<const double>(pattern), {301, 517}), dtype);
    check_parallel_equals_serial("max over dim 0, ties", [](const V& v) { return tg::max(v[0], {0}); }, {tied});
    // Unrecorded kernels: comparisons and conversions.
    std::vector<Tensor> serial, parallel;
    for (int threads : {1, 2}) {
      Threads t(threads);
      auto& out = threads == 1 ? serial : parallel;
      out = {tg::lt(a, row), tg::eq(at, at), tg::to(a, dtype == tg::float32 ? tg::float64 : tg::float32), tg::to(cond, dtype)};
    }
    for (std::size_t i = 0; i < serial.size(); ++i) BOOST_TEST(same_bits(serial[i], parallel[i]), "unrecorded kernel " << i);
  }
}

namespace {

// Every 97th float32 in [-limit, limit] plus the ends and zero: about 4 million points, which
// covers every binade the functions treat differently.
std::vector<float> sample(float limit) {
  std::vector<float> xs{0.0f, -0.0f, limit, -limit};
  for (std::uint32_t bits = 0; bits < 0x7f800000u; bits += 97) {
    float x;
    std::memcpy(&x, &bits, sizeof x);
    if (x > limit) break;
    xs.push_back(x);
    xs.push_back(-x);
  }
  return xs;
}

Tensor tensor_of(const std::vector<float>& xs) { return tg::from_vector(std::span<const float>(xs), {static_cast<std::int64_t>(xs.size())}); }

double ulps(float got, double want) {
  const double unit = std::ldexp(1.0, std::ilogb(std::max(std::fabs(want), static_cast<double>(std::numeric_limits<float>::min()))) - 23);
  return std::fabs(static_cast<double>(got) - want) / unit;
}

}  // namespace

BOOST_AUTO_TEST_CASE(float32_exp_and_tanh_within_a_few_ulp) {
  const std::vector<float> xs = sample(88.0f);
  const Tensor x = tensor_of(xs);
  const Tensor e = tg::exp(x), t = tg::tanh(x);
  double worst_exp = 0, worst_tanh = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    worst_exp = std::max(worst_exp, ulps(e.data<float>()[i], std::exp(static_cast<double>(xs[i]))));
    worst_tanh = std::max(worst_tanh, ulps(t.data<float>()[i], std::tanh(static_cast<double>(xs[i]))));
  }
  BOOST_TEST(worst_exp <= 2.0);
  BOOST_TEST(worst_tanh <= 3.0);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor s = tensor_of({inf, -inf, nan, 89.0f, -104.0f, 1e-30f});
  const Tensor es = tg::exp(s), ts = tg::tanh(s);
  BOOST_TEST(es.data<float>()[0] == inf);
  BOOST_TEST(es.data<float>()[1] == 0.0f);
  BOOST_TEST(std::isnan(es.data<float>()[2]));
  BOOST_TEST(es.data<float>()[3] == inf);
  BOOST_TEST(es.data<float>()[4] == 0.0f);
  BOOST_TEST(ts.data<float>()[0] == 1.0f);
  BOOST_TEST(ts.data<float>()[1] == -1.0f);
  BOOST_TEST(std::isnan(ts.data<float>()[2]));
  BOOST_TEST(ts.data<float>()[5] == 1e-30f);
}

// GELU = x Phi(x), Phi(x) = 0.5 (1 + erf(x / sqrt 2)); the reference is float64 with std::erfc
// (which keeps the left tail's precision). Bounds (kernels/gelu_f32.cpp has the measured ones): Phi
// within 1.2e-7 absolute, so GELU within 1.2e-7 |x| plus its own rounding; for -10 <= x < 0,
// GELU within 3e-7 relative (Phi's 2.1e-7 and the product's rounding); the derivative
// Phi + x phi within 1.5e-7 (1 + |x|) plus rounding.
BOOST_AUTO_TEST_CASE(float32_gelu_and_its_derivative_match_float64) {
  const std::vector<float> xs = sample(20.0f);
  const Tensor x = tensor_of(xs).set_requires_grad();
  const Tensor y = tg::gelu(x);
  tg::backward({y}, {tg::ones_like(y)});
  const Tensor d = x.grad();
  double worst_value = 0, worst_tail = 0, worst_slope = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i];
    const double cdf = 0.5 * std::erfc(-v / std::numbers::sqrt2);
    const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2 * std::numbers::pi);
    const double want = v * cdf, slope = cdf + v * pdf;
    const double value_err = std::fabs(y.data<float>()[i] - want) - 0.6e-7 * std::fabs(want);
    const double slope_err = std::fabs(d.data<float>()[i] - slope) - 0.6e-7 * std::fabs(slope);
    worst_value = std::max(worst_value, value_err / (1.2e-7 * std::fabs(v) + 1e-45));
    if (v >= -10 && v < 0 && std::fabs(want) > 1e-37)  // (a subnormal result has fewer digits)
      worst_tail = std::max(worst_tail, std::fabs(y.data<float>()[i] - want) / (3e-7 * std::fabs(want)));
    worst_slope = std::max(worst_slope, slope_err / (1.5e-7 * (1 + std::fabs(v))));
  }
  BOOST_TEST(worst_value <= 1.0);
  BOOST_TEST(worst_tail <= 1.0);
  BOOST_TEST(worst_slope <= 1.0);
  tg::clear_tape();
  // NaN propagates; the limits at +-inf: gelu(inf) = inf, gelu(-inf) = -0, slopes 1 and 0.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const Tensor xs2 = tensor_of({nan, inf, -inf, -30.0f, 30.0f}).set_requires_grad();
  const Tensor s = tg::gelu(xs2);
  tg::backward({s}, {tg::ones_like(s)});
  const float* sv = s.data<float>();
  const float* sd = xs2.grad().data<float>();
  BOOST_TEST(std::isnan(sv[0]));
  BOOST_TEST(sv[1] == inf);
  BOOST_TEST((sv[2] == 0.0f && std::signbit(sv[2])));
  BOOST_TEST(sv[3] == -0.0f);
  BOOST_TEST(sv[4] == 30.0f);
  BOOST_TEST(std::isnan(sd[0]));
  BOOST_TEST(sd[1] == 1.0f);
  BOOST_TEST(sd[2] == 0.0f);
  BOOST_TEST(sd[3] == 0.0f);
  BOOST_TEST(sd[4] == 1.0f);
  tg::clear_tape();
}

// Every GELU path this CPU runs (AVX-512, AVX2, scalar) gives the same bits, over a spread of
// float32 (both signs, subnormals, the clamps, inf and NaN) and lengths that leave a remainder
// past the last full vector; the op's result is the chosen path's.
BOOST_AUTO_TEST_CASE(float32_gelu_paths_agree_bit_for_bit) {
  std::vector<float> xs;
  for (std::uint64_t bits = 0; bits < (1ull << 32); bits += 4099) {
    const auto b = static_cast<std::uint32_t>(bits);
    float x;
    std::memcpy(&x, &b, sizeof x);
    xs.push_back(x);
  }
  for (float x : {0.0f, -0.0f, 14.8f, -14.8f, 0.25f, 1.0f, 3.0f, 7.0f, 15.0f, -0.25f, -1.0f, -3.0f, -7.0f, -15.0f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()})
    xs.push_back(x);
  xs.push_back(1.0f);  // an odd length: a remainder after the last 16 and 8
  const auto n = static_cast<std::int64_t>(xs.size());
  const auto bits_equal = [](const std::vector<float>& a, const std::vector<float>& b) {
    for (std::size_t i = 0; i < a.size(); ++i)
      if (!(std::isnan(a[i]) && std::isnan(b[i])) && std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
    return true;
  };
  using tg::detail::GeluPath;
  std::vector<float> g(xs.size()), y0(xs.size()), d0(xs.size()), y1(xs.size()), s1(xs.size()), d1(xs.size());
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i % 7) - 3.0f;
  tg::detail::gelu_f32(xs.data(), y0.data(), n, GeluPath::scalar);
  tg::detail::gelu_backward_f32(g.data(), xs.data(), d0.data(), n, GeluPath::scalar);
  int paths = 0;
  for (GeluPath path : {GeluPath::scalar, GeluPath::avx2, GeluPath::avx512}) {
    if (!tg::detail::gelu_path_supported(path)) continue;
    ++paths;
    BOOST_TEST_CONTEXT("path " << static_cast<int>(path)) {
      tg::detail::gelu_f32(xs.data(), y1.data(), n, path);
      BOOST_TEST(bits_equal(y0, y1));
      tg::detail::gelu_backward_f32(g.data(), xs.data(), d1.data(), n, path);
      BOOST_TEST(bits_equal(d0, d1));
      tg::detail::gelu_slope_f32(xs.data(), y1.data(), s1.data(), n, path);
      BOOST_TEST(bits_equal(y0, y1));
      for (std::size_t i = 0; i < s1.size(); ++i) s1[i] *= g[i];  // g * slope, as the backward
      BOOST_TEST(bits_equal(d0, s1));
    }
  }
  BOOST_TEST(paths >= 1);
  const Tensor y = tg::gelu(tensor_of(xs));
  BOOST_TEST(bits_equal(y0, std::vector<float>(y.data<float>(), y.data<float>() + n)));
}

// Tied maxima share the gradient (docs/gradients.md §4), over the last dim and over a leading
// dim, on the serial and on the parallel path (a NaN slice gets zeros).
BOOST_AUTO_TEST_CASE(max_shares_the_gradient_among_ties) {
  for (int threads : {1, 2}) {
    Threads t(threads);
    for (std::int64_t rows : {2, 20000}) {  // 20000 rows of 3: above the parallel grain
      std::vector<float> v;
      for (std::int64_t r = 0; r < rows; ++r) {
        const float a = static_cast<float>(r % 5);
        v.insert(v.end(), {a, a + 2, a + 2});  // two tied maxima per row
      }
      const float nan = std::numeric_limits<float>::quiet_NaN();
      v[3] = nan;  // row 1 is a NaN slice
      Tensor x = tg::from_vector(std::span<const float>(v), {rows, 3}).set_requires_grad();
      tg::backward({tg::max(x, {-1})}, {tg::full({rows}, 4.0)});
      const float* gx = x.grad().data<float>();
      BOOST_TEST(gx[0] == 0.0f);
      BOOST_TEST(gx[1] == 2.0f);
      BOOST_TEST(gx[2] == 2.0f);
      BOOST_TEST((gx[3] == 0.0f && gx[4] == 0.0f && gx[5] == 0.0f));
      // Over dim 0 of its transpose-shaped copy: columns of (a, a + 2, a + 2).
      Tensor y = tg::from_vector(std::span<const float>(v), {rows, 3}).set_requires_grad();
      tg::backward({tg::max(tg::transpose(y, 0, 1), {0})}, {tg::full({rows}, 4.0)});
      BOOST_TEST(y.grad().data<float>()[rows > 2 ? 7 : 1] == 2.0f);
      BOOST_TEST(y.grad().data<float>()[rows > 2 ? 6 : 0] == 0.0f);
      tg::clear_tape();
    }
  }
}

// weighted_matmul multiplies plainly only when its scan finds x all finite: a NaN anywhere in x
// (a head split's permuted block, a strided view read in runs, the scan's tail) must be found,
// so that a zero weight keeps it out and a nonzero weight lets it in.
BOOST_AUTO_TEST_CASE(weighted_matmul_finds_every_non_finite_element) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::int64_t b = 2, h = 3, l = 5, d = 37;  // x: [b, h, l, d] split from a [b, l, h * d] projection
  for (std::int64_t at = 0; at < b * l * h * d; at += 11) {
    std::vector<float> v(static_cast<std::size_t>(b * l * h * d), 1.0f);
    v[static_cast<std::size_t>(at)] = nan;
    const Tensor proj = tg::from_vector(std::span<const float>(v), {b, l, h * d});
    const Tensor heads = tg::permute(tg::reshape(proj, {b, l, h, d}), {0, 2, 1, 3});  // a dense permutation
    const Tensor strided = tg::permute(tg::slice(tg::reshape(proj, {b, l, h, d}), 3, 0, d - 1), {0, 2, 1, 3});  // runs of d - 1
    for (const Tensor& x : {heads, strided}) {
      const std::int64_t width = x.shape()[3];
      const Tensor xc = tg::clone(x);
      const float* xp = xc.data<float>();
      BOOST_TEST_CONTEXT("NaN at " << at << (x.is_contiguous() ? "" : ", strided x") << ", width " << width) {
        // Every query attends only to key 0; NaN reaches exactly the outputs of a NaN in key row 0.
        Tensor w = tg::zeros({b, 1, l, l});
        for (std::int64_t i = 0; i < l; ++i) tg::fill_(tg::select(tg::select(w, 3, 0), 2, i), 1.0);
        const Tensor c = tg::clone(tg::detail::weighted_matmul(w, x));
        const float* cp = c.data<float>();
        for (std::int64_t bi = 0; bi < b; ++bi)
          for (std::int64_t hi = 0; hi < x.shape()[1]; ++hi)
            for (std::int64_t n = 0; n < width; ++n) {
              const float x0 = xp[((bi * x.shape()[1] + hi) * l + 0) * width + n];
              const float got = cp[((bi * x.shape()[1] + hi) * l + 0) * width + n];
              BOOST_TEST((std::isnan(x0) ? std::isnan(got) : got == 1.0f));
            }
        // All weights nonzero: every output of a column holding the NaN is NaN.
        const Tensor all = tg::clone(tg::detail::weighted_matmul(tg::ones({b, 1, l, l}), x));
        std::int64_t nans_in = 0, nans_out = 0;
        for (std::int64_t i = 0; i < xc.numel(); ++i) nans_in += std::isnan(xp[i]);
        for (std::int64_t i = 0; i < all.numel(); ++i) nans_out += std::isnan(all.data<float>()[i]);
        BOOST_TEST(nans_out == nans_in * l);
      }
    }
  }
}
