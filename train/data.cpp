// Character vocabularies and random training windows (tapegrad/train/data.hpp).
#include "tapegrad/train/data.hpp"

#include <algorithm>
#include <charconv>

#include "autodiff/check.hpp"
#include "train/windows.hpp"

namespace tapegrad {
namespace {
using detail::fail;

// A byte as a message shows it: printable ASCII as itself, anything else by its value.
std::string shown(unsigned char c) { return c >= 0x20 && c < 0x7f ? fmt::format("'{}'", static_cast<char>(c)) : fmt::format("byte {}", c); }

}  // namespace

CharVocab::CharVocab(std::string_view text) {
  if (text.empty()) fail<ValueError>("CharVocab: argument 'text' is empty; a vocabulary needs at least one character");
  bool present[256] = {};
  for (char c : text) present[static_cast<unsigned char>(c)] = true;
  std::fill(std::begin(id_of_), std::end(id_of_), std::int16_t{-1});
  for (int b = 0; b < 256; ++b)
    if (present[b]) {
      id_of_[b] = static_cast<std::int16_t>(chars_.size());
      chars_.push_back(static_cast<char>(b));
    }
}

std::vector<std::int64_t> CharVocab::encode(std::string_view text) const {
  std::vector<std::int64_t> ids(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (id_of_[c] < 0)
      fail<ValueError>("CharVocab::encode: argument 'text' holds {} at position {}, which is not in the vocabulary of {} characters", shown(c),
                       i, chars_.size());
    ids[i] = id_of_[c];
  }
  return ids;
}

std::string CharVocab::decode(std::span<const std::int64_t> ids) const {
  detail::check_ids("CharVocab::decode", ids, size());
  std::string text(ids.size(), '\0');
  for (std::size_t i = 0; i < ids.size(); ++i) text[i] = chars_[static_cast<std::size_t>(ids[i])];
  return text;
}

std::string Tokenizer::decode(const Tensor& ids) const {
  detail::check_dtype("Tokenizer::decode", "ids", ids, DType::int64);
  const std::vector<std::int64_t> v = ids.to_vector<std::int64_t>();
  return decode(std::span<const std::int64_t>(v));
}

std::string CharVocab::to_codes() const {
  std::string out;
  for (char c : chars_) out += fmt::format("{}{}", out.empty() ? "" : ",", static_cast<unsigned char>(c));
  return out;
}

CharVocab CharVocab::from_codes(std::string_view codes) {
  std::string bytes;
  for (std::size_t at = 0; at <= codes.size();) {
    const std::size_t end = std::min(codes.find(',', at), codes.size());
    int value = -1;
    const auto [ptr, ec] = std::from_chars(codes.data() + at, codes.data() + end, value);
    if (ec != std::errc() || ptr != codes.data() + end || value < 0 || value > 255)
      fail<ValueError>("CharVocab::from_codes: argument 'codes' must be byte values 0-255 separated by commas, got '{}' at position {}",
                       codes.substr(at, end - at), at);
    // Ids are positions in the list, so a repeated or reordered code would renumber the tokens:
    // only the list to_codes() writes, strictly ascending, is taken.
    if (!bytes.empty() && value <= static_cast<unsigned char>(bytes.back()))
      fail<ValueError>("CharVocab::from_codes: argument 'codes' must list distinct byte values in ascending order (as to_codes() "
                       "writes them), got {} after {} at position {}",
                       value, static_cast<unsigned char>(bytes.back()), at);
    bytes.push_back(static_cast<char>(value));
    at = end + 1;
  }
  return CharVocab(bytes);
}

Windows random_windows(std::span<const std::int64_t> tokens, std::int64_t batch, std::int64_t length, Generator& gen) {
  return detail::draw_windows("random_windows", tokens, batch, length, gen);
}

}  // namespace tapegrad
