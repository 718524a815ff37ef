// Data for a language model: text as token ids and back, and random training windows.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

// What a training loop needs of a vocabulary, whichever it is (CharVocab, or the SentencePiece
// SubwordTokenizer of tokenizer.hpp): ids in [0, size()) and back.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::int64_t size() const = 0;
  // Text as ids; a ValueError names the first piece of text the vocabulary cannot express.
  virtual std::vector<std::int64_t> encode(std::string_view text) const = 0;
  // Ids as text; a ValueError names the first id outside [0, size()) and its position.
  virtual std::string decode(std::span<const std::int64_t> ids) const = 0;
  std::string decode(const Tensor& ids) const;  // int64 of any shape, in row-major order

 protected:
  Tokenizer() = default;
  Tokenizer(const Tokenizer&) = default;
  Tokenizer& operator=(const Tokenizer&) = default;
};

// A character-level vocabulary over bytes: the distinct bytes of a text, sorted, so that id i
// is chars()[i]. Any text works (UTF-8 or not: a multi-byte character is several tokens).
class CharVocab : public Tokenizer {
 public:
  // The bytes that occur in `text` (ValueError when it is empty).
  explicit CharVocab(std::string_view text);
  std::int64_t size() const noexcept override { return static_cast<std::int64_t>(chars_.size()); }
  const std::string& chars() const noexcept { return chars_; }

  // One id per byte; a ValueError names the first byte not in the vocabulary and its position.
  std::vector<std::int64_t> encode(std::string_view text) const override;
  // The bytes of the ids.
  std::string decode(std::span<const std::int64_t> ids) const override;
  using Tokenizer::decode;

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
