// rotary: each row's channel pairs turned by a position-dependent angle.
//
// forward                                   backward (R is orthogonal: R^{-1} = R^T)
//   y_a = x_a cos(theta) - x_b sin(theta)     dx_a =  g_a cos(theta) + g_b sin(theta)
//   y_b = x_a sin(theta) + x_b cos(theta)     dx_b = -g_a sin(theta) + g_b cos(theta)
//   y_j = x_j for the channels j >= r         dx_j = g_j
// The backward is the same rotation with sin negated, recorded as an op: linear in g, so its own
// backward is the forward rotation again, and every order is exact.
#include "tapegrad/ops/rotary.hpp"

#include <cmath>
#include <memory>
#include <vector>

#include "ops/op.hpp"

namespace tapegrad {
namespace {
using namespace detail;

constexpr const char* kOp = "rotary";
constexpr std::int64_t kMaxPosition = std::int64_t{1} << 53;

// cos and sin of every (row, pair), rounded once to the dtype: [L * r/2] each, as doubles so
// that one table serves either dtype's loop (a double holds the rounded float exactly).
struct Angles {
  std::vector<double> cos, sin;
  std::int64_t length = 0, pairs = 0;
  RotaryLayout layout{};
};

std::shared_ptr<const Angles> angles(const Tensor& x, const Tensor& positions, const RotaryOptions& o) {
  check_floating(kOp, "x", x);
  check_defined(kOp, "positions", positions);  // undefined arguments first, before any shape rule
  if (x.dim() < 2)
    fail<ShapeError>("{}: argument 'x' must be [..., L, D] with rank >= 2, got shape {}", kOp, shape_str(x.shape()));
  check_dtype(kOp, "positions", positions, DType::int64);
  const Shape want{x.size(-2)};
  if (positions.shape() != want)
    fail<ShapeError>("{}: argument 'positions' must have shape {} (one per row L of 'x', shape {}), got {}", kOp, shape_str(want),
                     shape_str(x.shape()), shape_str(positions.shape()));
  const std::int64_t r =
      check_rotary_options(o, x.size(-1), kOp, "options", "D", fmt::format(" for 'x' with shape {}", shape_str(x.shape())));
  const std::vector<std::int64_t> pos = positions.to_vector<std::int64_t>();
  for (std::size_t l = 0; l < pos.size(); ++l)
    if (pos[l] < -kMaxPosition || pos[l] > kMaxPosition)
      fail<ValueError>("{}: argument 'positions' holds {} at position [{}]; positions must lie in [-2^53, 2^53]", kOp, pos[l], l);
  const std::int64_t length = x.size(-2), pairs = r / 2;
  const auto n = static_cast<std::size_t>(length * pairs);
  auto a = std::make_shared<Angles>(Angles{std::vector<double>(n), std::vector<double>(n), length, pairs, o.layout});
  const bool f32 = x.dtype() == DType::float32;
  auto round = [f32](double v) { return f32 ? static_cast<double>(static_cast<float>(v)) : v; };
  for (std::int64_t i = 0; i < a->pairs; ++i) {
    const double frequency = std::pow(o.base, -2.0 * static_cast<double>(i) / static_cast<double>(r));
    for (std::int64_t l = 0; l < a->length; ++l) {
      // The angle of |p|, with sin's sign set after: a position and its negation give exactly
      // transposed rotations, whatever the libm.
      const double theta = static_cast<double>(std::abs(pos[static_cast<std::size_t>(l)])) * frequency;
      const auto at = static_cast<std::size_t>(l * a->pairs + i);
      a->cos[at] = round(std::cos(theta));
      a->sin[at] = round(pos[static_cast<std::size_t>(l)] < 0 ? -std::sin(theta) : std::sin(theta));
    }
  }
  return a;
}

// x's rows turned by the angles (sin negated when `inverse`), as op `name`, recorded.
Tensor rotate(const char* name, const Tensor& x_in, const std::shared_ptr<const Angles>& a, bool inverse) {
  Tensor out = new_tensor(x_in.shape(), x_in.dtype(), kOp);
  if (out.numel() > 0) {
    const Tensor x = x_in.is_contiguous() ? x_in : copy_of(x_in);
    visit_float(x.dtype(), kOp, [&]<class T>(Tag<T>) {
      const T* px = static_cast<const T*>(x.raw_data());
      T* py = static_cast<T*>(mutable_data(out));
      const std::int64_t d = x.size(-1), rows = x.numel() / d, half = a->pairs;
      // Pair i's channels: (i, i + r/2) or (2i, 2i + 1).
      const bool split = a->layout == RotaryLayout::half_split;
      const std::int64_t step = split ? 1 : 2, partner = split ? half : 1;
      const T sign = inverse ? T(-1) : T(1);
      for (std::int64_t row = 0; row < rows; ++row) {
        const T* xr = px + row * d;
        T* yr = py + row * d;
        const std::int64_t table = (row % a->length) * half;
        for (std::int64_t i = 0; i < half; ++i) {
          const T c = static_cast<T>(a->cos[static_cast<std::size_t>(table + i)]);
          const T s = sign * static_cast<T>(a->sin[static_cast<std::size_t>(table + i)]);
          const T u = xr[i * step], v = xr[i * step + partner];
          yr[i * step] = u * c - v * s;
          yr[i * step + partner] = u * s + v * c;
        }
        for (std::int64_t j = 2 * half; j < d; ++j) yr[j] = xr[j];
      }
    });
  }
  // dx = R(-theta) g
  record(name, {x_in}, out, {}, [a, inverse](std::span<const Tensor> g, const std::vector<bool>&) {
    return std::vector<Tensor>{rotate("rotary_backward", g[0], a, !inverse)};
  });
  return out;
}

}  // namespace

std::int64_t check_rotary_options(const RotaryOptions& o, std::int64_t width, std::string_view who, std::string_view name,
                                  std::string_view width_name, std::string_view context) {
  // Below 1, later pairs would turn faster than the first, and a tiny base overflows the angle
  // |p| base^(-2i/r) to infinity (cos and sin of it are NaN).
  if (!(std::isfinite(o.base) && o.base >= 1))
    fail<ValueError>("{}: {}.base must be finite and >= 1 (frequencies base^(-2i/r) in (0, 1]), got {}{}", who, name, o.base,
                     context);
  const std::int64_t r = o.rotary_dim == 0 ? width : o.rotary_dim;
  if (r < 0 || r % 2 != 0 || r > width)
    fail<ValueError>("{}: {}.rotary_dim must be even and in [0, {} = {}] (0 means {}{}), got {}{}", who, name, width_name, width,
                     width_name, width % 2 != 0 ? ", which is odd here: give an even rotary_dim" : "", o.rotary_dim, context);
  return r;
}

Tensor rotary(const Tensor& x, const Tensor& positions, const RotaryOptions& options) {
  return rotate(kOp, x, angles(x, positions, options), /*inverse=*/false);
}

}  // namespace tapegrad
