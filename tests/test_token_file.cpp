// Token files in llm.c's layout: written and read back, every broken header refused, windows keyed
// by (seed, step, rank), and one loop over either vocabulary through the Tokenizer interface.
#define BOOST_TEST_MODULE token_file
#include <array>
#include <cstring>

#include "files.hpp"
#include "support.hpp"

namespace tg = tapegrad;
using namespace tg_test;
using tg::Tensor;

namespace {

// llm.c's header: 256 int32, magic, version, count.
std::string llmc_file(std::int32_t magic, std::int32_t version, std::int32_t count, const std::vector<std::uint16_t>& tokens) {
  std::array<std::int32_t, 256> header{};
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::string bytes(reinterpret_cast<const char*>(header.data()), sizeof header);
  bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  return bytes;
}

std::vector<std::int64_t> counting(std::int64_t n, std::int64_t vocab) {
  std::vector<std::int64_t> ids(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) ids[static_cast<std::size_t>(i)] = (i * 7) % vocab;
  return ids;
}

}  // namespace

BOOST_AUTO_TEST_CASE(written_then_read_back_in_llmcs_layout) {
  const TempDir dir;
  const std::vector<std::int64_t> ids{0, 65535, 3, 1, 40000};
  tg::write_token_file(dir / "t.bin", ids, 65536);
  // The bytes are llm.c's: the header, then the ids as little-endian uint16.
  std::vector<std::uint16_t> as16(ids.begin(), ids.end());
  BOOST_TEST(read_bytes(dir / "t.bin") == llmc_file(20240520, 1, 5, as16));
  const tg::TokenFile file(dir / "t.bin", 65536);
  BOOST_TEST(file.size() == 5);
  BOOST_TEST(file.vocab_size() == 65536);
  BOOST_TEST(std::vector<std::int64_t>(file.tokens().begin(), file.tokens().end()) == ids);
  // An empty file of tokens is a valid file; a move keeps the mapping.
  tg::write_token_file(dir / "empty.bin", {}, 10);
  tg::TokenFile moved(dir / "empty.bin", 10);
  BOOST_TEST(moved.size() == 0);
  moved = tg::TokenFile(dir / "t.bin", 65536);
  BOOST_TEST(moved.tokens()[1] == 65535);
  // nanoGPT's raw layout: the same ids without the header.
  write_bytes(dir / "raw.bin", std::string(reinterpret_cast<const char*>(as16.data()), as16.size() * 2));
  const tg::TokenFile raw(dir / "raw.bin", 65536, tg::TokenLayout::raw);
  BOOST_TEST(std::vector<std::int64_t>(raw.tokens().begin(), raw.tokens().end()) == ids);
}

BOOST_AUTO_TEST_CASE(broken_files_are_refused_naming_the_problem) {
  const TempDir dir;
  const auto path = dir / "bad.bin";
  const std::vector<std::uint16_t> tokens{1, 2, 3};
  auto refused = [&](const std::string& bytes, std::vector<std::string> fragments, std::int64_t vocab = 10) {
    write_bytes(path, bytes);
    fragments.push_back("TokenFile");
    fragments.push_back(path.string());
    check_throws<tg::FormatError>([&] { tg::TokenFile(path, vocab); }, fragments);
  };
  refused(llmc_file(20240521, 1, 3, tokens), {"magic is 20240521, not 20240520"});
  refused(llmc_file(20240520, 2, 3, tokens), {"version is 2", "only version 1"});
  refused(llmc_file(20240520, 1, 4, tokens), {"counts 4 tokens", "holds 3"});
  refused(llmc_file(20240520, 1, -1, tokens), {"counts -1 tokens"});
  refused(llmc_file(20240520, 1, 3, tokens).substr(0, 1000), {"1000 bytes long", "1024-byte header", "truncated"});
  refused(llmc_file(20240520, 1, 3, tokens) + "x", {"not a whole number of uint16"});
  refused(llmc_file(20240520, 1, 3, tokens), {"token 2 is id 3", "vocab_size = 3"}, 3);
  // The raw layout has no header to check, but its ids are checked all the same.
  write_bytes(path, std::string("\x05\x00\x09\x00", 4));
  check_throws<tg::FormatError>([&] { tg::TokenFile(path, 9, tg::TokenLayout::raw); }, {"raw uint16", "token 1 is id 9"});
  check_throws<tg::IOError>([&] { tg::TokenFile(dir / "missing.bin", 10); }, {"TokenFile: cannot open", "missing.bin"});
  check_throws<tg::IOError>([&] { tg::TokenFile(dir.path, 10); }, {"is not a regular file"});
  check_throws<tg::ValueError>([&] { tg::TokenFile(path, 65537); }, {"TokenFile: argument 'vocab_size'", "[1, 65536]", "65537"});
  check_throws<tg::ValueError>([&] { tg::TokenFile(path, 10, static_cast<tg::TokenLayout>(2)); },
                               {"TokenFile: argument 'layout' must be TokenLayout::llmc or TokenLayout::raw, got the value 2"});
}

BOOST_AUTO_TEST_CASE(writing_checks_ids_and_sizes) {
  const TempDir dir;
  const std::vector<std::int64_t> ids{1, 2, 10};
  check_throws<tg::ValueError>([&] { tg::write_token_file(dir / "t.bin", ids, 10); },
                               {"write_token_file: argument 'ids' holds 10 at position 2", "[0, 10)"});
  check_throws<tg::ValueError>([&] { tg::write_token_file(dir / "t.bin", ids, 0); }, {"write_token_file: argument 'vocab_size'", "got 0"});
  check_throws<tg::ValueError>([&] { tg::write_token_file(dir.path / "", ids, 11); }, {"write_token_file: argument 'path'"});
  // The path is checked before the ids are read.
  check_throws<tg::ValueError>([&] { tg::write_token_file(dir.path / "", ids, 10); }, {"write_token_file: argument 'path'"});
  check_throws<tg::IOError>([&] { tg::write_token_file(dir / "no/such/dir/t.bin", ids, 11); }, {"write_token_file", "temporary"});
  BOOST_TEST(dir.entries().empty());  // nothing left behind by a refused write
}

BOOST_AUTO_TEST_CASE(windows_are_a_function_of_seed_step_and_rank) {
  const TempDir dir;
  const std::vector<std::int64_t> ids = counting(1000, 97);
  tg::write_token_file(dir / "t.bin", ids, 97);
  // Two readers of one file, as two processes or a resumed run would have.
  const tg::TokenFile a(dir / "t.bin", 97), b(dir / "t.bin", 97);
  auto same = [](const tg::Windows& p, const tg::Windows& q) {
    return p.x.to_vector<std::int64_t>() == q.x.to_vector<std::int64_t>() && p.y.to_vector<std::int64_t>() == q.y.to_vector<std::int64_t>();
  };
  const tg::Windows w = tg::token_windows(a, 8, 16, 5, 123);
  BOOST_TEST(same(w, tg::token_windows(b, 8, 16, 5, 123)));
  // Asked again after other steps were drawn: the same, since nothing carries from step to step.
  (void)tg::token_windows(a, 8, 16, 5, 124);
  BOOST_TEST(same(w, tg::token_windows(a, 8, 16, 5, 123)));
  BOOST_TEST(!same(w, tg::token_windows(a, 8, 16, 5, 124)));
  BOOST_TEST(!same(w, tg::token_windows(a, 8, 16, 6, 123)));
  BOOST_TEST(!same(w, tg::token_windows(a, 8, 16, 5, 123, 1)));
  BOOST_TEST(w.x.shape() == tg::Shape({8, 16}));
  BOOST_TEST(w.x.dtype() == tg::int64);
  // Each window is a run of the file and y is x shifted by one: find each row's start.
  const auto x = w.x.to_vector<std::int64_t>(), y = w.y.to_vector<std::int64_t>();
  for (std::size_t r = 0; r < 8; ++r) {
    const auto row = x.begin() + static_cast<std::ptrdiff_t>(r * 16);
    const auto at = std::search(ids.begin(), ids.end(), row, row + 16);
    BOOST_REQUIRE(at != ids.end());
    BOOST_TEST(std::equal(at + 1, at + 17, y.begin() + static_cast<std::ptrdiff_t>(r * 16)));
  }
  // Starts cover the file: over many steps every start is drawn, the last one included.
  const tg::TokenFile small = [&] {
    tg::write_token_file(dir / "small.bin", counting(6, 97), 97);
    return tg::TokenFile(dir / "small.bin", 97);
  }();
  std::set<std::int64_t> firsts;
  for (std::int64_t step = 0; step < 200; ++step) firsts.insert(tg::token_windows(small, 1, 3, 1, step).x.to_vector<std::int64_t>()[0]);
  BOOST_TEST(firsts == std::set<std::int64_t>({0, 7, 14}));
  check_throws<tg::ValueError>([&] { tg::token_windows(small, 1, 6, 1, 0); }, {"token_windows: needs", "length = 6 and 6 tokens"});
  check_throws<tg::ValueError>([&] { tg::token_windows(small, 1, 3, 1, -1); }, {"token_windows: arguments 'step' and 'rank'", "step = -1"});
}

BOOST_AUTO_TEST_CASE(a_char_vocabulary_is_a_tokenizer) {
  const tg::CharVocab chars("hello world");
  const tg::Tokenizer& t = chars;
  BOOST_TEST(t.size() == 8);
  BOOST_TEST(t.decode(t.encode("low")) == "low");
  BOOST_TEST(t.decode(tg::from_vector(t.encode("old"), {3})) == "old");
}
