// Data for a language model: text as token ids and back, and random training windows.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

// A character-level vocabulary over bytes: the distinct bytes of a text, sorted, so that id i
// is chars()[i]. Any text works (UTF-8 or not: a multi-byte character is several tokens).
class CharVocab {
 public:
  // The bytes that occur in `text` (ValueError when it is empty).
  explicit CharVocab(std::string_view text);
  std::int64_t size() const noexcept { return static_cast<std::int64_t>(chars_.size()); }
  const std::string& chars() const noexcept { return chars_; }

  // One id per byte; a ValueError names the first byte not in the vocabulary and its position.
  std::vector<std::int64_t> encode(std::string_view text) const;
  // The bytes of the ids; a ValueError names the first id outside [0, size()) and its position.
  std::string decode(std::span<const std::int64_t> ids) const;
  std::string decode(const Tensor& ids) const;  // int64 of any shape, in row-major order

  // The vocabulary as text that checkpoint metadata can hold (its byte values, comma-separated,
  // ascending), and back: from_codes takes exactly such a list, distinct byte values 0-255 in
  // ascending order, and refuses anything else (ValueError naming the first bad code).
  std::string to_codes() const;
  static CharVocab from_codes(std::string_view codes);

 private:
  CharVocab() = default;
  std::string chars_;
  std::int16_t id_of_[256];  // -1: not in the vocabulary
};

// `batch` windows of `length` consecutive tokens, each starting at a position drawn uniformly
// from the `tokens.size() - length` positions that leave room for one more token, and their
// next-token targets (the same windows shifted by one): x and y, int64 [batch, length]. Needs
// batch >= 1, length >= 1 and tokens.size() > length (ValueError naming the sizes otherwise).
struct Windows {
  Tensor x, y;
};
Windows random_windows(std::span<const std::int64_t> tokens, std::int64_t batch, std::int64_t length, Generator& gen);

}  // namespace tapegrad
