// Seeded random tensors with platform-independent values.
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numbers>
#include <random>
#include <sstream>
#include <utility>

#include "autodiff/check.hpp"
#include "autodiff/loops.hpp"

namespace tapegrad {

struct Generator::State {
  std::mt19937_64 engine;
  bool has_spare = false;
  double spare = 0.0;
};

Generator::Generator(std::uint64_t seed) : state_(std::make_shared<State>(State{std::mt19937_64(seed)})) {}

Generator::Generator(const Generator& other) : state_(std::make_shared<State>(*other.state_)) {}
Generator& Generator::operator=(const Generator& other) {
  if (this != &other) state_ = std::make_shared<State>(*other.state_);
  return *this;
}
Generator::~Generator() = default;

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

// The engine's words as its operator<< writes them, the form its operator>> reads back.
std::vector<std::int64_t> engine_words(const std::mt19937_64& engine) {
  std::stringstream text;
  text << engine;
  std::vector<std::int64_t> words;
  for (std::uint64_t w = 0; text >> w;) words.push_back(std::bit_cast<std::int64_t>(w));
  return words;
}

}  // namespace

Tensor Generator::get_state() const {
  std::vector<std::int64_t> state{state_->has_spare ? 1 : 0, state_->has_spare ? std::bit_cast<std::int64_t>(state_->spare) : 0};
  const std::vector<std::int64_t> words = engine_words(state_->engine);
  state.insert(state.end(), words.begin(), words.end());
  return from_vector(state, {static_cast<std::int64_t>(state.size())});
}

void Generator::set_state(const Tensor& state) {
  const char* fn = "Generator::set_state";
  detail::check_dtype(fn, "state", state, DType::int64);  // (which names an undefined state too)
  static const std::int64_t size = 2 + static_cast<std::int64_t>(engine_words(std::mt19937_64()).size());
  if (state.shape() != Shape{size})
    detail::fail<ShapeError>("{}: argument 'state' must be int64 [{}] as get_state() gives it, got shape {}", fn, size,
                             detail::shape_str(state.shape()));
  const std::vector<std::int64_t> s = state.to_vector<std::int64_t>();
  State restored;
  restored.has_spare = s[0] == 1;
  restored.spare = std::bit_cast<double>(s[1]);
  if ((s[0] != 0 && s[0] != 1) || (restored.has_spare ? !std::isfinite(restored.spare) : s[1] != 0))
    detail::fail<ValueError>("{}: argument 'state' must start with 0 and 0 (no spare normal) or 1 and a finite double's bits, "
                             "got {} and {} ({})",
                             fn, s[0], s[1], restored.spare);
  // An engine whose words are all zero draws only zeros (the seeding never makes one).
  if (std::all_of(s.begin() + 2, s.end() - 1, [](std::int64_t w) { return w == 0; }))
    detail::fail<ValueError>("{}: argument 'state' holds an all-zero engine state, which draws only zeros; get_state() never gives one", fn);
  std::stringstream text;
  for (std::size_t i = 2; i < s.size(); ++i) text << std::bit_cast<std::uint64_t>(s[i]) << ' ';
  text >> restored.engine;
  if (!text) detail::fail<ValueError>("{}: argument 'state' holds engine words std::mt19937_64 cannot read", fn);
  *state_ = restored;
}

namespace {

// A tensor of `shape` filled by draw = make(Tag<T>{}), one draw() per element, T the element
// type of `dtype` (make runs once, so per-dtype set-up stays out of the loop).
template <class Make> Tensor fill_random(const Shape& shape, DType dtype, const char* op, Make&& make) {
  if (!is_floating(dtype))
    detail::fail<DTypeError>("{}: argument 'dtype' must be float32 or float64, got {}", op, dtype);
  Tensor t = detail::new_tensor(shape, dtype, op, "argument 'shape'");
  detail::visit_float(dtype, op, [&]<class T>(detail::Tag<T> tag) {
    auto draw = make(tag);
    T* p = static_cast<T*>(detail::mutable_data(t));
    for (std::int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = draw();
  });
  return t;
}

void check_rand_bounds(DType dtype, double low, double high) {
  if (!std::isfinite(low) || !std::isfinite(high))
    detail::fail<ValueError>("rand: arguments 'low' and 'high' must be finite, got low={} high={}", low, high);
  if (!(low <= high)) detail::fail<ValueError>("rand: expected low <= high, got low={} high={}", low, high);
  constexpr double kFloatMax = std::numeric_limits<float>::max();
  if (dtype == DType::float32 && (std::abs(low) > kFloatMax || std::abs(high) > kFloatMax))
    detail::fail<ValueError>("rand: float32 cannot represent the bounds low={} high={} (its values lie within +-{}); "
                             "use float64 or narrower bounds",
                             low, high, kFloatMax);
}

// The T values rand may return for low < high: from the smallest T >= low to the largest T < high.
template <class T> std::pair<T, T> representable(double low, double high) {
  constexpr T inf = std::numeric_limits<T>::infinity();
  T lo = static_cast<T>(low), hi = static_cast<T>(high);
  if (static_cast<double>(lo) < low) lo = std::nextafter(lo, inf);
  if (static_cast<double>(hi) >= high) hi = std::nextafter(hi, -inf);
  if (lo > hi)
    detail::fail<ValueError>("rand: no {} value lies in [low, high) = [{}, {}); widen the interval or use float64",
                             dtype_of<T>(), low, high);
  return {lo, hi};
}

}  // namespace

Tensor randn(const Shape& shape, Generator& gen, DType dtype) {
  return fill_random(shape, dtype, "randn", [&]<class T>(detail::Tag<T>) {
    return [&] { return detail::convert<T>(gen.normal()); };
  });
}

// low (1 - u) + high u cannot overflow where high - low would (low = -DBL_MAX, high = DBL_MAX);
// rounding (of the sum, or to float32) may still reach high, hence the clamp. low == high gives
// low (as PyTorch's uniform_); the generator advances by one draw per element either way.
Tensor rand(const Shape& shape, Generator& gen, DType dtype, double low, double high) {
  check_rand_bounds(dtype, low, high);
  return fill_random(shape, dtype, "rand", [&]<class T>(detail::Tag<T>) {
    const std::pair<T, T> range = low == high ? std::pair{detail::convert<T>(low), detail::convert<T>(low)}
                                              : representable<T>(low, high);
    return [&gen, low, high, range] {
      const double u = gen.uniform();
      return std::clamp(detail::convert<T>(low * (1.0 - u) + high * u), range.first, range.second);
    };
  });
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
