// write_tokens: a text file as a token file in llm.c's layout (the .bin that llm.c reads, with
// its 256-int32 header), with the text's bytes or SentencePiece subwords as the vocabulary, then
// read back through TokenFile: it exits non-zero unless the tokens decode to the text.
//
//   ./build/examples/write_tokens                                   # GPL-3, bytes
//   ./build/examples/write_tokens --tokenizer bpe --vocab-size 512 --text book.txt --out book
//
// Writes OUT/tokens.bin and the vocabulary beside it: OUT/tokenizer.model (SentencePiece's own
// file) or OUT/alphabet.txt (CharVocab's byte values).
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

#include <CLI/CLI.hpp>
#include <tapegrad/tapegrad.hpp>

namespace tg = tapegrad;

int main(int argc, char** argv) try {
  std::string text_path = "/usr/share/common-licenses/GPL-3", tokenizer = "char", out = "write_tokens_out";
  std::int64_t vocab_size = 512;
  CLI::App app{"write_tokens: a text as a token file in llm.c's layout"};
  app.add_option("--text", text_path, "text file to tokenize")->check(CLI::ExistingFile);
  app.add_option("--tokenizer", tokenizer, "the text's bytes, or SentencePiece subwords (BPE or unigram) trained on the text")
      ->check(CLI::IsMember({"char", "bpe", "unigram"}));
  app.add_option("--vocab-size", vocab_size, "subword vocabulary size (bpe, unigram)")->check(CLI::PositiveNumber);
  app.add_option("--out", out, "folder for tokens.bin and the vocabulary");
  CLI11_PARSE(app, argc, argv);

  std::ifstream in(text_path, std::ios::binary);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::filesystem::create_directories(out);
  std::unique_ptr<tg::Tokenizer> vocab;
  if (tokenizer == "char") {
    auto chars = std::make_unique<tg::CharVocab>(text);
    std::ofstream(out + "/alphabet.txt") << chars->to_codes() << '\n';
    vocab = std::move(chars);
  } else {
    auto subwords = tg::SubwordTokenizer::train(
        text, {.model = tokenizer == "bpe" ? tg::SubwordModel::bpe : tg::SubwordModel::unigram, .vocab_size = vocab_size});
    subwords.save(out + "/tokenizer.model");
    vocab = std::make_unique<tg::SubwordTokenizer>(std::move(subwords));
  }
  tg::write_token_file(out + "/tokens.bin", vocab->encode(text), vocab->size());

  const tg::TokenFile file(out + "/tokens.bin", vocab->size());
  const std::vector<std::int64_t> ids(file.tokens().begin(), file.tokens().end());
  const bool same = vocab->decode(ids) == text;
  fmt::print("{}: {} characters as {} {} tokens ({:.3f} characters per token, {} in the vocabulary) in {}/tokens.bin, {} bytes\n",
             text_path, text.size(), file.size(), tokenizer, static_cast<double>(text.size()) / static_cast<double>(file.size()), vocab->size(),
             out, std::filesystem::file_size(out + "/tokens.bin"));
  if (file.size() > 16) {
    const auto window = tg::token_windows(file, 1, 16, /*seed=*/1, /*step=*/0);
    fmt::print("step 0's window of 16 tokens (seed 1): \"{}\"\n", vocab->decode(window.x));
  }
  fmt::print("{}\n", same ? "OK: the tokens read back decode to the text" : "MISMATCH: the tokens read back do not decode to the text");
  return same ? 0 : 1;
} catch (const std::exception& e) {
  fmt::print(stderr, "write_tokens: {}\n", e.what());
  return 1;
}
