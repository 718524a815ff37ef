// Element types a tensor can hold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

namespace tapegrad {

enum class DType : std::uint8_t { float32, float64, bool_, int64 };

inline constexpr DType float32 = DType::float32;
inline constexpr DType float64 = DType::float64;
inline constexpr DType bool_ = DType::bool_;
inline constexpr DType int64 = DType::int64;

std::string_view dtype_name(DType dtype) noexcept;
std::size_t itemsize(DType dtype) noexcept;
std::ostream& operator<<(std::ostream& os, DType dtype);
constexpr bool is_floating(DType dtype) noexcept {
  return dtype == DType::float32 || dtype == DType::float64;
}

// The C++ element type that stores each dtype (bool is one byte on every target we build for).
template <class T> constexpr DType dtype_of() noexcept;
template <> constexpr DType dtype_of<float>() noexcept { return DType::float32; }
template <> constexpr DType dtype_of<double>() noexcept { return DType::float64; }
template <> constexpr DType dtype_of<bool>() noexcept { return DType::bool_; }
template <> constexpr DType dtype_of<std::int64_t>() noexcept { return DType::int64; }
// The C++ types that a tensor's elements can be read as.
template <class T>
concept ElementType = std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bool> || std::is_same_v<T, std::int64_t>;

}  // namespace tapegrad

template <>
struct fmt::formatter<tapegrad::DType> : fmt::formatter<std::string_view> {
  auto format(tapegrad::DType d, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(tapegrad::dtype_name(d), ctx);
  }
};
