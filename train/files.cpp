// The files train/ writes and reads (files.hpp): the path check, reading, atomic saves.
#include "train/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <system_error>
#include <utility>

#include "autodiff/check.hpp"
#include "tapegrad/train/checkpoint.hpp"

namespace tapegrad::detail {
namespace fs = std::filesystem;

std::string errno_text(int err) { return std::generic_category().message(err); }

void check_path(const char* fn, const fs::path& path) {
  if (path.empty()) fail<ValueError>("{}: argument 'path' must name a file, got an empty path", fn);
  if (!path.has_filename())
    fail<ValueError>("{}: argument 'path' must name a file, got '{}', which ends in a directory separator", fn, path.string());
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

int open_regular(const char* fn, const fs::path& path, std::uint64_t& size) {
  check_path(fn, path);
  // O_NONBLOCK: opening a FIFO must not hang; it is refused as not a regular file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (const int err = errno; fd < 0) fail<IOError>("{}: cannot open '{}': {}", fn, path.string(), errno_text(err));
  Fd owned(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail<IOError>("{}: cannot stat '{}': {}", fn, path.string(), errno_text(errno));
  if (!S_ISREG(st.st_mode)) fail<IOError>("{}: '{}' is not a regular file", fn, path.string());
  size = static_cast<std::uint64_t>(st.st_size);
  return owned.release();
}

void read_at(const char* fn, const fs::path& path, int fd, std::uint64_t size, std::uint64_t offset, void* out,
             std::uint64_t n) {
  auto* p = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, std::min<std::uint64_t>(n, std::uint64_t{1} << 30), static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail<IOError>("{}: cannot read '{}': {}", fn, path.string(), errno_text(errno));
    if (r == 0)
      fail<IOError>("{}: '{}' ended at byte {} while reading it, before the {} bytes it had when opened; was it "
                    "changed while being read?",
                    fn, path.string(), offset, size);
    p += r;
    offset += static_cast<std::uint64_t>(r);
    n -= static_cast<std::uint64_t>(r);
  }
}

std::string read_all(const char* fn, const fs::path& path) {
  std::uint64_t size = 0;
  const Fd fd(open_regular(fn, path, size));
  std::string bytes(static_cast<std::size_t>(size), '\0');
  read_at(fn, path, fd.get(), size, 0, bytes.data(), size);
  return bytes;
}

TempFile::TempFile(const char* fn, const fs::path& final_path) : fn_(fn), final_(final_path) {
  check_path(fn, final_path);
  static std::atomic<std::uint64_t> counter{0};
  const fs::path dir = final_path.has_parent_path() ? final_path.parent_path() : fs::path(".");
  // A hidden name next to the destination (rename() is atomic only within one filesystem),
  // short enough for NAME_MAX whatever the destination's name; O_EXCL makes it ours alone.
  const std::string base = final_path.filename().string().substr(0, 100);
  int err = 0;
  for (int attempt = 0; attempt < 100; ++attempt) {
    const auto tick = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    path_ = dir / fmt::format(".{}.{}-{}-{:x}.tmp", base, ::getpid(), counter.fetch_add(1), tick & 0xFFFFFF);
    // 0666 less the umask: the permissions any newly created file would get.
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ >= 0) return;
    err = errno;
    if (err != EEXIST) break;
  }
  fail<IOError>("{}: cannot create a temporary file next to '{}' (as '{}'): {}", fn_, final_.string(), path_.string(), errno_text(err));
}
TempFile::~TempFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(path_.c_str());
}

void TempFile::write_all(const void* data, std::size_t n) {
  flush();
  write_through(data, n);
}

void TempFile::flush() {
  write_through(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void TempFile::write_through(const void* data, std::size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, std::min<std::size_t>(n, std::size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail_io("writing", w < 0 ? errno : EIO);
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void TempFile::append(const void* data, std::size_t n) {
  constexpr std::size_t kBuffer = std::size_t{1} << 20;
  if (buffer_.size() + n > kBuffer) flush();
  if (n >= kBuffer) return write_through(data, n);
  buffer_.reserve(kBuffer);
  const auto* p = static_cast<const char*>(data);
  buffer_.insert(buffer_.end(), p, p + n);
}

void TempFile::commit() {
  flush();
  // A file saved over keeps its permissions (a private 0600 checkpoint stays private); a new one
  // gets 0666 less the umask, as any newly created file.
  struct stat old {};
  if (::stat(final_.c_str(), &old) == 0 && S_ISREG(old.st_mode) && ::fchmod(fd_, old.st_mode & 07777) != 0)
    fail_io("setting the permissions of", errno);
  while (::fsync(fd_) != 0)
    if (errno != EINTR) fail_io("syncing", errno);
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0 && errno != EINTR) fail_io("closing", errno);
  if (::rename(path_.c_str(), final_.c_str()) != 0) fail_io("renaming", errno);
  committed_ = true;
  const fs::path dir = path_.parent_path();  // where the constructor put the temporary
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  const int err = dfd.get() < 0 || ::fsync(dfd.get()) != 0 ? errno : 0;
  // EINVAL: the filesystem has no directory sync; there is nothing more to do.
  if (err != 0 && err != EINVAL && err != EINTR)
    fail<IOError>(
        "{}: '{}' was written completely and renamed into place, but syncing its directory '{}' "
        "failed ({}); the new file may not survive a power loss",
        fn_, final_.string(), dir.string(), errno_text(err));
}

void TempFile::fail_io(const char* what, int err) const {
  fail<IOError>(
      "{}: could not save '{}': {} the temporary '{}' failed: {}; the temporary was removed and '{}' "
      "was left as it was",
      fn_, final_.string(), what, path_.string(), errno_text(err), final_.string());
}

}  // namespace tapegrad::detail
