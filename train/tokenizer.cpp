// SubwordTokenizer on SentencePiece (tapegrad/train/tokenizer.hpp). SentencePiece's headers are
// seen by this file alone.
#include "tapegrad/train/tokenizer.hpp"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "autodiff/check.hpp"
#include "tapegrad/train/checkpoint.hpp"
#include "train/files.hpp"
#include "train/safetensors.hpp"
#include "train/windows.hpp"

namespace tapegrad {
namespace {
using detail::fail;
namespace sp = sentencepiece;

// The training text, line by line (SentencePiece learns pieces within a sentence, and a line is
// one); the newlines themselves are the user-defined piece "\n". Tabs are one too: SentencePiece's
// trainer leaves them out of the vocabulary otherwise.
class Lines : public sp::SentenceIterator {
 public:
  explicit Lines(std::string_view text) : text_(text) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    done_ = at_ > text_.size();
    if (done_) return;
    const std::size_t end = std::min(text_.find('\n', at_), text_.size());
    line_.assign(text_.substr(at_, end - at_));
    at_ = end + 1;
  }
  const std::string& value() const override { return line_; }
  sp::util::Status status() const override { return {}; }

 private:
  std::string_view text_;
  std::size_t at_ = 0;
  std::string line_;
  bool done_ = false;
};

}  // namespace

// A processor over serialized model bytes; SentencePiece's refusal is a FormatError naming `what`.
struct SubwordTokenizer::Impl {
  Impl(const char* fn, std::string model, const std::string& what) : bytes(std::move(model)) {
    if (const auto status = processor.LoadFromSerializedProto(bytes); !status.ok())
      fail<FormatError>("{}: {} is not a SentencePiece model: {}", fn, what, status.message());
  }
  std::string bytes;
  sp::SentencePieceProcessor processor;
};

SubwordTokenizer::SubwordTokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

bool SubwordTokenizer::available() noexcept { return true; }

SubwordTokenizer SubwordTokenizer::train(std::string_view text, const SubwordOptions& options) {
  constexpr const char* fn = "SubwordTokenizer::train";
  if (text.empty()) fail<ValueError>("{}: argument 'text' is empty; a vocabulary needs a text to learn from", fn);
  if (!detail::valid_utf8(text)) fail<ValueError>("{}: argument 'text' is not valid UTF-8, which SentencePiece needs", fn);
  if (options.model != SubwordModel::bpe && options.model != SubwordModel::unigram)
    fail<ValueError>("{}: options.model must be SubwordModel::bpe or SubwordModel::unigram, got the value {}", fn, static_cast<int>(options.model));
  if (options.vocab_size < 4 || options.vocab_size > std::numeric_limits<std::int32_t>::max())
    fail<ValueError>("{}: options.vocab_size must be in [4, {}] (the unknown piece, newline, tab and at least one more), got {}", fn,
                     std::numeric_limits<std::int32_t>::max(), options.vocab_size);
  // identity normalisation, no dummy prefix, whitespace kept: decode(encode(text)) == text.
  // character_coverage 1: every character of the text gets a piece. No BOS/EOS pieces: ids are
  // text only. One thread: SentencePiece's unigram trainer picks other pieces on other thread
  // counts, and the model records the count, so only a fixed count gives the same bytes anywhere.
  const std::unordered_map<std::string, std::string> args{
      {"model_type", options.model == SubwordModel::bpe ? "bpe" : "unigram"},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "false"},
      {"remove_extra_whitespaces", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"split_digits", "false"},
      {"character_coverage", "1.0"},
      {"user_defined_symbols", "\n,\t"},
      {"bos_id", "-1"},
      {"eos_id", "-1"},
      {"max_sentence_length", std::to_string(std::numeric_limits<std::int32_t>::max() / 2)},
      {"num_threads", "1"},
      {"minloglevel", "2"}};
  Lines lines(text);
  std::string bytes;
  if (const auto status = sp::SentencePieceTrainer::Train(args, &lines, &bytes); !status.ok())
    fail<ValueError>("{}: SentencePiece refused to train a {} vocabulary of {} pieces: {}", fn,
                     options.model == SubwordModel::bpe ? "BPE" : "unigram", options.vocab_size, status.message());
  return SubwordTokenizer(std::make_shared<const Impl>(fn, std::move(bytes), "the model it trained"));
}

SubwordTokenizer SubwordTokenizer::load(const std::filesystem::path& path) {
  constexpr const char* fn = "SubwordTokenizer::load";
  return SubwordTokenizer(std::make_shared<const Impl>(fn, detail::read_all(fn, path), fmt::format("'{}'", path.string())));
}

void SubwordTokenizer::save(const std::filesystem::path& path) const {
  detail::TempFile file("SubwordTokenizer::save", path);
  file.write_all(impl_->bytes.data(), impl_->bytes.size());
  file.commit();
}

const std::string& SubwordTokenizer::model_bytes() const noexcept { return impl_->bytes; }

std::int64_t SubwordTokenizer::size() const { return impl_->processor.GetPieceSize(); }

std::vector<std::int64_t> SubwordTokenizer::encode(std::string_view text) const {
  const auto pieces = impl_->processor.EncodeAsImmutableProto(text);
  std::vector<std::int64_t> ids;
  ids.reserve(static_cast<std::size_t>(pieces.pieces_size()));
  for (const auto& piece : pieces.pieces()) {
    if (impl_->processor.IsUnknown(static_cast<int>(piece.id())))
      fail<ValueError>("SubwordTokenizer::encode: argument 'text' holds '{}' at byte {}, which is not in the vocabulary of {} pieces "
                       "(a character the training text did not have)",
                       detail::printable(piece.surface()), piece.begin(), size());
    ids.push_back(piece.id());
  }
  return ids;
}

std::string SubwordTokenizer::decode(std::span<const std::int64_t> ids) const {
  detail::check_ids("SubwordTokenizer::decode", ids, size());
  std::vector<int> pieces(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) pieces[i] = static_cast<int>(ids[i]);
  std::string text;
  if (const auto status = impl_->processor.Decode(pieces, &text); !status.ok())
    fail<ValueError>("SubwordTokenizer::decode: SentencePiece could not decode: {}", status.message());
  return text;
}

}  // namespace tapegrad
