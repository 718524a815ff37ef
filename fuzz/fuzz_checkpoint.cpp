// libFuzzer target for safetensors checkpoints: load_safetensors on hostile files.
//
// An input is a file in one of two forms, chosen by its first byte:
// - raw: the rest of the input is the file itself;
// - repeated: a header made of one fragment repeated up to 20,000 times ("%i" in the fragment
//   becomes the repetition's number, "%b" and "%e" the byte offsets of a tensor of the chosen
//   size), between a prefix and a suffix, and zero bytes for the data. Small inputs so reach
//   headers of megabytes: a reader that is not linear in the header is a timeout, which
//   ./dev fuzz sets per input for this target.
// Every load either throws a FormatError or returns tensors. Each tensor's bytes must be the
// file's bytes at its data_offsets (the header read again apart, so that a reader that copies
// the wrong bytes is seen); then they are saved again and loaded back, and must come back the
// same (names in order, dtypes, shapes, bytes, metadata).
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fuzz_support.hpp"
#include "train/safetensors.hpp"

namespace {
using namespace fuzz;
namespace fs = std::filesystem;

const fs::path& scratch() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / fmt::format("tapegrad-fuzz-checkpoint-{}", ::getpid());
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

std::string repeated_file(FuzzedDataProvider& fdp) {
  const auto count = fdp.ConsumeIntegralInRange<std::uint32_t>(0, 20000);
  const auto size = fdp.ConsumeIntegralInRange<std::uint32_t>(0, 64);  // up to 1.28 MB: runs across read pieces
  const std::string prefix = fdp.ConsumeRandomLengthString(64), suffix = fdp.ConsumeRandomLengthString(64);
  const std::string fragment = fdp.ConsumeRemainingBytesAsString();
  std::string header = prefix;
  for (std::uint32_t i = 0; i < count; ++i) {
    std::string f = replace_all(fragment, "%i", std::to_string(i));
    f = replace_all(f, "%b", std::to_string(std::uint64_t{i} * size));
    header += replace_all(f, "%e", std::to_string(std::uint64_t{i + 1} * size));
    if (header.size() > (std::size_t{8} << 20)) break;  // a few MiB is plenty to show a slow reader
  }
  header += suffix;
  const std::uint64_t length = header.size();
  std::string file(reinterpret_cast<const char*>(&length), sizeof length);
  file += header;
  // Data of 0 and 1 bytes (valid BOOL too), not all zero, so that misplaced bytes show.
  for (std::size_t k = 0; k < std::size_t{count} * size; ++k) file.push_back(static_cast<char>(k % 3 == 0));
  return file;
}

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  require(static_cast<bool>(out), "cannot write the scratch file {}", p.string());
}

void same(const tg::SafetensorsFile& a, const tg::SafetensorsFile& b) {
  require(a.metadata == b.metadata, "the metadata changed through save and load");
  require(a.tensors.size() == b.tensors.size(), "{} tensors saved, {} loaded back", a.tensors.size(), b.tensors.size());
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const Tensor &x = a.tensors[i].tensor, &y = b.tensors[i].tensor;
    require(a.tensors[i].name == b.tensors[i].name, "tensor {} came back named '{}' (was '{}')", i, b.tensors[i].name, a.tensors[i].name);
    require(x.dtype() == y.dtype() && x.shape() == y.shape(), "tensor '{}' came back as another dtype or shape", a.tensors[i].name);
    const auto bytes = static_cast<std::size_t>(x.numel()) * tg::itemsize(x.dtype());
    require(bytes == 0 || std::memcmp(x.raw_data(), y.raw_data(), bytes) == 0, "tensor '{}' came back with other bytes", a.tensors[i].name);
  }
}

// The loaded tensors hold the file's bytes at their offsets, in header order.
void holds_the_files_bytes(const std::string& file, const tg::SafetensorsFile& loaded) {
  std::uint64_t n = 0;
  std::memcpy(&n, file.data(), sizeof n);
  const std::string_view header(file.data() + sizeof n, n);
  const std::uint64_t data_start = sizeof n + n;
  tg::detail::SafetensorsHeader parsed;
  require(tg::detail::read_safetensors_header(header, file.size() - data_start, parsed).empty(), "the header read apart was refused");
  require(parsed.tensors.size() == loaded.tensors.size(), "{} tensors in the header, {} loaded", parsed.tensors.size(), loaded.tensors.size());
  for (std::size_t i = 0; i < parsed.tensors.size(); ++i) {
    const tg::detail::TensorSpec& s = parsed.tensors[i];
    const Tensor& t = loaded.tensors[i].tensor;
    require(s.end - s.begin == static_cast<std::uint64_t>(t.numel()) * tg::itemsize(t.dtype()), "tensor '{}' has another size", s.name);
    require(s.end == s.begin || std::memcmp(t.raw_data(), file.data() + data_start + s.begin, s.end - s.begin) == 0,
            "tensor '{}' does not hold the file's bytes [{}, {})", s.name, s.begin, s.end);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider fdp(data, size);
  const std::string file = fdp.ConsumeBool() ? repeated_file(fdp) : fdp.ConsumeRemainingBytesAsString();
  const fs::path in = scratch() / "in.safetensors", out = scratch() / "out.safetensors";
  write(in, file);
  tg::SafetensorsFile loaded;
  try {
    loaded = tg::load_safetensors(in);
  } catch (const tg::FormatError& e) {
    narrate("refused: {}", e.what());
    return 0;
  }
  narrate("loaded {} tensors", loaded.tensors.size());
  holds_the_files_bytes(file, loaded);
  try {
    tg::save_safetensors(out, loaded.tensors, loaded.metadata);
  } catch (const tg::ValueError& e) {
    // A file may hold what save refuses to write (an empty name is refused on load already).
    narrate("save refused: {}", e.what());
    return 0;
  }
  same(loaded, tg::load_safetensors(out));
  return 0;
}
