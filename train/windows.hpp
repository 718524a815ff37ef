// Internal: random training windows over any token container (random_windows' int64 ids, a
// token file's uint16 ids), one rule for both; the one range check of ids a caller gives.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "autodiff/check.hpp"
#include "tapegrad/train/data.hpp"

namespace tapegrad::detail {

// Each of `ids` in [0, size), or a ValueError naming the first that is not.
inline void check_ids(const char* fn, std::span<const std::int64_t> ids, std::int64_t size) {
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= size)
      fail<ValueError>("{}: argument 'ids' holds {} at position {}; ids must be in [0, {})", fn, ids[i], i, size);
}

template <class Token>
Windows draw_windows(const char* fn, std::span<const Token> tokens, std::int64_t batch, std::int64_t length, Generator& gen) {
  const auto n = static_cast<std::int64_t>(tokens.size());
  if (batch < 1 || length < 1 || n <= length)
    fail<ValueError>("{}: needs batch >= 1, length >= 1 and more than length tokens; got batch = {}, length = {} and {} tokens", fn, batch,
                     length, n);
  check_shape(fn, "the windows [batch, length]", {batch, length}, DType::int64);
  std::vector<std::int64_t> x, y;
  x.reserve(static_cast<std::size_t>(batch * length));
  y.reserve(static_cast<std::size_t>(batch * length));
  for (std::int64_t b = 0; b < batch; ++b) {
    // One of the n - length starts; the product stays below n - length since uniform() < 1.
    const auto at = std::min(static_cast<std::int64_t>(gen.uniform() * static_cast<double>(n - length)), n - length - 1);
    x.insert(x.end(), tokens.begin() + at, tokens.begin() + at + length);
    y.insert(y.end(), tokens.begin() + at + 1, tokens.begin() + at + length + 1);
  }
  return {from_vector(std::span<const std::int64_t>(x), {batch, length}), from_vector(std::span<const std::int64_t>(y), {batch, length})};
}

}  // namespace tapegrad::detail
