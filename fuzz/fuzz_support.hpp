// What the fuzz targets other than fuzz_attention share: turning bytes into values and shapes,
// and stopping with a readable report when a contract is broken.
//
// A finding is reported with abort(), which libFuzzer records as a crash with the input that
// caused it; so is any exception that is not a tapegrad::Error (it escapes the target).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <tapegrad/tapegrad.hpp>

namespace fuzz {

namespace tg = tapegrad;
using tg::Shape;
using tg::Tensor;

template <class... A> [[noreturn]] void fail(fmt::format_string<A...> f, A&&... a) {
  std::fprintf(stderr, "FINDING: %s\n", fmt::format(f, std::forward<A>(a)...).c_str());
  std::abort();
}

// With FUZZ_DEBUG set in the environment, a target narrates what it runs (to read a finding).
inline bool narrating() {
  static const bool on = std::getenv("FUZZ_DEBUG") != nullptr;
  return on;
}
template <class... A> void narrate(fmt::format_string<A...> f, A&&... a) {
  if (narrating()) std::fprintf(stderr, "%s\n", fmt::format(f, std::forward<A>(a)...).c_str());
}

template <class... A> void require(bool ok, fmt::format_string<A...> f, A&&... a) {
  if (!ok) fail(f, std::forward<A>(a)...);
}

// Runs f, which must throw E (a tapegrad::Error type); returns its message. Another tapegrad
// error is a finding, and so is no error; any other exception escapes, which is one too.
template <class E, class F> std::string expect_error(const char* what, F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const tg::Error& e) {
    fail("{}: expected {} but got another tapegrad error: {}", what, typeid(E).name(), e.what());
  }
  fail("{}: expected {}, got no error", what, typeid(E).name());
}

inline std::vector<double> values(const Tensor& t) { return t.defined() ? t.to_vector<double>() : std::vector<double>{}; }

// Equal value for value, NaN matching NaN: the exact comparison of two runs that must agree.
inline bool same_values(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
  return true;
}

inline std::int64_t numel_of(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

struct Input {
  FuzzedDataProvider& fdp;

  bool flag() { return fdp.ConsumeBool(); }
  template <class T> T in(T lo, T hi) { return fdp.ConsumeIntegralInRange<T>(lo, hi); }
  // One of the listed values.
  template <class T, std::size_t N> T pick(const T (&options)[N]) { return options[in<std::size_t>(0, N - 1)]; }
  double finite(double lo, double hi) { return fdp.ConsumeFloatingPointInRange<double>(lo, hi); }
  tg::DType float_dtype() { return flag() ? tg::float64 : tg::float32; }

  Shape shape(std::size_t max_rank, std::int64_t max_dim) {
    Shape s(in<std::size_t>(0, max_rank));
    for (auto& d : s) d = in<std::int64_t>(0, max_dim);
    return s;
  }

  // A tensor of `s` with values in [-2, 2] (float64 values, then converted).
  Tensor tensor(const Shape& s, tg::DType dtype) {
    std::vector<double> v(static_cast<std::size_t>(numel_of(s)));
    for (auto& x : v) x = finite(-2.0, 2.0);
    return tg::from_vector(v, s).to(dtype);
  }

  Tensor mask(const Shape& s) {
    std::vector<bool> v(static_cast<std::size_t>(numel_of(s)));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = fdp.ConsumeBool();
    return tg::from_bools(v, s);
  }
};

// Runs one input: a tapegrad::Error is an accepted outcome. Afterwards grad mode must be back
// on (every guard restored it) and clear_tape() must leave nothing.
template <class F> int run_one(const std::uint8_t* data, std::size_t size, F&& body) {
  FuzzedDataProvider fdp(data, size);
  Input in{fdp};
  try {
    body(in);
  } catch (const tg::Error&) {
  }
  require(tg::is_grad_enabled(), "grad mode left off after the input ran");
  tg::clear_tape();
  require(tg::tape_size() == 0, "clear_tape() left {} nodes", tg::tape_size());
  return 0;
}

}  // namespace fuzz
