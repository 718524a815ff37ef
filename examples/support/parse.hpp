// Reading integers from text an example did not write itself (checkpoint metadata, option
// values): the whole text must be one integer, and a message names where it came from.
#pragma once

#include <charconv>
#include <cstdint>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>

namespace tapegrad_examples {

// `text` as an int64, or std::invalid_argument "<where>: '<text>' is not an integer ...".
// Unlike std::stoll, "12abc", " 12" and an empty text are refused, not read as 12 or as an
// unnamed "stoll" error.
inline std::int64_t parse_int(std::string_view text, std::string_view where) {
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error == std::errc::result_out_of_range)
    throw std::invalid_argument(fmt::format("{}: '{}' is out of the range of int64", where, text));
  if (error != std::errc() || end != text.data() + text.size())
    throw std::invalid_argument(fmt::format("{}: '{}' is not an integer", where, text));
  return value;
}

}  // namespace tapegrad_examples
