// Token files: a text's token ids on disk, read by memory-mapping, and training windows drawn
// from them as a pure function of (seed, step, rank), so that a resumed run and several processes
// see the same stream.
//
// The layout is llm.c's (dev/data/data_common.py, read by llmc/dataloader.h): a header of 256
// little-endian int32, [0] the magic 20240520, [1] the version 1, [2] the token count, the rest
// zero, then the tokens as little-endian uint16. nanoGPT's .bin files are those tokens without the
// header; TokenLayout::raw reads them (any even size; nothing to check but the ids).
//
//   tg::write_token_file("train.bin", tokenizer.encode(text), tokenizer.size());
//   tg::TokenFile file("train.bin", tokenizer.size());
//   auto [x, y] = tg::token_windows(file, 32, 64, /*seed=*/1, step);
//
// A file that breaks its layout is a FormatError naming the file, one the system cannot open an
// IOError (both in checkpoint.hpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>

#include "tapegrad/train/data.hpp"

namespace tapegrad {

enum class TokenLayout { llmc, raw };

// A token file mapped read-only, its header (llmc) and every id (< vocab_size) checked on opening.
// Movable, not copyable; the mapping ends with the object. Replace a mapped file by writing a new
// one over it (write_token_file renames it into place: the mapping keeps the old one); truncating
// it in place while it is mapped ends the process with SIGBUS, as for any mapped file.
class TokenFile {
 public:
  // vocab_size in [1, 65536] (uint16 ids).
  TokenFile(const std::filesystem::path& path, std::int64_t vocab_size, TokenLayout layout = TokenLayout::llmc);
  ~TokenFile();
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  std::int64_t size() const noexcept { return static_cast<std::int64_t>(tokens_.size()); }
  std::int64_t vocab_size() const noexcept { return vocab_size_; }
  std::span<const std::uint16_t> tokens() const noexcept { return tokens_; }

 private:
  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  std::span<const std::uint16_t> tokens_;
  std::int64_t vocab_size_ = 0;
};

// Writes `ids` (each in [0, vocab_size), vocab_size in [1, 65536]) to `path` in llm.c's layout,
// atomically as checkpoints are saved (a temporary renamed over `path`).
void write_token_file(const std::filesystem::path& path, std::span<const std::int64_t> ids, std::int64_t vocab_size);

// random_windows over the file with a generator seeded from (seed, step, rank) alone: the windows
// of a step do not depend on what was drawn before. step >= 0, rank >= 0. In data-parallel
// training pass the global micro-batch index as `rank`: the windows then do not depend on the
// process count either.
Windows token_windows(const TokenFile& file, std::int64_t batch, std::int64_t length, std::uint64_t seed, std::int64_t step,
                      std::int64_t rank = 0);

}  // namespace tapegrad
