// Internal: the files train/ writes and reads (checkpoints, token files, tokenizer models) share
// one path check, one atomic save and one way of opening a file to read.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>

namespace tapegrad::detail {

std::string errno_text(int err);

// A path must name a file: not empty, not ending in a directory separator (ValueError).
void check_path(const char* fn, const std::filesystem::path& path);

class Fd {
 public:
  explicit Fd(int fd) noexcept : fd_(fd) {}
  ~Fd();
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const noexcept { return fd_; }
  int release() noexcept { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// Opens `path` read-only after check_path; an IOError unless it opens and is a regular file.
// `size` receives its length in bytes.
int open_regular(const char* fn, const std::filesystem::path& path, std::uint64_t& size);
// The whole of a regular file (IOError when it cannot be read).
std::string read_all(const char* fn, const std::filesystem::path& path);

// The temporary a save writes before renaming it over the destination. Until commit() it is
// removed when this object dies, on every path out of save, exceptions included.
class TempFile {
 public:
  TempFile(const char* fn, const std::filesystem::path& final_path);
  ~TempFile();
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  void write_all(const void* data, std::size_t n);
  // fsync, close, rename over the destination, then sync the directory so the rename itself
  // survives a power loss.
  void commit();

 private:
  [[noreturn]] void fail_io(const char* what, int err) const;

  const char* fn_;
  std::filesystem::path final_, path_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace tapegrad::detail
