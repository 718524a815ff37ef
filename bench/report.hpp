// The benchmark's measuring and reporting: timing statistics, tables printed as they fill, and
// the same numbers as one JSON document (layout in main.cpp's header).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace bench {

using clock_type = std::chrono::steady_clock;

// Seconds from t0 to now.
inline double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

// Wall time of one call: median and spread over `runs` timed calls after warm-up.
struct Stats {
  double median = 0, min = 0, max = 0;  // seconds
  int runs = 0;
};

// Times each function: one warm-up call each, then rounds in which every function runs once in
// turn (so all of them see the same machine), until each has at least min_runs calls and the
// rounds took at least min_seconds. A call shorter than ~50 us is timed in batches (each sample
// is then the mean of its batch).
std::vector<Stats> measure(const std::vector<std::function<void()>>& fs, int min_runs = 10, double min_seconds = 0.3);
Stats measure(const std::function<void()>& f, int min_runs = 10, double min_seconds = 0.3);

// Median and spread of samples (seconds).
Stats stats_of(std::vector<double> samples);

// A cell: text, an integer, a number printed with the column's precision, or a time printed in
// milliseconds as "median (min-max)" and written to JSON as {"median_ms", "min_ms", "max_ms", "runs"}.
// A std::monostate cell is "-" in the table and null in the JSON.
using Cell = std::variant<std::monostate, std::string, std::int64_t, double, Stats>;

struct Column {
  std::string key;     // the JSON key: lower case, units in the name ("forward_ms", "peak_mib")
  std::string header;  // printed
  int precision = 2;   // digits after the point for doubles and times; -n: n digits in scientific notation
  int width = 10;
  bool microseconds = false;  // print times in us (the JSON keeps ms)
};

// One table of a report: printed header first, then each row as soon as it is added.
class Table {
 public:
  Table(std::string section, std::string id, std::string title, std::vector<Column> columns);
  void add(std::vector<Cell> row);
  // A line printed under the table (and kept in the JSON as a note).
  void note(std::string text);
  const std::string& id() const { return id_; }
  const std::string& section() const { return section_; }
  std::string json() const;
  std::string markdown() const;  // the title, the rows as a Markdown table, the notes

 private:
  std::string section_, id_, title_;
  std::vector<Column> columns_;
  std::vector<std::vector<Cell>> rows_;
  std::vector<std::string> notes_;
};

class Report {
 public:
  // Sections add their tables under the section last begun; `about` says what it measures.
  void begin(const std::string& section, const std::string& about = "") {
    section_ = section;
    sections_.emplace_back(section, about);
  }
  // A fact about the run (CPU, oneDNN's ISA): printed at once, kept for the JSON under `key`.
  void fact(const std::string& key, const std::string& label, const Cell& value, const std::string& unit = "");
  Table& table(std::string id, std::string title, std::vector<Column> columns);
  // Writes the document main.cpp describes to path; `run` holds the options of the run.
  void write_json(const std::string& path, const std::string& run) const;
  // Writes every fact and table as one Markdown page (docs/benchmarks.md), headed by the command
  // that ran and its date.
  void write_markdown(const std::string& path, const std::string& command) const;

 private:
  std::string section_;
  std::vector<std::pair<std::string, std::string>> sections_;  // name, what it measures
  std::vector<std::pair<std::string, Cell>> facts_;
  std::vector<std::string> fact_labels_, fact_units_;
  std::vector<std::unique_ptr<Table>> tables_;
};

// Peak tensor storage of one call of f, in MiB above what was held before it (memory_stats():
// tensors only, not oneDNN's scratch or the cache of freed blocks).
double peak_mib_of(const std::function<void()>& f);

// Bytes per second of `bytes` moved in the median call of s, in GB/s; flop likewise in GFLOP/s.
inline double per_second(double amount, const Stats& s) { return amount / s.median * 1e-9; }

}  // namespace bench
