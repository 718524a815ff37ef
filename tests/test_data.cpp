// The data helpers a language model trains from (CharVocab, random_windows), and printing
// shapes and dtypes with fmt.
#define BOOST_TEST_MODULE data
#include <set>

#include "support.hpp"

namespace tg = tapegrad;
using namespace tg_test;
using tg::Tensor;

BOOST_AUTO_TEST_CASE(a_vocabulary_is_the_texts_bytes_sorted) {
  const tg::CharVocab vocab("hello, world");
  BOOST_TEST(vocab.chars() == " ,dehlorw");
  BOOST_TEST(vocab.size() == 9);
  const std::vector<std::int64_t> ids = vocab.encode("hello");
  BOOST_TEST(ids == std::vector<std::int64_t>({4, 3, 5, 5, 6}));
  BOOST_TEST(vocab.decode(ids) == "hello");
  BOOST_TEST(vocab.decode(tg::from_vector(ids, {1, 5})) == "hello");
  // Bytes, not characters: UTF-8's two-byte 'é' is two tokens, and comes back whole.
  const std::string text = "caf\xc3\xa9 \x01\xff";
  const tg::CharVocab bytes(text);
  BOOST_TEST(bytes.size() == 8);
  BOOST_TEST(bytes.decode(bytes.encode(text)) == text);
  BOOST_TEST(tg::CharVocab::from_codes(bytes.to_codes()).chars() == bytes.chars());
  BOOST_TEST(bytes.to_codes() == "1,32,97,99,102,169,195,255");  // sorted byte values
}

BOOST_AUTO_TEST_CASE(vocabulary_errors_name_the_position) {
  const tg::CharVocab vocab("abc");
  check_throws<tg::ValueError>([&] { vocab.encode("abxc"); }, {"CharVocab::encode", "'x'", "position 2", "3 characters"});
  check_throws<tg::ValueError>([&] { vocab.encode(std::string("a\nb")); }, {"byte 10", "position 1"});
  check_throws<tg::ValueError>([&] { vocab.decode(std::vector<std::int64_t>{0, 3}); }, {"CharVocab::decode", "holds 3 at position 1", "[0, 3)"});
  check_throws<tg::DTypeError>([&] { vocab.decode(tg::zeros({2})); }, {"Tokenizer::decode", "'ids'", "int64"});
  check_throws<tg::ValueError>([] { tg::CharVocab(""); }, {"CharVocab", "empty"});
  check_throws<tg::ValueError>([] { tg::CharVocab::from_codes("97,,98"); }, {"from_codes", "position 3"});
  check_throws<tg::ValueError>([] { tg::CharVocab::from_codes("97,256"); }, {"from_codes", "'256'"});
  // Ids are positions in the list: a repeated or reordered code would renumber them silently.
  check_throws<tg::ValueError>([] { tg::CharVocab::from_codes("66,65,65"); }, {"from_codes", "ascending", "got 65 after 66", "position 3"});
  check_throws<tg::ValueError>([] { tg::CharVocab::from_codes("65,66,66"); }, {"from_codes", "distinct", "got 66 after 66", "position 6"});
  check_throws<tg::ValueError>([] { tg::CharVocab::from_codes(""); }, {"from_codes", "''", "position 0"});
}

BOOST_AUTO_TEST_CASE(windows_are_consecutive_tokens_and_their_successors) {
  std::vector<std::int64_t> tokens(50);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int64_t>(i);
  tg::Generator gen(3);
  std::set<std::int64_t> starts;
  for (int round = 0; round < 200; ++round) {
    const auto [x, y] = tg::random_windows(tokens, 4, 10, gen);
    BOOST_TEST(x.shape() == tg::Shape({4, 10}));
    BOOST_TEST(y.shape() == tg::Shape({4, 10}));
    const auto xv = x.to_vector<std::int64_t>(), yv = y.to_vector<std::int64_t>();
    for (std::size_t b = 0; b < 4; ++b) {
      starts.insert(xv[b * 10]);
      for (std::size_t t = 0; t < 10; ++t) {
        BOOST_TEST(xv[b * 10 + t] == xv[b * 10] + static_cast<std::int64_t>(t));
        BOOST_TEST(yv[b * 10 + t] == xv[b * 10 + t] + 1);
      }
    }
  }
  // Every start from 0 to 39 (the last that leaves a target) is drawn, and no other.
  BOOST_TEST(starts.size() == 40u);
  BOOST_TEST(*starts.begin() == 0);
  BOOST_TEST(*starts.rbegin() == 39);
  // The same generator state gives the same windows.
  tg::Generator a(9), b(9);
  BOOST_TEST(tg::random_windows(tokens, 3, 5, a).x.to_vector<std::int64_t>() == tg::random_windows(tokens, 3, 5, b).x.to_vector<std::int64_t>());
}

BOOST_AUTO_TEST_CASE(window_sizes_are_checked) {
  const std::vector<std::int64_t> tokens{1, 2, 3};
  tg::Generator gen(1);
  check_throws<tg::ValueError>([&] { tg::random_windows(tokens, 2, 3, gen); }, {"random_windows", "length = 3", "3 tokens"});
  check_throws<tg::ValueError>([&] { tg::random_windows(tokens, 0, 1, gen); }, {"random_windows", "batch = 0"});
  check_throws<tg::ValueError>([&] { tg::random_windows(tokens, 1, 0, gen); }, {"length = 0"});
  BOOST_TEST(tg::random_windows(tokens, 1, 2, gen).y.to_vector<std::int64_t>() == std::vector<std::int64_t>({2, 3}));
}

BOOST_AUTO_TEST_CASE(shapes_and_dtypes_print_with_fmt) {
  const Tensor t = tg::zeros({2, 3}, tg::float64);
  BOOST_TEST(fmt::format("{}", t.shape()) == "[2, 3]");
  BOOST_TEST(fmt::format("{} {}", t.dtype(), tg::int64) == "float64 int64");
  BOOST_TEST(fmt::format("{}", tg::Shape{}) == "[]");
  // A plain std::vector makes a tensor (no span spelled out).
  const std::vector<std::int64_t> ids{4, 2};
  BOOST_TEST(tg::from_vector(ids, {2}).dtype() == tg::int64);
}
