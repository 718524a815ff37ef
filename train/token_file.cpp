// Token files in llm.c's layout, mapped read-only (tapegrad/train/token_file.hpp).
#include "tapegrad/train/token_file.hpp"

#include <sys/mman.h>

#include <array>
#include <bit>
#include <cerrno>
#include <limits>
#include <utility>
#include <vector>

#include "autodiff/check.hpp"
#include "tapegrad/train/checkpoint.hpp"
#include "train/files.hpp"
#include "train/windows.hpp"

// Both sections are little-endian and mapped as they lie; a big-endian host would need swaps.
static_assert(std::endian::native == std::endian::little, "token files assume a little-endian host");

namespace tapegrad {
namespace {
using detail::fail;

constexpr std::int32_t kMagic = 20240520, kVersion = 1;
constexpr std::size_t kHeaderInts = 256, kHeaderBytes = kHeaderInts * sizeof(std::int32_t);
constexpr std::int64_t kMaxVocab = std::int64_t{1} << 16;

void check_vocab_size(const char* fn, std::int64_t vocab_size) {
  if (vocab_size < 1 || vocab_size > kMaxVocab)
    fail<ValueError>("{}: argument 'vocab_size' must be in [1, {}] (ids are uint16), got {}", fn, kMaxVocab, vocab_size);
}

}  // namespace

TokenFile::TokenFile(const std::filesystem::path& path, std::int64_t vocab_size, TokenLayout layout) : vocab_size_(vocab_size) {
  constexpr const char* fn = "TokenFile";
  check_vocab_size(fn, vocab_size);
  if (layout != TokenLayout::llmc && layout != TokenLayout::raw)
    fail<ValueError>("{}: argument 'layout' must be TokenLayout::llmc or TokenLayout::raw, got the value {}", fn, static_cast<int>(layout));
  std::uint64_t size = 0;
  const detail::Fd fd(detail::open_regular(fn, path, size));
  auto format_fail = [&](const std::string& problem) {
    fail<FormatError>("{}: '{}' is not a token file in {} layout: {}", fn, path.string(),
                      layout == TokenLayout::llmc ? "llm.c's" : "the raw uint16", problem);
  };
  const std::uint64_t header = layout == TokenLayout::llmc ? kHeaderBytes : 0;
  if (size < header) format_fail(fmt::format("it is {} bytes long, shorter than the {}-byte header (truncated?)", size, header));
  if ((size - header) % 2 != 0) format_fail(fmt::format("its {} bytes after the header are not a whole number of uint16", size - header));
  const std::uint64_t count = (size - header) / 2;
  if (layout == TokenLayout::llmc) {
    std::array<std::int32_t, kHeaderInts> h{};
    detail::read_at(fn, path, fd.get(), size, 0, h.data(), kHeaderBytes);
    if (h[0] != kMagic) format_fail(fmt::format("the header's magic is {}, not {}", h[0], kMagic));
    if (h[1] != kVersion)
      format_fail(fmt::format("the header's version is {}; only version {} (uint16 tokens) is read", h[1], kVersion));
    if (h[2] < 0 || static_cast<std::uint64_t>(h[2]) != count)
      format_fail(fmt::format("the header counts {} tokens but the file holds {} after the header", h[2], count));
  }
  if (size > 0) {
    map_ = ::mmap(nullptr, static_cast<std::size_t>(size), PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (map_ == MAP_FAILED) {
      map_ = nullptr;
      fail<IOError>("{}: cannot map '{}': {}", fn, path.string(), detail::errno_text(errno));
    }
    map_bytes_ = static_cast<std::size_t>(size);
  }
  const auto* bytes = static_cast<const unsigned char*>(map_);
  tokens_ = {reinterpret_cast<const std::uint16_t*>(bytes + header), static_cast<std::size_t>(count)};
  for (std::size_t i = 0; i < tokens_.size(); ++i)
    if (const std::uint16_t id = tokens_[i]; id >= vocab_size) {
      ::munmap(map_, map_bytes_);  // a constructor that throws runs no destructor
      format_fail(fmt::format("token {} is id {}, not below vocab_size = {}", i, id, vocab_size));
    }
}

TokenFile::~TokenFile() {
  if (map_) ::munmap(map_, map_bytes_);
}

TokenFile::TokenFile(TokenFile&& other) noexcept
    : map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      tokens_(std::exchange(other.tokens_, {})),
      vocab_size_(other.vocab_size_) {}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    if (map_) ::munmap(map_, map_bytes_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, {});
    vocab_size_ = other.vocab_size_;
  }
  return *this;
}

void write_token_file(const std::filesystem::path& path, std::span<const std::int64_t> ids, std::int64_t vocab_size) {
  constexpr const char* fn = "write_token_file";
  check_vocab_size(fn, vocab_size);
  detail::check_path(fn, path);
  if (ids.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    fail<ValueError>("{}: argument 'ids' holds {} tokens; the header's int32 count holds at most {}", fn, ids.size(),
                     std::numeric_limits<std::int32_t>::max());
  detail::check_ids(fn, ids, vocab_size);
  std::vector<std::uint16_t> tokens(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) tokens[i] = static_cast<std::uint16_t>(ids[i]);
  std::array<std::int32_t, kHeaderInts> header{};
  header[0] = kMagic;
  header[1] = kVersion;
  header[2] = static_cast<std::int32_t>(ids.size());
  detail::TempFile file(fn, path);
  file.write_all(header.data(), kHeaderBytes);
  file.write_all(tokens.data(), tokens.size() * sizeof(std::uint16_t));
  file.commit();
}

Windows token_windows(const TokenFile& file, std::int64_t batch, std::int64_t length, std::uint64_t seed, std::int64_t step,
                      std::int64_t rank) {
  if (step < 0 || rank < 0)
    fail<ValueError>("token_windows: arguments 'step' and 'rank' must be >= 0, got step = {} and rank = {}", step, rank);
  // SplitMix64's finaliser over the three keys in turn: nearby (seed, step, rank) give unrelated
  // generators.
  auto mix = [](std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  };
  Generator gen(mix(mix(mix(seed) + static_cast<std::uint64_t>(step)) + static_cast<std::uint64_t>(rank)));
  return detail::draw_windows("token_windows", file.tokens(), batch, length, gen);
}

}  // namespace tapegrad
