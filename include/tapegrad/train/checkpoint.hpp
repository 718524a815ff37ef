// Checkpoints in the safetensors format (https://github.com/huggingface/safetensors, "Format"):
// an 8-byte little-endian header size N, N bytes of JSON naming each tensor's dtype, shape and
// byte range, then the raw little-endian row-major bytes. The format is read by PyTorch, JAX,
// NumPy and others, holds nothing executable, and can be checked completely before any value
// is used, which is why tapegrad uses it instead of a format of its own.
//
// Why the tensor-level functions live in train/ too: they need only tensors (autodiff/) and a
// row-major copy (ops/), but save(Module&)/load(Module&) need layers/module.hpp, which train/
// sees; keeping both halves in one file keeps one reader and one writer of the format.
//
//   tg::save(model, "step1000.safetensors", {{"step", "1000"}});
//   auto meta = tg::load(model, "step1000.safetensors");   // copy_ into the parameters
//
//   tg::save_safetensors("t.safetensors", {{"x", x}, {"mask", m}});
//   tg::SafetensorsFile f = tg::load_safetensors("t.safetensors");  // f.tensors in file order
//
// Dtypes: F32, F64, BOOL and I64 are tapegrad's float32, float64, bool_ and int64; a file that
// holds any other dtype (F16, BF16, I32...) is refused with a FormatError naming the tensor.
//
// Saving is atomic: the file is written under a temporary name in the destination directory,
// flushed to disk (fsync), then renamed over `path`, and the directory is synced. A failure at
// any point (disk full, no permission, a missing directory) removes the temporary and throws;
// `path` then still holds whatever it held before (or nothing). Only a failure of the last step,
// the directory's sync, comes after the rename: its IOError says that `path` holds the new file,
// which may not survive a power loss. Like every save-by-rename, a
// symbolic link at `path` is replaced by the new file rather than written through. A regular
// file saved over keeps its permissions (a private 0600 checkpoint stays private); a new file
// gets 0666 less the umask.
//
// Loading is safe on any input: the whole header is validated (sizes, JSON, types, dtypes,
// shapes with overflow-checked products, byte ranges inside the file and covering its data
// exactly, once) before any tensor is allocated, and BOOL bytes must be 0 or 1. A file that does
// not follow the format is a FormatError; nothing is ever read past the end of the file.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tapegrad/autodiff/error.hpp"
#include "tapegrad/autodiff/tensor.hpp"
#include "tapegrad/layers/module.hpp"

namespace tapegrad {

// The contents of a file violate the safetensors format or tapegrad's reading of it (truncated,
// bad JSON, a byte range out of bounds, an unsupported dtype...). The message names the file and,
// where there is one, the tensor.
class FormatError : public Error {
 public:
  using Error::Error;
};

// The operating system refused: a file that cannot be opened, read, written, synced or renamed.
// The message names the path and gives the system's reason.
class IOError : public Error {
 public:
  using Error::Error;
};

struct SafetensorsFile {
  std::vector<NamedTensor> tensors;             // in the order of the file's header
  std::map<std::string, std::string> metadata;  // the header's "__metadata__", if any

  // The tensor called `name`, or an undefined Tensor.
  Tensor find(const std::string& name) const;
};

// Writes `tensors` (names unique, non-empty, valid UTF-8, not "__metadata__"; every tensor
// defined) and `metadata` (valid UTF-8) to `path`. Views of any layout are written in row-major
// order. The header lists the tensors in the order given; their bytes are laid out by
// decreasing element size (so every tensor starts on a multiple of its element size) and the
// header is padded with spaces to a multiple of 8 bytes, so the data is aligned in the file for
// readers that map it.
void save_safetensors(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads every tensor of `path` into new contiguous tensors (no autograd state).
SafetensorsFile load_safetensors(const std::filesystem::path& path);

// save_safetensors of module.named_parameters().
void save(Module& module, const std::filesystem::path& path, const std::map<std::string, std::string>& metadata = {});

// Loads `path` into the module's parameters with copy_: they stay the same tensors (anything
// holding them sees the new values) and their versions bump. The file's names, shapes and dtypes
// must match the parameters exactly; otherwise a ValueError lists every difference (missing and
// unexpected names, shapes and dtypes with both values) and no parameter is changed. Returns the
// file's metadata.
std::map<std::string, std::string> load(Module& module, const std::filesystem::path& path);

}  // namespace tapegrad
