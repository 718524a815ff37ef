// A one-line progress display for the training examples: step/total, named values (loss,
// accuracy...), tokens per second and the time left. On a terminal the line is redrawn in
// place; into a file or a pipe it prints a new line every `every` steps, so logs stay short.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace tapegrad_examples {

class Progress {
 public:
  // `first`: the steps done before this process started (a resumed run), left out of the rate.
  Progress(std::int64_t total, std::int64_t every = 100, std::int64_t first = 0)
      : total_(total), every_(every), first_(first), start_(std::chrono::steady_clock::now()), tty_(isatty(fileno(stdout)) != 0) {}

  // After `step` (1-based) steps, of which those since `first` consumed `tokens` tokens.
  void update(std::int64_t step, std::int64_t tokens, const std::vector<std::pair<std::string, double>>& values) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (!tty_ && step % every_ != 0 && step != total_) return;
    std::string line = fmt::format("step {:>{}}/{}", step, fmt::formatted_size("{}", total_), total_);
    for (const auto& [name, value] : values) line += fmt::format("  {} {:.4f}", name, value);
    const double rate = seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0;
    const double left = step > first_ ? seconds * static_cast<double>(total_ - step) / static_cast<double>(step - first_) : 0.0;
    line += fmt::format("  {:.1f}k tok/s  ETA {}:{:02d}", rate / 1000, static_cast<int>(left) / 60, static_cast<int>(left) % 60);
    if (tty_) fmt::print("\r{:<100}", line);
    else fmt::print("{}\n", line);
    if (tty_ && step == total_) fmt::print("\n");
    std::fflush(stdout);
  }

  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

 private:
  std::int64_t total_, every_, first_;
  std::chrono::steady_clock::time_point start_;
  bool tty_;
};

}  // namespace tapegrad_examples
