// SubwordTokenizer (SentencePiece): exact round trips of ASCII and UTF-8 text, deterministic
// training, save and load, and its errors. Built only when SentencePiece is found.
#define BOOST_TEST_MODULE tokenizer
#include "files.hpp"
#include "support.hpp"

namespace tg = tapegrad;
using namespace tg_test;

namespace {

// A text with repeats to merge, leading and doubled spaces, blank lines, tabs and UTF-8.
std::string sample_text() {
  std::string text;
  for (int i = 0; i < 40; ++i)
    text += fmt::format("  the cat sat on the mat {}\n\nthe café serves crème brûlée\tat {} o'clock ☕ → 東京\n", i, i % 12);
  return text;
}

}  // namespace

BOOST_AUTO_TEST_CASE(decode_of_encode_gives_the_text_back) {
  const std::string text = sample_text();
  for (tg::SubwordModel model : {tg::SubwordModel::bpe, tg::SubwordModel::unigram}) {
    const auto t = tg::SubwordTokenizer::train(text, {.model = model, .vocab_size = 50});
    BOOST_TEST(t.size() == 50);
    const auto ids = t.encode(text);
    BOOST_TEST(ids.size() < text.size());  // subwords: fewer tokens than bytes
    BOOST_TEST(t.decode(ids) == text);
    for (const std::string s : {"the mat", "  \n\n  ", "café → 東京 ☕", "\tsat\n", ""}) BOOST_TEST(t.decode(t.encode(s)) == s);
    const tg::Tokenizer& any = t;
    const auto cat = any.encode("the cat");
    BOOST_TEST(any.decode(tg::from_vector(cat, {1, static_cast<std::int64_t>(cat.size())})) == "the cat");
  }
}

BOOST_AUTO_TEST_CASE(training_is_deterministic_and_the_model_file_loads_back) {
  const std::string text = sample_text();
  const auto a = tg::SubwordTokenizer::train(text, {.model = tg::SubwordModel::bpe, .vocab_size = 100});
  const auto b = tg::SubwordTokenizer::train(text, {.model = tg::SubwordModel::bpe, .vocab_size = 100});
  BOOST_TEST(a.model_bytes() == b.model_bytes());
  // On any thread count: SentencePiece's unigram trainer picks other pieces on more threads.
  const int threads = tg::num_threads();
  tg::set_num_threads(1);
  const auto u1 = tg::SubwordTokenizer::train(text, {.model = tg::SubwordModel::unigram, .vocab_size = 50});
  tg::set_num_threads(2);
  const auto u2 = tg::SubwordTokenizer::train(text, {.model = tg::SubwordModel::unigram, .vocab_size = 50});
  tg::set_num_threads(threads);
  BOOST_TEST(u1.model_bytes() == u2.model_bytes());
  BOOST_TEST(u1.model_bytes() != a.model_bytes());

  const TempDir dir;
  a.save(dir / "tokenizer.model");
  BOOST_TEST(read_bytes(dir / "tokenizer.model") == a.model_bytes());
  const auto loaded = tg::SubwordTokenizer::load(dir / "tokenizer.model");
  BOOST_TEST(loaded.size() == a.size());
  BOOST_TEST(loaded.encode(text) == a.encode(text));
}

BOOST_AUTO_TEST_CASE(errors_name_the_function_and_what_was_wrong) {
  const std::string text = sample_text();
  check_throws<tg::ValueError>([] { tg::SubwordTokenizer::train(""); }, {"SubwordTokenizer::train: argument 'text' is empty"});
  check_throws<tg::ValueError>([] { tg::SubwordTokenizer::train("ab\xff"); }, {"SubwordTokenizer::train", "not valid UTF-8"});
  check_throws<tg::ValueError>([&] { tg::SubwordTokenizer::train(text, {.vocab_size = 3}); },
                               {"SubwordTokenizer::train: options.vocab_size must be in [4,", "got 3"});
  check_throws<tg::ValueError>([&] { tg::SubwordTokenizer::train(text, {.model = static_cast<tg::SubwordModel>(7)}); },
                               {"SubwordTokenizer::train: options.model must be SubwordModel::bpe or SubwordModel::unigram, got the value 7"});
  // SentencePiece's own refusals come through with its message.
  check_throws<tg::ValueError>([&] { tg::SubwordTokenizer::train(text, {.vocab_size = 5}); },
                               {"SubwordTokenizer::train: SentencePiece refused to train a BPE vocabulary of 5 pieces:"});
  check_throws<tg::ValueError>([&] { tg::SubwordTokenizer::train(text, {.vocab_size = 100000}); },
                               {"SubwordTokenizer::train: SentencePiece refused", "100000"});

  const auto t = tg::SubwordTokenizer::train(text, {.vocab_size = 100});
  check_throws<tg::ValueError>([&] { t.encode("the zebra"); }, {"SubwordTokenizer::encode: argument 'text' holds 'z", "at byte 4"});
  check_throws<tg::ValueError>([&] { t.decode(std::vector<std::int64_t>{3, 100}); },
                               {"SubwordTokenizer::decode: argument 'ids' holds 100 at position 1", "[0, 100)"});
  check_throws<tg::DTypeError>([&] { t.decode(tg::zeros({2})); }, {"Tokenizer::decode", "'ids'", "int64"});

  const TempDir dir;
  check_throws<tg::IOError>([&] { tg::SubwordTokenizer::load(dir / "missing.model"); },
                            {"SubwordTokenizer::load: cannot open", "missing.model"});
  write_bytes(dir / "junk.model", "not a model");
  check_throws<tg::FormatError>([&] { tg::SubwordTokenizer::load(dir / "junk.model"); },
                                {"SubwordTokenizer::load: '", "junk.model' is not a SentencePiece model"});
  check_throws<tg::ValueError>([&] { t.save(""); }, {"SubwordTokenizer::save: argument 'path'"});
  check_throws<tg::IOError>([&] { t.save(dir / "no/dir/t.model"); }, {"SubwordTokenizer::save", "temporary"});
}
