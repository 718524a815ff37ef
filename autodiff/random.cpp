// Seeded random tensors with platform-independent values.
#include <cmath>
#include <numbers>
#include <random>

#include "autodiff/kernel.hpp"

namespace tapegrad {

struct Generator::State {
  std::mt19937_64 engine;
  bool has_spare = false;
  double spare = 0.0;
};

Generator::Generator(std::uint64_t seed) : state_(std::make_shared<State>()) {
  state_->engine.seed(seed);
}

std::uint64_t Generator::next_u64() { return state_->engine(); }

// 53 random bits into [0, 1): exact and identical everywhere (std::uniform_real_distribution is not).
double Generator::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

// Box-Muller; 1 - u keeps the logarithm's argument in (0, 1].
double Generator::normal() {
  if (state_->has_spare) {
    state_->has_spare = false;
    return state_->spare;
  }
  const double r = std::sqrt(-2.0 * std::log(1.0 - uniform()));
  const double theta = 2.0 * std::numbers::pi * uniform();
  state_->spare = r * std::sin(theta);
  state_->has_spare = true;
  return r * std::cos(theta);
}

namespace {
template <class F> Tensor fill_random(const Shape& shape, DType dtype, const char* op, F&& draw) {
  if (!is_floating(dtype))
    detail::fail<DTypeError>("{}: argument 'dtype' must be float32 or float64, got {}", op, dtype);
  Tensor t = detail::new_tensor(shape, dtype, op, "argument 'shape'");
  detail::visit_float(dtype, op, [&]<class T>(detail::Tag<T>) {
    T* p = static_cast<T*>(detail::mutable_data(t));
    for (std::int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = detail::convert<T>(draw());
  });
  return t;
}
}  // namespace

Tensor randn(const Shape& shape, Generator& gen, DType dtype) {
  return fill_random(shape, dtype, "randn", [&] { return gen.normal(); });
}
Tensor rand(const Shape& shape, Generator& gen, DType dtype, double low, double high) {
  if (!(low <= high))
    detail::fail<ValueError>("rand: expected low <= high, got low={} high={}", low, high);
  return fill_random(shape, dtype, "rand", [&] { return low + (high - low) * gen.uniform(); });
}
Tensor randn(const Shape& shape, std::uint64_t seed, DType dtype) {
  Generator gen(seed);
  return randn(shape, gen, dtype);
}
Tensor rand(const Shape& shape, std::uint64_t seed, DType dtype, double low, double high) {
  Generator gen(seed);
  return rand(shape, gen, dtype, low, high);
}

}  // namespace tapegrad
