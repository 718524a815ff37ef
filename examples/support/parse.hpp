// Reading numbers from text an example did not write itself (checkpoint metadata, option
// values): the whole text must be one integer, and a message names where it came from.
#pragma once

#include <charconv>
#include <cstdint>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>

namespace tapegrad_examples {

// `text` as a T, or std::invalid_argument "<where>: '<text>' is not <what>" (or out of T's
// range). Unlike std::stoll or std::stod, "12abc", " 12" and an empty text are refused, not
// read as 12 or as an unnamed "stoll" error.
template <class T> T parse_number(std::string_view text, std::string_view where, std::string_view what) {
  T value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error == std::errc::result_out_of_range)
    throw std::invalid_argument(fmt::format("{}: '{}' is out of range ({} expected)", where, text, what));
  if (error != std::errc() || end != text.data() + text.size())
    throw std::invalid_argument(fmt::format("{}: '{}' is not {}", where, text, what));
  return value;
}

inline std::int64_t parse_int(std::string_view text, std::string_view where) {
  return parse_number<std::int64_t>(text, where, "an integer");
}
// Exact: fmt's "{}" of a double writes the shortest text that reads back as the same double.
inline double parse_double(std::string_view text, std::string_view where) { return parse_number<double>(text, where, "a number"); }

}  // namespace tapegrad_examples
