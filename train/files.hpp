// Internal: the files train/ writes and reads (checkpoints, token files, tokenizer models) share
// one path check, one atomic save and one way of opening a file to read.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace tapegrad::detail {

std::string errno_text(int err);

// A path must name a file: not empty, not ending in a directory separator (ValueError). Savers
// call it before any other work, so a bad path is the first error, not one found after the data.
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

// Opens `path` read-only after checking that it names a file (not empty, not ending in a
// directory separator: a ValueError); an IOError unless it opens and is a regular file. `size`
// receives its length in bytes.
int open_regular(const char* fn, const std::filesystem::path& path, std::uint64_t& size);
// Exactly n bytes at `offset` of the file `fd` opened with `size` bytes; every range asked for
// lies inside `size`, so a short read means the file shrank while being read (an IOError).
void read_at(const char* fn, const std::filesystem::path& path, int fd, std::uint64_t size, std::uint64_t offset,
             void* out, std::uint64_t n);
// The whole of a regular file (IOError when it cannot be read).
std::string read_all(const char* fn, const std::filesystem::path& path);

// The temporary a save writes before renaming it over the destination, after the path check
// open_regular makes. Until commit() it is removed when this object dies, on every path out of
// save, exceptions included.
class TempFile {
 public:
  TempFile(const char* fn, const std::filesystem::path& final_path);
  ~TempFile();
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  // Writes after what append() has gathered, so the two can be mixed.
  void write_all(const void* data, std::size_t n);
  // Gathers small writes into large ones (the role fwrite's buffer plays); big ones go straight
  // through without a copy. commit() writes what is left.
  void append(const void* data, std::size_t n);
  // fsync, close, rename over the destination, then sync the directory so the rename itself
  // survives a power loss.
  void commit();

 private:
  [[noreturn]] void fail_io(const char* what, int err) const;
  void flush();  // writes what append() has gathered
  void write_through(const void* data, std::size_t n);

  const char* fn_;
  std::filesystem::path final_, path_;
  int fd_ = -1;
  bool committed_ = false;
  std::vector<char> buffer_;
};

}  // namespace tapegrad::detail
