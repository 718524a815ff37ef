// Safetensors checkpoints (see checkpoint.hpp for the format and the guarantees).
//
// nlohmann-json reads the header (safetensors_header.cpp) and escapes strings when writing it;
// it is private to these files, so no public header and no consumer of the installed library
// sees it. The reader never trusts a number from the file before checking it against the file's
// real size, so a corrupt or hostile file costs memory in proportion to its size (a small
// multiple of it: each shape entry of two bytes becomes an int64, each tensor entry a tensor)
// and ends in a FormatError.
#include "tapegrad/train/checkpoint.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>
#include <set>
#include <string_view>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "autodiff/check.hpp"
#include "train/files.hpp"
#include "train/safetensors.hpp"
#include "tapegrad/autodiff/tape.hpp"
#include "tapegrad/ops/inplace.hpp"
#include "tapegrad/ops/view.hpp"

// The format is little-endian and tensors are copied byte for byte; a big-endian port would need
// byte swapping here, which no target of this library needs today (x86-64, AArch64).
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace tapegrad {
namespace {
using detail::fail;
using detail::printable;
using detail::shape_str;
using detail::valid_utf8;
namespace fs = std::filesystem;

constexpr std::uint64_t kLengthBytes = 8;
// The reference implementation refuses larger headers (to bound JSON parsing); refusing them too
// means every file this reader accepts is readable there as well.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
// Reads of the data section gather small tensors into pieces of this size.
constexpr std::uint64_t kReadPiece = std::uint64_t{1} << 20;

std::string json_string(const std::string& s) { return nlohmann::json(s).dump(); }

[[noreturn]] void fail_header_size(const char* fn, std::size_t count, std::uint64_t bytes, const char* at_least) {
  fail<ValueError>("{}: the header for {} tensors would take {}{} bytes, more than the format's limit of {}; save "
                   "them in several files",
                   fn, count, at_least, bytes, kMaxHeaderBytes);
}

}  // namespace

void detail::write_safetensors(const char* fn, const fs::path& path, const std::vector<NamedTensor>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  check_path(fn, path);
  std::unordered_map<std::string_view, std::size_t> seen;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::string& name = tensors[i].name;
    if (name.empty()) fail<ValueError>("{}: tensors[{}] has an empty name; every tensor needs a name", fn, i);
    if (!valid_utf8(name))
      fail<ValueError>("{}: tensors[{}] has the name '{}', which is not valid UTF-8 (safetensors headers are JSON)", fn,
                       i, printable(name));
    if (name == "__metadata__")
      fail<ValueError>("{}: tensors[{}] is named '__metadata__', which the format reserves for the metadata", fn, i);
    if (auto [it, fresh] = seen.emplace(name, i); !fresh)
      fail<ValueError>("{}: tensors[{}] and tensors[{}] are both named '{}'; names must be unique", fn, it->second, i,
                       printable(name));
    if (!tensors[i].tensor.defined())
      fail<ValueError>("{}: tensor '{}' (tensors[{}]) is an undefined tensor", fn, printable(name), i);
  }
  for (const auto& [key, value] : metadata) {
    if (!valid_utf8(key)) fail<ValueError>("{}: metadata key '{}' is not valid UTF-8", fn, printable(key));
    if (!valid_utf8(value))
      fail<ValueError>("{}: metadata value of key '{}' is not valid UTF-8 ('{}')", fn, printable(key), printable(value));
  }

  // Escaping only lengthens strings, so this bound refuses an oversized header before building it.
  std::uint64_t at_least = 2;
  for (const auto& t : tensors) at_least += t.name.size() + 3;
  for (const auto& [key, value] : metadata) at_least += key.size() + value.size() + 6;
  if (at_least > kMaxHeaderBytes) fail_header_size(fn, tensors.size(), at_least, "at least ");

  auto byte_size = [&](std::size_t i) {
    return static_cast<std::uint64_t>(tensors[i].tensor.numel()) * itemsize(tensors[i].tensor.dtype());
  };

  // Bytes by decreasing element size, stable: with the header padded to 8 bytes, every tensor then
  // starts at a multiple of its own element size in the file, without gaps (the format allows none).
  std::vector<std::size_t> layout(tensors.size());
  std::iota(layout.begin(), layout.end(), 0);
  std::stable_sort(layout.begin(), layout.end(),
                   [&](std::size_t a, std::size_t b) {
                     return itemsize(tensors[a].tensor.dtype()) > itemsize(tensors[b].tensor.dtype());
                   });
  std::vector<std::uint64_t> begin(tensors.size());
  std::uint64_t offset = 0;
  for (std::size_t i : layout) {
    begin[i] = offset;
    offset += byte_size(i);
  }

  // Written by hand (nlohmann only escapes the strings) so the tensors keep the caller's order.
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (const auto& [key, value] : metadata)
      header += fmt::format("{}{}:{}", header.back() == '{' ? "" : ",", json_string(key), json_string(value));
    header += "}";
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i].tensor;
    header += fmt::format("{}{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                          header.size() > 1 ? "," : "", json_string(tensors[i].name), detail::safetensors_code(t.dtype()),
                          fmt::join(t.shape(), ","), begin[i], begin[i] + byte_size(i));
  }
  header += "}";
  header.append((kLengthBytes - header.size() % kLengthBytes) % kLengthBytes, ' ');
  if (header.size() > kMaxHeaderBytes) fail_header_size(fn, tensors.size(), header.size(), "");

  detail::TempFile file(fn, path);
  const std::uint64_t length = header.size();
  file.append(&length, sizeof length);
  file.append(header.data(), header.size());
  // One row-major copy at a time (only strided views need one), made without recording.
  const NoGradGuard no_grad;
  for (std::size_t i : layout) {
    if (byte_size(i) == 0) continue;
    const Tensor row_major = contiguous(tensors[i].tensor);
    file.append(row_major.raw_data(), static_cast<std::size_t>(byte_size(i)));
  }
  file.commit();
}

// ---- Reading ---------------------------------------------------------------------------------

namespace {

class Reader {
 public:
  Reader(const char* fn, const fs::path& path) : fn_(fn), path_(path), fd_(detail::open_regular(fn, path, size_)) {}

  SafetensorsFile read() {
    if (size_ < kLengthBytes)
      format_fail("the file is {} bytes long, shorter than the 8-byte header length every safetensors file starts "
                  "with (truncated?)",
                  size_);
    std::uint64_t n = 0;
    read_at(0, &n, sizeof n);
    if (n > kMaxHeaderBytes)
      format_fail("the header length field says {} bytes, more than the format's limit of {} (corrupt file?)", n,
                  kMaxHeaderBytes);
    if (n > size_ - kLengthBytes)
      format_fail("the header length field says {} bytes, but only {} bytes follow it (truncated?)", n,
                  size_ - kLengthBytes);
    data_start_ = kLengthBytes + n;
    data_size_ = size_ - data_start_;
    std::string text(n, '\0');
    read_at(kLengthBytes, text.data(), n);

    // The format's reference reader refuses a byte-order mark, which nlohmann's parser skips.
    if (text.starts_with("\xEF\xBB\xBF")) format_fail("the header starts with a UTF-8 byte-order mark, which the format does not allow");
    // JSON allows no raw NUL, but nlohmann's parser takes one as the end of its input and would
    // ignore whatever follows it.
    if (const auto nul = text.find('\0'); nul != std::string::npos)
      format_fail("the header holds a NUL byte at header offset {}, which JSON does not allow", nul);
    detail::SafetensorsHeader header;
    if (const std::string problem = detail::read_safetensors_header(text, data_size_, header); !problem.empty())
      format_fail("{}", problem);
    text = std::string();  // the header's text is not needed any more: free it before the data comes

    SafetensorsFile file;
    file.metadata = std::move(header.metadata);
    file.tensors.reserve(header.tensors.size());
    for (detail::TensorSpec& s : header.tensors) file.tensors.push_back({std::move(s.name), empty(s.shape, s.dtype)});
    read_data(header.tensors, header.file_order, file.tensors);
    return file;
  }

 private:
  // A fresh tensor's bytes, to fill (data<T>() for its dtype: the pointer the public API hands out).
  static void* bytes_of(const Tensor& t) {
    switch (t.dtype()) {
      case float32: return t.data<float>();
      case float64: return t.data<double>();
      case bool_: return t.data<bool>();
      case int64: return t.data<std::int64_t>();
    }
    return nullptr;
  }

  // The tensors' bytes, in the order they lie in the file (the header checked that they cover it
  // exactly once, and gave that order with non-decreasing ends): tensors of kReadPiece bytes or
  // more read straight into their storage, runs of smaller ones a piece at a time through one
  // buffer, so that many small tensors cost a few large reads rather than one system call each.
  void read_data(const std::vector<detail::TensorSpec>& specs, const std::vector<std::size_t>& order,
                 std::vector<NamedTensor>& tensors) const {
    std::vector<char> piece;
    for (std::size_t i = 0; i < order.size();) {
      const detail::TensorSpec& first = specs[order[i]];
      if (first.end - first.begin >= kReadPiece) {
        read_at(data_start_ + first.begin, bytes_of(tensors[order[i]].tensor), first.end - first.begin);
        check_bools(tensors[order[i]]);
        ++i;
        continue;
      }
      std::size_t j = i;
      while (j < order.size() && specs[order[j]].end - first.begin <= kReadPiece) ++j;
      piece.resize(static_cast<std::size_t>(specs[order[j - 1]].end - first.begin));
      read_at(data_start_ + first.begin, piece.data(), piece.size());
      for (; i < j; ++i) {
        const detail::TensorSpec& s = specs[order[i]];
        if (s.end == s.begin) continue;
        std::memcpy(bytes_of(tensors[order[i]].tensor), piece.data() + (s.begin - first.begin), s.end - s.begin);
        check_bools(tensors[order[i]]);
      }
    }
  }

  template <class... Args> [[noreturn]] void format_fail(fmt::format_string<Args...> f, Args&&... args) const {
    fail<FormatError>("{}: '{}' is not a valid safetensors file: {}", fn_, path_.string(),
                      fmt::format(f, std::forward<Args>(args)...));
  }
  void read_at(std::uint64_t offset, void* out, std::uint64_t n) const {
    detail::read_at(fn_, path_, fd_.get(), size_, offset, out, n);
  }

  // A bool byte other than 0 or 1 is not a value a C++ bool may hold.
  void check_bools(const NamedTensor& t) const {
    if (t.tensor.dtype() != bool_) return;
    const auto* p = static_cast<const unsigned char*>(t.tensor.raw_data());
    for (std::int64_t i = 0; i < t.tensor.numel(); ++i)
      if (p[i] > 1) format_fail("tensor '{}' (BOOL) holds byte {} at element {}; booleans must be 0 or 1", printable(t.name), p[i], i);
  }

  const char* fn_;
  fs::path path_;
  std::uint64_t size_ = 0;  // before fd_: open_regular sets it
  detail::Fd fd_;
  std::uint64_t data_start_ = 0, data_size_ = 0;
};

}  // namespace

Tensor SafetensorsFile::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return t.tensor;
  return {};
}

void save_safetensors(const fs::path& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  detail::write_safetensors("save_safetensors", path, tensors, metadata);
}

SafetensorsFile detail::read_safetensors(const char* fn, const fs::path& path) { return Reader(fn, path).read(); }

SafetensorsFile load_safetensors(const fs::path& path) { return Reader("load_safetensors", path).read(); }

void save(Module& module, const fs::path& path, const std::map<std::string, std::string>& metadata) {
  detail::write_safetensors("save", path, module.named_parameters(), metadata);
}

std::vector<std::string> detail::fit_problems(const std::vector<NamedTensor>& params, const std::vector<NamedTensor>& tensors) {
  std::unordered_map<std::string_view, const Tensor*> in_file;
  for (const auto& t : tensors) in_file.emplace(t.name, &t.tensor);
  auto describe = [](const Tensor& t) { return fmt::format("{} {}", t.dtype(), shape_str(t.shape())); };
  std::vector<std::string> problems;
  std::set<std::string_view> in_module;
  for (const auto& [name, p] : params) {
    if (!in_module.insert(name).second) {
      problems.push_back(fmt::format("the module has two parameters named '{}'", name));
      continue;
    }
    if (!p.defined()) {
      problems.push_back(fmt::format("'{}': the module's parameter is an undefined tensor", name));
      continue;
    }
    const auto it = in_file.find(name);
    if (it == in_file.end()) {
      problems.push_back(fmt::format("missing '{}': the module has {}, the file has no tensor of that name", name,
                                     describe(p)));
    } else {
      const Tensor& t = *it->second;
      if (t.dtype() != p.dtype())
        problems.push_back(fmt::format("'{}': dtype {} in the module, {} ({}) in the file", name, p.dtype(), t.dtype(),
                                       detail::safetensors_code(t.dtype())));
      if (t.shape() != p.shape())
        problems.push_back(fmt::format("'{}': shape {} in the module, {} in the file", name, shape_str(p.shape()),
                                       shape_str(t.shape())));
    }
    // What copy_ would refuse, found now rather than after other parameters were written.
    if (!p.is_leaf())
      problems.push_back(fmt::format("'{}': the module's parameter is the output of a recorded op whose graph is "
                                     "alive; parameters must be leaves",
                                     name));
    for (std::size_t d = 0; d < p.shape().size(); ++d)
      if (p.strides()[d] == 0 && p.shape()[d] > 1) {
        problems.push_back(fmt::format("'{}': the module's parameter is an expanded view (strides {}), which cannot "
                                       "be written in place",
                                       name, shape_str(p.strides())));
        break;
      }
  }
  for (const auto& t : tensors)
    if (!in_module.contains(t.name))
      problems.push_back(fmt::format("unexpected '{}': the file has {}, the module has no parameter of that name",
                                     printable(t.name), describe(t.tensor)));
  return problems;
}

void detail::copy_fitted(const std::vector<NamedTensor>& params, const std::vector<NamedTensor>& tensors) {
  std::unordered_map<std::string_view, const Tensor*> in_file;
  for (const auto& t : tensors) in_file.emplace(t.name, &t.tensor);
  for (const auto& [name, p] : params) copy_(p, *in_file.at(name));
}

std::map<std::string, std::string> load(Module& module, const fs::path& path) {
  SafetensorsFile file = Reader("load", path).read();
  const std::vector<NamedTensor> params = module.named_parameters();
  // Every problem is collected before anything is written, so a checkpoint that does not fit
  // leaves the module exactly as it was, and one message shows the whole difference.
  const std::vector<std::string> problems = detail::fit_problems(params, file.tensors);
  if (!problems.empty())
    fail<ValueError>("load: '{}' does not fit the module ({} problem{}; no parameter was changed):\n  {}",
                     path.string(), problems.size(), problems.size() == 1 ? "" : "s", fmt::join(problems, "\n  "));
  detail::copy_fitted(params, file.tensors);
  return std::move(file.metadata);
}

}  // namespace tapegrad
