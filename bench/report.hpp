// The benchmark's measuring and reporting: timing statistics, tables printed as they fill, and
// the same numbers as JSON.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace bench {

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

// "1.23 ms (1.20-1.31)"
std::string format_time(const Stats& s);

// A cell: text, an integer or a number printed with the column's precision.
using Cell = std::variant<std::string, std::int64_t, double>;

struct Column {
  std::string name;   // header, and the JSON key
  int precision = 2;  // digits after the point for doubles
  int width = 10;
};

// One table of a report: printed header first, then each row as soon as it is added.
class Table {
 public:
  Table(std::string id, std::string title, std::vector<Column> columns);
  void add(std::vector<Cell> row);
  // A line printed under the table (and kept in the JSON as a note).
  void note(std::string text);
  const std::string& id() const { return id_; }
  std::string json() const;

 private:
  std::string id_, title_;
  std::vector<Column> columns_;
  std::vector<std::vector<Cell>> rows_;
  std::vector<std::string> notes_;
};

class Report {
 public:
  // A fact about the run (CPU, threads, reference figures): printed at once, kept for the JSON.
  void fact(const std::string& key, const Cell& value, const std::string& unit = "");
  Table& table(std::string id, std::string title, std::vector<Column> columns);
  // Writes {"facts": {...}, "tables": {id: {"title", "columns", "rows", "notes"}}} to path.
  void write_json(const std::string& path) const;

 private:
  std::vector<std::pair<std::string, Cell>> facts_;
  std::vector<std::unique_ptr<Table>> tables_;
};

// Peak tensor memory of one call of f, in bytes above what was held before it (memory_stats()).
std::int64_t peak_bytes_of(const std::function<void()>& f);

}  // namespace bench
