// Subword tokenizers from SentencePiece (https://github.com/google/sentencepiece), the library
// most language models' tokenizers come from: BPE or unigram, trained on a text, saved as
// SentencePiece's own .model file (readable by its Python and C++ APIs) and loaded back.
//
//   auto bpe = tg::SubwordTokenizer::train(text, {.model = tg::SubwordModel::bpe, .vocab_size = 512});
//   bpe.save("out/tokenizer.model");
//   auto same = tg::SubwordTokenizer::load("out/tokenizer.model");
//
// Trained to give text back exactly: no normalisation, spaces and newlines kept as they are
// (newline and tab are pieces of their own; a line is what SentencePiece learns within), every
// character of the text in the vocabulary. A character that was not in the training text cannot
// be encoded (ValueError naming it and its byte offset), as with CharVocab. Ids: 0 is
// SentencePiece's unknown piece, 1 the newline, 2 the tab.
//
// SentencePiece is optional (docs/building.md): without it the library still has this class, and
// train and load throw an Error saying that tapegrad was built without it.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "tapegrad/train/data.hpp"

namespace tapegrad {

enum class SubwordModel { bpe, unigram };

struct SubwordOptions {
  SubwordModel model = SubwordModel::bpe;
  std::int64_t vocab_size = 512;  // >= 4; SentencePiece refuses sizes the text cannot fill
};

class SubwordTokenizer : public Tokenizer {
 public:
  // Trains on `text` (not empty, valid UTF-8); SentencePiece's refusal is a ValueError with its
  // message. Same text and options, same model file, byte for byte, on any machine and thread
  // count (SentencePiece trains on one thread).
  static SubwordTokenizer train(std::string_view text, const SubwordOptions& options = {});
  // A model file written by save() or by SentencePiece (IOError when it cannot be read,
  // FormatError when SentencePiece cannot read it).
  static SubwordTokenizer load(const std::filesystem::path& path);
  // Writes the model atomically, as checkpoints are saved.
  void save(const std::filesystem::path& path) const;
  // SentencePiece's serialized model, what save() writes.
  const std::string& model_bytes() const noexcept;

  std::int64_t size() const override;
  std::vector<std::int64_t> encode(std::string_view text) const override;
  std::string decode(std::span<const std::int64_t> ids) const override;
  using Tokenizer::decode;

  // The library was built with SentencePiece.
  static bool available() noexcept;

 private:
  struct Impl;
  explicit SubwordTokenizer(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;  // immutable, so copies may share it
};

}  // namespace tapegrad
