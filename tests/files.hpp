// Scratch files for the suites that write files (checkpoints, token files, tokenizer models).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace tg_test {

// A directory of its own for each test, removed afterwards.
struct TempDir {
  TempDir() {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() / fmt::format("tapegrad-test-{}-{}", ::getpid(), counter++);
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::filesystem::path operator/(const std::string& name) const { return path / name; }
  std::set<std::string> entries() const {
    std::set<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path)) out.insert(e.path().filename().string());
    return out;
  }
  std::filesystem::path path;
};

inline std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::filesystem::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace tg_test
